"""The step of ``gate_layout="in_warp"`` (``gate_layout``): every gate of a unit in one warp's accumulators.

Warp ``w`` holds the A fragments of units ``8 w + grp`` (``grp``: a lane's row of its row tiles), gate ``2 m``
in rows 0-7 of its row tile ``m`` and gate ``2 m + 1`` in rows 8-15. After the products, lane ``(grp, quad)``'s
accumulators of batch tile ``nt`` hold every gate of unit ``8 w + grp`` for batch rows ``8 nt + 2 quad`` and
``+ 1``: those are its pointwise items (item ``j``: batch row ``2 quad + j % 2 + 8 (j // 2)``), whose math reads
the accumulators themselves. No partial sums go to shared memory and no block barrier separates the products from
the pointwise math.

The operand tile is double-buffered: step ``t`` multiplies set ``t % 2`` and its items write their new states into
set ``(t + 1) % 2`` (the initial states go to set 0 before the time loop), so the one block barrier at the end of
the step (``block``) orders every write before the next step's products, and no thread overwrites values another
warp may still be multiplying.

The time loop is the step alone, as in the hand-written prototype it was measured against
(bench/changes/heads_gates_in_warp.json, issue 49): the initial states reach the tiles before it, each item keeps its
exchanged states in registers too (``kept``: a row past its length rewrites them without reading the tile), the
final states are written after it from those registers, and its one block barrier is unguarded, after the next
step's loads of the projection.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.base import sync_threads
from prnn_tvm.codegen.pointwise import as_type, bind_value
from prnn_tvm.frontend.plan import Leaf

from .gate_layout import UNITS_PER_WARP
from .persistent_cuda import Item
from .persistent_fragments import C_REGS


class WarpGates:
    """Mixin of the tensor-core builder (before ``FragmentWeights``): the rows, items, products' values and operand
    tiles of ``gate_layout="in_warp"``; every method passes through to the builder's own with ``by_gate``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.item_now = None  # with in_warp: the item whose body is being emitted (``_WarpItem``)
        if self.c.in_warp:
            self.ipt = self.g.items_per_thread  # 2 n_tiles: a lane's unit at two batch rows per batch tile

    def alloc_loop_state(self):
        """With ``in_warp``: ``kept``, each item's exchanged states as last written to the tiles (the storage type),
        which the step reads in registers (a row past its length keeps them) rather than back from the tile."""
        super().alloc_loop_state()
        if self.c.in_warp:
            self.kept = T.alloc_buffer((self.ipt * len(self.slot),), self.dt, scope="local")

    def kept_at(self, name: str) -> int:
        """Where, in ``kept``, the state ``name`` of the item being emitted sits."""
        return self.item_now * len(self.slot) + list(self.slot).index(name)

    @property
    def warp_unit0(self):
        """The first of this warp's units in the CTA."""
        return self.tx // 32 * UNITS_PER_WARP

    def fragment_rows(self, m: int, half: int) -> list:
        """Row ``grp + 8 * half`` of the warp's row tile ``m``: gate ``2 m + half`` of unit ``8 w + grp``."""
        if not self.c.in_warp:
            return super().fragment_rows(m, half)
        return [(tirx.const(True, "bool"), 2 * m + half, self.warp_unit0 + self.grp)]

    @property
    def tile_sets(self) -> int:
        return 2 if self.c.in_warp else super().tile_sets

    def tile_set(self, parity):
        """The offset, in the operand tiles, of set ``parity``."""
        return parity * (len(self.slot) * self.c.batch_tile * self.stride)

    @property
    def operand_base(self):
        """Where the warp's head starts in the set of operand tiles this step multiplies."""
        if not self.c.in_warp:
            return super().operand_base
        (red,) = self.reductions
        head = self.cols.head_offset(red.operand, red.head_size(self.H), self.cta, self.warp_unit0)
        return self.tile_set(self.t % 2) + self.slot[red.operand] * (self.c.batch_tile * self.stride) + head

    def prologue(self):
        """With ``in_warp``: the initial states into set 0 of the operand tiles before the time loop, then a block
        barrier (over the padding's zeros too), so that no step tests for the first one."""
        super().prologue()
        if self.c.in_warp:
            for name in self.operands_of_phase(0):
                self.copy_tile(name, 0, 0, 0, initial=True)
            for _it, _group, item in self.items():
                with item as (b, unit, _ul):
                    for name in self.slot:
                        T.buffer_store(self.kept, self.a.init[name][b, unit], [self.kept_at(name)])
            sync_threads()

    def load_operands(self, t, b0, phase: int):
        """Nothing with ``in_warp``: the step's set of tiles holds its operands (the prologue's, or the step before's
        writes, ordered by its block barrier)."""
        if not self.c.in_warp:
            super().load_operands(t, b0, phase)

    def store_partials(self, b0):
        """Nothing with ``in_warp``: the pointwise math reads the accumulators."""
        if not self.c.in_warp:
            super().store_partials(b0)

    def end_products(self):
        """No block barrier with ``in_warp``: each lane's items read its own accumulators."""
        if not self.c.in_warp:
            super().end_products()

    def product_value(self, it, b, leaf: Leaf, row):
        """Item ``it``'s gate ``leaf.slice``: accumulator ``2 * half + it % 2`` of row tile ``slice // 2`` (``half``:
        ``slice % 2``) and batch tile ``it // 2``."""
        if not self.c.in_warp:
            return super().product_value(it, b, leaf, row)
        m, half = divmod(leaf.slice, 2)
        return self.acc[(m * self.c.n_tiles + it // 2) * C_REGS + 2 * half + it % 2]

    def item(self, it: int, group: int | None = None):
        if not self.c.in_warp:
            return super().item(it, group)
        return _WarpItem(self, it)

    def publish(self, name: str, t, b, unit, value):
        """With ``in_warp``: into the set of operand tiles the next step multiplies."""
        if not self.c.in_warp:
            super().publish(name, t, b, unit, value)
            return
        T.buffer_store(self.smem, value, [self.tile_set((t + 1) % 2) + self.tile_at(name, b, unit)])
        T.buffer_store(self.kept, value, [self.kept_at(name)])

    def previous_state(self, name: str, t, b, unit):
        """With ``in_warp``: the item's registers, the value it wrote into the set this step multiplies (or the
        initial state)."""
        if not self.c.in_warp:
            return super().previous_state(name, t, b, unit)
        return self.kept[self.kept_at(name)]

    @property
    def waits_at_last_step(self) -> bool:
        """With ``in_warp``: the step's one barrier unguarded, after the next step's loads of the projection (guarded,
        ptxas issued those loads after it, once the barrier released)."""
        return self.c.in_warp or super().waits_at_last_step

    @property
    def finals_after_steps(self) -> bool:
        """With ``in_warp``, where every state is private or exchanged: the final states are written once, after the
        time loop, from the registers that hold each item's states (a row past its length kept them), rather than
        under a test for the last step in every step."""
        if not self.c.in_warp:
            return False
        return all(name in self.slot or name in s.priv for g, s in self.slots.items() for name in g.states)

    def write_outputs(self, t, timing, stored: dict, b, unit):
        if not self.finals_after_steps:
            super().write_outputs(t, timing, stored, b, unit)
            return
        self.barrier.write_outputs(self, t, timing, stored, b, unit)

    def after_steps(self):
        super().after_steps()
        if not self.finals_after_steps:
            return
        for _ in self.each_part():
            for it, group, item in self.items():
                with item as (b, unit, _ul):
                    priv = self.slots[group].priv
                    for name in group.states:
                        if name in priv:
                            value = as_type(self.sreg[it * self.width.priv + priv[name]], self.dt)
                        else:
                            value = self.kept[self.kept_at(name)]
                        T.buffer_store(self.a.final[name], value, [b, unit])


class _WarpItem(Item):
    """A lane's item ``it`` with ``in_warp``: its unit ``8 w + grp`` at batch row ``2 quad + it % 2 + 8 (it // 2)``,
    guarded to the batch (and, by ``Item``, the hidden units)."""

    def place(self) -> tuple:
        bld = self.b
        b = bind_value(2 * bld.quad + self.it % 2 + 8 * (self.it // 2), f"item_b{self.it}")
        return b, bld.warp_unit0 + bld.grp, b < bld.B

    def __enter__(self):
        self.b.item_now = self.it
        return super().__enter__()

    def __exit__(self, *exc):
        self.b.item_now = None
        return super().__exit__(*exc)

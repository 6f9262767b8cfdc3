"""The step of ``gate_layout="in_warp"`` (``gate_layout``): every gate of a unit in one warp's accumulators.

Warp ``w`` holds the A fragments of units ``8 w + grp`` (``grp``: a lane's row of its row tiles), gate ``2 m``
in rows 0-7 of its row tile ``m`` and gate ``2 m + 1`` in rows 8-15. After the products, lane ``(grp, quad)``'s
accumulators of batch tile ``nt`` hold every gate of unit ``8 w + grp`` for batch rows ``8 nt + 2 quad`` and
``+ 1``: those are its pointwise items (item ``j``: batch row ``2 quad + j % 2 + 8 (j // 2)``), whose math reads
the accumulators themselves. No partial sums go to shared memory and no block barrier separates the products from
the pointwise math.

The operand tile is double-buffered: step ``t`` multiplies set ``t % 2`` and its items write their new states into
set ``(t + 1) % 2`` (the initial states go to set 0 before the first step), so the one block barrier at the end of
the step (``block``) orders every write before the next step's products, and no thread overwrites values another
warp may still be multiplying.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.frontend.plan import Leaf

from .gate_layout import UNITS_PER_WARP
from .persistent_cuda import Item
from .persistent_fragments import C_REGS


class WarpGates:
    """Mixin of the tensor-core builder (before ``FragmentWeights``): the rows, items, products' values and operand
    tiles of ``gate_layout="in_warp"``; every method passes through to the builder's own with ``by_gate``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.c.in_warp:
            self.ipt = self.g.items_per_thread  # 2 n_tiles: a lane's unit at two batch rows per batch tile

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

    def previous_state(self, name: str, t, b, unit):
        """With ``in_warp``: from the set this step multiplies (set 0 holds the initial states)."""
        if not self.c.in_warp:
            return super().previous_state(name, t, b, unit)
        return self.smem[self.tile_set(t % 2) + self.tile_at(name, b, unit)]


class _WarpItem(Item):
    """A lane's item ``it`` with ``in_warp``: its unit ``8 w + grp`` at batch row ``2 quad + it % 2 + 8 (it // 2)``,
    guarded to the batch (and, by ``Item``, the hidden units)."""

    def place(self) -> tuple:
        bld = self.b
        b = bind_value(2 * bld.quad + self.it % 2 + 8 * (self.it // 2), f"item_b{self.it}")
        return b, bld.warp_unit0 + bld.grp, b < bld.B

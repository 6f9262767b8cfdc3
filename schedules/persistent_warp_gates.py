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
step's loads of the projection. Where the projection has a second bank of registers (``xp_two_ahead``) a turn of the
loop is two such steps, the second guarded by the sequence's end, the banks taking turns (:meth:`WarpGates.time_loop`).

The output sequence is copied from the set of operand tiles the step wrote, after its barrier (that set is read-only
until the next step's barrier): a thread's 16 bytes of a batch row's units in one shared load and one global store,
rather than each item's 2-byte store in the pointwise math (heads_out_from_tile in bench/results/heads-in-warp-h100.md:
H100, lstm_h12 bf16 768 x 16, T=1024, 0.735 -> 0.706 us a step, outputs bitwise equal).
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.base import row_lanes, sync_threads
from prnn_tvm.codegen.kernel import StepTiming, vec_index
from prnn_tvm.codegen.pointwise import as_type, bind_value
from prnn_tvm.dtypes import itemsize
from prnn_tvm.frontend.plan import Leaf
from prnn_tvm.target import GpuSpec, max_regs_per_thread

from .gate_layout import UNITS_PER_WARP
from .persistent_cuda import Item
from .persistent_fragments import C_REGS
from .persistent_mma_config import TILE_N


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
        if self.xp_two_ahead:  # the projection of the step after next (:meth:`next_inputs`)
            self.xnext = T.alloc_buffer(self.xreg.shape, self.xreg.dtype, scope="local")
        if self.outputs_from_tile:  # the length of the row each of the thread's copies of the outputs is of
            self.out_len = T.alloc_buffer((len(self.out_copies()),), "int32", scope="local")

    def kept_at(self, name: str) -> int:
        """Where, in ``kept``, the state ``name`` of the item being emitted sits."""
        return self.item_now * len(self.slot) + list(self.slot).index(name)

    @property
    def warp_unit0(self):
        """The first of this warp's units in the CTA (the same in each of the ``batch_warps`` sets of warps)."""
        if self.c.batch_warps == 1:
            return self.tx // 32 * UNITS_PER_WARP
        return self.tx // 32 % self.g.warp_rows * UNITS_PER_WARP

    @property
    def warp_tile0(self):
        """The first of the pass's batch tiles this warp multiplies: its set's (``batch_warps``), 0 with one set."""
        if self.c.batch_warps == 1:
            return 0
        return self.tx // 32 // self.g.warp_rows * self.c.warp_n_tiles

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
        base = self.tile_set(self.t % 2) + self.slot[red.operand] * (self.c.batch_tile * self.stride) + head
        return base if self.c.batch_warps == 1 else base + self.warp_tile0 * (TILE_N * self.stride)

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
            if self.xp_two_ahead:
                with T.If(1 < self.steps):
                    with T.Then():
                        self.load_inputs(1, self.xnext)
            if self.outputs_from_tile and self.a.lengths is not None:
                for i, (inside, b, _k) in enumerate(self.out_copies()):
                    with T.If(inside):
                        with T.Then():
                            T.buffer_store(self.out_len, self.a.lengths[b], [i])
            sync_threads()

    def load_operands(self, t, b0, phase: int):
        """Nothing with ``in_warp``: the step's set of tiles holds its operands (the prologue's, or the step before's
        writes, ordered by its block barrier)."""
        if not self.c.in_warp:
            super().load_operands(t, b0, phase)

    @property
    def xp_two_ahead(self) -> bool:
        """With ``in_warp``: whether each step's projection is loaded two steps ahead (:meth:`next_inputs`), where the
        geometry's register estimate with a second bank of the projection's registers stays within what a thread of
        a CTA of its threads may have (H100, lstm_h12 bf16 768 x 16, T=1024: 0.977x a step for 34 registers more,
        bench/results/heads-in-warp-h100.md; a CTA of 512 threads has 128 a thread and spilled)."""
        if not (self.c.in_warp and self.inputs_early):
            return False
        any_gpu = GpuSpec("any", 0, 0, 0)  # the register file, the same on every GpuSpec (its defaults)
        return self.g.regs_estimate + self.ipt * self.width.x <= max_regs_per_thread(self.g.threads, any_gpu)

    @property
    def inputs_ahead(self) -> int:
        """With :attr:`xp_two_ahead`, the projection loaded at a step's end is the one two steps on."""
        return 2 if self.xp_two_ahead else super().inputs_ahead

    # With xp_two_ahead, whether the projection's two register banks take turns (:meth:`time_loop`) rather than the
    # next step's values being moved from one bank into the other at each step's end (a move that waits for loads
    # issued a step before). H100, lstm_h24 bf16 768 x 16, T=1024: that move's wait was 17% of the kernel's stall
    # samples (ncu); taking turns, 0.373 -> 0.306 us a step (bench/results/xp-banks-h100.md)
    XP_BANKS_ALTERNATE = True

    @property
    def xp_banks_alternate(self) -> bool:
        """Whether the time loop runs two steps a turn, the projection's banks taking turns (above)."""
        return self.xp_two_ahead and self.XP_BANKS_ALTERNATE

    def time_loop(self):
        """With :attr:`xp_banks_alternate`: two steps a turn, the first reading ``xreg`` and the second ``xnext``
        (each loading, at its end, the projection of two steps on into the bank it read: :meth:`next_inputs`), so that
        a load has two steps to land."""
        if not self.xp_banks_alternate:
            super().time_loop()
            return
        with T.serial(0, (self.steps + 1) // 2) as turn:
            self.step(2 * turn)
            self.xreg, self.xnext = self.xnext, self.xreg
            with T.If(2 * turn + 1 < self.steps):
                with T.Then():
                    self.step(2 * turn + 1)
            self.xreg, self.xnext = self.xnext, self.xreg

    def next_inputs(self, t):
        """With :attr:`xp_two_ahead`, at the end of step ``t``: the loads of the step after next, into the bank this
        step read (:attr:`xp_banks_alternate`), or into the other bank once the next step's values are moved from it
        into the one the step reads (loaded a step before: about two steps against DRAM's latency where the
        projection is past L2, the move waiting for them)."""
        if not self.xp_two_ahead:
            super().next_inputs(t)
            return
        if self.xp_banks_alternate:
            with T.If(t + 2 < self.steps):
                with T.Then():
                    self.load_inputs(t + 2, self.xreg)
            return
        with T.If(t + 1 < self.steps):
            with T.Then():
                for i in range(int(self.xreg.shape[0])):
                    T.buffer_store(self.xreg, self.xnext[i], [i])
        with T.If(t + 2 < self.steps):
            with T.Then():
                self.load_inputs(t + 2, self.xnext)

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
        ``slice % 2``) and the warp's batch tile ``it // 2``."""
        if not self.c.in_warp:
            return super().product_value(it, b, leaf, row)
        m, half = divmod(leaf.slice, 2)
        return self.acc[(m * self.c.warp_n_tiles + it // 2) * C_REGS + 2 * half + it % 2]

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
        """Each item's outputs, but those copied from the operand tile after the barrier (:meth:`after_barrier`),
        and, unless :attr:`finals_after_steps`, the final states after the last step."""
        per_item = {name: value for name, value in stored.items() if name not in self.outputs_from_tile}
        self.barrier.write_outputs(self, t, timing, per_item, b, unit)
        if not self.finals_after_steps:
            with T.If(t == self.steps - 1):
                with T.Then():
                    self.write_final(stored, b, unit)

    @property
    def outputs_from_tile(self) -> tuple:
        """With ``in_warp``: the outputs copied from the operand tile (module doc), each an exchanged state of the
        output sequence's type, written at its own step."""
        if not self.c.in_warp or self.a.out is None or str(self.a.out.dtype) != str(self.dt):
            return ()
        p = self.p
        return tuple(n for n in p.outputs if n in self.slot and not p.delays[n] and n not in p.reversed_states)

    @property
    def out_lanes(self) -> int:
        """Values per copy of the outputs: 16 bytes where the CTA's units, the hidden size and the tile's row allow."""
        return row_lanes(math.gcd(self.c.units_per_cta, self.H, self.stride), itemsize(self.dt))

    def out_copies(self) -> list:
        """``(inside, batch row, first unit in the CTA)`` of each of the thread's copies of a row's ``out_lanes``
        values (``inside``: the copy is one of the CTA's rows and units)."""
        U, lv, threads = self.c.units_per_cta, self.out_lanes, self.g.threads
        n = self.B * U // lv
        copies = []
        for i in range(-(-n // threads)):
            idx = i * threads + self.tx
            b, k = idx * lv // U, idx * lv % U
            copies.append((tirx.all(idx < n, self.cta * U + k < self.H), b, k))
        return copies

    def after_barrier(self, t):
        """With :attr:`outputs_from_tile`: step ``t``'s outputs from the set of operand tiles it wrote (zeros past a
        row's length), ``out_lanes`` values a load and a store."""
        super().after_barrier(t)
        names = self.outputs_from_tile
        if not names:
            return
        lv, column = self.out_lanes, {name: k * self.H for k, name in enumerate(self.p.outputs)}
        for i, (inside, b, k) in enumerate(self.out_copies()):
            unit = self.cta * self.c.units_per_cta + k
            with T.If(inside):
                with T.Then():
                    timing = StepTiming(self.p, self.a, t, None if self.a.lengths is None else self.out_len[i])
                    for name in names:
                        value = self.smem[vec_index(self.tile_set((t + 1) % 2) + self.tile_at(name, b, unit), lv)]
                        running = timing.running(name)
                        if running is not None:
                            value = T.if_then_else(running, value, tirx.const(0, self.dt) if lv == 1
                                                   else T.broadcast(tirx.const(0, self.dt), lv))
                        T.buffer_store(self.a.out, value, [t, b, vec_index(column[name] + unit, lv)])

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
    """A lane's item ``it`` with ``in_warp``: its unit ``8 w + grp`` at batch row ``2 quad + it % 2 + 8 (it // 2)``
    (past the warp's first batch tile, with ``batch_warps``), guarded to the batch (and, by ``Item``, the hidden
    units)."""

    def place(self) -> tuple:
        bld = self.b
        row = 2 * bld.quad + self.it % 2 + 8 * (self.it // 2)
        b = bind_value(row if bld.c.batch_warps == 1 else row + 8 * bld.warp_tile0, f"item_b{self.it}")
        return b, bld.warp_unit0 + bld.grp, b < bld.B

    def __enter__(self):
        self.b.item_now = self.it
        return super().__enter__()

    def __exit__(self, *exc):
        self.b.item_now = None
        return super().__exit__(*exc)

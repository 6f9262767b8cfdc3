"""Sums over every hidden unit of a row (``CellPlan.unit_sums``: ``c.sum``, ``c.mean``) in the persistent templates.

A row's units live in every block, so a sum meets across blocks, with the exchange the step already has between
its phases (the plain one: a kind that polls values is refused, ``Barrier.problem``):

    phase p    each (batch row, unit) item adds its share of each sum the next phase reads (``CellPlan.sums_of``)
               into shared memory; after a block barrier a thread per (sum, batch row) adds the block's shares up
               (its units in order) and writes the block's partial sum to the workspace (float32, a slot per step
               parity), then the grid barrier between the phases
    phase p+1  a group of lanes per (sum, batch row) adds every block's partial up (:func:`lane_groups`): lane g of
               the group the blocks g, g + lanes, ... in that order, then the lanes' sums through xor shuffles (a
               fixed order: the same total in every block, run after run), into shared memory; a block barrier;
               every item reads the total

A step of a cell whose sums take two phases (the layer-normalized LSTM: the gates' means, then the cell state's)
thus meets at three grid barriers: one after each phase.

Shared memory, after the template's own (``Geometry.smem_us``): the shares ``[sum][batch row][unit of the
block]`` and the totals ``[sum][batch row]``, float32. The workspace holds the partial sums after the operands'
slots, as float32 ``[sum][parity][batch row][block]`` (``sum_slots`` more slots).

**Atomic sums** (the templates' knob ``atomic_sums=R``, R > 0; 0, the default, is the exchange above): a thread per
(sum, batch row) adds its block's partial with ``atomicAdd`` (its result unused: ``red.global.add.f32``) into one of
R accumulators of the pair (block i into replica i % R) before the grid barrier, and after it a thread per pair adds
the R replicas up: R loads a total where the exchange above loads every block's partial. Floats added by atomics in
the order the blocks arrive: the totals are not bit-identical from run to run (within rounding of each other).
The workspace holds float32 ``[parity][replica][sum][batch row]`` (each replica's words padded to whole 128-byte
lines, so that replicas meet in different lines of L2), then one word: the blocks that left the launch.

Why two buffers (the step's parity) suffice: every add of step t's sums goes into parity t % 2; during step t block
0 zeroes parity (t + 1) % 2 (:meth:`UnitSumExchange.clear_next`). The totals of step t - 1 (parity (t + 1) % 2) are
read in its phases before its last grid barrier, which block 0 passes before step t starts; the adds of step t + 1
come after step t's last barrier, which block 0 reaches after zeroing. The barriers order all of it: ``grid_sync``
(a fence and an arrival), ``counter`` (a block barrier, then a release reduction; waiters acquire, then a block
barrier); a kind that polls values does not carry sums (``Barrier.problem``). At a launch's end no barrier follows
the last step's reads, so each block counts itself out after its last reads (an acquire-release atomic, as the
barriers' base is advanced: ``common.cuh``'s ``prnn_barrier_end``), and the last one zeroes every accumulator and
the count (:meth:`UnitSumExchange.clear_sums`): every launch starts on the zeros the runtime made the workspace with.
"""

from __future__ import annotations

import functools
import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.base import sync_threads
from prnn_tvm.dtypes import itemsize
from prnn_tvm.errors import ConfigError

from .persistent_weights import FULL_MASK

SUM_DTYPE = "float32"
WARP = 32
MAX_PER_LANE = 16  # partials a lane loads and adds
ATOMIC_SUMS = (0, 1, 2, 4, 8)  # the knob's values: 0 the blocks' partials, else the accumulators' replicas
LINE_WORDS = 32  # float32 words of a 128-byte line: each replica's accumulators start a line
# The last block out of a launch zeroes the accumulators (``words``, float32) and the count ``left`` (the module's doc)
_CLEAR = r"""
__device__ __forceinline__ void prnn_sums_clear(float* words, unsigned* left, int count) {
  __shared__ int prnn_sums_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(left) : "memory");
    prnn_sums_last = before == gridDim.x - 1;
  }
  __syncthreads();
  if (prnn_sums_last) {
    for (int i = threadIdx.x; i < count; i += blockDim.x) words[i] = 0.0f;
    if (threadIdx.x == 0) *left = 0u;
  }
}
"""


def unit_sum_bytes(plan, batch: int, units: int) -> int:
    """Shared memory a block keeps the shares and totals of ``plan``'s sums over units in."""
    return itemsize(SUM_DTYPE) * len(plan.unit_sums) * batch * (units + 1)


def sum_slots(plan, slot_elements: int, storage: str, ctas: int, replicas: int = 0) -> int:
    """Workspace slots (of ``slot_elements`` ``storage`` values) the partial sums of ``ctas`` blocks take, or with
    ``replicas`` (``atomic_sums``) the accumulators and their count."""
    if not plan.unit_sums:
        return 0
    words = accumulator_words(plan, plan.batch, replicas) if replicas else len(plan.unit_sums) * 2 * plan.batch * ctas
    return math.ceil(words * itemsize(SUM_DTYPE) / (slot_elements * itemsize(storage)))


def replica_words(plan, batch: int) -> int:
    """Words of one replica of the accumulators (every sum's batch rows), in whole 128-byte lines."""
    return -(-len(plan.unit_sums) * batch // LINE_WORDS) * LINE_WORDS


def accumulator_words(plan, batch: int, replicas: int) -> int:
    """Workspace words of ``atomic_sums=replicas``: both parities' replicas, then the count of blocks that left."""
    return 2 * replicas * replica_words(plan, batch) + 1


def check_atomic_sums(cfg, plan) -> None:
    """ConfigError where a config's ``atomic_sums`` cannot take ``plan``, with the reason and the fix."""
    R = cfg.atomic_sums
    if R not in ATOMIC_SUMS:
        raise ConfigError(f"atomic_sums={R}: must be one of {', '.join(map(str, ATOMIC_SUMS))} (0: every block reads "
                          "each block's partial sum; R: the blocks add theirs into R accumulators by atomics)")
    if R and not plan.unit_sums:
        raise ConfigError(f"atomic_sums={R} adds the blocks' partial sums over units by atomics; cell "
                          f"'{plan.cell.name}' sums over no units: use atomic_sums=0")


def atomic_sums_offered(plan) -> tuple:
    """The ``atomic_sums`` a tuning space offers: every value where ``plan`` sums over units, else 0."""
    return ATOMIC_SUMS if plan.unit_sums else (0,)


def lane_groups(pairs: int, warps: int, ctas: int) -> tuple[int, int]:
    """``(lanes, rounds)``: each (sum, batch row) pair of ``pairs`` is added up by a group of ``lanes`` lanes (a power
    of two), ``32 / lanes`` groups a warp, in ``rounds`` rounds over the block's ``warps``; narrower groups where a
    warp has several pairs (their loads in flight together), while a lane loads at most ``MAX_PER_LANE`` of the
    ``ctas`` partials."""
    lanes = WARP
    while lanes > 1 and WARP // lanes * warps < pairs and -(-ctas // (lanes // 2)) <= MAX_PER_LANE:
        lanes //= 2
    return lanes, -(-pairs // (warps * (WARP // lanes)))


class UnitSumExchange:
    """Mixin of the template's builder (``persistent_cuda.PersistentBuilder``): the shares, partial sums and
    totals of the plan's sums over units. Uses the builder's ``p``, ``g``, ``c``, ``B``, ``H``, ``tx``, ``bx``,
    ``cta``, ``a`` and the products mixin's ``unit_sum_memory()`` (the shared allocation and the word the sums start
    at)."""

    def alloc_unit_sums(self, operand_slots: int):
        """Views of shared memory and of the workspace (after its ``operand_slots`` slots) for the sums."""
        sums = self.p.unit_sums
        self.sum_index = {us.name: i for i, us in enumerate(sums)}
        if not sums:
            return
        n, B, U = len(sums), self.B, self.c.units_per_cta
        memory, first = self.unit_sum_memory()
        self.shares = T.decl_buffer((n * B * U,), SUM_DTYPE, data=memory.data, elem_offset=first)
        self.totals = T.decl_buffer((n * B,), SUM_DTYPE, data=memory.data, elem_offset=first + n * B * U)
        self.sum_acc = T.alloc_buffer((1,), SUM_DTYPE, scope="local")
        ws = self.a.ws
        slot = math.prod(int(d) for d in ws.shape[1:])
        offset = operand_slots * slot * itemsize(ws.dtype) // itemsize(SUM_DTYPE)
        R = self.replicas
        words = accumulator_words(self.p, B, R) - 1 if R else n * 2 * B * self.g.ctas
        self.partials = T.decl_buffer((words,), SUM_DTYPE, data=ws.data, elem_offset=offset)
        if R:  # the count of blocks that left the launch, after the accumulators
            self.sums_left = T.decl_buffer((1,), "uint32", data=ws.data, elem_offset=offset + words)

    @property
    def replicas(self) -> int:
        """The config's ``atomic_sums``: 0 (each block's partial in a slot of its own) or the accumulators' replicas."""
        return getattr(self.c, "atomic_sums", 0)

    def accumulator_at(self, i, parity, replica, b):
        """Where replica ``replica`` of sum ``i``'s accumulator for row ``b`` at ``parity`` is (``atomic_sums``)."""
        return (parity * self.replicas + replica) * replica_words(self.p, self.B) + i * self.B + b

    def unit_sum(self, name: str, b):
        """The total of sum ``name`` for batch row ``b`` (in shared memory from the phase that reads it on)."""
        return self.totals[self.sum_index[name] * self.B + b]

    def add_share(self, name: str, b, ul, share):
        """This item's (unit ``ul`` of the block) share of sum ``name`` for row ``b``."""
        T.buffer_store(self.shares, share, [(self.sum_index[name] * self.B + b) * self.c.units_per_cta + ul])

    def which_sum(self, sums, pair):
        """The plan's index of the sum of pair ``pair`` of ``(sum, batch row)`` pairs over ``sums`` (``B`` pairs
        each)."""
        which = tirx.const(self.sum_index[sums[0].name], "int32")
        for j, us in enumerate(sums[1:], start=1):
            which = T.if_then_else(pair // self.B == j, self.sum_index[us.name], which)
        return which

    def per_row(self, sums, body):
        """``body(i, b)`` for each (sum ``i``: the plan's index of one of ``sums``; batch row ``b``), a thread each."""
        work = len(sums) * self.B
        for k in range(-(-work // self.g.threads)):
            idx = k * self.g.threads + self.tx
            with T.If(idx < work):
                with T.Then():
                    body(self.which_sum(sums, idx), idx % self.B)

    def partial_at(self, i, t, b):
        """Where the partials of sum ``i``, batch row ``b``, written at step ``t``, start (one per block after)."""
        return ((i * 2 + t % 2) * self.B + b) * self.g.ctas

    def sum_partials(self, t, phase: int):
        """End of ``phase``: the block's partial sum of each sum the next phase reads, to the workspace."""
        sums = self.p.sums_of(phase)
        if not sums:
            return
        U, B, total = self.c.units_per_cta, self.B, self.sum_acc
        sync_threads()
        units = T.min(U, self.H - self.cta * U)  # the last block's units past hidden hold no share

        def body(i, b):
            T.buffer_store(total, tirx.const(0.0, SUM_DTYPE), [0])
            with T.serial(0, units) as ul:
                T.buffer_store(total, total[0] + self.shares[(i * B + b) * U + ul], [0])
            if self.replicas:  # atomicAdd whose result is unused: red.global.add.f32
                at = self.accumulator_at(i, t % 2, self.bx % self.replicas, b)
                T.evaluate(T.call_extern(SUM_DTYPE, "atomicAdd", T.address_of(self.partials[at]), total[0]))
            else:
                T.buffer_store(self.partials, total[0], [self.partial_at(i, t, b) + self.cta])

        self.per_row(sums, body)

    def sum_totals(self, t, phase: int):
        """Start of ``phase`` (after the grid barrier): every block's partial of each sum it reads from now on, added
        up by a group of lanes per (sum, batch row) in a fixed order (:func:`lane_groups`)."""
        sums = [us for us in self.p.unit_sums if us.phase == phase]
        if not sums:
            return
        if self.replicas:
            self.replica_totals(t, sums)
            if phase == min(us.phase for us in self.p.unit_sums):  # once a step
                self.clear_next(t)
            sync_threads()
            return
        B, warps = self.B, self.g.threads // WARP
        work, lane = len(sums) * B, self.tx % WARP
        lanes, rounds = lane_groups(work, warps, self.g.ctas)
        groups = WARP // lanes
        for k in range(rounds):
            pair = (k * warps + self.tx // WARP) * groups + lane // lanes
            # a group past the last pair adds nothing (its lanes still join the warp's shuffles)
            inside = None if rounds * warps * groups == work else pair < work
            i, b = self.which_sum(sums, pair), pair % B
            self.group_total(self.partial_at(i, t, b), i * B + b, lanes, inside)
        sync_threads()

    def group_total(self, first, at, lanes: int, inside):
        """The sum of the ``ctas`` partials from ``first`` over a group of ``lanes`` lanes, into the totals'
        ``at`` (where ``inside``, None: always): lane g of the group adds partials g, g + lanes, ... in order, then
        the group's sums meet through xor shuffles (every lane of it ends with the same total: a + b is b + a)."""
        ctas, total, g = self.g.ctas, self.sum_acc, self.tx % lanes
        T.buffer_store(total, tirx.const(0.0, SUM_DTYPE), [0])
        for j in range(-(-ctas // lanes)):
            cta = g + j * lanes
            guard = [c for c in (inside, cta < ctas if (j + 1) * lanes > ctas else None) if c is not None]
            if not guard:
                T.buffer_store(total, total[0] + self.partials[first + cta], [0])
                continue
            with T.If(tirx.all(*guard)):
                with T.Then():
                    T.buffer_store(total, total[0] + self.partials[first + cta], [0])
        offset = lanes // 2
        while offset:
            other = T.call_extern(SUM_DTYPE, "__shfl_xor_sync", T.uint32(FULL_MASK), total[0], offset, WARP)
            T.buffer_store(total, total[0] + other, [0])
            offset //= 2
        with T.If(g == 0 if inside is None else tirx.all(g == 0, inside)):
            with T.Then():
                T.buffer_store(self.totals, total[0], [at])

    def replica_totals(self, t, sums):
        """After the grid barrier (``atomic_sums``): each total of ``sums`` at step ``t``, its replicas added by one
        thread in their order, into the totals."""
        total = self.sum_acc

        def body(i, b):
            T.buffer_store(total, tirx.const(0.0, SUM_DTYPE), [0])
            for r in range(self.replicas):
                T.buffer_store(total, total[0] + self.partials[self.accumulator_at(i, t % 2, r, b)], [0])
            T.buffer_store(self.totals, total[0], [i * self.B + b])

        self.per_row(sums, body)

    def clear_next(self, t):
        """During step ``t``, block 0 zeroes the accumulators step ``t + 1`` adds into (parity (t + 1) % 2: the
        module's doc says why no one reads or adds into them meanwhile)."""
        words, threads = self.replicas * replica_words(self.p, self.B), self.g.threads
        first = (t + 1) % 2 * words
        with T.If(self.bx == 0):
            with T.Then():
                for k in range(-(-words // threads)):
                    idx = k * threads + self.tx
                    store = functools.partial(T.buffer_store, self.partials, tirx.const(0.0, SUM_DTYPE), [first + idx])
                    if (k + 1) * threads <= words:
                        store()
                        continue
                    with T.If(idx < words):
                        with T.Then():
                            store()

    def clear_sums(self):
        """At the launch's end (``atomic_sums``): the last block out zeroes every accumulator and the count."""
        if not (self.p.unit_sums and self.replicas):
            return
        words = accumulator_words(self.p, self.B, self.replicas) - 1
        T.evaluate(T.cuda.func_call("prnn_sums_clear", T.address_of(self.partials[0]), T.address_of(self.sums_left[0]),
                                    words, source_code=_CLEAR, return_type="void"))

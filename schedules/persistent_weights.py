"""Where the persistent template keeps the recurrent weights, and the products over them.

A CTA owns ``units_per_cta`` hidden units with every gate row of every recurrent product;
product ``i`` owns CTA rows ``[row_lo[i], row_lo[i] + slices_i * units_per_cta)``. Thread
``tx`` is lane ``ks = tx % k_split`` of row group ``rg = tx // k_split`` and holds rows
``rg * rows_per_thread + r`` in registers for the whole launch, loaded once through fully
unrolled constant indices (a runtime index would send them to local memory): element
``k = vec * (ks + k_split * q) + v`` of row ``r`` lives at register ``(r * k_chunks + q) *
vec + v``. With several products each thread's rows belong to one of them
(``validate`` checks it), so a thread has one operand and one phase.

The weight tiers (``smem_chunks`` = S > 0): chunks ``q >= k_chunks - S`` of every row live in shared memory,
loaded once in the prologue, each thread writing and reading only its own words, so no block barrier
orders them. Shared chunk ``j = q - (k_chunks - S)`` of row ``r`` of thread ``tx`` starts at word
``ws0 + ((j * rows_per_thread + r) * threads + tx) * vec``: for one (j, r) a warp's 32 threads read 32
consecutive ``vec``-wide words, one 128-byte wavefront per word of the vector and no bank conflicts. A
product reads them once per batch tile: per shared chunk, the tile's state vectors, then per row one weight
vector multiplied into every batch row.

The third tier (``l2_chunks`` = L > 0, dense products): chunks ``q < L`` of every row are never loaded into the
CTA; every batch tile of every step reads them in place from its product's weight matrix (a thread's rows are all
one product's; with several, the matrix's address is chosen per thread) (row ``s * hidden + unit``, columns
``vec * (ks + k_split * q) ..``: a warp's lanes read consecutive ``vec``-wide words, 16-byte ``__ldg`` loads where
``vec`` is 4, the matrix being read-only for the launch), all rows' vectors of a chunk loaded before they are
multiplied. A thread past the CTA's rows, or a row of a unit past hidden, reads a row that exists (its sums are
never stored). Before each step's barrier wait each thread asks for its first streamed vectors to be brought into
L1 (``prefetch.global.L1``, at most ``L1_PREFETCH_BYTES`` a CTA), so that the wait hides their trip from L2.
Registers hold chunks ``[L, k_chunks - S)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import vec_index
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.codegen.prefetch import prefetch
from prnn_tvm.dtypes import itemsize

FULL_MASK = 0xFFFFFFFF
L1_PREFETCH_BYTES = 16 * 1024  # a CTA's streamed weights asked into L1 before a barrier wait (a guess: unmeasured)

_STREAMED = r"""
#ifndef PRNN_STREAMED
#define PRNN_STREAMED
// one weight vector of a streamed chunk, read-only for the launch: ld.global.nc, 16 bytes for a float4
template <typename V>
__device__ __forceinline__ V prnn_ldg(const float* p) { return __ldg(reinterpret_cast<const V*>(p)); }
// where several products stream: the address in the matrix of the product a thread's rows belong to
template <typename P>
__device__ __forceinline__ P prnn_pick(bool mine, P here, P before) { return mine ? here : before; }
#endif
"""


@dataclass(frozen=True)
class HalvingLevel:
    """One shuffle distance of the lane reduction: a lane holds ``held`` values before it and keeps ``half``
    (the lower half where its ``offset`` bit is clear), or ``half`` None: one value, summed across the pair."""

    offset: int
    held: int
    half: int | None


def halving_levels(values: int, k_split: int) -> list[HalvingLevel]:
    """The levels of :meth:`RegisterWeights.lane_reduce`, widest shuffle distance first."""
    out, offset = [], k_split // 2
    while offset >= 1:
        out.append(HalvingLevel(offset, values, (values + 1) // 2 if values > 1 else None))
        values = (values + 1) // 2
        offset //= 2
    return out


@functools.lru_cache(maxsize=1024)
def lane_shuffles(values: int, k_split: int) -> int:
    """Shuffles a lane issues in :meth:`RegisterWeights.lane_reduce` (answered once per arguments in a process: the
    cost estimate of every valid config of a space asks)."""
    return sum(level.half or 1 for level in halving_levels(values, k_split))


def held_after_halving(values: int, k_split: int) -> int:
    """Registers of sums a lane holds after :meth:`RegisterWeights.lane_reduce`."""
    levels = halving_levels(values, k_split)
    return (levels[-1].half or 1) if levels else values


class RegisterWeights:
    """Mixin of the template's builder: the register-resident weights and the products over them.

    Uses the builder's ``p`` (plan), ``c`` (config), ``g`` (geometry), ``a`` (arguments),
    ``bx``/``rg``/``ks`` (block, row group, lane), ``row_lo``, ``ops``, ``wreg``, ``acc``,
    ``hv``, ``smem`` and ``gs0`` (word offset of the gate sums in shared memory), and its
    ``operand_base`` / ``thread_phase``, which follow from ``first_row`` here.
    """

    def alloc_product_buffers(self):
        """Registers for the weights, accumulators and a state vector; shared memory for the operand
        tiles followed by the gate sums (word ``gs0``); the thread's lane and row group."""
        g, c = self.g, self.c
        self.wreg = T.alloc_buffer((max(1, g.weights_per_thread),), self.dt, scope="local")
        self.acc = T.alloc_buffer((c.rows_per_thread * c.batch_tile,), self.acc_dt, scope="local")
        self.hv = T.alloc_buffer((c.vec,), self.dt, scope="local")
        # the tiles and the sums, or all of g.smem_bytes where that is more (rounded up to 48 KB: launchable_smem)
        words = max(1, self.gs0 + g.smem_gs // itemsize(self.dt), -(-g.smem_bytes // itemsize(self.dt)))
        self.smem = T.alloc_buffer((words,), self.dt, scope="shared.dyn")
        if g.smem_chunks or g.l2_chunks:  # the tiers: a chunk's state vectors of the tile, its weight vectors
            self.hvs = T.alloc_buffer((c.batch_tile * c.vec,), self.dt, scope="local")
            self.wv = T.alloc_buffer((c.vec * (c.rows_per_thread if g.l2_chunks else 1),), self.dt, scope="local")
            self.ws0 = g.weights_offset // itemsize(self.dt)
        if g.l2_chunks:  # the streamed tier: each weight matrix as a flat buffer, each row's first element there
            self.wglobal = {red.weight: T.decl_buffer((red.slices * self.H * self.H,), self.dt,
                                                      data=self.a.weight[red.weight].data)
                            for red in self.p.reductions}
            self.wrow = T.alloc_buffer((c.rows_per_thread,), "int32", scope="local")
        self.ks = bind_value(self.tx % c.k_split, "ks")
        self.rg = bind_value(self.tx // c.k_split, "rg")

    def unit_sum_memory(self) -> tuple:
        """The shared allocation and the word the sums over units start at: after the gate sums."""
        return self.smem, self.gs0 + self.g.smem_gs // itemsize(self.dt)

    def load_weights(self):
        """Prologue: each thread's weight rows into registers; zero outside the matrices."""
        c, H, U = self.c, self.H, self.c.units_per_cta
        for r in range(c.rows_per_thread if self.reductions else 0):
            row = bind_value(self.rg * c.rows_per_thread + r, f"row{r}")
            if self.g.l2_chunks:
                self.streamed_row(r, row)
            for q in range(self.g.l2_chunks, self.g.k_chunks):
                for v in range(c.vec):
                    k = c.vec * (self.ks + c.k_split * q) + v
                    value = tirx.const(0.0, self.wreg.dtype)
                    for i, red in reversed(list(enumerate(self.reductions))):
                        lo, hi = self.row_lo[i], self.row_lo[i] + red.slices * U
                        s, ul = (row - lo) // U, (row - lo) % U
                        unit = self.cta * U + ul
                        ok = tirx.all(row >= lo, row < hi, unit < H, k < red.head_size(H))  # a head-wise row: D
                        value = T.if_then_else(ok, self.a.weight[red.weight][s * H + unit, k], value)
                    if q < self.g.smem_from:
                        T.buffer_store(self.wreg, value, [self.wreg_index(r, q, v)])
                    else:
                        T.buffer_store(self.smem, value, [self.shared_weight(r, q) + v])
        if self.g.l2_chunks:
            self.prefetch_streamed()

    def streamed_row(self, r: int, row):
        """Where row ``r`` of the thread starts in its product's flat weight matrix (the streamed tier): its gate
        slice's row of its unit, both clamped to rows that exist (a thread past the CTA's rows, a unit past hidden:
        sums never stored)."""
        U = self.c.units_per_cta
        if len(self.reductions) == 1:
            (red,) = self.reductions
            last = red.slices * U - 1
            inside = T.if_then_else(row < last, row, last)
        else:  # the thread's rows are all its product's (validate): from that product's first row
            lo = self.row_lo[0]
            last = self.reductions[0].slices * U - 1
            for i, red in enumerate(self.reductions[1:], start=1):
                mine = self.first_row >= self.row_lo[i]
                lo = T.if_then_else(mine, self.row_lo[i], lo)
                last = T.if_then_else(mine, red.slices * U - 1, last)
            inside = bind_value(T.min(row - lo, last), f"streamed{r}")
        unit = self.cta * U + inside % U
        unit = T.if_then_else(unit < self.H - 1, unit, self.H - 1)
        T.buffer_store(self.wrow, (inside // U * self.H + unit) * self.H, [r])

    def streamed_address(self, r: int, q: int):
        """The address of streamed chunk ``q`` of the thread's row ``r``: in its product's flat weight matrix (with
        several products, the one its rows belong to)."""
        at = self.wrow[r] + self.c.vec * (self.ks + self.c.k_split * q)
        address = T.address_of(self.wglobal[self.reductions[0].weight][at])
        for i, red in enumerate(self.reductions[1:], start=1):
            # (a pointer select: TIR's Select takes no handles)
            address = T.cuda.func_call("prnn_pick", self.first_row >= self.row_lo[i],
                                       T.address_of(self.wglobal[red.weight][at]), address, source_code=_STREAMED,
                                       return_type="handle")
        return address

    def prefetch_streamed(self):
        """Before a barrier wait: the thread's first streamed weight vectors asked into L1 (module doc), as many rows
        of the first chunks as ``L1_PREFETCH_BYTES`` a CTA takes."""
        c, g = self.c, self.g
        per_row = g.threads * c.vec * itemsize(self.dt)  # bytes of one (chunk, row) over the CTA
        budget = L1_PREFETCH_BYTES // per_row
        for i in range(min(budget, g.l2_chunks * c.rows_per_thread)):
            q, r = divmod(i, c.rows_per_thread)
            T.evaluate(prefetch(self.streamed_address(r, q), "L1"))

    def before_wait(self):
        """What a thread does before the step's barrier wait: ask for the next step's first streamed weights."""
        if self.g.l2_chunks:
            for _ in self.each_part():
                self.prefetch_streamed()

    def shared_weight(self, r: int, q: int):
        """The word where chunk ``q`` (one of the shared ones) of the thread's row ``r`` starts (module doc)."""
        j = q - self.g.smem_from
        return self.ws0 + ((j * self.c.rows_per_thread + r) * self.g.threads + self.tx) * self.c.vec

    def tile_products(self, b0, phase: int):
        """This phase's products for batch rows b0.. (in shared memory): the gate sums of the tile."""
        self.partial_products(phase)
        self.lane_reduce()
        self.store_gate_sums(b0, phase)

    def gate_sum(self, b, row):
        """The reduced product of CTA row ``row`` for batch row ``b``."""
        return self.smem[self.gs0 + b * self.g.rows + row]

    def partial_products(self, phase: int):
        """This lane's share of each of its rows' dot products, for every row of the batch tile."""
        c, BT = self.c, self.c.batch_tile
        for i in range(c.rows_per_thread * BT):
            T.buffer_store(self.acc, tirx.const(0.0, self.acc.dtype), [i])
        with T.If(self.thread_phase == phase):  # every lane still joins the shuffles after
            with T.Then():
                for q in range(self.g.l2_chunks):
                    self.streamed_chunk_products(q)
                for q in range(self.g.l2_chunks, self.g.smem_from):
                    for bb in range(BT):
                        base = self.operand_base + bb * self.g.stride + c.vec * (self.ks + c.k_split * q)
                        T.buffer_store(self.hv, self.smem[vec_index(base, c.vec)], [vec_index(0, c.vec)])
                        for r in range(c.rows_per_thread):
                            for v in range(c.vec):
                                a = r * BT + bb
                                T.buffer_store(self.acc, self.acc[a] + self.wreg[self.wreg_index(r, q, v)]
                                               * self.hv[v], [a])
                for q in range(self.g.smem_from, self.g.k_chunks):
                    self.shared_chunk_products(q)

    def tile_vectors(self, q: int):
        """Chunk ``q``'s state vectors of every row of the batch tile, into ``hvs``."""
        c = self.c
        for bb in range(c.batch_tile):
            base = self.operand_base + bb * self.g.stride + c.vec * (self.ks + c.k_split * q)
            T.buffer_store(self.hvs, self.smem[vec_index(base, c.vec)], [vec_index(bb * c.vec, c.vec)])

    def streamed_chunk_products(self, q: int):
        """The products over streamed chunk ``q``: every row's weight vector from global memory (all issued before
        the first is used), the tile's state vectors, then the products."""
        c = self.c
        vector = {1: "float", 2: "float2", 4: "float4"}[c.vec]  # the template's storage type is float32
        for r in range(c.rows_per_thread):
            value = T.cuda.func_call(f"prnn_ldg<{vector}>", self.streamed_address(r, q),
                                     source_code=_STREAMED, return_type=self.dt if c.vec == 1 else f"{self.dt}x{c.vec}")
            T.buffer_store(self.wv, value, [vec_index(r * c.vec, c.vec)])
        self.tile_vectors(q)
        for r in range(c.rows_per_thread):
            self.row_products(r, r * c.vec)

    def shared_chunk_products(self, q: int):
        """The products over shared chunk ``q``: the tile's state vectors, then per row its weight vector."""
        c = self.c
        self.tile_vectors(q)
        for r in range(c.rows_per_thread):
            T.buffer_store(self.wv, self.smem[vec_index(self.shared_weight(r, q), c.vec)], [vec_index(0, c.vec)])
            self.row_products(r, 0)

    def row_products(self, r: int, w0: int):
        """Row ``r``'s weight vector (``wv`` from element ``w0``) into its accumulators, times each of the tile's
        state vectors (``hvs``, :meth:`tile_vectors`)."""
        c, BT = self.c, self.c.batch_tile
        for bb in range(BT):
            for v in range(c.vec):
                a = r * BT + bb
                T.buffer_store(self.acc, self.acc[a] + self.wv[w0 + v] * self.hvs[bb * c.vec + v], [a])

    def lane_reduce(self):
        """Sum each of a row's ``rows_per_thread x batch_tile`` values over its ``k_split`` lanes by recursive
        halving (:func:`halving_levels`): at each shuffle distance a lane keeps half of the values it holds and
        sends the other half to its partner, so a level costs half the shuffles of the one before; once a lane
        holds one value the remaining distances add it up across lanes. Each total ends in the lanes that
        ``store_gate_sums`` picks (:meth:`held_value`), against one shuffle per value and distance for every
        lane to end with every sum (16 values over 32 lanes: 16 shuffles instead of 80)."""
        acc, zero = self.acc, tirx.const(0.0, self.acc.dtype)
        for level in halving_levels(self.c.rows_per_thread * self.c.batch_tile, self.c.k_split):
            if level.half is None:  # one value left: everyone adds the partner's
                other = self.lane_shuffle(acc[0], level.offset)
                T.buffer_store(acc, acc[0] + other, [0])
                continue
            upper = bind_value(tirx.NE(self.ks & level.offset, 0), f"upper{level.offset}")
            for j in range(level.half):
                low = acc[j]
                high = acc[level.half + j] if level.half + j < level.held else zero
                sent = self.lane_shuffle(tirx.Select(upper, low, high), level.offset)
                T.buffer_store(acc, tirx.Select(upper, high, low) + sent, [j])

    def lane_shuffle(self, value, offset: int):
        return T.call_extern(self.acc.dtype, "__shfl_xor_sync", T.uint32(FULL_MASK), value, offset, self.c.k_split)

    def held_value(self, slot: int):
        """After :meth:`lane_reduce`: (which of the thread's values, ``r * batch_tile + bb``, register ``slot``
        holds the total of; whether this lane is the one to store it)."""
        index, stores = tirx.const(slot, "int32"), tirx.const(True, "bool")
        for level in reversed(halving_levels(self.c.rows_per_thread * self.c.batch_tile, self.c.k_split)):
            bit = (self.ks // level.offset) % 2
            if level.half is None:
                stores = tirx.all(stores, bit == 0)
            else:  # the lane kept the upper half here: its slot j was slot half + j before
                index = index + level.half * bit
                if level.held % 2:  # the upper half was one short: its last slot held nothing
                    stores = tirx.all(stores, index < level.held)
        return index, stores

    def store_gate_sums(self, b0, phase: int):
        """Each total to the shared gate sums (``gs0 + b * rows + row``), by the lane holding it."""
        c, rows = self.c, self.g.rows
        for slot in range(held_after_halving(c.rows_per_thread * c.batch_tile, c.k_split)):
            index, stores = self.held_value(slot)
            value = bind_value(index, f"sum{slot}")
            row = self.rg * c.rows_per_thread + value // c.batch_tile
            b = b0 + value % c.batch_tile
            with T.If(tirx.all(stores, self.thread_phase == phase, row < rows, b < self.B)):
                with T.Then():
                    T.buffer_store(self.smem, self.acc[slot], [self.gs0 + b * rows + row])

    def wreg_index(self, r: int, q: int, v: int) -> int:
        """Register of element ``v`` of chunk ``q`` (one of the register chunks, from ``l2_chunks``) of row ``r``."""
        return (r * self.g.register_chunks + q - self.g.l2_chunks) * self.c.vec + v

    @property
    def first_row(self):
        """The thread's first CTA row (its rows all belong to one product, see validate)."""
        return self.rg * self.c.rows_per_thread


"""Recurrent weights as tensor-core fragments in registers, and the products over them.

Warp ``w`` of a CTA is ``(m, kg) = (w // k_groups, w % k_groups)``: it holds, for the whole
launch, the A fragments of row tiles ``m * mw .. m * mw + mw - 1`` (``mw``: ``m_tiles_per_warp``)
for its k tiles ``kg * kt_per + kt``; each B fragment it loads feeds all of them. Lane
``(grp, quad) = (lane // 4, lane % 4)`` holds, per k tile, the eight half values that
``mma.sync.m16n8k16.row.col`` takes from it (PTX ISA, "Matrix Fragments for mma.m16n8k16"):

    A element j (0..7): row grp + 8 * ((j // 2) % 2), column 2 * quad + j % 2 + 8 * (j // 4)
    B element j (0..3): column (batch row) grp, row (hidden) 2 * quad + j % 2 + 8 * (j // 2)
    C element i (0..3): row grp + 8 * (i // 2), column (batch row) 2 * quad + i % 2

With ``operand_path="direct"`` each lane polls its B fragments of every k tile straight from the output
sequence into registers (``poll_fragments``), the k columns of a warp's range permuted so that a lane's fragments
are whole 16-byte loads (``persistent_mma_config.direct_k``; the A fragments take the same columns), and the
partial sums alternate between two sets by step parity. Otherwise the B fragments of two batch tiles are one
``ldmatrix.x4`` from the shared operand tile (rows of
``stride`` elements; ``ROW_SKEW`` puts the eight batch rows on distinct banks; a batch smaller than the pass has a
tile of its own rows only, ``tile_rows``, and the fragments' rows past it read its last row); with one batch tile per
pass, two 32-bit loads (H100, tuned configs, one process, us per step, 32-bit loads -> ldmatrix: LSTM fp16 1024x64
5.18 -> 4.88, 1024x32 3.25 -> 3.15, 512x16 1.92 -> 1.91; at one batch tile ``.x2`` was 0-2.5% slower). Each warp
adds its k range into float32 accumulators and writes them to its k group's slice of the
shared partial sums; the pointwise math adds the ``k_groups`` partials of the gate it reads.

The weight tiers (``smem_k_tiles`` = S > 0): the last S of a warp's k tiles keep their A fragments in shared
memory, written once in the prologue by the lane that reads them (no block barrier orders them). Fragment ``j``
(``j = kt - (k_tiles_per_warp - S)``) of row tile ``m`` of lane ``lane`` of warp ``w`` is the 16 bytes at half
``((((w * m_tiles_per_warp + m) * S + j) * 32 + lane) * 8`` from ``weights_offset``: a warp's 32 lanes read 512
consecutive bytes with one 16-byte load each, four wavefronts and no bank conflicts, then multiply every batch tile
with it.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import vec_index
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.dtypes import itemsize

from .persistent_mma_config import TILE_K, TILE_M, TILE_N, product_tiles
from .streamed_fragments import StreamedFragments
from .streamed_tier import direct_k, direct_loads

A_REGS, B_REGS, C_REGS = 8, 4, 4  # half elements of A and B, float32 elements of C, per lane and tile

# TVM's ldmatrix op addresses shared memory through the allocation's element type; the operand tiles are a
# half-typed view of the float32 partial sums' allocation, so the kernel carries its own
_LDMATRIX = r"""
#ifndef PRNN_LDMATRIX
#define PRNN_LDMATRIX
// four 8 x 8 matrices of 16-bit values, lane l giving the address of row l % 8 of matrix l // 8
__device__ __forceinline__ void prnn_ldmatrix_x4(void* frag, const void* row) {
  unsigned* r = (unsigned*)frag;
  unsigned a = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
#endif
"""


def _weight_or(keep, weight: tirx.Buffer, row, col, lanes: int, otherwise):
    """``weight[row, col:col + lanes]`` where ``keep``, else ``otherwise``: one element of the prologue.

    Branch-free: every lane loads, its indices clamped into the matrix, and keeps the value or not.
    With a guarded load per element, ptxas (CUDA 13.0) built a nest of divergent regions per element
    wherever the unit range can be partial (``unit < H``), ran out of convergence barriers, saved and
    restored them in the time loop, and there let a warp reach ``bar.sync`` diverged (compute-sanitizer's
    synccheck: "Divergent thread(s) in warp", a thread of an invalid unit in the last block): Cho's GRU
    at fp16 133x11 with 8 units per block on one k group gave wrong outputs in its last block (0.16 max
    abs error where 4e-4 is right). Built this way it takes 184 registers instead of 242 and is right."""
    rows, cols = weight.shape
    inside = weight[tirx.max(tirx.min(row, rows - 1), 0), vec_index(tirx.max(tirx.min(col, cols - lanes), 0), lanes)]
    return T.if_then_else(keep, bind_value(inside, "w"), otherwise)


class FragmentWeights(StreamedFragments):
    """Mixin of the template's builder (see ``persistent_cuda.PersistentBuilder``) for the
    tensor-core template: row tiles per product, fragment registers, mma products, k-group sums.
    The builder's ``operand_base`` / ``thread_phase`` follow from ``first_row`` here."""

    def row_starts(self) -> list[int]:
        """Product i starts at row tile boundaries: a tile never holds rows of two products."""
        starts, lo = [], 0
        for tiles in product_tiles(self.reductions, self.c.units_per_cta):
            starts.append(lo)
            lo += TILE_M * tiles
        return starts

    def alloc_product_buffers(self):
        """Fragment registers; one dynamic shared buffer: the float32 partial sums, then the operand tiles."""
        g, c = self.g, self.c
        mw = c.m_tiles_per_warp
        self.wreg = T.alloc_buffer((max(1, A_REGS * g.register_k_tiles * mw),), self.dt, scope="local")
        self.acc = T.alloc_buffer((C_REGS * c.warp_n_tiles * mw * c.k_chains,), self.acc_dt, scope="local")
        # direct: the lane's fragments of every k tile, as its poll loads them; else one k tile's
        self.bfrag = T.alloc_buffer((B_REGS * c.warp_n_tiles * (g.k_tiles_per_warp if c.direct else 1),), self.dt,
                                    scope="local")
        gs_words = g.smem_gs // itemsize(self.acc_dt)
        # the sums and the tiles, or all of g.smem_bytes where that is more (rounded up to 48 KB: launchable_smem)
        words = max(gs_words + -(-g.smem_ops // itemsize(self.acc_dt)), -(-g.smem_bytes // itemsize(self.acc_dt)))
        self.gsum = T.alloc_buffer((max(1, words),), self.acc_dt, scope="shared.dyn")
        per_word = itemsize(self.acc_dt) // itemsize(self.dt)
        self.smem = T.decl_buffer((max(1, g.smem_ops // itemsize(self.dt)),), self.dt, data=self.gsum.data,
                                  elem_offset=gs_words * per_word)
        if g.smem_k_tiles:  # the tiers: the fragments in shared memory, and one staged in registers
            self.wsm = T.decl_buffer((g.smem_ws // itemsize(self.dt),), self.dt, data=self.gsum.data,
                                     elem_offset=g.weights_offset // itemsize(self.dt))
            self.afrag = T.alloc_buffer((A_REGS,), self.dt, scope="local")
        if g.l2_k_tiles:  # the third tier: the fragments read from global memory (``streamed_fragments``)
            self.alloc_streamed()
        warp, lane = self.tx // 32, self.tx % 32
        self.mt = bind_value(warp // c.k_groups * mw, "mt")  # the warp's first row tile
        self.kg = bind_value(warp % c.k_groups, "kg")
        self.grp = bind_value(lane // 4, "grp")
        self.quad = bind_value(lane % 4, "quad")

    def unit_sum_memory(self) -> tuple:
        """The shared allocation and the (float32) word the sums over units start at: after the partial sums and
        the operand tiles."""
        return self.gsum, self.g.smem_gs // itemsize(self.acc_dt) + -(-self.g.smem_ops // itemsize(self.acc_dt))

    def before_wait(self):
        """What a thread does before the step's barrier wait: ask for the next step's first streamed fragments (nothing
        where every fragment is on chip)."""
        if self.g.l2_k_tiles:  # one dense product: one part
            for _ in self.each_part():
                self.prefetch_streamed()

    def load_weights(self):
        """Prologue: this warp's A fragments into registers; zero outside the matrices.

        A lane's fragments cover two rows of its row tile (``grp`` and ``grp + 8``): where each
        row's weights live (which product, which weight row) is bound once per row, so the
        unrolled loads differ only in their column. Each element is loaded unconditionally
        (:func:`_weight_or`)."""
        if not self.reductions:
            return
        H, U, kt_per, lk = self.H, self.c.units_per_cta, self.g.k_tiles_per_warp, self.g.l2_k_tiles
        if lk:
            self.streamed_rows()
        # pairs (2 * quad, 2 * quad + 1) never straddle a row of an even number of columns (hidden, or a head's)
        lanes = 2 if all(int(self.a.weight[r.weight].shape[1]) % 2 == 0 for r in self.reductions) else 1
        for m in range(self.c.m_tiles_per_warp):
            sources = []  # per fragment row: [(in this product, weight row), per product]
            for half in range(2):
                per_product = []
                for i, (inside, slice_, ul) in enumerate(self.fragment_rows(m, half)):
                    unit = self.cta * U + ul
                    ok = bind_value(tirx.all(inside, unit < H), f"frag_ok{m}_{half}_{i}")
                    per_product.append((ok, bind_value(slice_ * H + unit, f"frag_src{m}_{half}_{i}")))
                sources.append(per_product)
            for kt in range(lk, kt_per):  # the streamed ones (the first lk) stay in the matrix
                for j in range(0, A_REGS, lanes):
                    if self.c.direct:  # the columns the lane's B fragments hold (direct_k)
                        k = TILE_K * self.kg * kt_per + direct_k(self.quad, kt, j % 2 + 2 * (j // 4), kt_per)
                    else:
                        k = TILE_K * (self.kg * kt_per + kt) + 2 * self.quad + j % 2 + 8 * (j // 4)
                    value = tirx.const(0.0, self.dt) if lanes == 1 else T.broadcast(tirx.const(0.0, self.dt), lanes)
                    for red, (ok, src) in reversed(list(zip(self.reductions, sources[(j // 2) % 2]))):
                        value = _weight_or(tirx.all(ok, k < red.head_size(H)), self.a.weight[red.weight], src, k,
                                           lanes, value)
                    if kt < lk + self.g.register_k_tiles:
                        T.buffer_store(self.wreg, value, [vec_index(self.a_operand(m, kt, 0)[1] + j, lanes)])
                    else:
                        T.buffer_store(self.wsm, value, [vec_index(self.shared_fragment(m, kt) + j, lanes)])

    def fragment_rows(self, m: int, half: int) -> list:
        """Where the rows of the lane's A fragments of its row tile ``m`` (row ``grp + 8 * half`` of the tile) lie in
        each product: ``(whether the row is that product's, its slice, its unit in the CTA)`` per product. The CTA's
        rows run product by product, slice by slice, unit by unit (``row_starts``)."""
        U = self.c.units_per_cta
        row = bind_value((self.mt + m) * TILE_M + self.grp + 8 * half, f"frag_row{m}_{half}")
        return [(tirx.all(row >= lo, row < lo + red.slices * U), (row - lo) // U, (row - lo) % U)
                for lo, red in zip(self.row_lo, self.reductions)]

    def shared_fragment(self, m: int, kt: int):
        """The half where the lane's A fragment of row tile ``m`` and k tile ``kt`` (a shared one) starts (module
        doc)."""
        mw, sk = self.c.m_tiles_per_warp, self.g.smem_k_tiles
        return ((((self.tx // 32) * mw + m) * sk + kt - (self.g.k_tiles_per_warp - sk)) * 32 + self.tx % 32) * A_REGS

    def tile_products(self, b0, phase: int):
        """This phase's products for batch rows b0.. (in shared memory) into the k group's partial sums."""
        c, g, stride, mw = self.c, self.g, self.stride, self.c.m_tiles_per_warp
        per_chain = C_REGS * c.warp_n_tiles * mw  # accumulators of one chain; k tile kt adds into chain kt % k_chains
        for i in range(per_chain * c.k_chains):
            T.buffer_store(self.acc, tirx.const(0.0, self.acc_dt), [i])
        tiles = self.filled_row_tiles()
        multiplies = self.thread_phase == phase
        if tiles < g.m_tiles:  # a part with fewer row tiles than the widest: its last warps have none
            multiplies = tirx.all(multiplies, self.mt < tiles)
        with T.If(multiplies):
            with T.Then():
                if c.direct:  # every fragment is in registers already (poll_fragments)
                    for kt in range(g.k_tiles_per_warp):
                        self.multiply(kt, lambda nt, kt=kt: (nt * g.k_tiles_per_warp + kt) * B_REGS, per_chain)
                    self.sum_chains(per_chain)
                    self.store_partials(b0)
                    return
                pairs = c.warp_n_tiles > 1  # B fragments of two batch tiles per ldmatrix, else two 32-bit loads
                lane = self.tx % 32
                # ldmatrix: lane l gives the row address of 8 x 8 matrix l // 8 (k 0-7 or 8-15 of batch tile nt or
                # nt + 1), row l % 8; lane (grp, quad) receives batch row grp, k 2 * quad.. of each
                lane_at = ((lane % 8 + TILE_N * (lane // 16)) * stride + 8 * (lane // 8 % 2) if pairs
                           else self.tile_row(self.grp) * stride + 2 * self.quad)
                first = bind_value(self.operand_base + lane_at + TILE_K * self.kg * g.k_tiles_per_warp, "frag0")
                starts = self.pair_starts(lane) if pairs else {}
                for kt in range(g.k_tiles_per_warp):
                    self.before_k_tile(b0, kt)
                    at = first + TILE_K * kt
                    if kt < g.l2_k_tiles:  # the streamed range's own column order
                        self.streamed_b(kt)
                    elif pairs:
                        for nt in range(0, c.warp_n_tiles, 2):
                            row_at = starts[nt] + TILE_K * kt if starts else at + nt * TILE_N * stride
                            T.evaluate(T.cuda.func_call("prnn_ldmatrix_x4", T.address_of(self.bfrag[nt * B_REGS]),
                                                        T.address_of(self.smem[row_at]),
                                                        source_code=_LDMATRIX, return_type="void"))
                    else:
                        for half in range(2):  # k 2*quad.. and 8 + 2*quad..
                            T.buffer_store(self.bfrag, self.smem[vec_index(at + 8 * half, 2)],
                                           [vec_index(2 * half, 2)])
                    self.multiply(kt, lambda nt: nt * B_REGS, per_chain)
                self.sum_chains(per_chain)
                self.store_partials(b0)

    def before_k_tile(self, b0, kt: int):
        """What a warp does before reading k tile ``kt`` of batch rows b0.. from the shared operand tile: nothing (the
        block filled the tile before :meth:`tile_products`); the tensor-core backward's warps copy their own
        columns there."""

    def tile_row(self, row):
        """The row of the shared operand tile that a fragment's batch row ``row`` (of the pass) reads: itself, or
        where the tile holds fewer rows than the pass (``tile_rows``: a batch under 8) its last row, whose products
        land in columns never stored (``store_partials``)."""
        return row if self.tile_rows == self.c.batch_tile else T.min(row, self.tile_rows - 1)

    def pair_starts(self, lane) -> dict:
        """Where the lane's ``ldmatrix`` row address of batch tiles ``nt, nt + 1`` starts, per even ``nt``, in a tile
        of fewer rows than the pass (each row clamped by :meth:`tile_row`); empty for a whole tile (one start, the
        tiles ``TILE_N`` rows apart)."""
        if self.tile_rows == self.c.batch_tile:
            return {}
        g, stride = self.g, self.stride
        return {nt: bind_value(self.operand_base + self.tile_row(lane % 8 + TILE_N * (lane // 16 + nt)) * stride
                               + 8 * (lane // 8 % 2) + TILE_K * self.kg * g.k_tiles_per_warp, f"frag_pair{nt}")
                for nt in range(0, self.c.warp_n_tiles, 2)}

    def filled_row_tiles(self) -> int:
        """Row tiles that hold weights in this CTA: its products' (the widest part may have more)."""
        return sum(product_tiles(self.reductions, self.c.units_per_cta))

    def multiply(self, kt: int, b_offset, per_chain: int):
        """The mma steps of k tile ``kt``: each batch tile's B fragment (at ``b_offset(nt)`` in ``bfrag``) times the
        warp's row tiles, into accumulator chain ``kt % k_chains``."""
        c, g, mma = self.c, self.g, self.p.policy.mma
        if kt < g.l2_k_tiles:
            self.multiply_streamed(kt, b_offset, per_chain)
            return
        if kt >= g.l2_k_tiles + g.register_k_tiles:
            self.multiply_shared(kt, b_offset, per_chain)
            return
        for nt in range(c.warp_n_tiles):
            for m in range(c.m_tiles_per_warp):  # the warp's row tiles share the B fragment
                accumulators = (kt % c.k_chains) * per_chain + (m * c.warp_n_tiles + nt) * C_REGS
                a_data, a_offset = self.a_operand(m, kt, nt)
                T.evaluate(T.ptx_legacy.mma(mma.shape, "row", "col", mma.ptx, mma.ptx, mma.accumulator,
                                            a_data, a_offset, self.bfrag.data,
                                            b_offset(nt), self.acc.data, accumulators, False))

    def a_operand(self, m: int, kt: int, nt: int) -> tuple:
        """``(data, offset)`` of the A fragment of the warp's row tile ``m`` and k tile ``kt`` (for batch tile
        ``nt``): its registers (k tiles ``l2_k_tiles`` to ``l2_k_tiles + register_k_tiles``)."""
        return self.wreg.data, (m * self.g.register_k_tiles + kt - self.g.l2_k_tiles) * A_REGS

    def multiply_shared(self, kt: int, b_offset, per_chain: int):
        """:meth:`multiply` for a k tile whose A fragments are in shared memory: each row tile's fragment staged in
        registers once, then multiplied with every batch tile's B fragment."""
        c, mma = self.c, self.p.policy.mma
        for m in range(c.m_tiles_per_warp):
            T.buffer_store(self.afrag, self.wsm[vec_index(self.shared_fragment(m, kt), A_REGS)],
                           [vec_index(0, A_REGS)])
            for nt in range(c.warp_n_tiles):
                accumulators = (kt % c.k_chains) * per_chain + (m * c.warp_n_tiles + nt) * C_REGS
                T.evaluate(T.ptx_legacy.mma(mma.shape, "row", "col", mma.ptx, mma.ptx, mma.accumulator,
                                            self.afrag.data, 0, self.bfrag.data, b_offset(nt), self.acc.data,
                                            accumulators, False))

    def sum_chains(self, per_chain: int):
        """Accumulator chains 1.. added into chain 0."""
        for chain in range(1, self.c.k_chains):
            for i in range(per_chain):
                T.buffer_store(self.acc, self.acc[i] + self.acc[chain * per_chain + i], [i])

    def poll_fragments(self, t, b0):
        """``operand_path="direct"``: this lane's B fragments of batch rows b0.. (row ``b0 + grp`` of each batch tile)
        over its warp's k range, straight from the state's sequence into registers (its initial state before its
        first step): the loads :func:`direct_k` lays out, polled until none holds the sentinel. Rows past the
        batch and columns past hidden read as zero. A timed-out wait sets ``aborted`` for this thread;
        ``end_products`` makes it the block's."""
        (name,) = self.part.operands  # validated: one exchanged state
        H, kt_per = self.H, self.g.k_tiles_per_warp
        width, loads = direct_loads(kt_per)
        per_load = width // itemsize(self.dt)
        k0 = bind_value(TILE_K * self.kg * kt_per + per_load * self.quad, "frag_k0")  # direct_k of its first load
        pieces = tirx.max(tirx.min((H - k0 + 4 * per_load - 1) // (4 * per_load), loads), 0)  # loads before hidden
        row = bind_value(b0 + self.grp, "frag_b")
        rows = tirx.max(tirx.min((self.B - row + TILE_N - 1) // TILE_N, self.c.n_tiles), 0)
        # an address inside the matrices where nothing is loaded (no row, or a k range past hidden)
        at, k_at = tirx.min(row, self.B - 1), tirx.min(k0, H - per_load)
        slot = t - 1 - self.p.delays[name]
        frag = T.address_of(self.bfrag[0])

        def poll(src, row_step, initial: bool):
            abort = self.barrier.poll_fragments(src, row_step, rows, pieces, frag, self.dt, self.c.n_tiles, loads,
                                                width, not initial, t, self.sync, self.c.poll_sleep)
            T.buffer_store(self.aborted, tirx.max(self.aborted[0], abort), [0])

        with T.If(slot < 0):
            with T.Then():
                poll(T.address_of(self.a.init[name][at, k_at]), TILE_N * H, initial=True)
            with T.Else():
                poll(T.address_of(self.sequence_slot(name, slot, at, k_at)), TILE_N * self.sequence_row(name),
                     initial=False)

    def store_partials(self, b0):
        """The accumulators to the shared partial sums of this warp's k group: ``[kg][b][row]``, batch rows
        ``sum_stride`` words apart."""
        g, c = self.g, self.c
        for m in range(c.m_tiles_per_warp):
            for nt in range(c.n_tiles):
                for i in range(C_REGS):
                    row = (self.mt + m) * TILE_M + self.grp + 8 * (i // 2)
                    b = b0 + nt * TILE_N + 2 * self.quad + i % 2
                    with T.If(b < self.B):
                        with T.Then():
                            T.buffer_store(self.gsum, self.acc[(m * c.n_tiles + nt) * C_REGS + i],
                                           [self.partials_base() + (self.kg * self.B + b) * g.sum_stride + row])

    def gate_sum(self, b, row):
        """The product of CTA row ``row`` for batch row ``b``: the sum of the k groups' partials."""
        base = self.partials_base()
        total = self.gsum[base + b * self.g.sum_stride + row]
        for kg in range(1, self.c.k_groups):
            total = total + self.gsum[base + (kg * self.B + b) * self.g.sum_stride + row]
        return total

    def partials_base(self):
        """Where this step's partial sums start in ``gsum``: the set of the step's parity with direct fragments
        (the next step's products may write theirs before every thread has read this step's: no block barrier
        between them), else 0."""
        if not self.c.direct:
            return 0
        return (self.t % 2) * (self.g.smem_gs // 2 // itemsize(self.acc_dt))

    @property
    def first_row(self):
        """The first CTA row of this warp's row tile (a tile never holds rows of two products)."""
        return self.mt * TILE_M


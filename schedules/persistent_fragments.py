"""Recurrent weights as tensor-core fragments in registers, and the products over them.

Warp ``w`` of a CTA is ``(m, kg) = (w // k_groups, w % k_groups)``: it holds, for the whole
launch, the A fragments of row tiles ``m * mw .. m * mw + mw - 1`` (``mw``: ``m_tiles_per_warp``)
for its k tiles ``kg * kt_per + kt``; each B fragment it loads feeds all of them. Lane
``(grp, quad) = (lane // 4, lane % 4)`` holds, per k tile, the eight half values that
``mma.sync.m16n8k16.row.col`` takes from it (PTX ISA, "Matrix Fragments for mma.m16n8k16"):

    A element j (0..7): row grp + 8 * ((j // 2) % 2), column 2 * quad + j % 2 + 8 * (j // 4)
    B element j (0..3): column (batch row) grp, row (hidden) 2 * quad + j % 2 + 8 * (j // 2)
    C element i (0..3): row grp + 8 * (i // 2), column (batch row) 2 * quad + i % 2

The B fragments of two batch tiles are one ``ldmatrix.x4`` from the shared operand tile (rows of
``stride`` elements; ``ROW_SKEW`` puts the eight batch rows on distinct banks); with one batch tile per pass,
two 32-bit loads (H100, tuned configs, one process, us per step, 32-bit loads -> ldmatrix: LSTM fp16 1024x64
5.18 -> 4.88, 1024x32 3.25 -> 3.15, 512x16 1.92 -> 1.91; at one batch tile ``.x2`` was 0-2.5% slower). Each warp
adds its k range into float32 accumulators and writes them to its k group's slice of the
shared partial sums; the pointwise math adds the ``k_groups`` partials of the gate it reads.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import MMA_TYPES, vec_index
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.dtypes import itemsize

from .persistent_mma_config import TILE_K, TILE_M, TILE_N, product_tiles

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


class FragmentWeights:
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
        self.wreg = T.alloc_buffer((max(1, A_REGS * g.k_tiles_per_warp * mw),), self.dt, scope="local")
        self.acc = T.alloc_buffer((C_REGS * c.n_tiles * mw * c.k_chains,), self.acc_dt, scope="local")
        self.bfrag = T.alloc_buffer((B_REGS * c.n_tiles,), self.dt, scope="local")
        gs_words = g.smem_gs // itemsize(self.acc_dt)
        # the sums and the tiles, or all of g.smem_bytes where that is more (rounded up to 48 KB: launchable_smem)
        words = max(gs_words + -(-g.smem_ops // itemsize(self.acc_dt)), -(-g.smem_bytes // itemsize(self.acc_dt)))
        self.gsum = T.alloc_buffer((max(1, words),), self.acc_dt, scope="shared.dyn")
        per_word = itemsize(self.acc_dt) // itemsize(self.dt)
        self.smem = T.decl_buffer((max(1, g.smem_ops // itemsize(self.dt)),), self.dt, data=self.gsum.data,
                                  elem_offset=gs_words * per_word)
        warp, lane = self.tx // 32, self.tx % 32
        self.mt = bind_value(warp // c.k_groups * mw, "mt")  # the warp's first row tile
        self.kg = bind_value(warp % c.k_groups, "kg")
        self.grp = bind_value(lane // 4, "grp")
        self.quad = bind_value(lane % 4, "quad")

    def load_weights(self):
        """Prologue: this warp's A fragments into registers; zero outside the matrices.

        A lane's fragments cover two rows of its row tile (``grp`` and ``grp + 8``): where each
        row's weights live (which product, which weight row) is bound once per row, so the
        unrolled loads differ only in their column. Each element is loaded unconditionally
        (:func:`_weight_or`)."""
        if not self.reductions:
            return
        H, U, kt_per = self.H, self.c.units_per_cta, self.g.k_tiles_per_warp
        lanes = 2 if H % 2 == 0 else 1  # pairs (2 * quad, 2 * quad + 1) never straddle an even H
        for m in range(self.c.m_tiles_per_warp):
            sources = []  # per fragment row: [(in this product, weight row), per product]
            for half in range(2):
                row = bind_value((self.mt + m) * TILE_M + self.grp + 8 * half, f"frag_row{m}_{half}")
                per_product = []
                for i, red in enumerate(self.reductions):
                    lo, hi = self.row_lo[i], self.row_lo[i] + red.slices * U
                    unit = self.cta * U + (row - lo) % U
                    ok = bind_value(tirx.all(row >= lo, row < hi, unit < H), f"frag_ok{m}_{half}_{i}")
                    per_product.append((ok, bind_value(((row - lo) // U) * H + unit, f"frag_src{m}_{half}_{i}")))
                sources.append(per_product)
            for kt in range(kt_per):
                for j in range(0, A_REGS, lanes):
                    k = TILE_K * (self.kg * kt_per + kt) + 2 * self.quad + j % 2 + 8 * (j // 4)
                    value = tirx.const(0.0, self.dt) if lanes == 1 else T.broadcast(tirx.const(0.0, self.dt), lanes)
                    for red, (ok, src) in reversed(list(zip(self.reductions, sources[(j // 2) % 2]))):
                        value = _weight_or(tirx.all(ok, k < H), self.a.weight[red.weight], src, k, lanes, value)
                    T.buffer_store(self.wreg, value, [vec_index((m * kt_per + kt) * A_REGS + j, lanes)])

    def tile_products(self, b0, phase: int):
        """This phase's products for batch rows b0.. (in shared memory) into the k group's partial sums."""
        c, g, stride, mw = self.c, self.g, self.stride, self.c.m_tiles_per_warp
        per_chain = C_REGS * c.n_tiles * mw  # accumulators of one chain; k tile kt adds into chain kt % k_chains
        for i in range(per_chain * c.k_chains):
            T.buffer_store(self.acc, tirx.const(0.0, self.acc_dt), [i])
        ptx = MMA_TYPES[self.dt]
        tiles = sum(product_tiles(self.reductions, c.units_per_cta))
        multiplies = self.thread_phase == phase
        if tiles < g.m_tiles:  # a part with fewer row tiles than the widest: its last warps have none
            multiplies = tirx.all(multiplies, self.mt < tiles)
        with T.If(multiplies):
            with T.Then():
                pairs = c.n_tiles > 1  # B fragments of two batch tiles per ldmatrix, else two 32-bit loads
                lane = self.tx % 32
                # ldmatrix: lane l gives the row address of 8 x 8 matrix l // 8 (k 0-7 or 8-15 of batch tile nt or
                # nt + 1), row l % 8; lane (grp, quad) receives batch row grp, k 2 * quad.. of each
                lane_at = ((lane % 8 + TILE_N * (lane // 16)) * stride + 8 * (lane // 8 % 2) if pairs
                           else self.grp * stride + 2 * self.quad)
                first = bind_value(self.operand_base + lane_at + TILE_K * self.kg * g.k_tiles_per_warp, "frag0")
                for kt in range(g.k_tiles_per_warp):
                    at = first + TILE_K * kt
                    if pairs:
                        for nt in range(0, c.n_tiles, 2):
                            T.evaluate(T.cuda.func_call("prnn_ldmatrix_x4", T.address_of(self.bfrag[nt * B_REGS]),
                                                        T.address_of(self.smem[at + nt * TILE_N * stride]),
                                                        source_code=_LDMATRIX, return_type="void"))
                    else:
                        for half in range(2):  # k 2*quad.. and 8 + 2*quad..
                            T.buffer_store(self.bfrag, self.smem[vec_index(at + 8 * half, 2)],
                                           [vec_index(2 * half, 2)])
                    for nt in range(c.n_tiles):
                        for m in range(mw):  # the warp's row tiles share the B fragment
                            T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", ptx, ptx, "fp32", self.wreg.data,
                                                        (m * g.k_tiles_per_warp + kt) * A_REGS, self.bfrag.data,
                                                        nt * B_REGS, self.acc.data,
                                                        (kt % c.k_chains) * per_chain + (m * c.n_tiles + nt) * C_REGS,
                                                        False))
                for chain in range(1, c.k_chains):
                    for i in range(per_chain):
                        T.buffer_store(self.acc, self.acc[i] + self.acc[chain * per_chain + i], [i])
                self.store_partials(b0)

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
                                           [(self.kg * self.B + b) * g.sum_stride + row])

    def gate_sum(self, b, row):
        """The product of CTA row ``row`` for batch row ``b``: the sum of the k groups' partials."""
        total = self.gsum[b * self.g.sum_stride + row]
        for kg in range(1, self.c.k_groups):
            total = total + self.gsum[(kg * self.B + b) * self.g.sum_stride + row]
        return total

    @property
    def first_row(self):
        """The first CTA row of this warp's row tile (a tile never holds rows of two products)."""
        return self.mt * TILE_M


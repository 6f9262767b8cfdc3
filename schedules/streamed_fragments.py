"""The tensor-core builder's streamed A fragments: the first ``l2_k_tiles`` k tiles of each warp, read in place from
the weight matrix every pass (the third weight tier; ``streamed_tier`` gives the column order and the knobs).

Lane ``(grp, quad)`` of warp ``(m, kg)`` reads, for a load group of ``per`` k tiles (two for 16-byte loads), the
``4 * per`` consecutive columns ``kbase + direct_k(quad, first tile, 0, ordered)`` of each of its two rows (``grp`` and
``grp + 8`` of the row tile): B indices 0..3 of each tile of the group, that is A elements 0, 1, 4, 5 from row
``grp`` and 2, 3, 6, 7 from row ``grp + 8``. The loads run ``stream_depth`` groups ahead of the products (registers
``lfrag``, one set per group in flight); each k tile's A fragment is assembled from them by 32-bit moves (register
renaming once compiled). A row past the CTA's rows or a unit past hidden reads a row that exists: its sums are never
stored. Before each step's barrier wait each thread asks for its first streamed rows to be brought into L1
(``prefetch.global.L1``, at most ``L1_PREFETCH_BYTES`` a CTA), as the float32 template's streamed tier does.
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import vec_index
from prnn_tvm.codegen.prefetch import prefetch

from .persistent_weights import L1_PREFETCH_BYTES
from .streamed_tier import TILE_K, direct_k, ordered_tiles, stream_depth, streamed_loads

A_REGS = 8  # half elements of an A fragment per lane

_LDG = r"""
#ifndef PRNN_LDG_BITS
#define PRNN_LDG_BITS
// 8 or 16 bytes of a matrix the launch never writes into registers: ld.global.nc (V: uint2 or uint4)
template <typename V>
__device__ __forceinline__ void prnn_ldg_bits(void* to, const void* p) {
  *reinterpret_cast<V*>(to) = __ldg(reinterpret_cast<const V*>(p));
}
#endif
"""


class StreamedFragments:
    """Mixin of the tensor-core builder (``persistent_fragments.FragmentWeights``): the streamed k tiles' buffers,
    row offsets, loads, prefetch and products. Uses the builder's ``c``, ``g``, ``p``, ``a``, ``dt``, ``H``, ``cta``,
    ``mt``, ``kg``, ``grp``, ``quad``, ``bfrag``, ``acc``, ``smem``, ``stride`` and ``operand_base``."""

    @property
    def ordered(self) -> int:
        """The k tiles of the warp whose columns ``direct_k`` orders (``streamed_tier.ordered_tiles``)."""
        return ordered_tiles(self.c, self.g.k_tiles_per_warp, self.g.l2_k_tiles)

    @property
    def load_shape(self) -> tuple[int, int]:
        """``(halves, k tiles)`` of one load of a streamed row."""
        width, per = streamed_loads(self.c, self.g.k_tiles_per_warp, self.g.l2_k_tiles)
        return width // 2, per

    def alloc_streamed(self):
        """The weight matrix as a flat buffer, each fragment row's first element there (``wrow``), the loads in
        flight (``lfrag``) and one assembled A fragment per row tile (``sfrag``)."""
        (red,) = self.p.reductions  # validated: one dense product
        matrix = self.a.weight[red.weight]
        rows, cols = (int(n) for n in matrix.shape)
        self.wglobal = T.decl_buffer((rows * cols,), self.dt, data=matrix.data)
        mw = self.c.m_tiles_per_warp
        halves, _ = self.load_shape
        self.wrow = T.alloc_buffer((2 * mw,), "int32", scope="local")
        self.lfrag = T.alloc_buffer((stream_depth(mw) * mw * 2 * halves,), self.dt, scope="local")
        self.sfrag = T.alloc_buffer((A_REGS * mw,), self.dt, scope="local")

    def streamed_rows(self):
        """Prologue: where each of the lane's fragment rows starts its warp's k range in the flat weight matrix: its
        gate slice's row of its unit, both clamped to rows that exist."""
        (red,) = self.reductions
        U, H = self.c.units_per_cta, self.H
        last = red.slices * U - 1
        for m in range(self.c.m_tiles_per_warp):
            for half in range(2):
                row = (self.mt + m) * 16 + self.grp + 8 * half - self.row_lo[0]
                inside = T.if_then_else(row < last, row, last)
                unit = self.cta * U + inside % U
                unit = T.if_then_else(unit < H - 1, unit, H - 1)
                start = (inside // U * H + unit) * H + TILE_K * self.kg * self.g.k_tiles_per_warp
                T.buffer_store(self.wrow, start, [2 * m + half])
        self.prefetch_streamed()

    def streamed_column(self, group: int):
        """The first column (from the warp's k range) of the lane's load group ``group``."""
        _, per = self.load_shape
        return direct_k(self.quad, group * per, 0, self.ordered)

    def prefetch_streamed(self):
        """The lane's first streamed rows asked into L1 (module doc)."""
        halves, _ = self.load_shape
        per_group = self.g.threads * self.c.m_tiles_per_warp * 2 * halves * 2  # bytes of one load group, the CTA
        groups = -(-self.g.l2_k_tiles // self.load_shape[1])
        for group in range(min(groups, L1_PREFETCH_BYTES // per_group)):
            for i in range(2 * self.c.m_tiles_per_warp):
                T.evaluate(prefetch(T.address_of(self.wglobal[self.wrow[i] + self.streamed_column(group)]), "L1"))

    def load_streamed(self, group: int):
        """Load group ``group`` of every fragment row of the lane into its set of ``lfrag``."""
        halves, _ = self.load_shape
        mw = self.c.m_tiles_per_warp
        base = group % stream_depth(mw) * mw * 2 * halves
        bits = "uint4" if halves == 8 else "uint2"
        for i in range(2 * mw):
            T.evaluate(T.cuda.func_call(f"prnn_ldg_bits<{bits}>", T.address_of(self.lfrag[base + i * halves]),
                                        T.address_of(self.wglobal[self.wrow[i] + self.streamed_column(group)]),
                                        source_code=_LDG, return_type="void"))

    def streamed_b(self, kt: int):
        """The shared operand path's B fragments of streamed k tile ``kt``: per batch tile, B indices 0..3 at the
        columns ``direct_k`` gives, one 8-byte load from the operand tile (batch row ``grp`` of the tile, or its last
        row where the tile holds fewer rows than the pass: ``tile_row``)."""
        at = self.operand_base + TILE_K * self.kg * self.g.k_tiles_per_warp + direct_k(self.quad, kt, 0, self.ordered)
        for nt in range(self.c.warp_n_tiles):
            row = self.tile_row(self.grp + 8 * nt)
            T.buffer_store(self.bfrag, self.smem[vec_index(at + row * self.stride, 4)], [vec_index(nt * 4, 4)])

    def multiply_streamed(self, kt: int, b_offset, per_chain: int):
        """:meth:`FragmentWeights.multiply` for streamed k tile ``kt``: the loads ``stream_depth`` groups ahead,
        each row tile's A fragment assembled from its group's loads, times every batch tile's B fragment."""
        c, mma = self.c, self.p.policy.mma
        halves, per = self.load_shape
        mw, depth = c.m_tiles_per_warp, stream_depth(c.m_tiles_per_warp)
        groups = -(-self.g.l2_k_tiles // per)
        group, within = divmod(kt, per)
        if kt == 0:
            for ahead in range(min(depth - 1, groups)):
                self.load_streamed(ahead)
        if within == 0 and group + depth - 1 < groups:
            self.load_streamed(group + depth - 1)
        base = group % depth * mw * 2 * halves
        for m in range(mw):
            for j in range(0, A_REGS, 2):  # A elements j, j + 1: row grp + 8 * ((j // 2) % 2), B indices 2 * (j // 4)..
                row = base + (2 * m + (j // 2) % 2) * halves
                T.buffer_store(self.sfrag, self.lfrag[vec_index(row + 4 * within + 2 * (j // 4), 2)],
                               [vec_index(m * A_REGS + j, 2)])
            for nt in range(c.warp_n_tiles):
                accumulators = (kt % c.k_chains) * per_chain + (m * c.warp_n_tiles + nt) * 4
                T.evaluate(T.ptx_legacy.mma(mma.shape, "row", "col", mma.ptx, mma.ptx, mma.accumulator,
                                            self.sfrag.data, m * A_REGS, self.bfrag.data, b_offset(nt), self.acc.data,
                                            accumulators, False))

"""Tensor-core persistent CUDA backward for half-precision layers (float16, bfloat16) on sm_80+.

The step is the float32 backward's (``persistent_backward``: the adjoints derived from the cell's plan, one
grid barrier per phase, the last phase first); the products that send the gate gradients back through the
recurrent weights are ``mma.sync.m16n8k16`` over the transposed weights held as A fragments in registers for
the whole launch, in the layer's half type (half the registers of the float32 backward's widened weights),
with float32 accumulators (``persistent_fragments``; knobs and geometry: ``backward_mma_config``).

The gate gradients are computed in float32 and rounded to the half type once, where they are published: the
blocks multiply the rounded values, and ``d_gates`` (for the weights' gradients, half GEMMs with float32
accumulation) holds the same. That is one rounding (2^-11 relative for float16, 2^-8 for bfloat16) of each
step's gate gradients, the backward's counterpart of the forward's rounding of each step's new state; the
states' adjoints, the params' gradients and the pointwise math stay float32.
"""

from __future__ import annotations

from dataclasses import replace

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers import row_lanes
from prnn_tvm.codegen.kernel import Kernel, vec_index
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.codegen.prefetch import prefetch_l2
from prnn_tvm.dtypes import itemsize
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import GpuSpec

from . import backward_mma_config as bc
from . import cluster_copy
from .backward_mma_config import BackwardMmaConfig
from .persistent_backward import _Backward
from .persistent_exchange import ceil_div, sync_threads
from .persistent_fragments import A_REGS, FragmentWeights, _weight_or
from .persistent_mma_config import TILE_K, TILE_M

NAME = "persistent_backward_mma"

# the gate gradients' tile goes from L2 to shared memory without registers: a CTA copies all of them every pass
# (B x gate rows: 128 KB at LSTM 1024 x 16), which as loads into registers held 64 per thread at 512 threads and
# spilled (ptxas, LSTM fp16 1024 x 16, every ranked config). 16 bytes a copy past L1 where the rows allow, else
# 8 or 4 (through L1: the grid barrier's acquire orders them as it does plain loads), else plain loads.
_CP_ASYNC = r"""
#ifndef PRNN_CP_ASYNC
#define PRNN_CP_ASYNC
template <int BYTES>
__device__ __forceinline__ void prnn_cp_async(void* dst, const void* src) {
  unsigned a = (unsigned)__cvta_generic_to_shared(dst);
  if (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(a), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" :: "r"(a), "l"(src), "n"(BYTES) : "memory");
  }
}
__device__ __forceinline__ void prnn_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void prnn_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// until at most N of this thread's latest groups are still in flight (every older one has landed)
template <int N>
__device__ __forceinline__ void prnn_cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#endif
"""
# the warp's lanes meet, with memory ordering: each reads what the others copied (TVM's storage_sync("warp") emits
# nothing)
_SYNC_WARP = r"""
#ifndef PRNN_SYNC_WARP
#define PRNN_SYNC_WARP
__device__ __forceinline__ void prnn_sync_warp() { __syncwarp(); }
#endif
"""


def _cp_async_call(name: str, *args):
    """A call of one of :data:`_CP_ASYNC`'s functions."""
    T.evaluate(T.cuda.func_call(name, *args, source_code=_CP_ASYNC, return_type="void"))


def backward_kernel(plan: CellPlan, gpu: GpuSpec, config: BackwardMmaConfig) -> Kernel:
    """The tensor-core backward of ``plan`` with ``config`` (see :func:`backward_mma_config.ranked_configs`)."""
    builder = _MmaBackward(plan, config, bc.validate(config, plan, gpu))
    return Kernel(builder.build(), NAME, builder.launch, config)


class _MmaBackward(FragmentWeights, _Backward):
    """The float32 backward's step with the products of ``FragmentWeights``: CTA row ``e * U16 + ul`` (``U16``:
    the units rounded up to whole row tiles) is operand ``e``'s unit ``ul``."""

    HALF_TILES = True

    def __init__(self, plan: CellPlan, cfg: BackwardMmaConfig, g):
        super().__init__(plan, cfg, g)
        self.stride = g.stride
        self.tile_rows = cfg.batch_tile  # its gate-gradient tile holds a whole pass's rows
        self.U16 = bc.tiles_per_operand(cfg.units_per_cta) * TILE_M
        self.kt_regs = g.k_tiles_per_warp - cfg.shared_k_tiles  # a warp's first k tiles: in registers
        # each warp copies its own columns where it alone reads them (one warp per k group), in copy_stages stages
        self.stages = min(cfg.copy_stages, g.k_tiles_per_warp) if g.warp_rows == 1 and g.m_tiles else 0
        # in clusters (``cluster_copy``): each warp waits for its own k group's columns alone (an mbarrier per k
        # group) where it would copy them alone and every warp multiplies in every pass (one phase); else the block
        # waits for the whole tile
        self.own_waits = cfg.cluster > 1 and self.stages > 0 and plan.phases == 1
        if cfg.cluster > 1:
            self.stages = 0  # no cp.async
        self.stage_starts = [s * g.k_tiles_per_warp // self.stages for s in range(self.stages)]

    def _launch(self):
        """The float32 backward's launch, its grid in clusters of ``cluster`` CTAs (``cluster_copy``)."""
        launch = super()._launch()
        return replace(launch, grid=replace(launch.grid, cluster=self.c.cluster)) if self.c.cluster > 1 else launch

    @property
    def pass_bytes(self) -> int:
        """Bytes of the gate gradients one pass copies into a CTA's tile: every batch row's (one pass a phase)."""
        return self.B * self.K * itemsize(self.gates_dt)

    @property
    def waited_columns(self) -> int:
        """Columns of the tile behind each of the cluster's mbarriers: a k group's, or all of them."""
        return TILE_K * self.g.k_tiles_per_warp if self.own_waits else self.K

    def columns_of(self, i):
        """The first column and the column count of the tile behind mbarrier ``i`` (a k group's ends at the gate
        rows' end: none for a k group wholly in the padding)."""
        w = self.waited_columns
        if isinstance(i, int):
            return i * w, max(0, min(self.K, (i + 1) * w) - i * w)
        return i * w, T.max(0, T.min(self.K, (i + 1) * w) - i * w)

    def barrier_bytes(self, i) -> int:
        """Bytes of the next pass that land on mbarrier ``i``: its columns of every batch row."""
        return self.B * self.columns_of(i)[1] * itemsize(self.gates_dt)

    def prologue(self):
        """The float32 backward's; where warps copy their own columns, a block barrier after it: the padding
        columns it zeroed are read by the last k group's warp, which no block barrier before the products orders
        otherwise. In clusters, the mbarrier the copies land on, armed for the first pass (``cluster_copy``)."""
        super().prologue()
        if self.stages and self.g.k_pad > self.K:
            sync_threads()
        if self.c.cluster > 1:
            cluster_copy.begin(self.mbar, self.parity, [self.barrier_bytes(i) for i in range(self.barriers)],
                               self.tx, self.abort if self.own_waits else None)

    def epilogue(self):
        """In clusters, first the cluster meets (no CTA leaves while a peer may still write into its tile); then the
        float32 backward's."""
        if self.c.cluster > 1:
            cluster_copy.sync()
        super().epilogue()

    def gate_gradients(self, t, phase: int, it, b, unit):
        """The float32 backward's; at a step's first phase walked (the last), with ``prefetch_steps``, first every
        forward value this item reads ``prefetch_steps`` steps on (backwards) asked into L2: its ``xp`` and ``saved``
        columns and ``d_out``, each read once from DRAM where nothing asked them ahead."""
        ahead = self.c.prefetch_steps
        if ahead and phase == self.p.phases - 1:
            with T.If(t >= ahead):
                with T.Then():
                    later, H = t - ahead, self.H
                    columns = [(self.a.xp, s) for s in range(self.p.input.slices)]
                    columns += [(self.saved, c) for c in range(len(self.saved_column))]
                    for buffer, column in [*columns, (self.d_out, 0)]:
                        T.evaluate(prefetch_l2(T.address_of(buffer[later, b, column * H + unit])))
        super().gate_gradients(t, phase, it, b, unit)

    def alloc_product_buffers(self):
        """The forward's buffers, and the A fragments of one k tile read back from shared memory."""
        super().alloc_product_buffers()
        self.afrag = T.alloc_buffer((A_REGS * self.c.m_tiles_per_warp,), self.dt, scope="local")
        if self.c.cluster > 1:  # the mbarriers the cluster's copies land on, and the parity of the pass awaited
            self.barriers = self.c.k_groups if self.own_waits else 1
            self.mbar = T.alloc_buffer((self.barriers,), "uint64", scope="shared")
            self.parity = T.alloc_buffer((1,), "int32", scope="local")
            if self.own_waits:  # a warp that gave up waiting: the block leaves after the pass
                self.abort = T.alloc_buffer((1,), "int32", scope="shared")

    def a_fragment(self, m: int, kt: int) -> tuple:
        """Where the A fragment of the warp's row tile ``m`` and k tile ``kt`` lives: ``(buffer, element)``, in the
        registers or (``shared_k_tiles``) in shared memory after the gate gradients' tile, 16 bytes a lane."""
        if kt < self.kt_regs:
            return self.wreg, (m * self.kt_regs + kt) * A_REGS
        warp, skt = self.tx // 32, self.c.shared_k_tiles
        tile = (warp * self.c.m_tiles_per_warp + m) * skt + kt - self.kt_regs
        return self.smem, self.c.batch_tile * self.stride + (tile * 32 + self.tx % 32) * A_REGS

    def row_of(self, e: int, ul):
        return e * self.U16 + ul

    def operand_of(self, row):
        return row // self.U16

    def filled_row_tiles(self) -> int:
        return self.g.m_tiles

    @property
    def operand_base(self):
        return 0  # dense products (``refusal``): the tile holds every gate row

    def load_weights(self):
        """Prologue: the A fragments of this warp, ``A[(e, unit), k] = W[k - lo, unit]`` for gate row ``k`` of a
        product (first gate row ``lo``) that multiplies operand ``e``, zero elsewhere; each element loaded
        unconditionally, its indices clamped into the weight (``_weight_or``)."""
        if not self.g.m_tiles:
            return
        H, U, kt_per, reductions = self.H, self.U, self.g.k_tiles_per_warp, self.p.reductions
        zero = tirx.const(0.0, self.dt)
        for m in range(self.c.m_tiles_per_warp):
            sources = []  # per fragment row: its unit and, per product, whether the row's operand is the product's
            for half in range(2):
                row = bind_value((self.mt + m) * TILE_M + self.grp + 8 * half, f"frag_row{m}_{half}")
                ul = row % self.U16
                unit = bind_value(self.cta * U + ul, f"frag_unit{m}_{half}")
                oks = [bind_value(tirx.all(self.operand_of(row) == self.ops[r.operand], ul < U, unit < H),
                                  f"frag_ok{m}_{half}_{i}") for i, r in enumerate(reductions)]
                sources.append((unit, oks))
            for kt in range(kt_per):
                for j in range(A_REGS):
                    k = TILE_K * (self.kg * kt_per + kt) + 2 * self.quad + j % 2 + 8 * (j // 4)
                    unit, oks = sources[(j // 2) % 2]
                    value = zero
                    for red, ok in reversed(list(zip(reductions, oks))):
                        lo = self.red_lo[red.name]
                        keep = tirx.all(ok, k >= lo, k < lo + red.slices * H)
                        value = _weight_or(keep, self.a.weight[red.weight], k - lo, unit, 1, value)
                    buffer, at = self.a_fragment(m, kt)
                    T.buffer_store(buffer, value, [at + j])

    def a_operand(self, m: int, kt: int, nt: int) -> tuple:
        """The A fragment from registers, or read back from shared memory into ``afrag`` (one 16-byte load a lane,
        at the first batch tile)."""
        buffer, at = self.a_fragment(m, kt)
        if buffer is self.wreg:
            return buffer.data, at
        if nt == 0:
            T.buffer_store(self.afrag, self.smem[vec_index(at, A_REGS)], [vec_index(m * A_REGS, A_REGS)])
        return self.afrag.data, m * A_REGS

    def products(self, t, phase: int):
        """What ``phase``'s products send back, per batch tile: the gate gradients into the shared tile (rows
        past the batch keep what they held, read only by the accumulators of rows that are never stored), then
        the tensor cores (``FragmentWeights.tile_products``). The block copies the whole tile and meets at a
        barrier, or (``copy_stages``) each warp copies its own columns as its products start
        (:meth:`before_k_tile`)."""
        c, g = self.c, self.g
        self.copied_step = t
        if c.cluster > 1:
            self.cluster_products(t, phase)
            return
        with T.serial(0, g.batch_chunks) as chunk:
            b0 = bind_value(chunk * c.batch_tile, "b0")
            if not self.stages:
                self.copy_columns(b0, 0, self.K, self.tx, g.threads)
                if self.copy_bytes >= 4:
                    _cp_async_call("prnn_cp_async_wait_all")
                sync_threads()
            self.tile_products(b0, phase)
            sync_threads()

    def cluster_products(self, t, phase: int):
        """``products`` in clusters (one pass: the tile holds the whole batch): for each batch row and mbarrier, a
        thread fetches this CTA's granules of the mbarrier's columns for the whole cluster (``cluster_copy``); the
        block waits for the whole tile, or each warp for its own columns at its first k tile (``before_k_tile``),
        leaving the time loop where a wait gives up; the tensor cores; each thread's reads of the tile ordered
        before the peers' next copy into it."""
        c, g, p = self.c, self.g, self.p
        lanes = cluster_copy.GRANULE // itemsize(self.gates_dt)
        ordinal = (self.a.seq_len - 1 - t) * p.phases + (p.phases - 1 - phase)  # as the grid barrier counts
        self.copy_ordinal = ordinal
        # copy j * B + b (mbarrier j's columns of row b) is thread (j * B + b) % threads's; each mbarrier's columns
        # a constant here (a symbolic mbarrier's made TVM's simplifier divide by zero: rnn_tanh 64x8 in clusters of 4)
        for j in range(self.barriers):
            k0, width = self.columns_of(j)
            if width == 0:
                continue
            first, count = cluster_copy.share(width // lanes, c.cluster, self.a.cluster_rank)
            mine = (self.tx + g.threads - (j * self.B) % g.threads) % g.threads
            for i in range(ceil_div(self.B, g.threads)):
                b = i * g.threads + mine
                with T.If(tirx.all(b < self.B, count > 0)):
                    with T.Then():
                        k = bind_value(k0 + first * lanes, "slice_k0")
                        cluster_copy.copy(c.cluster, T.address_of(self.smem[b * g.stride + k]),
                                          T.address_of(self.a.ws[t % 2, b, k]), count * cluster_copy.GRANULE,
                                          T.address_of(self.mbar[j]))
        if not self.own_waits:
            cluster_copy.wait(self.mbar, self.parity, self.a.sync, ordinal, self.pass_bytes, self.tx)
        self.tile_products(0, phase)
        cluster_copy.reads_done()
        sync_threads()
        if self.own_waits:
            cluster_copy.leave_if_aborted(self.abort, self.parity)

    @property
    def copy_bytes(self) -> int:
        """Bytes of one copy of the gate gradients: 16 where the rows allow, else 8, 4 or 2 (plain loads)."""
        return row_lanes(self.K, itemsize(self.gates_dt)) * itemsize(self.gates_dt)

    def copy_columns(self, b0, k0, width: int, thread, threads: int):
        """``width`` columns from ``k0`` (those before the gate rows' end) of batch rows b0.. of the step's gate
        gradients into the shared tile, ``threads`` threads sharing the copies, this one being ``thread``; by
        ``cp.async``, which a caller waits for, where a copy moves 4 bytes or more."""
        g, t, K = self.g, self.copied_step, self.K
        lanes = self.copy_bytes // itemsize(self.gates_dt)
        per_row = ceil_div(width, lanes)  # a multiple of lanes: the whole rows (K), or whole k tiles
        n = self.c.batch_tile * per_row
        for i in range(ceil_div(n, threads)):
            idx = i * threads + thread
            bb, k = idx // per_row, k0 + idx % per_row * lanes
            with T.If(tirx.all(idx < n, b0 + bb < self.B, k < K)):
                with T.Then():
                    if self.copy_bytes < 4:  # cp.async copies 4, 8 or 16 bytes
                        T.buffer_store(self.smem, self.a.ws[t % 2, b0 + bb, k], [bb * g.stride + k])
                    else:
                        _cp_async_call(f"prnn_cp_async<{self.copy_bytes}>", T.address_of(self.smem[bb * g.stride + k]),
                                       T.address_of(self.a.ws[t % 2, b0 + bb, k]))

    def before_k_tile(self, b0, kt: int):
        """With ``copy_stages``: at the warp's first k tile, every stage's copy of its own columns (a ``cp.async``
        group each); at each stage's first k tile, the wait for that stage's group and the warp's lanes meeting
        (each lane reads what the others copied)."""
        if self.own_waits and kt == 0:  # in clusters: the warp's own columns landed
            cluster_copy.wait_warp(self.mbar, self.kg, self.parity, self.a.sync, self.copy_ordinal, self.abort,
                                   self.barrier_bytes(self.kg), self.tx % 32)
        if not self.stages:
            return
        kt_per, first = self.g.k_tiles_per_warp, TILE_K * self.kg * self.g.k_tiles_per_warp
        bounds = [*self.stage_starts, kt_per]
        if kt == 0:
            for s in range(self.stages):
                self.copy_columns(b0, first + TILE_K * bounds[s], TILE_K * (bounds[s + 1] - bounds[s]), self.tx % 32,
                                  32)
                if self.copy_bytes >= 4:
                    _cp_async_call("prnn_cp_async_commit")
        if kt in self.stage_starts:
            if self.copy_bytes >= 4:
                _cp_async_call(f"prnn_cp_async_wait_group<{self.stages - 1 - self.stage_starts.index(kt)}>")
            T.evaluate(T.cuda.func_call("prnn_sync_warp", source_code=_SYNC_WARP, return_type="void"))

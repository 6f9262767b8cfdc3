"""The input projection ``xp[t, n, j] = sum_i x[t, n, i] * W_ih[j, i] + b_ih[j]``.

Inputs are the layer's storage dtype; the products accumulate, and ``xp`` is kept, in the
accumulation type (float32 for every dtype), so a half-precision layer rounds its inputs once.

It has no recurrence, so it is one large matrix product over all timesteps, built from
TE and scheduled by TVM (dlight's GPU rules on CUDA, its matmul rule with tiles measured
for these shapes; a parallel loop nest on the CPU) before the persistent kernel runs.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.s_tir import dlight as dl

from ..frontend.plan import CellPlan
from .kernel import SEQ_LEN


def projection_func(plan: CellPlan, input_size: int, target: tvm.target.Target) -> tirx.PrimFunc:
    """The projection as a PrimFunc named ``projection``, scheduled for ``target``."""
    B, N, dt, acc = plan.batch, plan.input.slices * plan.hidden, plan.dtype, plan.policy.accumulate
    seq_len = tirx.Var(SEQ_LEN, "int32")
    x = te.placeholder((seq_len, B, input_size), dt, name="x")
    w = te.placeholder((N, input_size), dt, name="W_ih")
    b = te.placeholder((N,), dt, name="b_ih")
    if input_size == 1:
        # No reduction for a single input feature: with one, dlight's fallback rule inlines the
        # bias into a reduction of extent 1 as its init *and* its update, adding it twice
        # (TVM 0.27; every cell at input_size=1 was wrong on the GPU through it).
        xp = te.compute((seq_len, B, N), lambda t, n, j: x[t, n, 0].astype(acc) * w[j, 0].astype(acc)
                        + b[j].astype(acc), name="xp")
    else:
        k = te.reduce_axis((0, input_size), name="k")
        xw = te.compute((seq_len, B, N), lambda t, n, j: te.sum(x[t, n, k].astype(acc) * w[j, k].astype(acc),
                                                                 axis=k), name="xw")
        xp = te.compute((seq_len, B, N), lambda t, n, j: xw[t, n, j] + b[j].astype(acc), name="xp")
    func = te.create_prim_func([x, w, b, xp]).with_attr("global_symbol", "projection")
    mod = tvm.IRModule({"projection": func})
    if target.kind.name == "cuda":
        matmul = (_ProjectionMatmul(B) if dt == "float32" and B * N >= LARGE_TILE_MIN_ROW_WORK
                  else dl.gpu.Matmul())
        with _schedule_target(target, dt):
            mod = dl.ApplyDefaultSchedule(matmul, dl.gpu.GEMV(), dl.gpu.Fallback())(mod)
    else:
        mod = _cpu_schedule(mod, "xp" if input_size == 1 else "xw")
    return mod["projection"]


# Batch x output width from which the larger tiles pay off (the sequence length is not known
# when the projection is built): below it, dlight's own tiles keep the small products faster.
LARGE_TILE_MIN_ROW_WORK = 4096


class _ProjectionMatmul(dl.gpu.Matmul):
    """dlight's SIMT matmul rule with larger tiles held k-major in shared memory, for float32
    projections of batch x width >= :data:`LARGE_TILE_MIN_ROW_WORK`.

    dlight stores each shared tile as its global rows (row-major, k innermost), so in the inner
    product the threads of a warp read 16 floats apart: bank conflicts on every load. Here the
    tiles are transposed (``[k][row]``, rows padded by 4 floats), so a warp reads consecutive
    rows. A 16x16-thread block with 2x2 virtual threads of 4x4 elements (a 128x128 tile, 8 x 8
    outputs per thread, k steps of 8); at batch 1 (T x 1 rows: too few 128-row tiles to fill the
    GPU) 2x4 elements (64x128, k steps of 16). On the H100, T=256, against cuBLAS (``torch.addmm``,
    TF32 off) in one run (``bench/projection.py``): LSTM H=1024 B=1/4/16/64 1.31/1.23/1.22/1.26x,
    H=512 B=16 1.18x, GRU H=1024 B=4 1.29x (the row-major 64x128 tiles used before: 1.95x at
    H=1024 B=4, dlight's own 2.57x). Below the threshold (H=256/512 at B=1, H=256 at B=4)
    dlight's own tiles stay faster than these, and half-precision projections gain nothing from
    larger tiles.
    """

    ROW_PAD = 4  # floats added to each k row of a shared tile (spreads the transposing stores over banks)

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch

    def get_configs(self, target: tvm.target.Target) -> dl.gpu.Matmul.Config:
        micro_x, micro_k = (2, 16) if self.batch == 1 else (4, 8)
        return dl.gpu.Matmul.Config(block_size_x=16, block_size_y=16, vthread_x=2, vthread_y=2,
                                    micro_size_x=micro_x, micro_size_y=4, micro_size_k=micro_k, vector_size=4,
                                    unroll=256, use_shared=True, storage_align=False, inner_x=False)

    def apply(self, func, target, tunable):
        sch = super().apply(func, target, tunable)
        if sch is None:
            return None
        for block in sch.get_producers(sch.get_sblock("xw_update")):  # the two shared tiles (and the init)
            if sch.get(block).writes[0].source.scope() == "shared":
                sch.transform_layout(block, ("write", 0), lambda b, row, k: (b, k, row))
                sch.storage_align(block, 0, axis=1, factor=32, offset=self.ROW_PAD)
        return sch


# dlight's float16 tensor-core matmul rule fails on a symbolic sequence length in TVM 0.27 (a
# compute-at "not a stage pipeline" error, with or without the bias epilogue); below sm_70 it
# takes its SIMT rule, which schedules any length. Half-precision projections are scheduled so.
SIMT_SCHEDULE_ARCH = "sm_61"


def _schedule_target(target: tvm.target.Target, dtype: str) -> tvm.target.Target:
    """The target dlight schedules the projection for (the build still targets ``target``)."""
    if dtype == "float32":
        return target
    return tvm.target.Target({"kind": "cuda", "arch": SIMT_SCHEDULE_ARCH})


def _cpu_schedule(mod: tvm.IRModule, main_block: str) -> tvm.IRModule:
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    block = sch.get_sblock(main_block, func_name="projection")
    t, n = sch.get_loops(block)[:2]
    sch.parallel(sch.fuse(t, n))
    return sch.mod

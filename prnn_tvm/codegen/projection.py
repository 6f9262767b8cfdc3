"""The input projection ``xp[t, n, j] = sum_i x[t, n, i] * W_ih[j, i] + b_ih[j]``.

Inputs are the layer's storage dtype; the products accumulate, and ``xp`` is kept, in the
accumulation type (float32 for every dtype), so a half-precision layer rounds its inputs once.

It has no recurrence, so it is one large matrix product over all timesteps, built from
TE and scheduled by TVM (dlight's GPU rules on CUDA, a parallel loop nest on the CPU)
before the persistent kernel runs.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx

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
        from tvm.s_tir import dlight as dl

        with _schedule_target(target, dt):
            mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Fallback())(mod)
    else:
        mod = _cpu_schedule(mod, "xp" if input_size == 1 else "xw")
    return mod["projection"]


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

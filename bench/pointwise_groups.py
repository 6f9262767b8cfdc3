"""Pointwise groups on and off: each group's (batch row, unit) items on warps of their own
(``CellPlan.pointwise_groups``, what the CUDA templates do) against one item computing every group (a stack's
every layer), with the same config, in one process; recurrent kernel alone, us per step, the minimum of 3
interleaved rounds.

    python bench/pointwise_groups.py

"Off" rebuilds the layer with the plan's groups replaced by one (``PointwiseGroup.whole``)."""

import prnn_tvm
from prnn_tvm.checks import time_layer
from prnn_tvm.frontend import plan as plan_module

T = 256
CASES = [
    ("lstm", 512, 8, 4, "float16"),
    ("lstm", 256, 8, 4, "float16"),
    ("gru", 512, 4, 2, "float16"),
    ("lstm", 512, 4, 2, "float32"),
    ("lstm", 256, 4, 3, "float32"),
    ("gru_cho", 1024, 4, 1, "float32"),
    ("gru_cho", 512, 16, 1, "float16"),
    ("stacked_rnn", 1024, 4, 1, "float32"),
]
grouped = plan_module.CellPlan.pointwise_groups


def whole(self):
    return (plan_module.PointwiseGroup.whole(self),)


for cell, H, B, L, dt in CASES:
    on = prnn_tvm.compile_cell(cell, H, B, dtype=dt, layers=L)
    plan_module.CellPlan.pointwise_groups = property(whole)
    try:
        off = prnn_tvm.compile_cell(cell, H, B, dtype=dt, layers=L, config=on.kernel.config)
    finally:
        plan_module.CellPlan.pointwise_groups = grouped
    best = {"on": 1e9, "off": 1e9}
    for _ in range(3):
        for name, layer in (("on", on), ("off", off)):
            best[name] = min(best[name], time_layer(layer, T).recurrent_s / (T + layer.plan.lag) * 1e6)
    groups = len(on.plan.pointwise_groups)
    print(
        f"{cell} x{L} H={H} B={B} {dt} ({groups} groups, {on.report.registers}/{off.report.registers} regs, "
        f"{on.report.spill_store_bytes}/{off.report.spill_store_bytes} B spills): on {best['on']:.2f} off "
        f"{best['off']:.2f} us/step -> {best['off'] / best['on']:.2f}x",
        flush=True,
    )

"""Per-step time of every built-in cell at one size, beside LSTM, on the GPU.

    python bench/cells.py [--hidden 1024 --batch 4 --seq 256] [--out bench/results/cells-h100.md]

Each cell is compiled with its default config, checked against its NumPy reference, and
its recurrent kernel timed (TVM time_evaluator, minimum over repeats). The phases column
shows how many grid synchronizations a step needs: Cho's GRU against the cuDNN-style GRU
(same products, one phase) gives the cost of the second phase.
"""

import argparse

import prnn_tvm
from prnn_tvm.checks import check_against_reference, time_layer
from prnn_tvm.dtypes import tolerance
from prnn_tvm.schedules import knob_short_names, knob_text

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--out", default=None)
args = p.parse_args()

lines = [
    f"# Cells at hidden={args.hidden}, batch={args.batch}, T={args.seq} (fp32, default configs)",
    "",
    "| cell | phases | config | us/step | max abs error vs float64 |",
    "|---|---|---|---|---|",
]
print("\n".join(lines), flush=True)
for name in prnn_tvm.builtin_cells():
    layer = prnn_tvm.compile_cell(name, args.hidden, args.batch, target="cuda")
    knobs = knob_text(layer.report.config, knob_short_names())
    err = check_against_reference(layer, 16, tolerance("float32", 16)).max_abs_error
    us = time_layer(layer, args.seq).per_step_s * 1e6
    line = f"| {name} | {layer.plan.phases} | {knobs} | {us:.2f} | {err:.1e} |"
    print(line, flush=True)
    lines.append(line)
if args.out:
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")

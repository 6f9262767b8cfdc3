"""Grid barrier variants: latency alone, an all-to-all stress run, and the effect on an LSTM kernel.

    python bench/barrier.py [--stress-steps 10000 --stress-launches 1000] [--out bench/results/barrier.md]

1. Latency: each variant alone (``prnn_tvm.bench.barrier_probe``), for CTAs in {SMs, 2 x SMs}
   and threads in {128, 256}, with one dependent read per step or reads of every CTA's
   value, microseconds per step (minimum over repeats of 1000-step launches).
2. Stress: every step, every CTA reads the tags all other CTAs wrote in the step before;
   steps x launches per variant, counting wrong values (must be 0) and timeouts.
3. Kernel: LSTM fp32 hidden 1024, batch 4, 256 steps with the default config and each
   barrier: the recurrent kernel's time per step.

``sentinel`` exchanges through a layer's output sequence, which the probe does not have: it is in the
kernel section only (``bench/probes/sentinel_exchange.cu`` probes it alone).
"""

import argparse
import time

import prnn_tvm
from prnn_tvm.bench.barrier_probe import Probe
from prnn_tvm.checks import check_against_reference, time_layer
from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.dtypes import tolerance
from prnn_tvm.target import gpu_spec

p = argparse.ArgumentParser()
p.add_argument("--stress-steps", type=int, default=10_000)
p.add_argument("--stress-launches", type=int, default=1000)
p.add_argument("--out", default=None, help="also write the Markdown tables to this file")
args = p.parse_args()

gpu = gpu_spec()
lines = [f"# Grid barriers on {gpu.device_name} ({gpu.sms} SMs)", ""]


def emit(line=""):
    print(line, flush=True)
    lines.append(line)


emit("## Barrier alone (us per step)")
emit()
emit("Each step every CTA writes one value and, after the barrier, reads what another CTA wrote")
emit("(one neighbour's value) or what every CTA wrote (all). For `tags` the value carries the")
emit("synchronization, and it is only a barrier when every CTA reads every value (*all*).")
emit()
emit("| barrier | CTAs | threads | neighbour | all |")
emit("|---|---|---|---|---|")
PROBED = [name for name, b in BARRIERS.items() if b.probe_problem(all_to_all=True) is None]  # not sentinel
for name in PROBED:
    for ctas in (gpu.sms, 2 * gpu.sms):
        for threads in (128, 256):
            cells = []
            for all_to_all in (False, True):
                if BARRIERS[name].probe_problem(all_to_all):
                    cells.append("n/a")
                    continue
                probe = Probe(name, ctas, threads, all_to_all=all_to_all)
                assert probe.run(steps=200) == 0
                cells.append(f"{probe.seconds_per_step() * 1e6:.3f}")
            emit(f"| {name} | {ctas} | {threads} | {' | '.join(cells)} |")

emit()
emit(f"## Stress: {args.stress_steps} steps x {args.stress_launches} launches, all-to-all reads")
emit()
emit("| barrier | CTAs | wrong values | seconds |")
emit("|---|---|---|---|")
for name in PROBED:
    probe = Probe(name, gpu.sms, 128, all_to_all=True)
    start = time.perf_counter()
    wrong = probe.run(args.stress_steps, args.stress_launches)
    emit(f"| {name} | {gpu.sms} | {wrong} | {time.perf_counter() - start:.2f} |")

emit()
emit("## LSTM fp32 hidden=1024 batch=4 T=256, default config, per barrier")
emit()
emit("| barrier | recurrent us/step | max abs error vs float64 |")
emit("|---|---|---|")
default = prnn_tvm.compile_cell("lstm", 1024, 4, target="cuda", tuning_logs=[]).report.config
for name in BARRIERS:
    layer = prnn_tvm.compile_cell("lstm", 1024, 4, target="cuda", config={**default, "barrier": name})
    check = check_against_reference(layer, 256, tolerance("float32", 256))
    emit(f"| {name} | {time_layer(layer, 256).per_step_s * 1e6:.2f} | {check.max_abs_error:.1e} |")

if args.out:
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")

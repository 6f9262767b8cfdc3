"""Configs of one case against each other in one run: each config's layer built, checked against the float64 reference
(max abs error over ``--check-seq`` steps, and its bound) and its recurrent kernel timed in interleaved rounds (us per
step, T=``--seq``), so that every config meets the same GPU state.

    python bench/configs.py lstm_layernorm:1024x8 --dtype float16 \\
        --configs '{"units_per_cta": 8, "k_groups": 4, "barrier": "counter"}' '{"units_per_cta": 8, ...}' \\
        [--default] [--rounds 3] [--seq 256] [--check-seq 16] [--fastest FILE]

``--default`` adds the case's untuned default config first. Prints one line per config: its knobs, registers and
spills, the error and its bound, the fastest and median rounds; ``--fastest`` writes the knobs of the config with the
fastest median (as built: a JSON dict, for another script's ``--config``). Needs a GPU.
"""

import argparse
import json
import statistics

from prnn_tvm.bench.matrix import Case
from prnn_tvm.checks import check_against_reference, plan_tolerance, time_layer
from prnn_tvm.compiler import compile_cell

p = argparse.ArgumentParser()
p.add_argument("case", help="CELL:HIDDENxBATCH, e.g. lstm_layernorm:1024x8")
p.add_argument("--configs", nargs="*", type=json.loads, default=[], help="configs as JSON dicts")
p.add_argument("--default", action="store_true", help="time the untuned default config first")
p.add_argument("--dtype", default="float16")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--check-seq", type=int, default=16, help="steps checked against the float64 reference")
p.add_argument("--fastest", default=None, help="write the fastest config's knobs here, as JSON")
args = p.parse_args()

case = Case.parse(args.case, args.seq, args.dtype)
configs = ([None] if args.default else []) + args.configs
if not configs:
    p.error("give --configs or --default")
layers = [compile_cell(case.cell, case.hidden, case.batch, dtype=case.dtype, config=cfg, tuning_logs=[])
          for cfg in configs]
times = [[] for _ in layers]
for _ in range(args.rounds):
    for layer, found in zip(layers, times):
        found.append(time_layer(layer, args.seq).recurrent_s / (args.seq + layer.plan.lag) * 1e6)
for cfg, layer, found in zip(configs, layers, times):
    rep, bound = layer.report, plan_tolerance(layer.plan, args.check_seq)
    err = check_against_reference(layer, args.check_seq, bound).max_abs_error
    knobs = " ".join(f"{k}={v}" for k, v in rep.config.items())
    print(f"{case.label} {'default ' if cfg is None else ''}{knobs}: {rep.ctas} CTAs x {rep.threads}, "
          f"{rep.registers} registers, {rep.spill_store_bytes} B spills; error {err:.2e} (bound {bound:.1e}); "
          f"{min(found):.3f} us/step (median {statistics.median(found):.3f})", flush=True)
if args.fastest:
    fastest = min(zip(layers, times), key=lambda pair: statistics.median(pair[1]))[0]
    with open(args.fastest, "w") as f:
        json.dump(dict(fastest.report.config), f)

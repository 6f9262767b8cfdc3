"""Time every valid persistent config of the template's space for one shape (a small sweep).

    python bench/config_sweep.py lstm --hidden 1024 --batch 4 --seq 256 [--limit 40]

Prints configs ranked by recurrent-kernel time, with the default config's rank: the raw
data for checking the default heuristic (the tuner searches the same space).
"""

import argparse
import math

import prnn_tvm
from prnn_tvm.checks import check_against_reference, time_layer
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.target import gpu_spec

p = argparse.ArgumentParser()
p.add_argument("cell")
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--limit", type=int, default=40, help="time the N configs of least estimated cost")
args = p.parse_args()

gpu = gpu_spec()
plan = prnn_tvm.analyze(prnn_tvm.resolve(args.cell), args.batch, args.hidden)
default = pc.default_config(plan, gpu)
valid = []
for cfg in pc.space(plan, gpu):
    try:
        valid.append((pc.estimated_cycles(cfg, pc.validate(cfg, plan, gpu)), cfg))
    except ConfigError:
        pass
valid.sort(key=lambda v: v[0])
chosen = [c for _, c in valid[: args.limit]]
if default not in chosen:
    chosen.append(default)
print(f"{len(valid)} valid configs; timing {len(chosen)}", flush=True)
results = []
for cfg in chosen:
    layer = prnn_tvm.compile_cell(plan.cell, args.hidden, args.batch, target="cuda", config=cfg)
    rep = layer.report
    if rep.spill_bytes:
        print(f"spills {rep.spill_bytes} B: {cfg}")
        continue
    ok = check_against_reference(layer, 8, 1e-4).ok
    t = time_layer(layer, args.seq, number=5, repeat=3)
    results.append((t.per_step_s, cfg, rep.registers, rep.threads, ok))
    print(f"{t.per_step_s * 1e6:7.2f} us/step ok={ok} regs={rep.registers} threads={rep.threads} {cfg.as_dict()}",
          flush=True)
results.sort(key=lambda r: r[0])
rank = next(i for i, r in enumerate(results) if r[1] == default) + 1 if any(r[1] == default for r in results) else None
print(f"\nbest  {results[0][0] * 1e6:.2f} us/step {results[0][1].as_dict()}")
print(f"default rank {rank}/{len(results)}: {default.as_dict()}")
print(f"estimated-cost order vs measured: first timed = {chosen[0].as_dict()}; log2 spread "
      f"{math.log2(results[-1][0] / results[0][0]):.2f}")

"""Tuning evidence from records: tuned vs default per shape, and the tuner vs random search.

    python bench/tuning_report.py tuning_logs/sm_90.jsonl [--grid GRID.jsonl] [--seeds 20] > report.md

For every key in the log: trials, errors, the default config's time (when it was
measured: the tuner's first batch includes it), the best time and the speedup. With
``--grid``, a log in which one space was measured exhaustively (``prnn-tvm tune ...
--search grid``): the cost-model search (both objectives) and random search are replayed
on those measured times, and their best after 16, 32 and 64 trials is given as a
fraction of the exhaustive best, averaged over seeds.
"""

import argparse
import dataclasses
import math

from prnn_tvm import records
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.schedules import by_name, knob_text
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune.model import XGBoostCostModel
from prnn_tvm.tune.replay import replay
from prnn_tvm.tune.search import ModelSearch, RandomSearch
from prnn_tvm.tune.space import ConfigSpace
from prnn_tvm.tune.tuner import known_times

p = argparse.ArgumentParser()
p.add_argument("log")
p.add_argument("--grid", default=None, help="a log holding one exhaustively measured space")
p.add_argument("--seeds", type=int, default=20)
args = p.parse_args()


def plan_gpu_template(rec):
    plan = analyze(resolve(rec.cell), rec.key.batch, rec.key.hidden, rec.key.dtype)
    return plan, dataclasses.replace(gpu_spec(rec.key.arch), sms=rec.key.sms), by_name(rec.key.template)


def us(seconds):
    return f"{seconds * 1e6:.2f}" if math.isfinite(seconds) else "failed"


recs = records.load(args.log)
print(f"## Tuned vs default ({args.log})\n")
print("| cell | hidden | batch | trials | errors | default us/step | tuned us/step | speedup | tuned config |")
print("|---|---|---|---|---|---|---|---|---|")
for key in dict.fromkeys(r.key for r in recs):
    mine = records.for_key(recs, key)
    plan, gpu, template = plan_gpu_template(mine[0])
    default = template.default_configs(plan, gpu.target(), gpu)[0].as_dict()
    d = min((r.per_step_s for r in mine if r.config == default), default=math.inf)
    best = records.best(mine, key)
    b = best.per_step_s if best else math.inf
    knobs = knob_text(best.config) if best else ""
    speedup = f"{d / b:.2f}x" if math.isfinite(d) and math.isfinite(b) else "n/a"
    print(
        f"| {mine[0].cell} | {key.hidden} | {key.batch} | {len(mine)} | {sum(not r.ok for r in mine)} | {us(d)} "
        f"| {us(b)} | {speedup} | {knobs} |"
    )

if args.grid:
    grid = records.load(args.grid)
    plan, gpu, template = plan_gpu_template(grid[0])
    space = ConfigSpace(plan, gpu, template)
    per_step = known_times(space, records.for_key(grid, grid[0].key))
    missing = len(space) - len(per_step)
    best = min(per_step.values())
    print(
        f"\n## Search vs random on an exhaustively measured space\n\n{grid[0].cell} hidden={plan.hidden} "
        f"batch={plan.batch}: {len(per_step)} of {len(space)} valid configs measured ({missing} missing), "
        f"{sum(not math.isfinite(v) for v in per_step.values())} failed; best {us(best)} us/step, median "
        f"{us(sorted(per_step.values())[len(per_step) // 2])}. Mean over {args.seeds} seeds of "
        "(exhaustive best / best found), and in brackets the share of seeds reaching 95%:\n"
    )
    if missing:  # replaying needs every config's time; unmeasured ones count as failed
        per_step.update({i: math.inf for i in range(len(space)) if i not in per_step})
    strategies = {
        "xgb, rank objective (default)": lambda: ModelSearch(XGBoostCostModel("rank")),
        "xgb, regression objective": lambda: ModelSearch(XGBoostCostModel("regression")),
        "random": RandomSearch,
    }
    print("| search | 16 trials | 32 trials | 64 trials |\n|---|---|---|---|")
    for name, make in strategies.items():
        res = replay(space, per_step, make, budgets=(16, 32, 64), seeds=range(args.seeds))
        cells = [f"{m:.3f} ({h:.0%})" for m, h in zip(res.mean(), res.hit_rate(0.95))]
        print(f"| {name} | " + " | ".join(cells) + " |")

"""Tune a new knob's values where the records are already good: how records gain a knob added to a space.

    python bench/tune_knob.py --knob poll_sleep --values 256 512 --dtype float16 \\
        --cases lstm:1024x16 lstm:1024x32 lstm:512x32 gru:1024x16 [--top 6] [--trials 6] [--log ...]

Values are integers or names (``--knob barrier --values sentinel``). For each case (cell:HIDDENxBATCH; a stack
is ``lstm_x4``) it takes the ``--top`` fastest records of the log whose config is still
valid with the knob set to one of ``--values`` (a case the log has no record of: the template's untuned defaults, in
their order), measures each of those configs with each value first
(``tune(first=...)``), then ``--trials`` configs of the usual model-guided search; everything lands in the log.
Configs the log has already are skipped, unless ``--remeasure``: after a change to the generated code, that
measures the best records' configs again (``--values`` their own value of the knob).
Prints one line per case: configs seeded, the best before and after, the best config.
"""

import argparse
import os

from prnn_tvm import records
from prnn_tvm.bench.matrix import Case
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.schedules import template_for
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune import tune
from prnn_tvm.tune.space import ConfigSpace
from prnn_tvm.tune.tuner import with_knob


def case_parser() -> argparse.ArgumentParser:
    """The arguments every tuning script here takes: the cases, the trials after the seeded configs, the GPU, the
    build workers and the log."""
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", required=True, help="cell:HIDDENxBATCH")
    p.add_argument("--trials", type=int, default=6, help="model-guided trials after the seeded ones")
    p.add_argument("--arch", default=None)
    p.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    p.add_argument("--log", default=None, help="default: the package's tuning_logs/<arch>.jsonl")
    return p


def cases(args, dtype: str):
    """``(case, cell, hidden, batch, plan, gpu, log)`` for each of ``args.cases`` (cell:HIDDENxBATCH)."""
    gpu = gpu_spec(args.arch)
    log = args.log or records.default_log(gpu.arch)
    for case in args.cases:
        c = Case.parse(case, dtype=dtype)
        yield case, c.cell, c.hidden, c.batch, analyze(resolve(c.cell), c.batch, c.hidden, dtype), gpu, log


def seeded(args, cell: str, hidden: int, batch: int, dtype: str, log, seeds: list, remeasure: bool = False):
    """``tune`` of one case into ``log``: ``seeds`` measured first (again where ``remeasure``), then ``args.trials``
    configs of the model-guided search, builds on ``args.workers`` processes."""
    return tune(
        cell,
        hidden,
        batch,
        dtype=dtype,
        arch=args.arch,
        trials=len(seeds) + args.trials,
        log_path=log,
        workers=args.workers,
        progress=False,
        first=seeds,
        remeasure=remeasure,
    )


def main():
    p = case_parser()
    p.add_argument("--knob", required=True)
    p.add_argument("--values", nargs="+", type=lambda v: int(v) if v.isdigit() else v, required=True)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--top", type=int, default=6)
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the seeded configs again where the log has them (after a change to the kernels)",
    )
    args = p.parse_args()

    for case, cell, hidden, batch, plan, gpu, log in cases(args, args.dtype):
        template = template_for(plan, gpu.target())
        known = records.for_key(records.load(log), records.key_for(plan, gpu, template.name))
        before = min((r.per_step_s for r in known if r.ok), default=float("nan")) * 1e6
        defaults = [c.as_dict() for c in template.default_configs(plan, gpu.target(), gpu)]
        seeds = with_knob(ConfigSpace(plan, gpu, template), known, args.knob, args.values, args.top, defaults)
        res = seeded(args, cell, hidden, batch, args.dtype, log, seeds, args.remeasure)
        print(
            f"{case}: {len(seeds)} seeded; best {before:.3f} -> {res.best.per_step_s * 1e6:.3f} us/step "
            f"{res.best.config}, {res.errors} errors",
            flush=True,
        )


if __name__ == "__main__":  # build workers are spawned and import this file
    main()

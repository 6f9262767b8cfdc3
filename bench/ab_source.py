"""A/B of a change to the generated CUDA before it goes into the code generator (``prnn_tvm.bench.ab``): each
case's layer as built against the same config with the change applied to its source, their outputs compared
bitwise on the same inputs, their recurrent kernels timed in interleaved rounds (us per step, T=256).

    python bench/ab_source.py bench/changes/CHANGE.json [MORE.json ...] [--cases lstm:1024x16 lstm_x4:512x8] \\
        [--dtype float16] [--config '{...}'] [--rounds 3] [--seq 256] [--arch sm_90]

A change file is ``{"why": "...", "cases": [...], "config": {...}, "dtype": "...", "replace": [[old, new], ...]}``:
texts of the generated CUDA, each old one required (a change the code no longer matches is refused, naming the
text); ``--cases``, ``--config`` and ``--dtype`` default to the file's own (a prototype written against one kernel's
generated names carries its config and dtype), else each case's tuned or default config, and float16.
``bench/changes/`` holds the changes written and not yet measured. Without a GPU (``--arch sm_90``) both layers are
built and ptxas's registers and spills printed: the change still has to apply and compile.
"""

import argparse
import json

from prnn_tvm.bench.ab import SourceChange, compare, layer_pair, line
from prnn_tvm.bench.matrix import Case

p = argparse.ArgumentParser()
p.add_argument("change", nargs="+", help="change files, {'why': ..., 'replace': [[old, new], ...]}, run in turn")
p.add_argument(
    "--cases", nargs="+", default=None, help="CELL:HIDDENxBATCH (a stack: lstm_x4:512x8); default: the change file's"
)
p.add_argument("--dtype", default=None, help="default: the change file's, else float16")
p.add_argument(
    "--config",
    type=json.loads,
    default=None,
    help="one config for every case (default: the change file's, else each case's tuned or default one)",
)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()

changes = [SourceChange.load(path) for path in args.change]  # every file read (or refused) before any build
for path, change in zip(args.change, changes):
    if not (args.cases or change.cases):
        p.error(f"{path} names no cases: give --cases")
for change in changes:
    print(f"{change.name}: {change.why}" if change.why else change.name)
    for spec in args.cases or change.cases:
        case = Case.parse(spec, args.seq, args.dtype or change.dtype or "float16")
        built, changed = layer_pair(case, change, args.config, args.arch)
        found = None if args.arch else compare(built, changed, args.seq, args.rounds)
        print(line(case, built, changed, found), flush=True)

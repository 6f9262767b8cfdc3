"""Where a head-a-block step goes: per warp and step, the clocks the recurrent kernel records at the borders of its
phases (the first operand fragment landed, the mma chains, the projection's wait, the pointwise math, the stores,
the next step's loads issued, the block barrier; ``prnn_tvm.bench.heads_timeline``), against the plain kernel's
time per step. Default: lstm_h12 (12 heads of 64) bf16 H=768 B=16 T=1024, the in_warp config of issue 49.

    python bench/heads_timeline.py [--cell lstm_h12 --hidden 768 --batch 16 --seq 1024 --dtype bfloat16] \\
        [--config '{...}'] [--change bench/changes/NAME.json ...] [--first 512] [--arch sm_90]

``--change``: source changes (``bench/ab_source.py``'s files) applied before the stamps, to see where a candidate's
step goes (each must keep the anchors). ``--first``: the first step recorded (256 are). Without a GPU (``--arch
sm_90``) it builds the instrumented kernel, prints ptxas's figures and stops: the rewrite still applies. About 30 s
on an H100.
"""

import argparse
import json

from prnn_tvm.bench import heads_timeline as htl
from prnn_tvm.bench.ab import SourceChange
from prnn_tvm.codegen import build
from prnn_tvm.compiler import compile_cell

p = argparse.ArgumentParser()
p.add_argument("--cell", default="lstm_h12")
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--config", type=json.loads, default=htl.IN_WARP, help="default: issue 49's in_warp config")
p.add_argument("--change", nargs="*", default=[], help="source changes applied before the stamps")
p.add_argument("--first", type=int, default=None, help="first step recorded (default: the middle 256)")
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()

first = max(0, (args.seq - htl.STEPS) // 2) if args.first is None else args.first
if first + htl.STEPS > args.seq:
    p.error(f"--first {first} records steps past the sequence's {args.seq}")
changes = [SourceChange.load(path) for path in args.change]


def changed(source: str) -> str:
    for change in changes:
        source = change.apply(source)
    return source


def layer(stamped: bool):
    def rewrite(source):
        source = changed(source)
        return htl.instrument(source, first) if stamped else source

    with build.rewriting_sources(rewrite), htl.one_step_a_turn():  # the loop the rewrite reads
        return compile_cell(args.cell, args.hidden, args.batch, dtype=args.dtype, config=args.config, arch=args.arch)


plain, stamped = layer(False), layer(True)
for name, built in (("plain", plain), ("stamped", stamped)):
    r = built.report
    print(f"{name}: registers {r.registers}, spill bytes {r.spill_store_bytes + r.spill_load_bytes}; {r.config}")
if args.arch is None:
    from prnn_tvm.checks import time_layer

    for name, built in (("plain", plain), ("stamped", stamped)):
        t = time_layer(built, args.seq)
        print(f"{name}: recurrent kernel {t.recurrent_s / args.seq * 1e6:.3f} us per step")
    spans, clocks = htl.run(stamped, args.seq)
    if not spans.any():
        raise SystemExit("heads timeline: no spans came back (was the recurrent kernel instrumented?)")
    last = first + spans.shape[1]
    print(f"{args.cell} {args.dtype} H={args.hidden} B={args.batch} T={args.seq}, steps {first}-{last}:")
    for line in htl.summary(spans, clocks, args.seq):
        print(line)

"""Block kernels' input projection asked into L2 some steps ahead of its early load (issue 49): per cell, the layer
built with each variant of ``PersistentBuilder``'s ``XP_PREFETCH_EARLY_*`` (the tensor-core template's, PRNN_TVM
cache off), ptxas's registers and spills and the prefetch call sites in its source; per sequence length the outputs
and final states compared bitwise against the first variant's (every row whole, then rows of random lengths), and
the recurrent kernel's us per step, the best of interleaved rounds (each round times every variant in turn).

    python bench/xp_prefetch_block.py [--cells lstm_h24 lstm_h12 lstm_h48 slstm_h12] [--hidden 768 --batch 16] \\
        [--dtype bfloat16] [--seqs 1024 256] [--rounds 3] \\
        [--variants off word:4:load segment:4:load segment:4:barrier] [--arch sm_90]

A variant is ``off`` (no prefetch) or ``BY:STEPS:AT``: ``BY`` ``segment`` (one ``cp.async.bulk.prefetch.L2`` per
contiguous segment of the CTA's projection, ``prefetch_segments``) or ``word`` (each thread one ``prefetch.global.L2``
per word it reads), ``STEPS`` on from the loaded step, ``AT`` ``load`` (with the loads, before the step's barrier)
or ``barrier`` (after it). The layer's own config: its tuning record's, else the default. With ``--arch`` the layers
are built only (no GPU needed): registers, spills and call sites.
"""

import argparse
import os

import numpy as np

os.environ.setdefault("PRNN_TVM_CACHE", "0")  # each variant's source compiled, not a cached module of another's

from prnn_tvm.compiler import compile_cell  # noqa: E402
from prnn_tvm.reference import random_inputs, random_lengths  # noqa: E402
from prnn_tvm.schedules.persistent_mma import _MmaBuilder  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--cells", nargs="+", default=["lstm_h24", "lstm_h12", "lstm_h48", "slstm_h12"])
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--seqs", nargs="+", type=int, default=[1024, 256])
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--variants", nargs="+", default=["off", "word:4:load", "segment:4:load", "segment:4:barrier"])
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()


KNOBS = ("XP_PREFETCH_EARLY_BY", "XP_PREFETCH_EARLY_STEPS", "XP_PREFETCH_EARLY_AT")


def settings(variant: str) -> tuple:
    """``(by, steps, at)`` of a variant (``off``: no prefetch)."""
    if variant == "off":
        return _MmaBuilder.XP_PREFETCH_EARLY_BY, 0, _MmaBuilder.XP_PREFETCH_EARLY_AT
    by, steps, at = variant.split(":")
    if by not in ("segment", "word") or at not in ("load", "barrier") or not steps.isdigit():
        p.error(f"variant {variant!r}: off, or BY:STEPS:AT with BY segment|word, AT load|barrier")
    return by, int(steps), at


def build(cell: str, variant: str):
    """The layer with ``variant``'s prefetch (the class's settings restored after)."""
    saved = [getattr(_MmaBuilder, knob) for knob in KNOBS]
    for knob, value in zip(KNOBS, settings(variant)):
        setattr(_MmaBuilder, knob, value)
    try:
        return compile_cell(cell, args.hidden, args.batch, dtype=args.dtype, target="cuda", arch=args.arch,
                            cache=False)
    finally:
        for knob, value in zip(KNOBS, saved):
            setattr(_MmaBuilder, knob, value)


def same(a, b) -> bool:
    """Whether two calls' results (the output sequence, the final states) are bitwise equal."""
    (out_a, finals_a), (out_b, finals_b) = a, b
    return all(np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
               for x, y in zip((out_a, *finals_a), (out_b, *finals_b)))


for variant in args.variants:
    settings(variant)  # every variant parsed before any build
for cell in args.cells:
    layers = {v: build(cell, v) for v in args.variants}
    first = layers[args.variants[0]]
    print(f"{cell} {args.hidden}x{args.batch} {args.dtype} {first.report.config}", flush=True)
    for v, layer in layers.items():
        src, r = layer.cuda_source, layer.report
        print(f"  {v:<18} registers {r.registers} spills {r.spill_bytes} call sites: "
              f"segment {src.count('prnn_prefetch_l2_bulk((')} word {src.count('prnn_prefetch_l2((')}", flush=True)
    if args.arch:
        continue
    for T in args.seqs:
        inputs = random_inputs(first.plan, T, first.input_size, seed=1)
        ragged = {**inputs, "lengths": random_lengths(args.batch, T, seed=T)}
        calls = (inputs, ragged)
        bitwise = {v: all(same(layer(**call), first(**call)) for call in calls) for v, layer in layers.items()}
        best = {v: float("inf") for v in layers}
        for _ in range(args.rounds):
            for v, layer in layers.items():
                best[v] = min(best[v], layer.time(number=5, repeat=3, **inputs)["recurrent"] * 1e6 / T)
        print(f"  T={T:<5} " + "  ".join(f"{v} {best[v]:.3f}{'' if bitwise[v] else ' (NOT bitwise)'}" for v in layers),
              flush=True)

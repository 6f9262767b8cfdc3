"""Block kernels' input projection asked into L2 some steps ahead of its early load (issue 49): per cell, the layer
built with each variant of ``PersistentBuilder``'s ``XP_PREFETCH_EARLY_*`` (the tensor-core template's, PRNN_TVM
cache off), ptxas's registers and spills and the prefetch call sites in its source; per sequence length the outputs
and final states compared bitwise against the first variant's (every row whole, then rows of random lengths), and
the recurrent kernel's us per step, the best of interleaved rounds (each round times every variant in turn).

    python bench/xp_prefetch_block.py [--cells lstm_h24 lstm_h12 lstm_h48 slstm_h12] [--hidden 768 --batch 16] \\
        [--dtype bfloat16] [--seqs 1024 256] [--rounds 3] \\
        [--variants off word:3:load sector:4:barrier sector:4:load:128] [--arch sm_90]

A variant is ``off`` (no prefetch), ``word:STEPS:load`` (each thread one ``prefetch.global.L2`` per word it reads,
``PersistentBuilder.inputs_prefetched``) or ``sector:STEPS:AT[:BYTES[:WARPS]]`` (warp 0, or the first ``WARPS``
warps, one ``prefetch.global.L2`` per lane, a lane a ``BYTES``-byte sector or line, 32 unless given, of the CTA's
projection, in turns where there are more: ``persistent_xp_sectors``), ``STEPS`` on from the loaded step, ``AT``
``load`` (with the loads, before the step's barrier) or ``barrier`` (after it). Any of them prefixed ``moved+``: the
projection's two register banks as they were before they took turns (``WarpGates.XP_BANKS_ALTERNATE`` off: the next
step's values moved from one bank into the other at each step's end). The layer's own config: its tuning
record's, else the default. With ``--arch`` the layers are built only (no GPU needed): registers, spills and call
sites.

Measured (H100, bfloat16 768 x 16, us/step of the recurrent kernel, best of 3 rounds), the first, since dropped,
variant ``segment``: one ``cp.async.bulk.prefetch.L2`` per contiguous segment (batch row x leaf x the CTA's units'
bytes), each by a thread of its own, costs far more than it saves:

    cell       T     off    word:3:load  segment:4:load  segment:4:barrier
    lstm_h24   1024  0.545  0.414        0.458           0.435
    lstm_h24   256   0.321  0.377        0.475           0.454
    lstm_h12   1024  0.619  0.444        0.540           0.511
    lstm_h12   256   0.427  0.466        0.566           0.538
    lstm_h48   1024  0.564  -            1.304           1.313   (32 segments of 32 bytes a CTA)
    slstm_h12  1024  0.598  -            1.568           1.527

(segment:2 and :8 as :4; outputs bitwise equal in every variant.)
"""

import argparse
import os

import numpy as np

os.environ.setdefault("PRNN_TVM_CACHE", "0")  # each variant's source compiled, not a cached module of another's

from prnn_tvm.compiler import compile_cell  # noqa: E402
from prnn_tvm.reference import random_inputs, random_lengths  # noqa: E402
from prnn_tvm.schedules import by_name  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--cells", nargs="+", default=["lstm_h24", "lstm_h12", "lstm_h48", "slstm_h12"])
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--seqs", nargs="+", type=int, default=[1024, 256])
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--variants", nargs="+", default=["off", "word:3:load", "sector:4:barrier", "sector:4:load:128"])
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()


BUILDER = by_name("persistent_mma").builder  # the tensor-core template's builder, whose class settings vary
KNOBS = ("XP_PREFETCH_EARLY_BY", "XP_PREFETCH_EARLY_STEPS", "XP_PREFETCH_EARLY_AT", "XP_PREFETCH_EARLY_BYTES",
         "XP_PREFETCH_EARLY_WARPS", "XP_BANKS_ALTERNATE")
MOVED = "moved+"


def settings(variant: str) -> tuple:
    """``(by, steps, at, bytes, warps, banks alternate)`` of a variant (``off``: no prefetch)."""
    if variant.startswith(MOVED):
        return (*settings(variant[len(MOVED):])[:-1], False)
    if variant == "off":
        return BUILDER.XP_PREFETCH_EARLY_BY, 0, BUILDER.XP_PREFETCH_EARLY_AT, 32, 1, True
    by, steps, at, *rest = variant.split(":")
    size, warps = (rest + ["32", "1"][len(rest):])[:2] if len(rest) <= 2 else ("", "")
    valid = (by == "sector" and at in ("load", "barrier") and size in ("32", "64", "128") and warps.isdigit()
             and int(warps) > 0) or (by == "word" and at == "load" and not rest)
    if not valid or not steps.isdigit():
        p.error(f"variant {variant!r}: off, word:STEPS:load or sector:STEPS:AT[:BYTES[:WARPS]] with AT load|barrier, "
                "BYTES 32|64|128, WARPS 1 or more, each may be prefixed moved+")
    return by, int(steps), at, int(size), int(warps), True


def build(cell: str, variant: str):
    """The layer with ``variant``'s prefetch (the class's settings restored after)."""
    saved = [getattr(BUILDER, knob) for knob in KNOBS]
    for knob, value in zip(KNOBS, settings(variant)):
        setattr(BUILDER, knob, value)
    try:
        return compile_cell(cell, args.hidden, args.batch, dtype=args.dtype, target="cuda", arch=args.arch,
                            cache=False)
    finally:
        for knob, value in zip(KNOBS, saved):
            setattr(BUILDER, knob, value)


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
              f"{src.count('prnn_prefetch_l2((')}", flush=True)
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

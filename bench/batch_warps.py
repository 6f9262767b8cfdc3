"""The head-a-block step with its batch tiles split over more warps (``batch_warps``, schedules/gate_layout.py) against
the untuned default, for every head size at hidden 768 (issue 49: LSTM, B=16, bf16), in one run: each layer built,
checked against the float64 reference at an odd T with per-row lengths, and its recurrent kernel timed in interleaved
rounds (us per step, T=``--seq``), so that every config meets the same GPU state.

    python bench/batch_warps.py [--heads 16 32 64 128 256] [--batch 16] [--seq 1024] [--rounds 3] [--check-seq 255]
                                [--arch sm_90]

Per head size D: the default (``batch_warps=1`` as the default ranks it, or whatever ``BATCH_WARPS_BELOW`` picks), its
in_warp config where the default is another (the fewest shared k tiles that validate), then each split of the in_warp
config that validates (``batch_warps`` 2, 4, ... up to its ``n_tiles``; where the registers of a CTA of more threads
are short, with more of each warp's k tiles in shared memory), and the same with a head a CTA (twice the CTAs on
SMs that are idle) where the default's CTAs hold several heads. ``--arch``: build only, for that architecture, and
print the configs with ptxas's figures (no GPU needed). Prints one line per
config: its knobs, CTAs x threads, registers and spills, the error and its bound, the fastest and median rounds and
the fastest's ratio to the default's. What the figures decide: ``BATCH_WARPS_BELOW`` in
schedules/persistent_mma_config.py. About 60 s on an H100 (the builds).
"""

import argparse
import dataclasses
import statistics

from prnn_tvm.checks import check_against_reference, plan_tolerance, time_layer
from prnn_tvm.compiler import compile_cell
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_lengths
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules.gate_layout import BATCH_WARPS, in_warp_tiles

HIDDEN = 768

p = argparse.ArgumentParser()
p.add_argument("--heads", nargs="*", type=int, default=[16, 32, 64, 128, 256], help="head sizes D (H=768)")
p.add_argument("--batch", type=int, default=16)
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--check-seq", type=int, default=255, help="steps checked against the float64 reference")
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()


def build(cell: str, config):
    options = {} if args.arch is None else {"target": "cuda", "arch": args.arch}
    return compile_cell(cell, HIDDEN, args.batch, dtype=args.dtype, config=config, tuning_logs=[], **options)


def fewest_shared(cfg, plan, gpu, **knobs):
    """``cfg`` with ``knobs``, and the fewest shared k tiles from its own up with which it validates (None where none
    does)."""
    for sk in range(cfg.smem_k_tiles, mc.geometry(cfg, plan).k_tiles_per_warp + 1):
        other = dataclasses.replace(cfg, smem_k_tiles=sk, **knobs)
        try:
            mc.validate(other, plan, gpu)
        except ConfigError:
            continue
        return other
    return None


def candidates(layer) -> list:
    """The default's in_warp config (where the default is another), then that with its batch tiles over 2, 4, ...
    sets of warps; the same with a head a CTA where the default's CTAs hold several heads."""
    cfg, plan, gpu = layer.kernel.config, layer.plan, layer.gpu
    base = cfg
    if not cfg.in_warp:
        mw, passes = in_warp_tiles(plan), -(-plan.batch // mc.TILE_N)
        base = None if mw is None else fewest_shared(cfg, plan, gpu, gate_layout="in_warp", m_tiles_per_warp=mw,
                                                     k_groups=1, n_tiles=passes, k_chains=1, l2_k_tiles=0)
    if base is None:
        return []
    D = plan.reductions[0].head_size(plan.hidden)
    one_head = fewest_shared(base, plan, gpu, units_per_cta=D) if D < base.units_per_cta else None
    found = []
    for first in (base, one_head):  # and a head a CTA, where the default's CTAs hold several: more SMs
        if first is None:
            continue
        found += [] if first == cfg else [first]
        for bw in (b for b in BATCH_WARPS if 1 < b and first.n_tiles % b == 0):
            found += [c for c in (fewest_shared(first, plan, gpu, batch_warps=bw),) if c is not None]
    return found


for D in args.heads:
    cell = f"lstm_h{HIDDEN // D}"
    default = build(cell, None)
    layers = [default] + [build(cell, cfg) for cfg in candidates(default)]
    if args.arch is not None:
        for layer in layers:
            rep = layer.report
            print(f"D={D} {cell}: {rep.config}: {rep.ctas} CTAs x {rep.threads}, {rep.registers} registers, "
                  f"{rep.spill_bytes} B spills", flush=True)
        continue
    times = [[] for _ in layers]
    for _ in range(args.rounds):
        for layer, found in zip(layers, times):
            found.append(time_layer(layer, args.seq).recurrent_s / args.seq * 1e6)
    for i, (layer, found) in enumerate(zip(layers, times)):
        rep, bound = layer.report, plan_tolerance(layer.plan, args.check_seq)
        lengths = random_lengths(args.batch, args.check_seq, seed=3)
        err = check_against_reference(layer, args.check_seq, bound, seed=3, lengths=lengths).max_abs_error
        knobs = " ".join(f"{k}={v}" for k, v in rep.config.items())
        verdict = "ok" if err <= bound else "WRONG"
        print(f"D={D} {cell} {HIDDEN}x{args.batch} {args.dtype} {'default ' if i == 0 else ''}{knobs}: {rep.ctas} CTAs "
              f"x {rep.threads}, {rep.registers} registers, {rep.spill_bytes} B spills; error {err:.2e} (bound "
              f"{bound:.1e}, T={args.check_seq}) {verdict}; {min(found):.3f} us/step (median "
              f"{statistics.median(found):.3f}), {min(found) / min(times[0]):.3f}x the default", flush=True)

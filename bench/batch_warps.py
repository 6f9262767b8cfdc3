"""The untuned default of a head-wise LSTM (B=16, bf16, hidden 768: issue 49) against the other configs of a unit's
gates in one warp (``gate_layout="in_warp"``, schedules/gate_layout.py), for every head size, in one run: each layer
built, checked against the float64 reference at an odd T with per-row lengths, and its recurrent kernel timed in
interleaved rounds (us per step, T=``--seq``), so that every config meets the same GPU state.

    python bench/batch_warps.py [--heads 16 32 64 128 256] [--batch 16 1] [--seq 1024] [--rounds 3] [--check-seq 255]
                                [--defaults | --groups] [--arch sm_90] [--fastest DIR]

Per head size D and batch: the default, then each in_warp config of a head a CTA and of two heads a CTA, each
``batch_warps`` that splits its pass (its weights' fewest shared k tiles that validate), then the default's first
fallback of the other gate layout. ``--defaults``: the default alone (about a minute on an H100 for the five head
sizes at two batches, the builds). ``--arch``: build only, for that architecture, and print the configs with
ptxas's figures (no GPU needed). Prints one line per config: its knobs, CTAs x threads, registers and spills, the
error and its bound, the fastest and median rounds and the fastest's ratio to the default's. What the figures decide:
``BATCH_WARPS_BELOW`` and ``gates_in_warp`` in schedules/persistent_mma_config.py.

``--groups``: the default against itself in each count of batch groups the tuning space offers it (each group's rows
on CTAs of their own, no CTA waiting for another under ``block``): what decides ``BLOCK_GROUPS_MOST``. ``--fastest
DIR``: the knobs of each case's fastest config that passed its check, as ``DIR/fastest{D}.json`` (at the first batch;
for ``bench/against_flashrnn.py --heads-configs D=FILE``).

Heads of 256 have no in_warp config: a unit's four gates in one warp make 32 warps of a head (1024 threads, 64
registers each, below the accumulators, items and addresses alone), and a head's weights (512 KiB in bf16) pass an
SM's registers and shared memory together.
"""

import argparse
import dataclasses
import json
import os
import statistics

from prnn_tvm.checks import check_against_reference, plan_tolerance, time_layer
from prnn_tvm.compiler import compile_cell
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_lengths
from prnn_tvm.schedules import by_name

HIDDEN = 768

p = argparse.ArgumentParser()
p.add_argument("--heads", nargs="*", type=int, default=[16, 32, 64, 128, 256], help="head sizes D (H=768)")
p.add_argument("--batch", nargs="*", type=int, default=[16], help="batch sizes, each timed on its own")
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--check-seq", type=int, default=255, help="steps checked against the float64 reference")
p.add_argument("--defaults", action="store_true", help="the default alone for each head size and batch")
p.add_argument("--groups", action="store_true", help="the default against itself in each count of batch groups")
p.add_argument("--fastest", default=None, help="write each head size's fastest config here, as fastest{D}.json")
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()


def build(cell: str, batch: int, config):
    options = {} if args.arch is None else {"target": "cuda", "arch": args.arch}
    return compile_cell(cell, HIDDEN, batch, dtype=args.dtype, config=config, tuning_logs=[], **options)


def candidates(layer) -> list:
    """The in_warp configs of a head and of two heads a CTA, each split of their pass (``batch_warps``, the values the
    tuning space offers), with the fewest shared k tiles that validate; then the first ranked config of the other
    layout (the fallback). Through the template's contract (``schedules.by_name``): the default's config is the base."""
    cfg, plan, gpu = layer.kernel.config, layer.plan, layer.gpu
    template = by_name(layer.report.template)
    D = plan.reductions[0].head_size(plan.hidden)
    splits = sorted({c.batch_warps for c in template.space(plan, gpu)})
    family = [] if not cfg.in_warp else [
        fewest_shared_tiles(template, dataclasses.replace(cfg, units_per_cta=units, batch_warps=bw, smem_k_tiles=0),
                            plan, gpu)
        for units in (D, 2 * D) for bw in splits if cfg.n_tiles % bw == 0]
    ranked = template.default_configs(plan, layer.target, gpu)
    fallback = next((c for c in ranked if c.in_warp != cfg.in_warp), None)
    return [c for c in dict.fromkeys(family + [fallback]) if c is not None and c != cfg]


def grouped(layer) -> list:
    """The default with its batch in each count of groups (more than one) the tuning space offers its barrier: a
    group's rows in the batch tiles they need (one pass where the default runs one), one set of warps, the fewest
    shared k tiles that validate."""
    cfg, plan, gpu = layer.kernel.config, layer.plan, layer.gpu
    template = by_name(layer.report.template)
    counts = sorted({c.batch_groups for c in template.space(plan, gpu) if c.barrier == cfg.barrier} - {1})
    found = []
    for G in counts:
        tiles = min(cfg.n_tiles, -(-plan.batch // G // 8))
        n_tiles = next(n for n in (1, 2, 4, 8) if n >= tiles)
        found.append(fewest_shared_tiles(template, dataclasses.replace(cfg, batch_groups=G, n_tiles=n_tiles,
                                                                       batch_warps=1, smem_k_tiles=0), plan, gpu))
    return [c for c in found if c is not None]


def fewest_shared_tiles(template, cfg, plan, gpu):
    """``cfg`` with the fewest ``smem_k_tiles`` with which the template validates it, or None."""
    try:
        k_tiles = template.geometry(cfg, plan).k_tiles_per_warp
    except ConfigError:  # a geometry the template refuses (validate says why)
        return None
    for sk in range(k_tiles + 1):
        other = dataclasses.replace(cfg, smem_k_tiles=sk)
        try:
            template.validate(other, plan, gpu)
        except ConfigError:
            continue
        return other
    return None


for D, batch in ((D, batch) for batch in args.batch for D in args.heads):
    cell = f"lstm_h{HIDDEN // D}"
    default = build(cell, batch, None)
    others = [] if args.defaults else grouped(default) if args.groups else candidates(default)
    layers = [default] + [build(cell, batch, cfg) for cfg in others]
    if args.arch is not None:
        for layer in layers:
            rep = layer.report
            print(f"D={D} {cell} {HIDDEN}x{batch}: {rep.config}: {rep.ctas} CTAs x {rep.threads}, {rep.registers} "
                  f"registers, {rep.spill_bytes} B spills", flush=True)
        continue
    times = [[] for _ in layers]
    for _ in range(args.rounds):
        for layer, found in zip(layers, times):
            found.append(time_layer(layer, args.seq).recurrent_s / args.seq * 1e6)
    passed = []
    for i, (layer, found) in enumerate(zip(layers, times)):
        rep, bound = layer.report, plan_tolerance(layer.plan, args.check_seq)
        lengths = random_lengths(batch, args.check_seq, seed=3)
        err = check_against_reference(layer, args.check_seq, bound, seed=3, lengths=lengths).max_abs_error
        knobs = " ".join(f"{k}={v}" for k, v in rep.config.items())
        verdict = "ok" if err <= bound else "WRONG"
        if err <= bound:
            passed.append((statistics.median(found), layer))
        print(f"D={D} {cell} {HIDDEN}x{batch} {args.dtype} {'default ' if i == 0 else ''}{knobs}: {rep.ctas} CTAs "
              f"x {rep.threads}, {rep.registers} registers, {rep.spill_bytes} B spills; error {err:.2e} (bound "
              f"{bound:.1e}, T={args.check_seq}) {verdict}; {min(found):.3f} us/step (median "
              f"{statistics.median(found):.3f}), {min(found) / min(times[0]):.3f}x the default", flush=True)
    if args.fastest and batch == args.batch[0] and passed:
        with open(os.path.join(args.fastest, f"fastest{D}.json"), "w") as f:
            json.dump(dict(min(passed, key=lambda pair: pair[0])[1].report.config), f)

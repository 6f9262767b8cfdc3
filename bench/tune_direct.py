"""Tune the tensor-core template's direct fragments (``operand_path="direct"``) where records already exist.

    python bench/tune_direct.py --cases lstm:1024x16 lstm:1024x32 lstm:512x32 [--seeds 16] [--trials 6]

For each case (cell:HIDDENxBATCH, float16): the three fastest records of the log measured again (the sentinel's
check changed with this knob), then up to ``--seeds`` valid direct configs nearest cuDNN's layout (16 units per
CTA, then 8 and 32; warps holding as many row tiles as the space allows; about eight warps; at most four batch
tiles in turn; no sleep first), then ``--trials`` configs of the usual model-guided search; everything lands in
the log. Prints one line per case: the best before and after, and the best direct config.
"""

from tune_knob import case_parser, cases, seeded

from prnn_tvm import records
from prnn_tvm.schedules import template_for
from prnn_tvm.tune.space import ConfigSpace


def direct_seeds(plan, gpu, limit: int) -> list[dict]:
    """Valid direct configs without accumulator chains or long sleeps, nearest cuDNN's layout first."""
    found = []
    template = template_for(plan, gpu.target())
    space = ConfigSpace(plan, gpu, template).configs
    per_warp = sorted({cfg.m_tiles_per_warp for cfg in space})  # the row tiles a warp may hold
    for cfg in space:
        if not cfg.direct or cfg.poll_sleep > 256 or cfg.k_chains != 1:
            continue
        g = template.geometry(cfg, plan)
        most = max(m for m in per_warp if g.m_tiles % m == 0)
        if cfg.m_tiles_per_warp == most and g.batch_chunks <= 4 and 4 <= g.threads // 32 <= 16:
            key = (
                abs(cfg.units_per_cta - 16) + 0.5 * (cfg.units_per_cta < 16),
                abs(g.threads // 32 - 8),
                cfg.poll_sleep,
                cfg.batch_groups,
            )
            found.append((key, cfg.as_dict()))
    return [knobs for _, knobs in sorted(found, key=lambda entry: entry[0])[:limit]]


def main():
    p = case_parser()
    p.add_argument("--seeds", type=int, default=16, help="direct configs measured before the search")
    args = p.parse_args()

    for case, cell, hidden, batch, plan, gpu, log in cases(args, "float16"):
        key = records.key_for(plan, gpu, template_for(plan, gpu.target()).name)
        known = records.ranked(records.load(log), key)
        best = [r.config for r in known[:3]]
        seeds = best + [c for c in direct_seeds(plan, gpu, args.seeds) if c not in best]
        seeded(args, cell, hidden, batch, "float16", log, seeds, remeasure=True)
        after = records.ranked(records.load(log), key)
        direct = next((r for r in after if r.config.get("operand_path") == "direct"), None)
        before = f"{known[0].per_step_s * 1e6:.3f}" if known else "none"
        print(
            f"{case}: best {before} -> {after[0].per_step_s * 1e6:.3f} us/step {after[0].config}; best direct "
            f"{direct.per_step_s * 1e6 if direct else float('nan'):.3f} {direct.config if direct else ''}",
            flush=True,
        )


if __name__ == "__main__":  # build workers are spawned and import this file
    main()

"""Tune shapes that have no records of their own, seeded from their neighbours' records: how tuning_logs/ gained LSTM
float16 at batch 16 for every hidden size of cuDNN's persistent kernel.

    python bench/tune_neighbours.py --cases lstm:384x16 lstm:640x16 lstm:768x16 lstm:896x16 lstm:1024x16 \\
        [--dtype float16] [--top 3] [--trials 2] [--most 12] [--log tuning_logs/sm_90.jsonl]

For each case, in the order given (a case tuned earlier is a neighbour of the later ones: the log is read again for
each), it measures first what a compile would carry over from the records of the neighbouring hidden sizes
(``prnn_tvm.neighbours``, the same cell, batch, dtype and GPU within a factor of two): the ``--top`` fastest records
of every neighbour, each carried over as it is and in 2 and 4 batch groups (the units per CTA raised as far as
one CTA per SM needs), at most ``--most``; then ``--trials`` configs of the model-guided search. All
land in the log, one process, builds in parallel (``--workers``). Configs the log has for the key are skipped.
Prints one line per case: configs seeded, the carried default's time, the best time and config.
"""

from tune_knob import case_parser, cases, seeded

from prnn_tvm import records
from prnn_tvm.neighbours import carried_seeds
from prnn_tvm.schedules import template_for
from prnn_tvm.tune.space import ConfigSpace

SPLITS = (2, 4)  # batch groups tried beside each record's own: at batch 16 the fastest record of every size has 2 or 4


def main():
    p = case_parser()
    p.add_argument("--dtype", default="float16")
    p.add_argument("--top", type=int, default=3, help="fastest records of each neighbour to carry over")
    p.add_argument("--most", type=int, default=12, help="seeded configs per case at most")
    p.set_defaults(trials=2)
    args = p.parse_args()

    for case, cell, hidden, batch, plan, gpu, log in cases(args, args.dtype):
        template = template_for(plan, gpu.target())
        key = records.key_for(plan, gpu, template.name)
        found = records.load(log)
        space = ConfigSpace(plan, gpu, template)
        seeds = [
            c
            for c in carried_seeds(found, plan, template, gpu, key, args.top, "batch_groups", SPLITS)
            if space.index(c) is not None
        ][: args.most]
        res = seeded(args, cell, hidden, batch, args.dtype, log, seeds)
        mine = records.ranked(records.load(log), key)
        first = next((f"{r.per_step_s * 1e6:.3f}" for r in mine if seeds and r.config == seeds[0].as_dict()), "-")
        best = f"{res.best.per_step_s * 1e6:.3f} us/step {res.best.config}" if res.best else "none"
        print(
            f"{case} {args.dtype}: {len(seeds)} seeded, {len(res.new)} measured ({res.errors} errors); "
            f"carried default {first}; best {best}",
            flush=True,
        )


if __name__ == "__main__":  # build workers are spawned and import this file
    main()

"""Tune every shape of a matrix on this GPU, appending to one log: how tuning_logs/ is produced.

    python bench/tune_matrix.py [--cells rnn_tanh lstm gru] [--hidden 256 512 1024] [--batch 1 4 16]
                                [--trials 64] [--log tuning_logs/sm_90.jsonl]

Prints one line per shape: trials, errors, default and tuned time, speedup, wall time.
"""

import argparse
import os

from prnn_tvm.tune import tune


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["rnn_tanh", "lstm", "gru"])
    p.add_argument("--hidden", nargs="+", type=int, default=[256, 512, 1024])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--log", default=None, help="default: the package's tuning_logs/<arch>.jsonl")
    args = p.parse_args()

    for cell in args.cells:
        for hidden in args.hidden:
            for batch in args.batch:
                res = tune(
                    cell,
                    hidden,
                    batch,
                    seq_len=args.seq,
                    trials=args.trials,
                    log_path=args.log,
                    workers=args.workers,
                    progress=False,
                )
                best = res.best.per_step_s * 1e6 if res.best else float("nan")
                default = res.default.per_step_s * 1e6 if res.default else float("nan")
                print(
                    f"{cell:9s} H={hidden:<5d} B={batch:<3d} {len(res.new):3d} trials {res.errors:2d} errors  "
                    f"default {default:6.2f}  tuned {best:6.2f} us/step  {default / best:5.2f}x  "
                    f"{res.seconds:5.1f} s",
                    flush=True,
                )


if __name__ == "__main__":  # build workers are spawned and import this file
    main()

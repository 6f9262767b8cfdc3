"""Data-parallel training throughput on one GPU and on two: ``examples/ddp_train.py`` run four times, for
``prnn_tvm.torch.LSTM`` and for ``torch.nn.LSTM`` (cuDNN), each in one process without DDP and under ``torchrun``
with one process per GPU (DDP over NCCL), at the same batch per GPU.

    python bench/ddp.py [--hidden 1024 --batch 16 --seq 256 --steps 30 --name ddp-h100]
    python bench/ddp.py --device cpu --hidden 32 --seq 16 --batch 4 --steps 5 --out /tmp/ddp.md   # a smoke run

Throughput is sequences per second over ``--steps`` Adam steps after ``--warmup`` (the example's clock: the GPU
synchronized and the ranks met at a barrier on both sides), summed over the ranks; scaling is the two-GPU figure
over the one-GPU one (issue 52's target: at least 1.8x for the LSTM fp32 H=1024, B=16 per GPU). Each run's final
check (every rank's parameters equal rank 0's) must pass. Writes ``bench/results/<name>.md`` (or ``--out``).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_train.py"
RESULTS = Path(__file__).parent / "results"
TARGET = 1.8  # two GPUs against one (issue 52)
MODULES = {"prnn": "prnn_tvm.torch.LSTM", "torch": "torch.nn.LSTM (cuDNN on the GPU)"}


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 1024), ("batch", 16), ("seq", 256), ("steps", 30), ("warmup", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--gpus", type=int, default=2, help="processes of the data-parallel runs")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo processes (a smoke run)")
    p.add_argument("--name", default="ddp-h100", help="the result's name under bench/results/")
    p.add_argument("--out", type=Path, help="write the table here instead")
    p.add_argument("--timeout", type=int, default=900, help="seconds one run may take")
    return p.parse_args()


def run(args, module: str, processes: int | None) -> dict:
    """One run of the example: ``processes`` ranks under torchrun, or None: one process without DDP. Its JSON
    summary; SystemExit with the run's output when it fails (a final check that does not pass included)."""
    sizes = ["--hidden", args.hidden, "--batch", args.batch, "--seq", args.seq, "--steps", args.steps]
    backend = "nccl" if args.device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as folder:
        summary = Path(folder) / "summary.json"
        tail = [*map(str, sizes), "--warmup", str(args.warmup), "--module", module, "--backend", backend]
        tail += ["--json", str(summary)]
        if processes is None:
            command = [sys.executable, str(EXAMPLE), "--plain", *tail]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
            command += [str(EXAMPLE), *tail]
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0 or not summary.exists():
            sys.exit(f"{' '.join(command)} failed (status {done.returncode}):\n{done.stdout}\n{done.stderr}")
        print(done.stdout, flush=True)
        return json.loads(summary.read_text())


def table(args, results: dict) -> str:
    """The markdown page: the command, the sizes, one row per module."""
    gpu = args.device == "cuda"
    one, many = ("1 GPU", f"{args.gpus} GPUs") if gpu else ("1 process", f"{args.gpus} processes")
    each = "per GPU" if gpu else "per process"
    first, ddp = next(iter(results.values()))
    lines = [
        f"# Data-parallel training: {one} and {many} ({first['device']}, {datetime.date.today()})",
        "",
        f"`python bench/ddp.py {' '.join(sys.argv[1:])}`. {first['layers']}x{args.hidden} LSTM (input "
        f"{first['input']}) and a linear head, float32 (TF32 off), batch {args.batch} {each}, T={args.seq}, Adam; "
        f"sequences/s over {args.steps} steps after {args.warmup} warm-up steps, summed over the ranks "
        f"(`examples/ddp_train.py`). {one}: one process without DDP; {many}: {ddp['mode']}, under "
        f"torchrun. Target (issue 52): {many} >= {TARGET}x {one}'s. Host CPUs in this process's affinity: "
        f"{len(os.sched_getaffinity(0))}.",
        "",
        f"| module | {one}: sequences/s (ms per step) | {many}: sequences/s (ms per step, each rank) | scaling | "
        "final check |",
        "|---|---|---|---|---|",
    ]
    for module, (single, parallel) in results.items():
        scaling = parallel["total_sequences_per_s"] / single["total_sequences_per_s"]
        ranks = ", ".join(f"{ms:.2f}" for ms in parallel["ms_per_step"])
        checked = "passed" if single["check_passed"] and parallel["check_passed"] else "FAILED"
        lines.append(
            f"| {MODULES[module]} | {single['total_sequences_per_s']:.1f} ({single['ms_per_step'][0]:.2f}) | "
            f"{parallel['total_sequences_per_s']:.1f} ({ranks}) | {scaling:.2f}x | {checked} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments()
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < args.gpus:
            sys.exit(f"--gpus {args.gpus} needs {args.gpus} CUDA GPUs, found {torch.cuda.device_count()}")
    results = {module: (run(args, module, None), run(args, module, args.gpus)) for module in MODULES}
    page = table(args, results)
    out = args.out or RESULTS / f"{args.name}.md"
    out.write_text(page)
    print(page + f"\nwritten to {out}")


if __name__ == "__main__":
    main()

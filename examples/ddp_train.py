"""Data-parallel training of a model holding ``prnn_tvm.torch.LSTM``, under
``torch.nn.parallel.DistributedDataParallel``: one process per GPU, each training on its own slice of every
global batch, the gradients averaged across processes by DDP (NCCL on GPUs, gloo on the CPU).

    torchrun --nproc_per_node=2 examples/ddp_train.py [--hidden 1024 --batch 16 --seq 256 --steps 30]
    torchrun --nproc_per_node=2 examples/ddp_train.py --backend gloo --hidden 32 --seq 16   # CPU processes
    python examples/ddp_train.py --plain [...]   # one process, no DDP: the one-GPU baseline

The model is a sequence regressor: an LSTM (``--layers``) and a linear head, trained with Adam on synthetic
data (each rank draws its own batches; ``--batch`` is per process). The parameters and the autograd backward
of ``prnn_tvm.torch`` modules are torch's own, so DDP works on them as on any module: it broadcasts rank 0's
parameters at the start and all-reduces the gradients during the backward. ``--module torch`` trains
``torch.nn.LSTM`` instead (cuDNN on the GPU), for comparison. float32 with TF32 off.

Rank 0 prints each rank's throughput (sequences per second over the ``--steps`` after ``--warmup`` steps, the
first of which compiles the layer, or loads it from the layer cache) and their sum, then the final check:
every rank's parameters equal rank 0's bit for bit and the loss finite, else exit status 1. ``--json PATH``
writes rank 0's summary (``bench/ddp.py`` reads it).
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import prnn_tvm.torch as pt


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--input", type=int, default=None, help="input width (default: --hidden)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--batch", type=int, default=16, help="sequences per process and step")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first compiles)")
    p.add_argument("--module", choices=["prnn", "torch"], default="prnn")
    p.add_argument(
        "--backend", choices=["auto", "nccl", "gloo"], default="auto", help="auto: nccl with CUDA, else gloo"
    )
    p.add_argument("--plain", action="store_true", help="one process without a process group or DDP")
    p.add_argument("--json", help="write rank 0's summary here")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 1:
        p.error(f"--steps and --warmup must be at least 1 (got {args.steps} and {args.warmup})")
    return args


def join(args) -> tuple[str, int, int, torch.device]:
    """Join the process group (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address): the backend,
    this process's rank, the world size, and its device (with NCCL, the GPU of its local rank)."""
    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if args.plain and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.exit("--plain trains in one process: run it with python, or torchrun --nproc_per_node=1")
    if not args.plain and "RANK" not in os.environ:
        sys.exit("run under torchrun (torchrun --nproc_per_node=N examples/ddp_train.py), or pass --plain")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            sys.exit(
                f"the nccl backend needs a GPU per process: local rank {local_rank}, {torch.cuda.device_count()} "
                "GPUs here (use --backend gloo for CPU processes)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before the group: NCCL's communicators live on the current device
    if args.plain:
        return backend, 0, 1, device
    dist.init_process_group(backend)
    return backend, dist.get_rank(), dist.get_world_size(), device


class Regressor(torch.nn.Module):
    """An LSTM and a linear head over every step: (T, B, input) -> (T, B)."""

    def __init__(self, lstm: torch.nn.Module):
        super().__init__()
        self.lstm = lstm
        self.head = torch.nn.Linear(lstm.hidden_size, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out).squeeze(-1)


def synthetic_batches(args, n_in: int, rank: int, device, count: int = 4) -> list:
    """``count`` batches of this rank's own: inputs, and as target the running mean of the input's first feature."""
    draw = torch.Generator(device=device).manual_seed(1 + rank)
    batches = []
    for _ in range(count):
        x = torch.randn(args.seq, args.batch, n_in, device=device, generator=draw)
        counts = torch.arange(1, args.seq + 1, device=device, dtype=x.dtype).unsqueeze(1)
        batches.append((x, x[..., 0].cumsum(0) / counts))
    return batches


def train(args, trained: torch.nn.Module, batches: list, device) -> tuple[float, float, float]:
    """Adam on ``batches`` in turn: ``args.warmup`` steps (the first compiles the layer, or loads it from the layer
    cache), then ``args.steps`` timed ones. Returns the first and the last loss, and the timed steps' seconds."""
    optimizer = torch.optim.Adam(trained.parameters(), lr=3e-3)

    def step(i: int) -> torch.Tensor:
        x, target = batches[i % len(batches)]
        loss = torch.nn.functional.mse_loss(trained(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # under DDP: the gradients all-reduced (averaged) across ranks, bucket by bucket
        optimizer.step()
        return loss.detach()

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if dist.is_initialized():
            dist.barrier()

    first = step(0).item()
    for i in range(1, args.warmup):
        step(i)
    synchronize()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = step(i)
    synchronize()
    return first, loss.item(), time.perf_counter() - start


def compare_ranks(model: torch.nn.Module, mine: torch.Tensor, world: int) -> tuple[list, float]:
    """Every rank's ``mine`` (gathered), and the largest difference of any rank's parameters from rank 0's."""
    if world == 1:
        return [mine.tolist()], 0.0
    rates = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(rates, mine)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    rank0 = params.clone()
    dist.broadcast(rank0, src=0)
    differs = (params - rank0).abs().max().double()
    dist.all_reduce(differs, op=dist.ReduceOp.MAX)
    return [t.tolist() for t in rates], differs.item()


def main() -> int:
    args = arguments()
    backend, rank, world, device = join(args)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    n_in = args.input or args.hidden
    torch.manual_seed(0)  # one initialization everywhere (DDP broadcasts rank 0's anyway)
    lstm = torch.nn.LSTM(n_in, args.hidden, num_layers=args.layers)
    model = Regressor(pt.from_torch(lstm) if args.module == "prnn" else lstm).to(device)
    trained = model
    if not args.plain:
        trained = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    first_loss, last_loss, seconds = train(args, trained, synthetic_batches(args, n_in, rank, device), device)
    if args.module == "prnn":
        model.lstm.check()  # a barrier timeout in any of the kernels raises here

    mine = torch.tensor([args.batch * args.steps / seconds, seconds], dtype=torch.float64, device=device)
    rates, largest = compare_ranks(model, mine, world)
    ok = largest == 0 and math.isfinite(last_loss)
    if rank == 0:
        report(args, backend, world, device, rates, largest, ok, (first_loss, last_loss), n_in)
    if not args.plain:
        dist.destroy_process_group()
    return 0 if ok else 1


def report(args, backend, world, device, rates, largest, ok, losses, n_in) -> None:
    """Rank 0's lines: each rank's sequences/s, their sum, the final check; the JSON summary with --json."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    what = "prnn_tvm.torch.LSTM" if args.module == "prnn" else "torch.nn.LSTM"
    mode = "one process, no DDP" if args.plain else f"DDP over {backend}, {world} processes"
    print(
        f"# {what} {args.layers}x{args.hidden} (input {n_in}), batch {args.batch} per process, T={args.seq}, "
        f"float32, {mode} on {name}\n"
    )
    for r, (rate, seconds) in enumerate(rates):
        print(f"rank {r}: {rate:.1f} sequences/s ({seconds / args.steps * 1e3:.2f} ms per step)")
    total = sum(rate for rate, _ in rates)
    print(f"all ranks: {total:.1f} sequences/s over {args.steps} steps")
    print(
        f"final check {'passed' if ok else 'FAILED'}: parameters identical on {world} rank(s) after "
        f"{args.warmup + args.steps} steps (largest difference {largest:.1e}); loss {losses[0]:.4f} -> {losses[1]:.4f}"
    )
    if args.json:
        summary = {
            "module": what,
            "device": name,
            "mode": mode,
            "world": world,
            "hidden": args.hidden,
            "input": n_in,
            "layers": args.layers,
            "batch_per_rank": args.batch,
            "seq": args.seq,
            "steps": args.steps,
            "sequences_per_s": [rate for rate, _ in rates],
            "ms_per_step": [s / args.steps * 1e3 for _, s in rates],
            "total_sequences_per_s": total,
            "check_passed": ok,
            "loss": list(losses),
        }
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown, as multiprocessing's workers do: gloo's threads may still be letting
    # go of the last collectives' tensors, and one of them taking the GIL while the interpreter exits aborts the
    # process ("terminate called without an active exception"; seen on the CPU about one run in ten).
    os._exit(code)

"""The kernels a public call runs, ours against cuDNN's, with their launch shapes, on the GPU.

    python bench/call_kernels.py [--seq 256 --number 3]

For each LSTM float16 shape, ``prnn_tvm.torch.from_torch(m)(x)`` and ``m(x)`` (cuDNN, whose persistent
kernel runs at a batch that is a multiple of 8) are each called ``--number`` times under
``torch.profiler``; every GPU kernel of a call is listed with its mean time, its grid, block, registers
per thread and shared memory (what CUPTI reports). It shows what a call costs beyond its recurrent kernel
(the projection, a bias pass, initialization kernels) and how cuDNN lays out its persistent kernel.

    python bench/call_kernels.py --heads 12 --seq 1024

lists instead the kernels of the head-wise LSTM's module call at FlashRNN's shape (``prnn_tvm.torch.Recurrent``,
``lstm_h<heads>``, hidden 768, batch 16, bfloat16; cuDNN has no head-wise LSTM): what the call costs besides its
recurrent kernel (issue 49's target is the whole call).
"""

import functools
import json
import os
import tempfile
from collections import defaultdict

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines

SHAPES = [(256, 8), (256, 16), (512, 8), (512, 16), (1024, 8), (1024, 16), (1024, 64)]

args = baselines.script_arguments(number=3, heads=0)


def kernels(call, number: int) -> list:
    """``(mean us, launches per call, grid, block, registers, shared bytes, name)`` of each kernel ``call`` runs."""
    with torch.no_grad():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(number):
                call()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    seen = defaultdict(list)
    for e in events:
        a = e["args"]
        seen[(e["name"], tuple(a["grid"]), tuple(a["block"]), a["registers per thread"], a["shared memory"])].append(
            e["dur"]
        )
    return [(sum(d) / len(d), len(d) // number, *key[1:], key[0]) for key, d in seen.items()]


def show(who: str, rows: list) -> None:
    print(f"\n{who}: {sum(r[0] * r[1] for r in rows):.1f} us of kernels per call")
    for us, per_call, grid, block, regs, smem, name in rows:
        print(f"  {us:8.1f} x{per_call:<3d} grid={list(grid)} block={list(block)} regs={regs} smem={smem}  {name[:80]}")


if args.heads:
    spec, H, B = f"lstm_h{args.heads}", 768, 16
    print(f"{spec} bfloat16, T={args.seq}, {args.number} calls; us per launch")
    module = pt.Recurrent(spec, H, H, device="cuda", dtype=torch.bfloat16).eval()
    x = torch.randn(args.seq, B, H, device="cuda", dtype=torch.bfloat16)
    show(f"ours {spec} H={H} B={B}", kernels(functools.partial(module, x), args.number))
    raise SystemExit

print(f"LSTM float16, T={args.seq}, {args.number} calls each; us per launch")
for H, B in SHAPES:
    module = torch.nn.LSTM(H, H).cuda().half().eval()
    ours = pt.from_torch(module)
    x = torch.randn(args.seq, B, H, device="cuda", dtype=torch.half)
    for who, fn in (("cuDNN", module), ("ours", ours)):
        show(f"{who} H={H} B={B}", kernels(functools.partial(fn, x), args.number))

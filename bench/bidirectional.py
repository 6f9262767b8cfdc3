"""Bidirectional layers on the GPU: the two directions of each layer side by side (two streams, the
default) against one after the other, and against cuDNN, through the public calls (fp32, TF32 off).

    python bench/bidirectional.py [--seq 256 --repeats 7 --number 5]

Each direction is its own persistent kernel; side by side they overlap where the GPU holds both grids
at once (*grids that fit* at least 2), and only there does a module run them so (else the second would
wait for SMs: both columns then time one after the other). Every figure is the median of CUDA-event
runs in one process (``prnn_tvm.bench.baselines.cuda_event_times``).
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines

SHAPES = [("LSTM", 256, 1, 1), ("LSTM", 512, 4, 1), ("GRU", 512, 4, 1), ("LSTM", 512, 8, 2), ("LSTM", 1024, 4, 1)]

args = baselines.script_arguments(number=5)
T = args.seq
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"# bidirectional layers, T={T}, fp32, {torch.cuda.get_device_name()} ({sms} SMs), ms per call, median\n")
print("| module | CTAs per direction | grids that fit | side by side | one after the other | gain | cuDNN | "
      "cuDNN / ours |")
print("|---|---|---|---|---|---|---|---|")


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def row(kind: str, H: int, B: int, layers: int) -> str:
    ref = getattr(torch.nn, kind)(H, H, num_layers=layers, bidirectional=True).cuda().eval()
    fast = pt.from_torch(ref)
    x = torch.randn(T, B, H, device="cuda")
    times = {}
    with torch.no_grad():
        for concurrent in (True, False):
            fast.concurrent_directions = concurrent
            times[concurrent] = ms(lambda: fast(x))
        cudnn = ms(lambda: ref(x))
        error = (fast(x)[0] - ref(x)[0]).abs().max().item()
    fast.check()
    layer = fast.layer_for(B, x.device)
    return (f"| {kind} {layers}x H={H} B={B} | {layer.report.ctas} | {layer.grids_that_fit()} | {times[True]:.3f} | "
            f"{times[False]:.3f} | "
            f"{times[False] / times[True]:.2f}x | {cudnn:.3f} | {cudnn / times[True]:.2f}x (max diff {error:.1e}) |")


for shape in SHAPES:
    print(row(*shape), flush=True)

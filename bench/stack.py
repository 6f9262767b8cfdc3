"""Stacked layers on the GPU: one wavefront launch for the whole stack (``compile_cell(..., layers=)``, what a
one-directional ``prnn_tvm.torch`` stack runs in inference where it fits) against its layers one after the
other, and against cuDNN, through the public calls; and the wavefront's step against one layer's.

    python bench/stack.py [--seq 256 --repeats 7 --number 5]

*wavefront* and *layer by layer* time the same module (``module.wavefront`` on and off); *step, stack /
one layer* is the recurrent kernel alone, microseconds per step, of the stack (one wavefront step: every
layer advances) and of one layer of the same cell and shape (``prnn_tvm.checks.time_layer``, the minimum of
its repeats), each with its tuned or default config. Call figures are the median of CUDA-event runs in one
process (``prnn_tvm.bench.baselines.cuda_event_times``), TF32 off.
"""

import torch

import prnn_tvm
import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines
from prnn_tvm.checks import time_layer

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
SHAPES = [
    ("LSTM", 512, 8, 4, "fp16"),
    ("LSTM", 256, 8, 4, "fp16"),
    ("GRU", 512, 4, 2, "fp16"),
    ("LSTM", 512, 4, 2, "fp32"),
    ("LSTM", 256, 4, 3, "fp32"),
    ("LSTM", 1024, 4, 2, "fp32"),
]

args = baselines.script_arguments(number=5)
T = args.seq
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"# stacked layers, T={T}, {torch.cuda.get_device_name()} ({sms} SMs), ms per call (median), us per step\n")
print("| module | wavefront | layer by layer | gain | cuDNN | cuDNN / ours | step, stack / one layer | config |")
print("|---|---|---|---|---|---|---|---|")


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def row(kind: str, H: int, B: int, layers: int, dtype: str) -> str:
    ref = getattr(torch.nn, kind)(H, H, num_layers=layers).cuda().to(DTYPES[dtype]).eval()
    fast = pt.from_torch(ref)
    fast.batch_buckets = False  # the kernels of batch B itself, whose stack is read below
    x = torch.randn(T, B, H, device="cuda", dtype=DTYPES[dtype])
    times = {}
    with torch.no_grad():
        for wavefront in (True, False):
            fast.wavefront = wavefront
            times[wavefront] = ms(lambda: fast(x))
        fast.wavefront = True
        cudnn = ms(lambda: ref(x))
        error = (fast(x)[0] - ref(x)[0]).abs().max().item()
    fast.check()
    (note,) = fast.stack_notes.values()
    name = f"| {kind} {layers}x H={H} B={B} {dtype} |"
    stack = fast.stack_for(B, x.device)
    if stack is None:
        return f"{name} - | {times[False]:.3f} | - | {cudnn:.3f} | {cudnn / times[False]:.2f}x | - | {note} |"
    one = prnn_tvm.compile_cell(kind.lower(), H, B, dtype=stack.plan.dtype)
    # per step the kernel runs: a stack runs T + layers - 1 of them
    steps = [time_layer(layer, T).recurrent_s / (T + layer.plan.lag) * 1e6 for layer in (stack, one)]
    config = " ".join(f"{k}={v}" for k, v in stack.report.config.items())
    return (
        f"{name} {times[True]:.3f} | {times[False]:.3f} | {times[False] / times[True]:.2f}x | {cudnn:.3f} | "
        f"{cudnn / times[True]:.2f}x (max diff {error:.1e}) | {steps[0]:.2f} / {steps[1]:.2f} = "
        f"{steps[0] / steps[1]:.2f}x | {config} ({stack.report.config_origin.value}) |"
    )


for shape in SHAPES:
    print(row(*shape), flush=True)

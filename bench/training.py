"""A training step through the public calls on the GPU: forward, a loss over every output, and
``loss.backward()`` for ``prnn_tvm.torch.from_torch(m)`` (the persistent forward that saves its
states and products, the persistent backward, torch's GEMMs for the weights' gradients) against
``m`` itself (cuDNN) in the same dtype: fp32 with TF32 off, fp16 and bf16.

    python bench/training.py [--seq 256]

Each figure is the median of CUDA-event runs in one process
(``prnn_tvm.bench.baselines.cuda_event_times``), gradients cleared inside every call of both.
The gradients (input, initial states, every parameter) are compared with cuDNN's first: the
largest difference relative to that gradient's largest entry.
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines
from prnn_tvm.bench.training_step import case, step
from prnn_tvm.checks import abs_error, worst

CASES = [
    ("LSTM", 1024, 4, torch.float32),
    ("LSTM", 1024, 16, torch.float32),
    ("LSTM", 512, 4, torch.float32),
    ("GRU", 1024, 4, torch.float32),
    ("GRU", 512, 16, torch.float32),
    ("LSTM", 1024, 4, torch.float16),
    ("LSTM", 1024, 16, torch.float16),
    ("GRU", 1024, 16, torch.float16),
    ("LSTM", 1024, 16, torch.bfloat16),
    ("LSTM", 1536, 16, torch.float16),
]

args = baselines.script_arguments(number=10)
T = args.seq


def ms(fn, *arguments) -> float:
    """Median milliseconds of ``fn(*arguments)``."""
    return baselines.cuda_event_times(lambda: fn(*arguments), args.repeats, args.number)[0] * 1e3


print(
    "case | training step: prnn-tvm ms, cuDNN ms, speedup | forward alone: prnn-tvm ms, cuDNN ms | "
    "gradients' relative difference"
)
for kind, H, B, dtype in CASES:
    ref, x, hx = case(kind, H, B, dtype, T)
    fast = pt.from_torch(ref)
    want, got = [g.clone() for g in step(ref, x, hx)], step(fast, x, hx)
    err = worst(abs_error(g, w) / w.abs().max().item() for w, g in zip(want, got))
    ours, cudnn = ms(step, fast, x, hx), ms(step, ref, x, hx)
    with torch.no_grad():
        ours_fwd, cudnn_fwd = ms(fast, x), ms(ref, x)
    fast.check()
    print(
        f"{kind} H={H} B={B} {str(dtype)[6:]} T={T} | {ours:.3f}, {cudnn:.3f}, {cudnn / ours:.2f}x | {ours_fwd:.3f}, "
        f"{cudnn_fwd:.3f} | {err:.1e}",
        flush=True,
    )

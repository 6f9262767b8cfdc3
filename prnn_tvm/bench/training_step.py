"""The training step the training benchmarks time (``bench/training.py``, ``bench/training_parts.py``,
``bench/backward_timeline.py``): a case's inputs, and one step's GPU work, gradients cleared, forward, a loss over
every output and final state, ``backward()``; optionally each part inside a context (a profiler's range)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable

import torch

PARTS = ("zero_grad", "forward", "loss", "backward")


def cell_arguments(several: bool) -> argparse.Namespace:
    """The command line of the benchmarks of a cell's training step through ``prnn_tvm.torch.Recurrent``
    (``bench/cell_*.py``): ``--spec`` (sLSTM of 12 heads by default; several where ``several``), ``--dtype``, the sizes
    (FlashRNN's headline shape) and the timing's ``--repeats`` and ``--number``. Float32 GEMMs without TF32, torch
    seeded."""
    p = argparse.ArgumentParser()
    p.add_argument("--spec", nargs="+" if several else None, default=["slstm_h12"] if several else "slstm_h12")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    for name, default in {"hidden": 768, "batch": 16, "seq": 1024, "repeats": 5, "number": 2}.items():
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    return args


def case(kind: str, hidden: int, batch: int, dtype: torch.dtype, seq: int) -> tuple:
    """``(module, x, hx)``: ``torch.nn.<kind>(hidden, hidden)`` on the GPU in ``dtype``, in training mode; an input
    of ``seq`` steps and initial states (two for an LSTM), every one requiring its gradient."""
    ref = getattr(torch.nn, kind)(hidden, hidden).cuda().to(dtype).train()
    x = torch.randn(seq, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
    hx = [
        (0.5 * torch.randn(1, batch, hidden, device="cuda", dtype=dtype)).requires_grad_()
        for _ in range(2 if kind == "LSTM" else 1)
    ]
    return ref, x, hx


def step(module, x, hx, part: Callable[[str], contextlib.AbstractContextManager] | None = None) -> list:
    """One training step's GPU work: gradients cleared, forward, loss, backward, each inside ``part(name)`` (one of
    :data:`PARTS`) where given. Returns the gradients (input, initial states, every parameter)."""
    part = part or (lambda name: contextlib.nullcontext())
    leaves = [x, *hx, *module.parameters()]
    with part("zero_grad"):
        for t in leaves:
            t.grad = None
    with part("forward"):
        out, finals = module(x, tuple(hx) if len(hx) > 1 else hx[0])
    with part("loss"):
        finals = finals if len(hx) > 1 else (finals,)
        # summed (per batch row) in float32: a mean over every element would push half gradients below fp16's range
        loss = (out.float().square().sum() + sum(f.float().sum() for f in finals)) / x.shape[1]
    with part("backward"):
        loss.backward()
    return [t.grad for t in leaves]

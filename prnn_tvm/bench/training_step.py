"""The training step the training benchmarks time (``bench/training.py``, ``bench/training_parts.py``,
``bench/backward_timeline.py``): a case's inputs, and one step's GPU work, gradients cleared, forward, a loss over
every output and final state, ``backward()``; optionally each part inside a context (a profiler's range)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

PARTS = ("zero_grad", "forward", "loss", "backward")


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

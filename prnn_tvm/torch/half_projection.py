"""The input projection of a call that trains, differentiable by autograd: a half layer's as half GEMMs forward and
backward (:class:`HalfProjection`), a float32 layer's as torch's own ``linear``."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import

from .projection import project


def trained_projection(
    x: torch.Tensor, W_ih: torch.Tensor, b_ih: torch.Tensor | None, biased_weight=None
) -> torch.Tensor:
    """:func:`project` differentiable by autograd, for a call that trains: float32 (and float64) layers through
    torch's own ``linear``; half layers through :class:`HalfProjection` (half GEMMs forward and backward)."""
    if x.dtype in (torch.float32, torch.float64):
        return torch.nn.functional.linear(x, W_ih, b_ih)
    return HalfProjection.apply(x, W_ih, b_ih, biased_weight)


class HalfProjection(torch.autograd.Function):
    """A half layer's input projection with a backward of its own, on the tensor cores as the forward is.

    Forward: :func:`project` (half GEMM, float32 accumulation, float32 ``xp``). Backward: the float32 ``d_xp``
    (the recurrent kernel's) is rounded to the half type once, then ``d_x = d_xp @ W_ih`` and ``d_W_ih =
    d_xp^T x`` are half GEMMs with float32 accumulation whose results come in the parameters' type, and
    ``d_b_ih`` is ``d_xp`` summed in float32. That one rounding (2^-11 relative for float16, 2^-8 for bfloat16) is
    the one the tensor-core backward makes of each step's gate gradients before multiplying them (the recurrent
    weights' gradients are the same half GEMMs over them): the same bound holds (``checks.plan_tolerance``).
    Widened to float32 instead, the three GEMMs ran on CUDA cores: 2.0 ms of a 4.9 ms training step (LSTM fp16
    H=1024 B=16 T=256, H100), against cuDNN's 0.28 ms of half GEMMs. Arguments: ``x`` (T, B, I), ``W_ih``, ``b_ih``
    (or None), ``biased_weight`` (:func:`project`'s)."""

    @staticmethod
    def forward(ctx, x, W_ih, b_ih, biased_weight=None):
        ctx.save_for_backward(x, W_ih)
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        return project(x, W_ih, b_ih, biased_weight=biased_weight)

    @staticmethod
    def backward(ctx, d_xp):
        x, W_ih = ctx.saved_tensors
        wants_x, wants_W, wants_b = ctx.needs_input_grad[:3]
        rows = d_xp.reshape(-1, d_xp.shape[-1])
        d = rows.to(x.dtype)  # the one rounding
        d_x = (d @ W_ih).view(x.shape) if wants_x else None
        d_W = d.t() @ x.reshape(-1, x.shape[-1]) if wants_W else None
        d_b = rows.sum(0, dtype=torch.float32).to(ctx.bias_dtype) if wants_b else None
        return d_x, d_W, d_b, None


"""The input projection of a call on torch tensors: ``x @ W_ih.T + b_ih`` for every step as one GEMM (cuBLAS on
the GPU), in the recurrent kernel's ``xp`` type, the tensors a half projection derives from the parameters, and its
gradients in a call that trains on the GPU (``autograd.CudaBackprop``, which runs it with the recurrent kernels)."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import

# Elements of a half projection from which its bias is added inside the GEMM (``project``). On the H100,
# T=256, the projection alone (`scratch`, median of 5 x 50), separate add_ / bias in the GEMM, ms: 2^24
# elements (LSTM H=1024 B=16, H=512 B=32, H=256 B=64) 0.134 / 0.088, 0.114 / 0.077, 0.104 / 0.074; 2^23
# (H=1024 B=8, H=512 B=16, H=256 B=32) 0.068 / 0.060, 0.057 / 0.068, 0.052 / 0.064; 2^22 and less:
# 0.042-0.045 / 0.060-0.075.
BIAS_IN_GEMM = 1 << 24


def project(
    x: torch.Tensor, W_ih: torch.Tensor, b_ih: torch.Tensor | None, biased_weight=None, rounded: bool = False
) -> torch.Tensor:
    """``x @ W_ih.T + b_ih`` for every step as one GEMM (cuBLAS on the GPU) in the recurrent kernel's ``xp``
    type: float32 layers follow torch's TF32 setting; half layers multiply on tensor cores into float32 (a call
    that trains on the GPU differentiates it with its kernels, :func:`projection_gradients`), or with ``rounded``
    into their own type (:func:`rounds`). :func:`projector` says how."""
    return projector(W_ih, b_ih, biased_weight, rounded)(x)


def rounds(layer) -> bool:
    """Whether ``layer``'s recurrent launch reads its input projection ``xp`` in the layer's own type: a half layer
    built with the tensor-core template's ``half_xp`` (a float32 layer's is float32 either way)."""
    signature = layer.signature
    return signature.launch("recurrent").arg("xp").dtype == signature.dtype


def projector(W_ih: torch.Tensor, b_ih: torch.Tensor | None, biased_weight=None, rounded: bool = False):
    """The inference projection with its weights bound, ``x -> xp``: what a repeated call keeps
    (:mod:`~prnn_tvm.torch.repeat`), the transposed weight made once.

    ``rounded`` (a half layer on the GPU whose kernel reads ``xp`` in the half type, :func:`rounds`): the GEMM
    accumulates in float32 and rounds once into the half type, the bias added in cuBLAS's epilogue (``addmm``):
    half the bytes written (H100, 768 x 16 bf16 LSTM, T=1024: 116.7 us against 202.2 into float32,
    ``bench/half_xp.py``).

    A half GEMM into float32 has no bias epilogue in torch (``addmm`` with ``out_dtype`` measured as slow as
    the GEMM and a separate ``add_``). The ``add_`` reads and writes the float32 result: at
    :data:`BIAS_IN_GEMM` elements and more (LSTM H=1024 B=16 T=256) it costs as much as the GEMM, so there
    the bias rides in the GEMM: ``x`` padded with columns of ones times ``[W_ih | b_ih | 0]`` (the bias
    multiplied by one and summed in float32: the same value), ``biased_weight(W_ih, b_ih)`` making that
    matrix. Below, the padded GEMM measured slower than the two kernels. Where the cell's plan lets params carry
    ``b_ih`` (:attr:`~prnn_tvm.frontend.plan.CellPlan.input_bias`, folded by the caller), ``b_ih`` is None: the
    GEMM alone."""
    if W_ih.dtype in (torch.float32, torch.float64):  # float64: the CPU build's
        return lambda x: torch.nn.functional.linear(x, W_ih, b_ih)  # one addmm over the (T * B) rows
    if W_ih.device.type != "cuda":  # a half layer on the CPU: float32 math
        return lambda x: torch.nn.functional.linear(x.float(), W_ih.float(), None if b_ih is None else b_ih.float())
    transposed, gates = W_ih.t(), W_ih.shape[0]
    if rounded:
        if b_ih is None:  # carried by the recurrent bias (folded)
            return lambda x: torch.mm(x.view(-1, x.shape[2]), transposed).view(*x.shape[:2], -1)
        return lambda x: torch.addmm(b_ih, x.view(-1, x.shape[2]), transposed).view(*x.shape[:2], -1)

    def half(x: torch.Tensor) -> torch.Tensor:
        T, B, _ = x.shape
        rows = x.view(T * B, -1)
        if b_ih is None:  # carried by the recurrent bias (folded)
            return torch.mm(rows, transposed, out_dtype=torch.float32).view(T, B, -1)
        if T * B * gates < BIAS_IN_GEMM:
            return torch.mm(rows, transposed, out_dtype=torch.float32).add_(b_ih).view(T, B, -1)
        W = biased_weight(W_ih, b_ih)
        ones = torch.nn.functional.pad(rows, (0, W.shape[1] - x.shape[2]), value=1.0)
        return torch.mm(ones, W.t(), out_dtype=torch.float32).view(T, B, -1)

    return half


def summed(b_hh: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """``b_hh + b_ih`` in float32, rounded once to their type (a param carrying the input projection's bias)."""
    return (b_hh.float() + b_ih.float()).to(b_hh.dtype)


def biased(W_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """``[W_ih | b_ih | 0]``, its columns padded to a multiple of 8 (16-byte rows for the GEMM)."""
    rows, columns = W_ih.shape
    W = W_ih.new_zeros(rows, -(-(columns + 1) // 8) * 8)
    W[:, :columns] = W_ih
    W[:, columns] = b_ih
    return W


def projection_gradients(d_xp: torch.Tensor, x: torch.Tensor, W_ih: torch.Tensor, wants: tuple, bias_dtype):
    """``(d_x, d_W_ih, d_b_ih)`` of ``xp = x W_ih^T + b_ih`` from ``d_xp`` (T, B, gate rows), each None where
    ``wants`` (three flags) says it is not asked (a first layer's data takes none, and costs no GEMM).

    ``d_xp`` comes from the backward kernel in the layer's storage type: a half layer's rounded once, where the
    kernel writes it (2^-11 relative for float16, 2^-8 for bfloat16: the rounding the tensor-core backward makes of
    each step's gate gradients before multiplying them, whose weight gradients are the same half GEMMs, so the same
    bound holds, ``checks.plan_tolerance``). ``d_x = d_xp W_ih`` and ``d_W_ih = d_xp^T x`` are GEMMs in that type
    with float32 accumulation, whose results come in the parameters' type; ``d_b_ih`` is ``d_xp`` summed in float32,
    rounded to ``bias_dtype``. Widened to float32 instead, the three GEMMs ran on CUDA cores: 2.0 ms of a 4.9 ms
    training step (LSTM fp16 H=1024 B=16 T=256, H100), against cuDNN's 0.28 ms of half GEMMs; rounded here rather
    than in the kernel, the copy took 95 us a step (slstm_h12 bf16 768 x 16, T=1024)."""
    wants_x, wants_W, wants_b = wants
    rows = d_xp.reshape(-1, d_xp.shape[-1]).to(x.dtype)  # already in it, as the kernel writes it
    d_x = (rows @ W_ih).view(x.shape) if wants_x else None
    d_W = rows.t() @ x.reshape(-1, x.shape[-1]) if wants_W else None
    d_b = rows.sum(0, dtype=torch.float32).to(bias_dtype) if wants_b else None
    return d_x, d_W, d_b

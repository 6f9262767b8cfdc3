"""A product's weight gradient in ``prnn_tvm.torch`` (``autograd.weight_gradient``): a head-wise weight's as one batched
GEMM of its heads' blocks, against float64 NumPy (the dense gradient's diagonal blocks, as the plan's reference takes
them) at awkward sizes; a half weight's with half inputs within the dtype's rounding. On the CPU (torch's own GEMMs);
the GPU runs it inside every training step (``test_gpu_heads.py``)."""

import numpy as np
import pytest

from prnn_tvm.frontend.heads import diagonal_blocks

torch = pytest.importorskip("torch")
from prnn_tvm.torch.autograd import weight_gradient  # noqa: E402


@pytest.mark.parametrize(
    "rows, hidden, heads, slices",
    [
        (1, 1, 1, 1),  # hidden 1, one row (T = B = 1)
        (5, 7, 7, 4),  # heads of one unit, odd hidden
        (6, 9, 3, 4),  # odd heads
        (3, 12, 2, 3),  # GRU's three slices
        (17, 16, 1, 4),  # dense: one GEMM
    ],
)
def test_a_head_wise_gradient_is_the_dense_ones_diagonal_blocks(rows, hidden, heads, slices):
    rng = np.random.default_rng(rows * hidden + heads)
    gates, operand = rng.standard_normal((rows, slices * hidden)), rng.standard_normal((rows, hidden))
    want = diagonal_blocks(gates.T @ operand, heads)
    got = weight_gradient(torch.from_numpy(gates), torch.from_numpy(operand), slices, heads, torch.float64)
    assert got.shape == want.shape == (slices * hidden, hidden // heads)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_a_head_wise_gradient_reads_a_products_columns_of_wider_gate_gradients():
    """The training step hands each product its columns of every product's gate gradients (rows strided by the
    whole width) and its operand's columns of ``saved``: strided views, read as they are."""
    rng = np.random.default_rng(5)
    rows, hidden, heads, slices = 10, 12, 4, 3
    every = torch.from_numpy(rng.standard_normal((rows, 2 * slices * hidden)))
    saved = torch.from_numpy(rng.standard_normal((rows, 3 * hidden)))
    gates, operand = every[:, slices * hidden :], saved[:, hidden : 2 * hidden]
    assert not gates.is_contiguous() and not operand.is_contiguous()
    want = diagonal_blocks(gates.numpy().T @ operand.numpy(), heads)
    got = weight_gradient(gates, operand, slices, heads, torch.float64)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_weights_gradient_multiplies_half_values(dtype):
    """Float32 gate gradients (the float32 backward's) are rounded to the weight's type once, the operand is a half
    value already: the result is within a few of the type's rounding of the float64 product (relative to its largest
    entry), and it comes in the half type, as the parameter's gradient does."""
    half = getattr(torch, dtype)
    rng = np.random.default_rng(3)
    rows, hidden, heads, slices = 64, 24, 3, 4
    gates = torch.from_numpy(rng.standard_normal((rows, slices * hidden))).float()
    operand = torch.from_numpy(rng.standard_normal((rows, hidden))).to(half).float()  # as the forward saved it
    got = weight_gradient(gates, operand, slices, heads, half)
    want = diagonal_blocks(gates.double().numpy().T @ operand.double().numpy(), heads)
    assert got.dtype == half
    unit = 2.0 ** -(8 if dtype == "bfloat16" else 11)
    assert np.abs(got.double().numpy() - want).max() <= 4 * unit * np.abs(want).max()

"""A half layer's input projection as a call that trains runs it (``prnn_tvm.torch.half_projection``): forward and
backward as half GEMMs with float32 accumulation, ``d_xp`` rounded to the half type once, against float64 on the
same half values. On the CPU, where torch multiplies half and bfloat16 tensors; the GPU's cuBLAS path is
exercised by the training tests of ``tests/test_gpu_backward_mma.py``."""

import pytest

torch = pytest.importorskip("torch")

from prnn_tvm.checks import relative_error  # noqa: E402 - after the skip
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch.half_projection import HalfProjection, trained_projection  # noqa: E402

NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _grads_of(xp, d_xp, *tensors):
    """The gradients of ``sum(xp * d_xp)`` with respect to ``tensors`` (None where one takes none)."""
    for t in tensors:
        t.grad = None
    (xp * d_xp).sum().backward()
    return [t.grad for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_half_projection_gradients_match_float64(dtype, bias):
    torch.manual_seed(5)
    T, B, n_in, rows = 7, 5, 24, 48
    x = torch.randn(T, B, n_in).to(dtype).requires_grad_()
    W = (0.3 * torch.randn(rows, n_in)).to(dtype).requires_grad_()
    # without a bias, a module passes a constant zero one, which takes no gradient
    b = (0.1 * torch.randn(rows)).to(dtype).requires_grad_() if bias else torch.zeros(rows, dtype=dtype)
    d_xp = torch.randn(T, B, rows)  # float32, as the recurrent kernel gives it
    xp = trained_projection(x, W, b)
    assert xp.dtype == torch.float32 and xp.grad_fn.name() == "HalfProjectionBackward"
    got = _grads_of(xp, d_xp, x, W, b)

    x64, W64, d64 = x.detach().double(), W.detach().double(), d_xp.double()
    want_xp = x64 @ W64.T + b.detach().double()
    assert relative_error(xp.detach().double().numpy(), want_xp.numpy()) <= 1e-6  # float32 accumulation
    want = [d64 @ W64, d64.reshape(-1, rows).T @ x64.reshape(-1, n_in), d64.sum((0, 1))]
    bound = tolerance(NAMES[dtype], 1)
    assert got[2] is None or bias
    for name, g, w in zip(("x", "W_ih", "b_ih")[: 2 + bias], got, want):
        assert g.dtype == dtype, name  # in the parameters' type
        err = relative_error(g.double().numpy(), w.numpy())
        assert 0 < err <= bound, (name, err, bound)  # rounded (not float64), within the dtype's bound


def test_half_projection_takes_only_the_gradients_asked():
    """An input that takes no gradient (a first layer's data) gets none, and costs no GEMM."""
    x = torch.randn(3, 2, 8).half()
    W = torch.randn(16, 8).half().requires_grad_()
    b = torch.zeros(16).half()  # a constant bias (a module without biases)
    got = _grads_of(HalfProjection.apply(x, W, b, None), torch.randn(3, 2, 16), x, W, b)
    assert got[0] is None and got[2] is None and got[1].shape == W.shape


def test_float32_layers_keep_torch_linear():
    x = torch.randn(3, 2, 8, requires_grad=True)
    W, b = torch.randn(16, 8, requires_grad=True), torch.randn(16, requires_grad=True)
    xp = trained_projection(x, W, b)
    assert "HalfProjection" not in xp.grad_fn.name()
    got = _grads_of(xp, torch.ones(3, 2, 16), x, W, b)
    assert torch.allclose(got[0], W.detach().sum(0).expand(3, 2, 8))

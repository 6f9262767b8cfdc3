"""The input projection's gradients in a call that trains on the GPU (``projection.projection_gradients``): GEMMs in
the layer's type from the kernel's ``d_xp`` (a half layer's rounded once, where the kernel writes it), against
float64 on the same half values; and ``autograd.CudaBackprop``, which runs the projection with the recurrent kernels,
its arguments and gradients plumbed through with the kernels' launches replaced by arrays of their signatures. On
the CPU, where torch multiplies half and bfloat16 tensors; the GPU's path is exercised by the training tests of
``tests/test_gpu_backward_mma.py`` and ``tests/test_gpu_heads.py``."""

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm  # noqa: E402 - after the skip
from prnn_tvm.checks import relative_error  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch.autograd import CudaBackprop, weight_gradient  # noqa: E402
from prnn_tvm.torch.projection import projection_gradients  # noqa: E402

NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_projection_gradients_match_float64(dtype):
    torch.manual_seed(5)
    T, B, n_in, rows = 7, 5, 24, 48
    x = torch.randn(T, B, n_in).to(dtype)
    W = (0.3 * torch.randn(rows, n_in)).to(dtype)
    d_xp = torch.randn(T, B, rows).to(dtype)  # in the layer's type, as the kernel writes it
    got = projection_gradients(d_xp, x, W, (True, True, True), dtype)

    x64, W64, d64 = x.double(), W.double(), d_xp.double()
    want = [d64 @ W64, d64.reshape(-1, rows).T @ x64.reshape(-1, n_in), d64.sum((0, 1))]
    bound = tolerance(NAMES[dtype], 1)
    for name, g, w in zip(("x", "W_ih", "b_ih"), got, want):
        assert g.dtype == dtype and g.shape == w.shape, name  # in the parameters' type
        err = relative_error(g.double().numpy(), w.numpy())
        assert 0 < err <= bound, (name, err, bound)  # rounded (not float64), within the dtype's bound
    # a float32 d_xp (a float32 layer's) is rounded once, to the same values
    again = projection_gradients(d_xp.float(), x, W, (True, True, True), dtype)
    assert all(torch.equal(a, b) for a, b in zip(got, again))


def test_the_projection_takes_only_the_gradients_asked():
    """An input that takes no gradient (a first layer's data, a folded or absent bias) gets none, and costs no GEMM."""
    x, W = torch.randn(3, 2, 8).half(), torch.randn(16, 8).half()
    d_x, d_W, d_b = projection_gradients(torch.randn(3, 2, 16).half(), x, W, (False, True, False), None)
    assert d_x is None and d_b is None and d_W.shape == W.shape and d_W.dtype == torch.float16


class _Launches:
    """What CudaBackprop asks of its module: ``_launch``, here arrays of the launch's written arguments (random,
    in their dtypes), remembered by launch; and the hidden size."""

    def __init__(self, hidden: int):
        self.hidden_size, self.made, self.given = hidden, {}, {}

    def _launch(self, layer, xp, recurrent, function):
        self.given[function] = [xp, *recurrent]
        T = xp.shape[0]
        written = [a for a in layer.signature.launches[0].args if a.role.written]
        made = [torch.randn(*(T if d == "T" else d for d in a.shape)).to(getattr(torch, a.dtype)) for a in written]
        self.made[function] = dict(zip((a.name for a in written), made))
        return made


def test_cuda_backprop_runs_the_projection_with_the_kernels_and_plumbs_each_gradient():
    """``CudaBackprop`` projects ``x`` (no bias: the params carry it), launches the saving forward on the projection
    and, backwards, the backward on the outputs' gradients in the layer's type; ``x`` and ``W_ih`` take the
    projection's gradients from the kernel's ``d_xp``, the recurrent weight its heads' GEMM over ``d_gates`` and the
    saved operand, the param its rows' sum, each initial state its ``d_<s>0``, all in the layer's type."""
    T, B, H, n_in = 3, 2, 8, 5
    layer = prnn_tvm.compile_cell("slstm_h2", H, B, input_size=n_in, dtype="bfloat16", target="cuda", arch="sm_90",
                                  tuning_logs=[], cache=False)
    training = prnn_tvm.compile_training(layer)
    bf = torch.bfloat16
    x = torch.randn(T, B, n_in).to(bf).requires_grad_()
    W_ih = torch.randn(4 * H, n_in).to(bf).requires_grad_()
    R = torch.randn(4 * H, H // 2).to(bf).requires_grad_()
    b_hh = torch.randn(4 * H).to(bf).requires_grad_()
    states = [torch.randn(B, H).to(bf).requires_grad_() for _ in range(4)]
    lengths = torch.full((B,), T, dtype=torch.int32)
    launches = _Launches(H)
    out, *finals = CudaBackprop.apply(launches, training, x, W_ih, None, None, R, b_hh, *states, lengths)
    xp = launches.given["recurrent_save"][0]
    assert xp.dtype == torch.float32 and torch.allclose(xp, x.float() @ W_ih.float().T, rtol=1e-2, atol=1e-2)
    (out.float().sum() + sum(f.float().sum() for f in finals)).backward()
    given, d = launches.given["recurrent_backward"], launches.made["recurrent_backward"]
    names = [a.name for a in training.backward.signature.launches[0].args if a.role.data]
    d_out = given[names.index("d_out")]
    assert d_out.dtype == bf and torch.equal(d_out, torch.ones(T, B, H, dtype=bf))  # as autograd gave it
    assert d["d_xp"].dtype == bf  # the layer's type, which the projection's GEMMs take
    assert torch.equal(x.grad, (d["d_xp"].reshape(T * B, -1) @ W_ih.detach()).view(T, B, n_in))
    assert torch.equal(W_ih.grad, d["d_xp"].reshape(T * B, -1).T @ x.detach().reshape(T * B, n_in))
    saved = launches.made["recurrent_save"]["saved"]
    want_R = weight_gradient(d["d_gates"].reshape(T * B, -1), saved[:, :, :H].reshape(T * B, H), 4, 2, bf)
    assert torch.equal(R.grad, want_R)
    assert torch.equal(b_hh.grad, d["d_b_hh_rows"].sum(0).to(bf))
    for name, state in zip(("h", "c", "n", "m"), states):
        assert torch.equal(state.grad, d[f"d_{name}0"].to(bf)), name
    assert all(t.grad.dtype == bf for t in (x, W_ih, R, b_hh, *states))

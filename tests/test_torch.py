"""``prnn_tvm.torch``: the modules against ``torch.nn`` (CPU build here; CUDA with ``-m gpu``)."""

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm import ConfigError, InputError  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402


def _reference(kind, **kw):
    torch.manual_seed(0)
    ctor = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN, "rnn_relu": torch.nn.RNN}[kind]
    if kind.startswith("rnn"):
        kw["nonlinearity"] = kind[4:]
    return ctor(**kw).eval()


def _compare(kind, device, batch_first=False, bias=True, T=6, B=3, n_in=10, H=16, hx=True):
    ref = _reference(kind, input_size=n_in, hidden_size=H, batch_first=batch_first, bias=bias).to(device)
    fast = pt.from_torch(ref)
    assert fast.weight_hh_l0 is ref.weight_hh_l0  # shared, not copied
    shape = (B, T, n_in) if batch_first else (T, B, n_in)
    x = torch.randn(*shape, device=device)
    state = None
    if hx:
        h0 = 0.5 * torch.randn(1, B, H, device=device)
        state = (h0, 0.5 * torch.randn(1, B, H, device=device)) if kind == "lstm" else h0
    with torch.no_grad():
        want_out, want_h = ref(x, state)
        got_out, got_h = fast(x, state)
    assert got_out.shape == want_out.shape and got_out.device == want_out.device
    err = (got_out - want_out).abs().max().item()
    for a, b in zip(*((got_h, want_h) if kind == "lstm" else ((got_h,), (want_h,)))):
        assert a.shape == b.shape == (1, B, H)
        err = max(err, (a - b).abs().max().item())
    assert err <= tolerance("float32", T), f"{kind}: max abs error {err:.2e}"  # TF32 off on the GPU


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_cpu_matches_torch(kind):
    _compare(kind, "cpu")


def test_batch_first_no_bias_and_zero_state():
    _compare("gru", "cpu", batch_first=True, bias=False, hx=False)


def test_unbatched_input_and_batch_cache():
    ref = _reference("rnn_tanh", input_size=4, hidden_size=8)
    fast = pt.from_torch(ref)
    with torch.no_grad():
        out, h = fast(torch.randn(5, 4))
        fast(torch.randn(5, 4))
        want, _ = ref(torch.randn(5, 4))
    assert out.shape == want.shape == (5, 8) and h.shape == (1, 8)
    assert len(fast._layers) == 1  # one batch size, compiled once


def test_new_module_has_torch_layout():
    m = pt.LSTM(10, 16, batch_first=True)
    assert [n for n, _ in m.named_parameters()] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert m.weight_ih_l0.shape == (64, 10)
    m.load_state_dict(torch.nn.LSTM(10, 16).state_dict())


@pytest.mark.parametrize("module, message", [
    (torch.nn.LSTM(4, 8, num_layers=2), "num_layers=2"),
    (torch.nn.GRU(4, 8, bidirectional=True), "bidirectional"),
    (torch.nn.LSTM(4, 8, proj_size=4), "proj_size=4"),
    (torch.nn.LSTM(4, 8).double(), "torch.float64"),
    (torch.nn.Linear(4, 8), "takes a torch.nn.LSTM, GRU or RNN"),
])
def test_unsupported_modules_are_refused(module, message):
    with pytest.raises(ConfigError, match=message):
        pt.from_torch(module)


def test_inference_only_and_bad_states():
    fast = pt.from_torch(_reference("lstm", input_size=4, hidden_size=8))
    x = torch.randn(3, 2, 4)
    with pytest.raises(InputError, match="inference only.*no_grad"):
        fast(x)
    with torch.no_grad(), pytest.raises(InputError, match=r"initial state has shape \(2, 2, 8\)"):
        fast(x, (torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)))


def test_readme_pytorch_example_runs():
    from .test_export import readme_block

    exec(compile(readme_block("## PyTorch"), "README.md", "exec"), {})


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_cuda_matches_torch(kind, batch_first):
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    _compare(kind, "cuda", batch_first=batch_first, T=32, B=4, n_in=256, H=256)

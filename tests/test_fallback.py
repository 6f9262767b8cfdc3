"""A layer no prnn-tvm config places runs on torch.nn's kernels, on the module's own Parameters, with a note saying
which and why (CPU here, the compile made to refuse; CUDA with ``-m gpu``)."""

import logging

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
import prnn_tvm.torch.dispatch as dispatch  # noqa: E402
import prnn_tvm.torch.fallback as fallback  # noqa: E402
from prnn_tvm import ConfigError  # noqa: E402
from prnn_tvm.checks import max_error  # noqa: E402

from .test_torch import _gradient_error, _gradients, _lengths, _reference  # noqa: E402

NO_FIT = "no persistent config fits cell 'lstm' at hidden=6 (the weights may not fit in registers)"


@pytest.fixture
def refused(monkeypatch):
    """The dispatch's compile refuses layers taking the input widths in the returned set (every width: None)."""
    widths = {"refused": None}

    def compile_cell(cell, hidden, batch, input_size=None, **options):
        if widths["refused"] is None or input_size in widths["refused"]:
            raise ConfigError(NO_FIT)
        return real(cell, hidden, batch, input_size=input_size, **options)

    real = dispatch.compile_cell
    monkeypatch.setattr(dispatch, "compile_cell", compile_cell)
    return widths


def _inference_and_gradients(ref, fast, x, hx, lengths=None):
    """The outputs and final states of ``ref`` and ``fast`` (no gradients), then their gradients of x, hx and
    every parameter: ``(outputs error, gradients error)``."""
    state = tuple(hx) if len(hx) > 1 else hx[0]
    sequence = x if lengths is None else torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        (out, finals), (want, want_finals) = fast(sequence, state), ref(sequence, state)
    if lengths is not None:
        out, want = out.data, want.data
    finals, want_finals = (finals, want_finals) if len(hx) > 1 else ((finals,), (want_finals,))
    outputs = max_error([(out, want), *zip(finals, want_finals)])
    params = list(ref.parameters())
    return outputs, _gradient_error(*(_gradients(m, x, hx, params, lengths) for m in (ref, fast)))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("layers, bidirectional, packed", [(2, False, False), (2, True, True), (1, True, False)])
def test_a_layer_that_fits_nowhere_runs_on_torch_nns_kernels(kind, layers, bidirectional, packed, refused, caplog):
    """Every compile refused: outputs, final states and gradients (input, initial states, every parameter)
    are torch.nn's; each layer is noted, the first logged as a warning."""
    ref = _reference(kind, input_size=5, hidden_size=6, num_layers=layers, bidirectional=bidirectional).train()
    fast = pt.from_torch(ref)
    slots = layers * (2 if bidirectional else 1)
    x = torch.randn(7, 3, 5, requires_grad=True)
    hx = [(0.5 * torch.randn(slots, 3, 6)).requires_grad_() for _ in range(2 if kind == "lstm" else 1)]
    with caplog.at_level(logging.INFO, logger=fallback.__name__):
        outputs, gradients = _inference_and_gradients(ref, fast, x, hx, _lengths(3, 7) if packed else None)
    assert outputs <= 1e-6 and gradients <= 1e-6
    assert fast._layers == {}  # nothing of prnn-tvm's ran
    assert sorted(key[3] for key in fast.fallback_notes) == list(range(layers))  # batch 3 ran as 4: one note each
    assert all(key[:3] == (4, "cpu", torch.float32) for key in fast.fallback_notes)
    assert all(
        note.startswith("torch.nn's kernels: prnn-tvm cannot compile its kernel: no persistent config fits")
        for note in fast.fallback_notes.values()
    )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "runs on torch.nn's kernels" in warnings[0].getMessage()


def test_only_the_layers_that_do_not_fit_run_on_torch_nns(refused):
    """Layer 0 (input width 5) refused, layer 1 (width 12) compiled: the two together are torch.nn's module."""
    refused["refused"] = {5}
    ref = _reference("gru", input_size=5, hidden_size=6, num_layers=2, bidirectional=True).train()
    fast = pt.from_torch(ref)
    x = torch.randn(4, 2, 5, requires_grad=True)
    hx = [(0.5 * torch.randn(4, 2, 6)).requires_grad_()]
    outputs, gradients = _inference_and_gradients(ref, fast, x, hx)
    assert outputs <= 1e-5 and gradients <= 1e-5
    assert list(fast.fallback_notes) == [(2, "cpu", torch.float32, 0)]
    assert {key[4] for key in fast._layers} == {12}  # layer 1's, both directions in one launch and apart


def test_any_module_of_torch_nns_cells_falls_back_and_others_keep_the_error(refused):
    """A Recurrent of a torch.nn cell (its own parameter names), bias=False, unbatched: torch.nn's results; a cell
    torch.nn does not have, or a module made with a config, keeps the compile's error."""
    torch.manual_seed(3)
    ref = torch.nn.LSTM(3, 6, bias=False)
    ours = pt.Recurrent("lstm", 3, 6)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            getattr(ours, name.replace("weight_", "W_")).copy_(p)
        ours.b_ih_l0.zero_()
        ours.b_hh_l0.zero_()
        x = torch.randn(5, 3)
        assert max_error([(ours(x)[0], ref(x)[0]), (pt.from_torch(ref)(x)[0], ref(x)[0])]) <= 1e-6
    with pytest.raises(ConfigError, match="no persistent config fits"):
        pt.Recurrent("gru_cho", 3, 6)(torch.randn(5, 2, 3))
    with pytest.raises(ConfigError, match="no persistent config fits"):  # the caller chose the kernel's config
        pt.from_torch(ref, config={"units_per_cta": 2})(torch.randn(5, 2, 3))


def test_a_fallback_is_decided_once_per_shape(refused, monkeypatch):
    """The compile is tried once per batch size and input width, not at every call."""
    tried = []
    refuse = dispatch.compile_cell
    monkeypatch.setattr(dispatch, "compile_cell", lambda *a, **k: tried.append(a) or refuse(*a, **k))
    fast = pt.from_torch(_reference("rnn_tanh", input_size=3, hidden_size=6, num_layers=2))
    with torch.no_grad():
        for _ in range(3):
            fast(torch.randn(2, 2, 3))
    assert len(tried) == 3  # the wavefront stack, layer 0 (width 3), layer 1 (width 6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_an_lstm_too_big_for_the_chip_runs_as_torch_nn(dtype, no_tf32):
    """nn.LSTM(2048, 2048) on the GPU: in float32 its inference runs our kernel (part of the weights streamed from L2
    every step) and its training torch.nn's kernels (no backward fits); outputs and gradients equal torch.nn's; a
    note says so."""
    ref = torch.nn.LSTM(2048, 2048).cuda().to(dtype)
    fast = pt.from_torch(ref)
    x = torch.randn(8, 4, 2048, device="cuda", dtype=dtype, requires_grad=True)
    hx = [(0.5 * torch.randn(1, 4, 2048, device="cuda", dtype=dtype)).requires_grad_() for _ in range(2)]
    outputs, gradients = _inference_and_gradients(ref, fast, x, hx)
    if dtype == torch.float32:
        assert fast.fallback_notes and outputs <= 1e-5 and gradients <= 1e-4
        assert all("training kernels" in note for note in fast.fallback_notes.values()), fast.fallback_notes
    else:  # float16 weights fit in registers and shared memory; training falls back where its backward does not
        assert outputs <= 1e-2 and gradients <= 4e-2


@pytest.mark.gpu
def test_cuda_training_falls_back_where_the_backward_does_not_fit(monkeypatch, no_tf32):
    """The forward kernel fits, its training kernels do not: inference runs prnn-tvm's kernel, training
    torch.nn's, with the module's gradients torch.nn's."""

    def no_backward(layer):
        raise ConfigError("the backward's transposed weights do not fit in registers")

    monkeypatch.setattr(fallback, "compile_training", no_backward)
    ref = _reference("lstm", input_size=16, hidden_size=64).cuda().train()
    fast = pt.from_torch(ref)
    x = torch.randn(9, 4, 16, device="cuda", requires_grad=True)
    hx = [(0.5 * torch.randn(1, 4, 64, device="cuda")).requires_grad_() for _ in range(2)]
    outputs, gradients = _inference_and_gradients(ref, fast, x, hx)
    assert outputs <= 1e-5 and gradients <= 1e-5 and fast._layers
    (note,) = fast.fallback_notes.values()
    assert note.startswith("torch.nn's kernels: prnn-tvm cannot compile its training kernels: the backward's")

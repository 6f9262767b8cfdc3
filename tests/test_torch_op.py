"""``prnn_tvm.torch`` modules as torch operators (``torch.compile`` without graph breaks, ``torch.export``) and with
``torch.nn.RNNBase``'s manners (parametrizations, autocast, quantization). CPU here; CUDA with ``-m gpu``."""

import io

import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm import ConfigError  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch import ops  # noqa: E402

pytestmark = pytest.mark.skipif(not ops.AVAILABLE, reason="this torch has no torch.library.custom_op")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Model(torch.nn.Module):
    """A model holding a module between torch layers, as a user's would."""

    def __init__(self, rnn, n_in):
        super().__init__()
        self.embed, self.rnn = torch.nn.Linear(3, n_in), rnn
        self.head = torch.nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 2)

    def forward(self, x, hx=None):
        out, _ = self.rnn(torch.tanh(self.embed(x)), hx)
        return self.head(out)


def _module(kind, device, **kw):
    torch.manual_seed(0)
    make = {"lstm": pt.LSTM, "gru": pt.GRU, "rnn_tanh": pt.RNN}[kind]
    return make(4, 8, **kw).to(device)


def _close(got, want, T, dtype="float32"):
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got - want).abs().max().item()
    assert err <= tolerance(dtype, T), f"max abs error {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kind, kw",
    [
        ("lstm", {}),
        ("gru", {"num_layers": 2, "bidirectional": True}),
        ("rnn_tanh", {"batch_first": True}),
        ("lstm", {"num_layers": 2}),
    ],
)
def test_compile_fullgraph_has_no_graph_breaks_and_equals_eager(device, kind, kw, no_tf32):
    """``torch.compile(fullgraph=True)`` of a model holding a module: one graph (the layers are the operator
    ``prnn_tvm::layers``), outputs and gradients equal to the eager model's, call after call (a new length
    compiles a new graph, not a new kernel)."""
    model = Model(_module(kind, device, **kw), 4).to(device)
    x = torch.randn(5, 2, 3, device=device)
    if kw.get("batch_first"):
        x = x.transpose(0, 1).contiguous()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True, backend="eager" if device == "cpu" else "inductor")
    with torch.no_grad():
        for T in (5, 5, 7):
            x = torch.randn(T, 2, 3, device=device)
            _close(compiled(x), model(x), T)
    compiled(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for p, g in zip(model.parameters(), want):
        _close(p.grad, g, 7)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_with_initial_states_unbatched_input_and_after_eager_calls(device):
    """Initial states (their gradients too), unbatched input, and a module that ran eagerly before it is
    compiled: one graph each, equal to eager."""
    rnn = _module("lstm", device, num_layers=2)
    x = torch.randn(6, 3, 4, device=device)
    h0 = (torch.randn(2, 3, 8, device=device), torch.randn(2, 3, 8, device=device))
    want, (h_n, c_n) = rnn(x, h0)  # eagerly first
    compiled = torch.compile(rnn, fullgraph=True, backend="eager")
    got, (h, c) = compiled(x, h0)
    for a, b in ((got, want), (h, h_n), (c, c_n)):
        _close(a.detach(), b.detach(), 6)
    states = [t.clone().requires_grad_() for t in h0]
    compiled(x, tuple(states))[1][1].sum().backward()
    eager_states = [t.clone().requires_grad_() for t in h0]
    rnn(x, tuple(eager_states))[1][1].sum().backward()
    for a, b in zip(states, eager_states):
        _close(a.grad, b.grad, 6)
    with torch.no_grad():
        _close(compiled(x[:, 0])[0], rnn(x[:, 0])[0], 6)
    assert torch._dynamo.explain(rnn)(x[:, 0]).graph_break_count == 0


def test_packed_input_still_runs_under_compile():
    """A PackedSequence under torch.compile: padded by torch's own (data-dependent) op, so not one graph, but
    the same answer as eagerly."""
    rnn = _module("gru", "cpu", bidirectional=True)
    x = torch.randn(5, 3, 4)
    packed = pack_padded_sequence(x, [5, 2, 4], enforce_sorted=False)
    compiled = torch.compile(rnn, backend="eager")
    with torch.no_grad():
        got, want = compiled(packed), rnn(packed)
    _close(got[0].data, want[0].data, 5)
    _close(got[1], want[1], 5)


def test_modules_the_operator_cannot_name_break_the_graph_and_export_refuses_them():
    """A cell given as an object, a template config or dropout in training mode: no operator (its plain
    arguments name a configuration); torch.compile runs the layers as they are, torch.export says why."""
    from prnn_tvm.deferred import resolve

    rnn = pt.Recurrent(resolve("gru_cho"), 4, 8)
    x = torch.randn(5, 2, 4)
    assert rnn._operator_refusal().startswith("its cell is an object")
    compiled = torch.compile(rnn, backend="eager")
    with torch.no_grad():
        _close(compiled(x)[0], rnn(x)[0], 5)
    with pytest.raises(Exception, match="torch.export cannot record this module: its cell is an object"):
        torch.export.export(rnn, (x,))
    dropping = pt.LSTM(4, 8, num_layers=2, dropout=0.5)
    assert "dropout" in dropping._operator_refusal() and dropping.eval()._operator_refusal() is None


@pytest.mark.parametrize("device", DEVICES)
def test_export_round_trips(device):
    """``torch.export`` records the operator; the exported program, saved and loaded, runs and equals the eager
    model, with initial states as inputs."""
    model = Model(_module("lstm", device, num_layers=2, bidirectional=True), 4).to(device).eval()
    x = torch.randn(5, 2, 3, device=device)
    h0 = (torch.randn(4, 2, 8, device=device), torch.randn(4, 2, 8, device=device))
    program = torch.export.export(model, (x, h0))
    assert "prnn_tvm.layers" in str(program.graph)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    with torch.no_grad():
        want = model(x, h0)
        _close(program.module()(x, h0), want, 5)
        _close(loaded.module()(x, h0), want, 5)


def test_the_operator_compiles_at_run_time_and_serves_a_configuration():
    """Tracing compiles nothing (the fake implementation gives the shapes); the run looks the configuration up,
    and modules of one configuration share its compiled layers."""
    ops._RUNNERS.clear()
    model = Model(pt.GRU(4, 8), 4)
    x = torch.randn(5, 2, 3)
    program = torch.export.export(model, (x,))
    assert not ops._RUNNERS  # traced, nothing compiled
    with torch.no_grad():
        program.module()(x)
        (runner,) = ops._RUNNERS.values()
        assert runner.weight_hh_l0.device.type == "meta" and len(runner._layers) == 1
        other = Model(pt.GRU(4, 8), 4)
        torch.compile(other, fullgraph=True, backend="eager")(x)
        assert list(ops._RUNNERS.values()) == [runner] and len(runner._layers) == 1


def test_jit_trace_is_refused_with_the_alternatives():
    with pytest.raises(Exception, match="torch.jit.trace cannot record.*torch.export or torch.compile"):
        torch.jit.trace(_module("lstm", "cpu"), (torch.randn(5, 2, 4),))

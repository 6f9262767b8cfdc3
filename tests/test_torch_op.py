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

pytestmark = pytest.mark.skipif(not ops.AVAILABLE, reason="this torch has no torch.library.register_fake")
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


def test_a_compiled_training_step_runs_the_layers_once_and_lets_their_graph_go(monkeypatch):
    """A compiled training step runs the layers once (``prnn_tvm::layers_train`` keeps the call's autograd graph,
    ``prnn_tvm::layers_backward`` differentiates it), lets that graph go after the backward and when no backward
    runs, and its gradients equal eager ones; an exported program (the inference operator) trained runs the
    layers again in its backward, to the same gradients."""
    import gc

    from prnn_tvm.torch.modules import _Recurrent

    runs = []
    run_given = _Recurrent._run_given
    monkeypatch.setattr(_Recurrent, "_run_given", lambda self, *a: runs.append(a[-1]) or run_given(self, *a))
    model = Model(_module("lstm", "cpu", num_layers=2), 4)
    x = torch.randn(5, 2, 3)
    model(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    for backend in ("eager", "aot_eager"):
        model.zero_grad()
        runs.clear()
        torch.compile(model, fullgraph=True, backend=backend)(x).square().sum().backward()
        assert runs == [True], backend  # one differentiable run: the forward, not again in the backward
        assert not ops._KEPT
        for p, g in zip(model.parameters(), want):
            _close(p.grad, g, 5)
    dropped = torch.compile(model, fullgraph=True, backend="eager")(x)  # no backward: the graph goes with it
    assert len(ops._KEPT) == 1
    del dropped
    gc.collect()
    assert not ops._KEPT
    model.zero_grad()
    torch.export.export(model, (x,)).module()(x).square().sum().backward()
    for p, g in zip(model.parameters(), want):
        _close(p.grad, g, 5)


def test_an_inference_call_of_the_operator_runs_the_layers_without_redispatching(monkeypatch):
    """Without gradients, on plain tensors, the operator's autograd kernel runs the layers itself: torch's
    redispatch (and torch.library.custom_op's wrapper) cost tens of microseconds a call, which made a warm
    compiled call slower than an eager one."""
    rnn = _module("gru", "cpu")
    x = torch.randn(5, 2, 4)
    compiled = torch.compile(rnn, fullgraph=True, backend="eager")
    with torch.no_grad():
        want = compiled(x)[0]

        class Refuse:
            def redispatch(self, *args):
                raise AssertionError("redispatched")

        monkeypatch.setitem(ops._OPS, "layers", Refuse())
        _close(compiled(x)[0], want, 5)


def test_a_compiled_graph_calls_the_operator_overload_positionally():
    """The graph records ``prnn_tvm::layers.default`` with positional arguments, so that a compiled call goes to
    the overload itself (an overload packet's call with keywords costs microseconds more), and still computes
    what the eager call does."""
    rnn = _module("lstm", "cpu").eval()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(5, 2, 4)
    compiled = torch.compile(rnn, fullgraph=True, backend=backend)
    with torch.no_grad():
        got, want = compiled(x)[0], rnn(x)[0]
    (gm,) = graphs
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "prnn_tvm" in str(n.target)]
    assert node.target is torch.ops.prnn_tvm.layers.default
    assert not node.kwargs and len(node.args) == 15
    _close(got, want, 5)


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


# torch.nn.RNNBase's manners


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: pt.LSTM(4, 8, num_layers=2, bidirectional=True), lambda: torch.nn.LSTM(4, 8, 2, bidirectional=True)),
        (lambda: pt.GRU(4, 8, bias=False), lambda: torch.nn.GRU(4, 8, bias=False)),
        (lambda: pt.RNN(4, 8, nonlinearity="relu"), lambda: torch.nn.RNN(4, 8, nonlinearity="relu")),
    ],
)
def test_modules_are_rnnbase_with_torch_nns_bookkeeping(ours, theirs):
    """``isinstance(m, nn.RNNBase)``, ``mode``, ``proj_size``, ``all_weights`` and the state dict as torch.nn's;
    ``flatten_parameters`` leaves the parameters where they are."""
    m, ref = ours(), theirs()
    assert isinstance(m, torch.nn.RNNBase) and not isinstance(m, (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN))
    assert (m.mode, m.proj_size, m._all_weights) == (ref.mode, ref.proj_size, ref._all_weights)
    assert [[w.shape for w in ws] for ws in m.all_weights] == [[w.shape for w in ws] for ws in ref.all_weights]
    assert list(m.state_dict()) == list(ref.state_dict())
    m.load_state_dict(ref.state_dict())
    pointers = [p.data_ptr() for p in m.parameters()]
    m.flatten_parameters()
    assert [p.data_ptr() for p in m.parameters()] == pointers
    assert pt.Recurrent("gru_cho", 4, 8).mode == "gru_cho"


def test_proj_size_is_refused_with_the_way_out():
    with pytest.raises(ConfigError, match=r"proj_size=4 \(an LSTM with projections, LSTMP\).*torch.nn.LSTM"):
        pt.LSTM(4, 8, proj_size=4)


def _scaled(w):
    return 0.5 * w


class _Half(torch.nn.Module):
    def forward(self, w):
        return _scaled(w)


@pytest.mark.parametrize(
    "apply",
    [
        lambda m: torch.nn.utils.parametrize.register_parametrization(m, "weight_hh_l0", _Half()),
        lambda m: torch.nn.utils.parametrizations.weight_norm(m, "weight_hh_l0"),
        lambda m: torch.nn.utils.weight_norm(m, "weight_hh_l0"),
    ],
    ids=["register_parametrization", "parametrizations.weight_norm", "weight_norm"],
)
@pytest.mark.filterwarnings("ignore:.*weight_norm.*deprecated")
def test_parametrized_weights_run_and_train_as_torch_nns(apply):
    """A parametrization or weight norm on ``weight_hh_l0``: the module reads the parametrized weight (by
    attribute), and outputs and the gradients of every parameter (the originals too) equal torch.nn's."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(4, 8, num_layers=2)
    m = pt.LSTM(4, 8, num_layers=2)
    m.load_state_dict(ref.state_dict())
    apply(ref), apply(m)
    x = torch.randn(5, 3, 4)
    got, want = m(x)[0], ref(x)[0]
    _close(got.detach(), want.detach(), 5)
    got.square().sum().backward()
    want.square().sum().backward()
    names = dict(ref.named_parameters())
    assert sorted(names) == sorted(n for n, _ in m.named_parameters())
    for name, p in m.named_parameters():
        _close(p.grad, names[name].grad, 5)


@pytest.mark.parametrize("kind, follows", [("lstm", True), ("rnn_tanh", True), ("gru", False)])
def test_cpu_autocast_runs_where_torch_nn_runs(kind, follows):
    """Under ``torch.autocast("cpu", bfloat16)`` a float32 module runs in bfloat16 where torch.nn's does (LSTM,
    RNN), in float32 where it does not (GRU: torch.nn's returns float32, its composite GEMMs autocast to bfloat16
    inside, so the answers agree to bfloat16's bound), with torch.nn's answer; gradients reach the float32
    parameters."""
    torch.manual_seed(0)
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}[kind](4, 8)
    m = pt.from_torch(ref)
    x = torch.randn(6, 3, 4)
    with torch.autocast("cpu", torch.bfloat16):
        got, want = m(x)[0], ref(x)[0]
        got.float().square().sum().backward()
    assert got.dtype == want.dtype == (torch.bfloat16 if follows else torch.float32)
    _close(got.detach().float(), want.detach().float(), 6, "bfloat16")
    grads = [p.grad.clone() for p in m.parameters()]
    ref.zero_grad()
    with torch.autocast("cpu", torch.bfloat16):
        ref(x)[0].float().square().sum().backward()
    for p, g in zip(ref.parameters(), grads):
        assert g.dtype == torch.float32
        err = (p.grad - g).abs().max().item() / max(1.0, p.grad.abs().max().item())
        assert err <= 4 * tolerance("bfloat16", 6), f"{kind}: relative gradient error {err:.2e}"


def test_autocast_under_compile_is_one_graph():
    m = _module("lstm", "cpu").eval()
    x = torch.randn(5, 2, 4)
    with torch.autocast("cpu", torch.bfloat16), torch.no_grad():
        assert torch._dynamo.explain(m)(x).graph_break_count == 0
        got = torch.compile(m, fullgraph=True, backend="eager")(x)[0]
        want = m(x)[0]
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_quantize_dynamic_leaves_the_module_unchanged():
    """``quantize_dynamic`` swaps torch.nn's classes by exact type: a module here keeps its float kernels (asked
    for by name too), the model's Linear layers are quantized, and the model runs."""
    model = Model(_module("lstm", "cpu"), 4)
    x = torch.randn(5, 2, 3)
    for spec in (None, {torch.nn.Linear, torch.nn.LSTM, pt.LSTM}):
        quantized = torch.ao.quantization.quantize_dynamic(model, spec)
        assert type(quantized.rnn) is pt.LSTM and type(quantized.head) is not torch.nn.Linear
        with torch.no_grad():
            assert quantized(x).shape == model(x).shape


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_runs_in_the_autocast_dtype_as_cudnn_does(kind, dtype):
    """Under ``torch.autocast("cuda", dtype)`` torch.nn's RNNs (cuDNN) run in float16 whatever ``dtype`` (torch's
    autocast casts them to half), and so does a module here (the half kernels), with torch.nn's answer; gradients
    reach the float32 parameters."""
    torch.manual_seed(0)
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind](16, 32).cuda()
    m = pt.from_torch(ref)
    x = torch.randn(8, 4, 16, device="cuda")
    with torch.autocast("cuda", dtype):
        got, want = m(x)[0], ref(x)[0]
        got.float().sum().backward()
    assert got.dtype == want.dtype == torch.float16
    _close(got.detach().float(), want.detach().float(), 8, "float16")
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())

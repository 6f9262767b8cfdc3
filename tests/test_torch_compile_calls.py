"""A compiled model holding a ``prnn_tvm.torch`` module, call after call: one graph, compiled once (what it guards on
does not change between calls, eager calls of the module in between included), and the operator's repeated call runs
the plan an eager module's does (:mod:`~prnn_tvm.torch.repeat`). Its speed against eager is a benchmark row
(``bench/compiled.py``), not asserted here."""

import threading

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch import ops, repeat  # noqa: E402
from prnn_tvm.torch.modules import _Recurrent  # noqa: E402

pytestmark = pytest.mark.skipif(not ops.AVAILABLE, reason="this torch has no torch.library.register_fake")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Model(torch.nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.embed, self.rnn, self.head = torch.nn.Linear(3, 4), rnn, torch.nn.Linear(rnn.hidden_size, 2)

    def forward(self, x):
        return self.head(self.rnn(torch.tanh(self.embed(x)))[0])


def _counted(graphs: list):
    """A torch.compile backend that runs Dynamo's graph as it is and counts the graphs it is given."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def _runner(rnn):
    (runner,) = [r for key, r in ops._RUNNERS.items() if key[:3] == (rnn.cell, rnn.input_size, rnn.hidden_size)]
    return runner


@pytest.mark.parametrize("make", [lambda: pt.LSTM(4, 8), lambda: pt.GRU(4, 8, num_layers=2)])
def test_a_compiled_model_compiles_once_whatever_runs_between_its_calls(make):
    """Fresh inputs, eager calls of the model (plans made, kept weights), an eager call under autocast (a call on
    parameters it is given: the module's per-thread state) and a compiled call from another thread: one graph, never
    broken, compiled once; every call equals the eager model's."""
    torch.manual_seed(0)
    model = Model(make()).eval()
    graphs = []
    compiled = torch.compile(model, fullgraph=True, backend=_counted(graphs))
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(5, 2, 3)
            got, want = compiled(x), model(x)
            assert (got - want).abs().max().item() <= tolerance("float32", 5)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.rnn(torch.randn(5, 2, 4))
        # grad mode is per thread: no_grad there too (else the compiled call compiles again, for grad mode)
        other = threading.Thread(target=torch.no_grad()(lambda: compiled(torch.randn(5, 2, 3))))
        other.start()
        other.join()
        compiled(torch.randn(5, 2, 3))
    assert len(graphs) == 1, f"compiled {len(graphs)} times"
    explained = torch._dynamo.explain(model)(torch.randn(5, 2, 3))
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("device", DEVICES)
def test_the_operators_repeated_call_runs_its_plan_and_follows_the_parameters(monkeypatch, device, no_tf32):
    """The operator's third call of a shape runs the plan an eager module's would (its own path runs the first two,
    planning at the second); a parameter changed in place, or another module of the configuration, takes the own path
    again, with the right answer."""
    ops._RUNNERS.clear()  # a runner of its own: no plans of other tests' modules
    torch.manual_seed(0)
    model = Model(pt.LSTM(4, 8)).to(device).eval()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(5, 2, 3, device=device)
    own_path = []
    # the operator's own path, counted (patched on the class: setting a module's attribute forgets its plans)
    run_given = _Recurrent._run_given
    monkeypatch.setattr(_Recurrent, "_run_given", lambda self, *a: own_path.append(a) or run_given(self, *a))
    with torch.no_grad():
        for _ in range(4):
            compiled(x)
        assert len(own_path) == 2  # planned at the second call, run from the third
        runner = _runner(model.rnn)
        assert any(type(plan) is repeat.Plan for plan in runner._plans.values())
        model.rnn.weight_hh_l0.mul_(0.5)
        got, want = compiled(x), model(x)
        assert len(own_path) == 3 and (got - want).abs().max().item() <= tolerance("float32", 5)
        other = Model(pt.LSTM(4, 8)).to(device).eval()
        got, want = torch.compile(other, fullgraph=True, backend="eager")(x), other(x)
        assert len(own_path) == 4 and (got - want).abs().max().item() <= tolerance("float32", 5)

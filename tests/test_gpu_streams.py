"""Calls that do not wait for the GPU (``pytest -m gpu``): the caller's stream, CUDA graphs,
concurrent launches of one layer, and barrier timeouts reported after the call."""

import copy
import dataclasses
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prnn_tvm  # noqa: E402 - after the skip
import prnn_tvm.torch as pt  # noqa: E402
from prnn_tvm.bench.baselines import captured  # noqa: E402
from prnn_tvm.checks import max_error  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.errors import BarrierTimeout  # noqa: E402
from prnn_tvm.reference import random_inputs  # noqa: E402
from prnn_tvm.schedules.persistent_config import default_config  # noqa: E402
from prnn_tvm.target import gpu_spec  # noqa: E402

from .test_gpu_numerics import run_and_compare  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_tf32")]
STATEFUL = ["tags", "counter"]


def _modules(H=256, n_in=64):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(n_in, H).cuda().eval()
    gru = torch.nn.GRU(H, H).cuda().eval()
    return lstm, gru


def _model(lstm, gru):
    """Two modules in a row, the GRU on the LSTM's output."""

    def run(x):
        out, _ = lstm(x)
        return gru(out)[0]

    return run


def test_a_call_runs_on_the_callers_stream_without_waiting():
    """The caller's stream is busy (a long sleep queued first) when each call is made: a call that waited for the
    stream or the device, before its launches or after them, would return only once the sleep had ended."""
    lstm, _ = _modules()
    fast = pt.from_torch(lstm)
    x = torch.randn(64, 4, 64, device="cuda")
    side = torch.cuda.Stream()
    with torch.no_grad():
        with torch.cuda.stream(side):
            want = fast(x)[0].clone()  # compiled, loaded, this stream's memory cached: the calls below only launch
        side.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(500_000_000)  # ~0.25 s of GPU time ahead of the calls
            slept = torch.cuda.Event()
            slept.record(side)
            got = fast(x)[0]
            returned = slept.query()
            after = fast(x)[0]
            returned |= slept.query()
        assert not returned, "a call waited for the stream's earlier work"
        assert not side.query()  # the calls' kernels are queued behind the sleep, on the caller's stream
        side.synchronize()
    assert torch.equal(got, want) and torch.equal(after, want)


def test_graph_replays_of_two_modules_equal_eager_calls():
    lstm, gru = _modules()
    fast = _model(pt.from_torch(lstm), pt.from_torch(gru))
    x = torch.randn(32, 4, 64, device="cuda")
    with torch.no_grad():
        eager = fast(x).clone()
        graph, replayed = captured(lambda: fast(x))  # after warm-up calls on a side stream
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, eager)
        reference = _model(lstm, gru)(x)
        assert (eager - reference).abs().max().item() <= tolerance("float32", 32)
        for i in range(1000):  # the barrier's base lives on the device: a replay advances it like a launch
            replayed.zero_()
            graph.replay()
            if i % 100 == 99:
                torch.cuda.synchronize()
                assert torch.equal(replayed, eager), f"replay {i}"
        x.copy_(torch.randn_like(x))  # a replay reads the captured input's memory
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, fast(x))


@pytest.mark.parametrize("one_launch", [True, False])
def test_a_bidirectional_call_from_another_stream_and_a_graph(one_launch):
    """An inference call runs each layer's directions in one launch, or (``one_launch_directions`` off) the
    reverse direction on a stream of its own (one per caller stream, joined before the next layer): results
    equal torch.nn's, from another caller stream, and replayed from a CUDA graph."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(64, 128, num_layers=2, bidirectional=True).cuda().eval()
    fast = pt.from_torch(ref)
    fast.one_launch_directions = one_launch
    sides = 0 if one_launch else 1  # side streams per caller stream
    x = torch.randn(32, 4, 64, device="cuda")
    here = torch.cuda.current_stream()
    with torch.no_grad():
        (out, (h, c)), (want, (wh, wc)) = fast(x), ref(x)
        assert max_error([(out, want), (h, wh), (c, wc)]) <= tolerance("float32", 32)
        assert len(fast._side_streams) == sides
        other = torch.cuda.Stream()
        other.wait_stream(here)
        with torch.cuda.stream(other):
            again = fast(x)[0]
        here.wait_stream(other)
        assert len(fast._side_streams) == 2 * sides and torch.equal(again, out)
        graph, replayed = captured(lambda: fast(x)[0])
        for _ in range(100):
            replayed.zero_()
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, out)
    fast.check()


@pytest.mark.parametrize(
    "kind, dtype, bidirectional, bias_in_gemm",
    [
        ("lstm", torch.float16, False, None),  # b_ih folded into b_hh
        ("rnn_tanh", torch.bfloat16, True, None),  # folded, both directions' W_ih joined
        ("gru", torch.float16, True, 0),  # [W_ih | b_ih] the GEMM operand
        ("lstm", torch.float32, False, None),
    ],
)
def test_graph_replays_follow_in_place_parameter_updates(kind, dtype, bidirectional, bias_in_gemm, monkeypatch):
    """What a call derives from the parameters and keeps between eager calls (the folded bias, joined and
    aligned copies, the biased GEMM operand) is made inside a graph being captured: after in-place updates
    (an unaligned bias among them, as cuDNN's flat weights give) a replay equals an eager call again."""
    if bias_in_gemm is not None:
        monkeypatch.setattr("prnn_tvm.torch.projection.BIAS_IN_GEMM", bias_in_gemm)  # where the projection reads it
    torch.manual_seed(4)
    ctor = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}[kind]
    ref = ctor(24, 64, bidirectional=bidirectional).cuda().to(dtype).eval()
    flat = torch.zeros(ref.bias_hh_l0.numel() + 1, device="cuda", dtype=dtype)  # a bias one element into a buffer
    flat[1:] = ref.bias_hh_l0.detach()
    ref.bias_hh_l0 = torch.nn.Parameter(flat[1:])
    fast = pt.from_torch(ref)
    x = torch.randn(12, 3, 24, device="cuda").to(dtype)
    with torch.no_grad():
        fast(x)  # the eager call that fills the caches before the capture
        graph, (replayed, _) = captured(lambda: fast(x))
        for p in ref.parameters():
            p.mul_(-0.75).add_(0.125)
        graph.replay()
        eager = fast(x)[0]
        torch.cuda.synchronize()
        want = copy.deepcopy(ref).double()(x.double())[0]
    assert torch.equal(replayed, eager)
    assert (eager.double() - want).abs().max().item() <= tolerance(pt.DTYPES[dtype], 12)
    fast.check()


def test_a_training_step_graphed_by_torch_equals_eager():
    """``torch.cuda.make_graphed_callables``: the forward (saving) and the backward captured as graphs and
    replayed give the eager step's output and gradients, replay after replay."""
    lstm, _ = _modules()
    fast = pt.from_torch(lstm.train())

    class Output(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            return self.module(x)[0]

    x = torch.randn(16, 4, 64, device="cuda", requires_grad=True)
    model = Output(fast)

    def step(run):
        for t in (x, *fast.parameters()):
            t.grad = None
        out = run(x)
        out.square().sum().backward()
        return [out.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in fast.parameters())]

    eager = step(model)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    for _ in range(3):
        got = step(graphed)
        torch.cuda.synchronize()
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(eager, got))
    fast.check()


def test_one_layer_from_two_streams_and_two_threads():
    lstm, _ = _modules()
    fast = pt.from_torch(lstm)
    inputs = [torch.randn(16, 4, 64, device="cuda") for _ in range(2)]
    with torch.no_grad():
        expected = [fast(x)[0].clone() for x in inputs]
    results = [[], []]

    def worker(i):
        stream = torch.cuda.Stream()
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(500):
                results[i].append(fast(inputs[i])[0])
        stream.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fast.check()
    for i in range(2):
        assert len(results[i]) == 500
        assert all(torch.equal(r, expected[i]) for r in results[i]), f"stream {i}"


def test_a_graph_replay_beside_an_eager_call():
    lstm, _ = _modules()
    fast = pt.from_torch(lstm)
    x, y = (torch.randn(32, 4, 64, device="cuda") for _ in range(2))
    with torch.no_grad():
        want_x, want_y = fast(x)[0].clone(), fast(y)[0].clone()
        graph, (replayed, _) = captured(lambda: fast(x))
        other = torch.cuda.Stream()
        eager = []
        for _ in range(100):
            graph.replay()  # on the current stream
            with torch.cuda.stream(other):
                eager.append(fast(y)[0])
        torch.cuda.synchronize()
    assert torch.equal(replayed, want_x) and all(torch.equal(e, want_y) for e in eager)


def _config(barrier, hidden=256, batch=4):
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), batch, hidden)
    return dataclasses.replace(default_config(plan, gpu_spec()), barrier=barrier)


def _stalling(barrier, module=None, hidden=256, batch=4):
    """A layer (or a torch module's layer) whose block 0 stalls at step 3 with a 20 ms bound."""
    if module is not None:
        layer = module.layer_for(batch, torch.device("cuda", torch.cuda.current_device()))
    else:
        layer = prnn_tvm.compile_cell("lstm", hidden, batch, target="cuda", config=_config(barrier, hidden, batch))
    layer.barrier_timeout_us, layer.debug_stall_step = 20_000, 3
    return layer


@pytest.mark.parametrize("barrier", STATEFUL)
def test_a_timeout_on_device_tensors_fills_nan_and_the_next_call_raises(barrier):
    layer = _stalling(barrier)
    inputs = random_inputs(layer.plan, 16, layer.input_size)
    on_device = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    out, finals = layer(**on_device)  # returns at once: nothing waits
    torch.cuda.synchronize()
    assert torch.from_dlpack(out).isnan().all() and all(torch.from_dlpack(f).isnan().all() for f in finals)
    layer.debug_stall_step = -1
    with pytest.raises(BarrierTimeout, match="after step 3 timed out.*filled with NaN"):
        layer(**on_device)  # the earlier launch's timeout, raised before this one starts
    assert run_and_compare(layer, 16) <= tolerance("float32", 16)  # the state was reset


@pytest.mark.parametrize("barrier", STATEFUL)
def test_check_raises_a_timeout_and_a_module_recovers(barrier):
    lstm, _ = _modules()
    fast = pt.from_torch(lstm, config=_config(barrier))
    x = torch.randn(16, 4, 64, device="cuda")
    with torch.no_grad():
        want = fast(x)[0].clone()
        layer = _stalling(barrier, module=fast)
        out, (h_n, _) = fast(x)
        with pytest.raises(BarrierTimeout, match="after step 3"):
            fast.check()
        assert out.isnan().all() and h_n.isnan().all()
        layer.debug_stall_step = -1
        fast.check()  # reported once
        assert torch.equal(fast(x)[0], want)


def test_a_numpy_call_still_raises_its_own_timeout():
    layer = _stalling("tags")
    with pytest.raises(BarrierTimeout, match="after step 3 of 16"):
        layer(**random_inputs(layer.plan, 16, layer.input_size))
    layer.debug_stall_step = -1
    out, _ = layer(**random_inputs(layer.plan, 16, layer.input_size))
    assert np.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_stacks_step_writes_its_final_states_where_the_call_returns_them_eagerly_and_in_a_graph(dtype):
    """A one-launch stack called a step at a time (T=1, states in and out) returns each state's (layers, B, H) as
    the launch wrote it (no stacking after): against the float64 module a step and a loop of steps, and replayed
    from a CUDA graph (the launch's views made inside the capture, of the graph's own outputs)."""
    torch.manual_seed(0)
    L, H, B, steps = 2, 128, 8, 9
    reference = torch.nn.LSTM(H, H, L).to("cuda", dtype).eval()
    exact = copy.deepcopy(reference).double()  # the same weights, in float64
    ours = pt.from_torch(reference).eval()
    xs = torch.randn(steps, 1, B, H, device="cuda", dtype=dtype)
    state = tuple(torch.randn(L, B, H, device="cuda", dtype=dtype) for _ in range(2))
    bound = tolerance(pt.DTYPES[dtype], steps)
    with torch.no_grad():
        assert ours.stack_for(B, xs.device, dtype) is not None, ours.stack_notes
        first_out, first = ours(xs[0], state)
        for got in (first_out, *first):
            assert got.is_contiguous() and got._base is None  # the call's own tensors, not views of another
        mine, want = state, tuple(s.double() for s in state)
        for x in xs:  # each step from the last one's states
            (out, mine), (want_out, want) = ours(x, mine), exact(x.double(), want)
            assert (out.double() - want_out).abs().max().item() <= bound
        assert all((g.double() - w).abs().max().item() <= bound for g, w in zip(mine, want))
        graph, (replayed_out, replayed) = captured(lambda: ours(xs[0], state))
        for r in (replayed_out, *replayed):
            r.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed_out, first_out) and all(torch.equal(r, g) for r, g in zip(replayed, first))

"""Resident sessions on the GPU (``pytest -m gpu``): a step per call equal to the float64 reference of the same
steps and to the layer's sequence call (the host transport: ``step`` with NumPy), both transports in one session,
releases and relaunches, the state operations, the caller's stream and CUDA graphs (the device transport:
``post``), bounded waits, the SMs a session holds, a process that exits with a session open, and 10^6 steps
against the sequence call."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_error
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import SessionError
from prnn_tvm.reference import random_inputs, reference_layer

pytestmark = pytest.mark.gpu


def _layer(cell, hidden, batch, input_size, dtype="float32"):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype)
    return layer, random_inputs(layer.plan, 1, input_size, seed=3)


def _session(layer, inputs, **options):
    """A session of ``layer`` with the weights and initial states of ``inputs``; its collect and its blocks wait up
    to 10 s (other tests' processes share the GPU by time slices, and their kernels may hold the SMs its resident
    kernel needs a while)."""
    weights = {name: value for name, value in inputs.items() if name != "x"}
    return layer.session(**weights, **{"collect_timeout_us": 10_000_000, "barrier_timeout_us": 10_000_000, **options})


def _error(got: dict, want: dict) -> float:
    """The worst error of the states ``got`` (by name) against ``want``'s, over every state ``want`` has."""
    return max_error((got[name], value) for name, value in want.items())


def _reference(plan, inputs, xs, states=None):
    """Every state after each of the steps ``xs`` (T, B, input), from ``states`` (by name; default: the inputs'
    initial states), by the float64 reference: (list of {state: value}, final states)."""
    state = states or {s.name: inputs[f"{s.name}0"] for s in plan.states}
    found = []
    for x in xs:
        _, state = reference_layer(plan, {**inputs, "x": x[None], **{f"{n}0": v for n, v in state.items()}})
        found.append(state)
    return found, state


@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, dtype",
    [
        ("lstm", 256, 4, 128, "float32"),
        ("lstm_d2", 128, 1, 64, "float32"),  # a market model: two layers, batch 1
        ("lstm", 640, 8, 640, "float16"),  # an RNN-T prediction network
        ("gru_d3", 96, 4, 80, "bfloat16"),
        ("rnn_tanh", 1, 1, 1, "float32"),
        ("lstm_d3", 960, 1, 960, "float16"),  # weights in registers and shared memory
        ("lstm_d3", 960, 1, 960, "float32"),  # weights in registers, shared memory and L2
    ],
)
def test_a_session_serves_each_step_as_the_reference_computes_it(cell, hidden, batch, input_size, dtype):
    layer, inputs = _layer(cell, hidden, batch, input_size, dtype)
    T = 40
    xs = np.random.default_rng(4).standard_normal((T, batch, input_size)).astype(dtype)
    want, _ = _reference(layer.plan, inputs, xs)
    with _session(layer, inputs) as session:
        for x, expected in zip(xs, want):
            y, states = session.step(x)
            assert _error(states, expected) <= tolerance(dtype, T)
            assert np.array_equal(y, states[layer.plan.outputs[0]])
        assert session.launches == 1


@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, dtype",
    [
        ("lstm_d2", 128, 1, 128, "float32"),  # the market model of the latency targets
        ("lstm", 640, 8, 640, "float16"),  # the RNN-T prediction network: an input taken in chunks
        ("gru", 96, 4, 40, "float16"),
        ("lstm", 33, 3, 1, "float32"),  # an input of one value, odd sizes
        ("gru", 96, 3, 7, "bfloat16"),  # 21 half values in 11 words: the last word's high half pads
        ("lstm", 33, 1, 1, "float16"),  # a single half value: one word, as float32 bits
        ("lstm_d3", 960, 1, 960, "float16"),  # issue 47's 3x960: registers and shared memory
        ("lstm_d3", 960, 1, 960, "float32"),  # and the streamed tier (L2)
    ],
)
def test_host_steps_equal_the_layers_sequence_call(cell, hidden, batch, input_size, dtype):
    """``step`` (the host transport: page-locked requests relayed by CTA 0, the kernel projecting each input, the
    states stored into page-locked memory) returns at every step what the layer's sequence call returns for the same
    inputs, in one launch."""
    layer, inputs = _layer(cell, hidden, batch, input_size, dtype)
    T = 30
    xs = np.random.default_rng(7).standard_normal((T, batch, input_size)).astype(dtype)
    weights = {k: v for k, v in inputs.items() if k != "x"}
    out = np.asarray(layer(x=xs, **weights)[0], "float64")  # NumPy in, NumPy out
    with _session(layer, inputs) as session:
        got = np.stack([session.step(x)[0] for x in xs]).astype("float64")
        assert session.launches == 1
    # two kernels of different configs, each within the tolerance of the float64 reference
    assert np.abs(got - out).max() <= 2 * tolerance(dtype, T)


@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, dtype",
    [
        ("lstm_d2", 128, 1, 128, "float32"),  # a float32 a word
        ("lstm", 640, 8, 640, "float16"),  # two halves a word
        ("lstm", 33, 1, 1, "bfloat16"),  # a half a word, widened
    ],
)
def test_native_and_python_host_steps_give_the_same_states(cell, hidden, batch, input_size, dtype):
    """The native host step (the default where it is built) and the Python one, each in a session of its own over
    the same layer: bit for bit the same states at every step (one kernel, the same words)."""
    layer, inputs = _layer(cell, hidden, batch, input_size, dtype)
    xs = np.random.default_rng(8).standard_normal((30, batch, input_size)).astype(dtype)
    got = {}
    for host_step in ("native", "python"):
        with _session(layer, inputs, host_step=host_step) as session:
            assert session.native == (host_step == "native"), "the native host step is not built here"
            got[host_step] = [session.step(x)[1] for x in xs]
    for t, (fast, slow) in enumerate(zip(got["native"], got["python"])):
        assert all(np.array_equal(fast[n].view(np.uint8), slow[n].view(np.uint8)) for n in fast), t


def test_host_and_device_steps_mix_in_one_session():
    """A step of the other transport closes the running launch and relaunches in its own, from the states the last
    step left: host, device, host steps in turn equal the reference of the whole sequence."""
    torch = pytest.importorskip("torch")
    import tvm_ffi

    layer, inputs = _layer("lstm_d2", 64, 2, 24)
    xs = np.random.default_rng(9).standard_normal((6, 2, 24)).astype("float32")
    want, _ = _reference(layer.plan, inputs, xs)
    x = torch.empty(2, 24, device="cuda")
    out = torch.empty(len(layer.plan.states), 2, 64, device="cuda")
    (out - 1).abs().max().item()  # torch's kernels, loaded before the session starts
    with _session(layer, inputs, release_after=None) as session:
        for t, xt in enumerate(xs):
            if t % 2:
                x.copy_(torch.from_numpy(xt))
                with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
                    session.post(x, out)
                states = dict(zip(session.state_names, out.cpu().numpy()))
            else:
                states = session.step(xt)[1]
            assert _error(states, want[t]) <= tolerance("float32", t + 1), t
        assert session.launches == 6


def test_an_idle_session_lets_the_gpu_go_and_resumes_where_it_was():
    layer, inputs = _layer("lstm_d2", 64, 2, 32)
    xs = np.random.default_rng(5).standard_normal((12, 2, 32)).astype("float32")
    want, _ = _reference(layer.plan, inputs, xs)
    with _session(layer, inputs, release_after=0.002) as session:
        for t, x in enumerate(xs):
            if t % 3 == 2:
                time.sleep(0.05)
                assert not session.running
            y, states = session.step(x)
            assert _error(states, want[t]) <= tolerance("float32", 12)
        assert session.launches >= 4


def test_reset_reorder_and_set_state_change_what_the_next_step_starts_from():
    layer, inputs = _layer("gru", 32, 4, 16)
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((6, 4, 16)).astype("float32")
    with _session(layer, inputs) as session:
        for x in xs[:2]:
            session.step(x)
        after_two = session.state
        _, want = _reference(layer.plan, inputs, xs[:2])
        assert _error(after_two, want) <= tolerance("float32", 2)
        index = np.array([3, 3, 0, 1])
        session.reorder(index)
        session.reset([1])
        edited = {n: v[index].copy() for n, v in want.items()}
        for v in edited.values():
            v[1] = 0
        _, want = _reference(layer.plan, inputs, xs[2:4], edited)
        for x in xs[2:4]:
            session.step(x)
        assert _error(session.state, want) <= tolerance("float32", 4)
        chosen = {"h": rng.standard_normal((4, 32)).astype("float32")}
        session.set_state(chosen)
        y, _ = session.step(xs[4])
        (expected,), _ = _reference(layer.plan, inputs, xs[4:5], chosen)
        assert max_error([(y, expected["h"])]) <= tolerance("float32", 1)


def test_steps_posted_on_torchs_stream_and_replayed_from_a_cuda_graph():
    """Steps on torch's stream, then captured in a CUDA graph and replayed: each replay is the next step. torch's
    capture synchronizes the device first, so the session is released before it (the capture's post relaunches the
    resident kernel, on its own stream, outside the graph)."""
    torch = pytest.importorskip("torch")
    import tvm_ffi

    layer, inputs = _layer("lstm", 128, 2, 64)
    xs = torch.randn(8, 2, 64, device="cuda")
    want, _ = _reference(layer.plan, inputs, xs.cpu().numpy()[[0, 1, 2, 4, 5, 6]])
    session = _session(layer, inputs, release_after=None)
    x = torch.empty(2, 64, device="cuda")
    out = torch.empty(len(session.state_names), 2, 128, device="cuda")
    graph = torch.cuda.CUDAGraph()

    def one_step():
        with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
            session.post(x, out)

    def check(t):
        states = dict(zip(session.state_names, out.cpu().numpy()))
        assert _error(states, want[t]) <= tolerance("float32", 8), t

    try:
        for t in range(3):  # eager, on torch's stream
            x.copy_(xs[t])
            one_step()
            check(t)
        session.release()
        with torch.cuda.graph(graph):
            one_step()
        for t in range(3, 6):
            x.copy_(xs[t + 1])
            graph.replay()
            check(t)
        assert session.launches == 2
    finally:
        session.close()


def test_a_caller_that_stops_posting_lets_the_kernel_go_and_resumes_where_it_was():
    """The resident kernel leaves after idle_timeout_s without a request (it took none: its final states are the
    last step's); the next step relaunches from them, as a release does."""
    layer, inputs = _layer("lstm", 32, 2, 16)
    session = _session(layer, inputs, release_after=None, idle_timeout_s=0.2)
    xs = np.random.default_rng(5).standard_normal((3, 2, 16)).astype("float32")
    want, _ = _reference(layer.plan, inputs, xs)
    try:
        _, first = session.step(xs[0])
        time.sleep(0.5)  # the resident kernel gives up waiting for a request and leaves
        got = [first, *(session.step(x)[1] for x in xs[1:])]
        assert (session.idle_exits, session.launches) == (1, 2)
        assert max(_error(g, w) for g, w in zip(got, want)) <= tolerance("float32", 3)
    finally:
        session.close()


def test_a_kernel_first_loaded_during_a_session_waits_then_the_session_resumes():
    """CUDA's lazy loading makes a kernel's first launch wait for every running kernel: the resident kernel leaves
    after idle_timeout_s (the host thread, held in the load, cannot release it), the load goes on, and the next step
    relaunches from the last step's states."""
    torch = pytest.importorskip("torch")
    layer, inputs = _layer("lstm", 32, 2, 16)
    session = _session(layer, inputs, release_after=None, idle_timeout_s=1.0)
    xs = np.random.default_rng(6).standard_normal((2, 2, 16)).astype("float32")
    want, _ = _reference(layer.plan, inputs, xs)
    try:
        _, first = session.step(xs[0])
        t0 = time.monotonic()
        torch.special.bessel_j0(torch.ones(3, device="cuda")).cpu()  # a kernel no test launched before
        assert time.monotonic() - t0 < 30
        _, second = session.step(xs[1])
        assert max(_error(first, want[0]), _error(second, want[1])) <= tolerance("float32", 2)
    finally:
        session.close()


def test_a_block_that_never_publishes_is_a_timeout_not_a_hang():
    layer, inputs = _layer("lstm", 256, 2, 16)
    session = _session(layer, inputs, barrier_timeout_us=20_000, collect_timeout_us=200_000)
    session.debug_stall_step = 2  # block 0 never publishes step 2's states: the others wait at step 3
    x = np.zeros((2, 16), "float32")
    served = 0
    with pytest.raises(SessionError, match="timed out"):
        for _ in range(6):
            session.step(x)
            served += 1
    assert served == 3
    with pytest.raises(SessionError, match="closed"):
        session.step(x)


def test_sessions_hold_sms_and_the_next_is_refused_with_what_fits():
    layer, inputs = _layer("lstm", 1024, 4, 64)
    first = _session(layer, inputs, release_after=None)  # resident until closed, however slow the host
    first.step(np.zeros((4, 64), "float32"))
    ctas = first.signature.resident.grid.ctas
    second = _session(layer, inputs, release_after=None)
    try:
        if 2 * ctas <= 132 - 4:
            second.step(np.zeros((4, 64), "float32"))  # both fit
        else:
            with pytest.raises(SessionError, match="are left"):
                second.step(np.zeros((4, 64), "float32"))
            first.close()
            second.step(np.zeros((4, 64), "float32"))  # now it fits
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("ending", ["pass", "os._exit(0)"])
def test_a_process_that_exits_with_a_session_open_exits(ending):
    code = textwrap.dedent(f"""
        import os
        import numpy as np
        import prnn_tvm
        from prnn_tvm.reference import random_inputs
        layer = prnn_tvm.compile_cell("lstm", 64, 2)
        inputs = random_inputs(layer.plan, 1, 64)
        session = layer.session(**{{k: v for k, v in inputs.items() if k != "x"}}, release_after=None)
        session.step(np.zeros((2, 64), "float32"))
        {ending}
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_million_steps_equal_the_sequence_call():
    """No step lost, duplicated or reordered: 10^6 steps through a session, every state of every step compared with
    the layer's sequence call over the same inputs, chunk by chunk on the GPU."""
    torch = pytest.importorskip("torch")
    import tvm_ffi

    layer, inputs = _layer("lstm_d2", 32, 1, 8)
    T, chunk = 1_000_000, 20_000
    xs = torch.randn(T, 1, 8, device="cuda")
    weights = {k: v for k, v in inputs.items() if k != "x"}
    out, _ = layer(x=xs, **{k: torch.from_numpy(v).cuda() for k, v in weights.items()})
    out = torch.from_dlpack(out)
    x = torch.empty(1, 8, device="cuda")  # a step's input, aligned as the publish wants it
    got = torch.empty(chunk, len(layer.plan.states), 1, 32, device="cuda")
    k = [s.name for s in layer.plan.states].index(layer.plan.outputs[0])
    # every kernel the loop launches, launched once before the session starts (CUDA loads a kernel at its first
    # launch, and a load waits for every running kernel, the resident one included)
    x.copy_(xs[0])
    (got[:, k] - out[:chunk]).abs().max().item()
    session = layer.session(**weights, release_after=None)
    assert session.output_index == k
    worst = 0.0
    try:
        with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
            for start in range(0, T, chunk):
                for i in range(chunk):
                    x.copy_(xs[start + i])
                    session.post(x, got[i])
                worst = max(worst, (got[:, k] - out[start : start + chunk]).abs().max().item())
    finally:
        session.close()
    assert session.steps == T
    # two float32 kernels of different configs round differently, and a lost, repeated or swapped step moves the
    # output by far more than this
    assert worst <= 1e-4, worst


def test_a_torch_modules_session_steps_as_torch_nn_runs_the_sequence():
    """``module.session(batch)``: each step's output and states, in torch.nn's layout, equal torch.nn's sequence
    call on the same inputs (float32, TF32 off)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(8)
    ref = torch.nn.LSTM(24, 48, num_layers=2).cuda().eval()
    module = pt.from_torch(ref)
    xs = torch.randn(10, 3, 24, device="cuda")
    with torch.no_grad():
        want, (h_n, c_n) = ref(xs)
    (want[0] - want[0]).abs().max().item()  # this test's own kernels, loaded before the session starts
    with module.session(batch=3) as session:
        for t in range(10):
            y, (h, c) = session.step(xs[t])
            assert (y - want[t]).abs().max().item() <= tolerance("float32", 10)
        assert (h - h_n).abs().max().item() <= tolerance("float32", 10)
        assert (c - c_n).abs().max().item() <= tolerance("float32", 10)
        state = session.state
        assert (state[0] - h_n).abs().max().item() <= tolerance("float32", 10)


def test_a_torch_modules_session_takes_host_inputs_through_the_host_transport():
    """CPU tensors (pinned or not) and NumPy arrays step through the host transport and give CPU tensors, GPU
    tensors through the device one and give GPU tensors, in one session: every step's output equals torch.nn's
    sequence call on the same inputs (float16: two half-precision computations, each within the tolerance of the
    float64 reference)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.manual_seed(9)
    ref = torch.nn.LSTM(24, 48).cuda().half().eval()
    module = pt.from_torch(ref)
    xs = torch.randn(8, 2, 24, device="cuda").half()
    with torch.no_grad():
        want, (h_n, c_n) = ref(xs)
    (want[0] - want[0]).abs().max().item()  # this test's own kernels, loaded before the session starts
    host = xs.cpu()
    given = [host[0], host[1].pin_memory(), host[2].numpy(), xs[3], host[4], xs[5], host[6].numpy(), host[7]]
    with module.session(batch=2) as session:
        assert session.session.native  # CPU tensors through their data_ptr()
        for t, x in enumerate(given):
            y, (h, c) = session.step(x)
            on_gpu = isinstance(x, torch.Tensor) and x.is_cuda
            assert y.device.type == h.device.type == ("cuda" if on_gpu else "cpu"), (t, y.device)
            assert y.shape == (2, 48) and h.shape == c.shape == (1, 2, 48)
            assert (y.cuda().float() - want[t].float()).abs().max().item() <= 2 * tolerance("float16", t + 1), t
        assert (c.cuda().float() - c_n.float()).abs().max().item() <= 2 * tolerance("float16", 8)
        assert session.session.launches >= 5  # a relaunch at each switch of transport


def test_a_session_dropped_while_its_kernel_runs_is_closed_first():
    """A session garbage-collected with its resident kernel running closes it (the kernel stops polling and writing
    the page-locked rings before they are freed): a device-wide synchronization right after returns at once (a
    kernel left running would hold it for its idle_timeout_s of 30 s), and a new session over the same layer steps as
    the reference computes it."""
    import gc
    import weakref

    import tvm

    layer, inputs = _layer("lstm_d2", 128, 1, 64)
    x = np.random.default_rng(2).standard_normal((1, 64)).astype("float32")
    session = _session(layer, inputs, release_after=None, idle_timeout_s=30)
    session.step(x)
    assert session.running
    dropped = weakref.ref(session)
    del session
    gc.collect()
    assert dropped() is None
    start = time.monotonic()
    tvm.cuda(0).sync()
    assert time.monotonic() - start < 5.0
    with _session(layer, inputs) as again:
        _, states = again.step(x)
    want, _ = _reference(layer.plan, inputs, x[None])
    assert _error(states, want[0]) <= tolerance("float32", 1)


LOADED_SESSION = textwrap.dedent("""
    import sys, numpy as np, tvm
    import prnn_tvm
    layer = prnn_tvm.load(sys.argv[1])
    data = np.load(sys.argv[2])
    weights = {k[2:]: data[k] for k in data.files if k.startswith("w_")}
    names = [k[5:] for k in data.files if k.startswith("want_")]
    with layer.session(**weights, collect_timeout_us=10_000_000, barrier_timeout_us=10_000_000) as session:
        for t, x in enumerate(data["xs"]):
            y, states = session.step(x)
            worst = max(float(np.abs(states[n] - data["want_" + n][t]).max()) for n in names)
            assert worst <= float(data["tolerance"]), f"step {t}: error {worst}"
        assert session.launches == 1
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY and "libtvm_compiler" not in maps, "the TVM compiler was loaded"
    print("loaded session ok", len(data["xs"]))
""")


@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, dtype", [("lstm_d2", 128, 1, 64, "float32"), ("gru", 96, 4, 40, "float16")]
)
def test_an_exported_session_runs_with_the_runtime_only(cell, hidden, batch, input_size, dtype, tmp_path):
    """export(session=True), then load in a fresh process with TVM's runtime alone: the loaded layer's session
    serves each step as the float64 reference computes it, in one launch."""
    layer, inputs = _layer(cell, hidden, batch, input_size, dtype)
    path = prnn_tvm.export(layer, tmp_path / f"{cell}.so", session=True)
    T = 30
    xs = np.random.default_rng(5).standard_normal((T, batch, input_size)).astype(dtype)
    want, _ = _reference(layer.plan, inputs, xs)
    np.savez(
        tmp_path / "io.npz",
        xs=xs,
        tolerance=tolerance(dtype, T),
        **{f"w_{k}": v for k, v in inputs.items() if k != "x"},
        **{f"want_{n}": np.stack([w[n] for w in want]) for n in want[0]},
    )
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run(
        [sys.executable, "-c", LOADED_SESSION, str(path), str(tmp_path / "io.npz")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0 and "loaded session ok 30" in done.stdout, done.stderr[-2000:]

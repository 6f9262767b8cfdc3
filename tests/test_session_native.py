"""A session's native host step (``prnn_tvm.runtime.session_native``) against the Python one, on the CPU: the same
request words and the same states for every dtype and packing, through a layer's resident kernel run as emitted
(the emulator), and through a :class:`Session` whose kernel is a test double (responses placed in the ring before
the step, so the spin ends at once, or never); built once per machine; without a compiler, Python with a warning.
The rings' bounds and the spin's cases, both ways: ``test_session_host.py``. On the GPU: ``test_gpu_session.py``."""

import logging
import shutil
import subprocess
import sysconfig
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.cli import main
from prnn_tvm.compiler import compile_session
from prnn_tvm.errors import SessionError
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime import session_host, session_native
from prnn_tvm.runtime.session import HOST, Session
from prnn_tvm.runtime.session_host import READY, HostRings
from prnn_tvm.verify import emulator
from prnn_tvm.verify.session import run_session

from .test_session import _reference_steps

ml_dtypes = pytest.importorskip("ml_dtypes")

STATES, BATCH, HIDDEN, INPUTS = 4, 2, 9, 11
NO_ERROR = np.zeros(1, np.uint32)
BUILDABLE = shutil.which("cc") is not None and Path(sysconfig.get_paths()["include"], "Python.h").is_file()


@pytest.fixture
def built():
    """The native step's module (skips where this machine cannot build it)."""
    module = session_native.native()
    if module is None:
        pytest.skip("the native host step cannot be built here (see the warning)")
    return module


def _pair(dtype, words, depth=2):
    """Rings of both host steps, alike: (native rings, Python rings, their request and response rings)."""
    made = []
    for native in (True, False):
        requests = np.zeros((depth, words), np.uint64)
        responses = np.zeros((depth, STATES, BATCH, HIDDEN), np.uint64)
        rings = HostRings(requests, responses, BATCH * INPUTS, dtype, dtype, NO_ERROR.ctypes.data, native)
        made.append((rings, requests, responses))
    assert made[0][0].native and not made[1][0].native
    return made


def _tagged(values: np.ndarray, tag: int) -> np.ndarray:
    """What the resident kernel stores: each state value's bits, tagged."""
    bits = values.view(np.uint16 if values.dtype.itemsize == 2 else np.uint32).astype(np.uint64)
    return (np.uint64(tag) << np.uint64(32)) | bits


def _inputs(rng, dtype, shape):
    """Random values of ``dtype`` with every kind of bits a caller may pass: infinities, a signed zero, NaNs,
    and the close mark's bits (every bit set) in a value and in a pair of halves."""
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[:4] = [np.inf, -np.inf, -0.0, np.nan]
    bits = np.uint16 if x.dtype.itemsize == 2 else np.uint32
    flat[4:6].view(bits)[:] = np.iinfo(bits).max
    return x


def test_the_native_step_is_built_where_a_c_compiler_and_pythons_headers_are():
    if not BUILDABLE:
        pytest.skip("no cc or no Python.h here: the fallback is tested below")
    module = session_native.native()
    assert module is not None
    assert (module.READY, module.FAILED, module.TIMED_OUT) == (session_host.READY, session_host.FAILED,
                                                               session_host.TIMED_OUT)
    assert module.CHECK_EVERY == session_host.CHECK_EVERY


@pytest.mark.parametrize(
    "dtype, words",
    [
        ("float32", BATCH * INPUTS),  # a float32 a word
        ("float16", (BATCH * INPUTS + 1) // 2),  # two halves a word, an odd count
        ("bfloat16", (BATCH * INPUTS + 1) // 2),
        ("float16", BATCH * INPUTS),  # a half a word, widened to float32
        ("bfloat16", BATCH * INPUTS),
    ],
)
def test_native_and_python_steps_write_and_read_the_same_words(built, dtype, words):
    """Eight steps through both host steps' rings: every request word alike, and every step's states (placed by a
    double of the kernel before the step) alike, bit for bit, and equal to what was placed."""
    (fast, fast_requests, fast_responses), (slow, slow_requests, slow_responses) = _pair(dtype, words)
    rng = np.random.default_rng(5)
    for step in range(8):
        tag = 0xFFFFFFFF - 3 + step  # across the tag's wrap to 0
        tag &= 0xFFFFFFFF
        x = _inputs(rng, dtype, (BATCH, INPUTS))
        values = rng.standard_normal((STATES, BATCH, HIDDEN)).astype(dtype)
        for responses in (fast_responses, slow_responses):
            responses[step % 2] = _tagged(values, tag)
        got = [np.empty((STATES, BATCH, HIDDEN), dtype) for _ in range(2)]
        assert fast.step(x, got[0], step, tag, 10**9) == READY
        assert slow.step(x, got[1], step, tag, 10**9) == READY
        assert np.array_equal(fast_requests, slow_requests), step
        assert np.array_equal(got[0].view(np.uint8), got[1].view(np.uint8)), step
        assert np.array_equal(got[0].view(np.uint8), values.view(np.uint8)), step


def test_the_native_step_takes_addresses_views_and_refuses_wrong_sizes(built):
    """A tensor's ``data_ptr()`` passes as an integer; a view that is not in order is copied once; an array of the
    wrong size, a null address or a wrong count of arguments is refused, naming it, before anything is posted."""
    (fast, requests, responses), (slow, slow_requests, _) = _pair("float32", BATCH * INPUTS)
    values = np.arange(STATES * BATCH * HIDDEN, dtype=np.float32).reshape(STATES, BATCH, HIDDEN)
    responses[0] = _tagged(values, 1)
    x = np.arange(2 * BATCH * INPUTS, dtype=np.float32).reshape(BATCH, 2 * INPUTS)[:, ::2]  # not in order
    out = np.zeros_like(values)
    assert fast.step(x, out.ctypes.data, 0, 1, 10**9) == READY
    assert np.array_equal(out, values)
    slow.post(np.ascontiguousarray(x), 0, 1)
    assert np.array_equal(requests, slow_requests)
    before = requests.copy()
    with pytest.raises(ValueError, match="x holds 8 bytes"):
        fast.step(np.zeros(2, np.float32), out, 2, 3, 10**9)
    with pytest.raises(ValueError, match="out holds"):
        fast.step(np.zeros((BATCH, INPUTS), np.float32), np.zeros(3, np.float32), 2, 3, 10**9)
    with pytest.raises(ValueError, match="x: a null address"):
        fast.step(0, out, 2, 3, 10**9)
    with pytest.raises(TypeError, match=r"post\(ring, x, step, tag\) takes 4 arguments, got 2"):
        built.post(fast._address, x)
    assert np.array_equal(requests, before)


def _session(host_step: str, dtype="float32", timeout_us=20_000):
    """A :class:`Session` whose resident kernel is a double: its launch marked running, its rings plain NumPy (the
    caller places the responses); returns ``(session, the response ring)``."""
    requests = np.zeros((2, BATCH * INPUTS), np.uint64)
    responses = np.zeros((2, STATES, BATCH, HIDDEN), np.uint64)
    rings = HostRings(requests, responses, BATCH * INPUTS, dtype, dtype, NO_ERROR.ctypes.data, host_step == "native")
    session = Session.__new__(Session)
    session.__dict__.update(
        signature=SimpleNamespace(cell="lstm_d2", dtype=dtype),
        state_names=("l0_h", "l0_c", "l1_h", "l1_c"),
        output_index=2,
        _lock=threading.RLock(),
        _closed=False,
        _running=True,
        _transport=HOST,
        _error=SimpleNamespace(read=lambda: 0),
        _host=rings,
        _host_base=0,
        _host_steps=0,
        _collect_timeout_ns=timeout_us * 1000,
        _x_shape=(BATCH, INPUTS),
        _x_dtype=np.dtype(dtype),
        _states_shape=(STATES, BATCH, HIDDEN),
        steps=0,
        _last_step=0.0,
    )
    return session, responses


@pytest.mark.parametrize("host_step", ["native", "python"])
def test_a_sessions_host_step_is_the_same_natively_and_in_python(built, host_step):
    session, responses = _session(host_step)
    assert session.native == (host_step == "native")
    rng = np.random.default_rng(2)
    for step in range(5):
        values = rng.standard_normal((STATES, BATCH, HIDDEN)).astype(np.float32)
        responses[step % 2] = _tagged(values, step + 1)
        y, states = session.step(rng.standard_normal((BATCH, INPUTS)).astype(np.float32))
        assert np.array_equal(y, values[2]) and list(states) == list(session.state_names)
        assert all(np.array_equal(states[n], values[k]) for k, n in enumerate(session.state_names))
    assert session.steps == session._host_steps == 5


@pytest.mark.parametrize("host_step", ["native", "python"])
def test_a_host_step_whose_states_never_come_raises_the_sessions_timeout(built, host_step):
    """One response word stale (the step before's tag): the step gives up after collect_timeout_us with the
    session's timeout error, not a hang, and the session is closed."""
    session, responses = _session(host_step, timeout_us=20_000)
    responses[0] = _tagged(np.ones((STATES, BATCH, HIDDEN), np.float32), 1)
    responses[0, 1, 0, 3] = _tagged(np.ones(1, np.float32), 0)[0]
    start = time.monotonic()
    with pytest.raises(SessionError, match="timed out at step 0"):
        session.step(np.zeros((BATCH, INPUTS), np.float32))
    assert 0.02 <= time.monotonic() - start < 2.0
    with pytest.raises(SessionError, match="closed"):
        session.step(np.zeros((BATCH, INPUTS), np.float32))


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
def test_native_and_python_host_steps_serve_a_resident_kernel_alike(built):
    """A two-layer LSTM's resident kernel run as emitted, fed and read by each host step: the same states at every
    step, bit for bit, and the float64 reference's. (Half layers multiply on tensor cores, which the emulator has
    no host form of: their words are checked above, and on the GPU.)"""
    layer = prnn_tvm.compile_cell("lstm_d2", 10, 2, input_size=3, target="cuda", arch="sm_90")
    kernels = compile_session(layer)
    inputs = random_inputs(layer.plan, 4, 3, seed=3)
    runs = {step: run_session(kernels, inputs, 4, transport="host", host_step=step) for step in ("native", "python")}
    want = _reference_steps(layer.plan, inputs)
    for name in want:
        assert np.array_equal(runs["native"][0][name], runs["python"][0][name]), name
        assert np.abs(runs["native"][0][name] - want[name]).max() < 1e-5, name
    assert runs["native"][2] == runs["python"][2] == 0


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """The native step looked up anew, in an empty cache of its own; the process's lookup restored after."""
    monkeypatch.setenv("PRNN_TVM_CACHE_DIR", str(tmp_path / "cache"))
    session_native.native.cache_clear()
    yield
    session_native.native.cache_clear()


@pytest.mark.skipif(not BUILDABLE, reason="no cc or no Python.h here")
def test_the_native_step_is_built_once_and_found_in_the_cache_after(fresh_native, monkeypatch, capsys):
    assert session_native.native() is not None
    assert main(["cache", "list"]) == 0
    assert "native   session host step " in capsys.readouterr().out  # an entry of the layer cache
    session_native.native.cache_clear()  # as a second process starts

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"compiled again: {args}")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert session_native.native() is not None


def test_without_a_compiler_a_host_step_runs_in_python_with_a_warning(fresh_native, monkeypatch, caplog):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="prnn_tvm.runtime.session_native"):
        assert session_native.native() is None
    assert "runs in Python" in caplog.text and "no C compiler" in caplog.text
    session, responses = _session("native")
    assert not session.native
    values = np.full((STATES, BATCH, HIDDEN), 2.5, np.float32)
    responses[0] = _tagged(values, 1)
    y, _ = session.step(np.zeros((BATCH, INPUTS), np.float32))
    assert np.array_equal(y, values[2])

"""The host's half of a session's host transport on the CPU (``prnn_tvm.runtime.session_host``), natively
(``session_native``) and in Python: the rings are NumPy arrays, and a thread stands in for the resident kernel. The
requests it packs, the spin on the responses (a probe word, then every word), its bounds, and a dropped session's
close. The native step against the Python one: ``test_session_native.py``. On the GPU: ``test_gpu_session.py``."""

import threading
import time

import numpy as np
import pytest

from prnn_tvm.runtime import session_words as words
from prnn_tvm.runtime.session import Session
from prnn_tvm.runtime.session_host import FAILED, READY, TIMED_OUT, HostRings
from prnn_tvm.runtime.session_native import native

ml_dtypes = pytest.importorskip("ml_dtypes")

STATES, BATCH, HIDDEN, INPUTS = 2, 3, 5, 7
NO_ERROR = np.zeros(1, np.uint32)  # a kernel's error word that stays clear


@pytest.fixture(params=["native", "python"])
def host_step(request):
    """Each test of the host side runs natively and in Python."""
    if request.param == "native" and native() is None:
        pytest.skip("the native host step cannot be built here (see the warning)")
    return request.param


def _rings(host_step, dtype="float32", error=NO_ERROR, words=BATCH * INPUTS):
    requests = np.zeros((2, words), np.uint64)
    responses = np.zeros((2, STATES, BATCH, HIDDEN), np.uint64)
    rings = HostRings(requests, responses, BATCH * INPUTS, dtype, dtype, error.ctypes.data, host_step == "native")
    assert rings.native == (host_step == "native")
    return rings, requests, responses


def _collected(rings, step, tag, dtype, timeout_ns=10**9):
    """How step ``step``'s wait ended, and its states (zeros where it did not end READY)."""
    out = np.zeros((STATES, BATCH, HIDDEN), dtype)
    return rings.collect(out, step, tag, timeout_ns), out


def _respond(responses, slot, values, tag, skip_last=False):
    """What the resident kernel stores: each state value's bits, tagged."""
    bits = values.view(np.uint16 if values.dtype.itemsize == 2 else np.uint32).astype(np.uint64)
    words_ = (np.uint64(tag) << np.uint64(32)) | bits
    flat = responses[slot].reshape(-1)
    n = flat.size - 1 if skip_last else flat.size
    flat[:n] = words_.reshape(-1)[:n]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_request_is_the_inputs_float32_bits_tagged_in_its_slot(dtype, host_step):
    rings, requests, _ = _rings(host_step, dtype)
    x = np.random.default_rng(0).standard_normal((BATCH, INPUTS)).astype(dtype)
    x[0, :3] = [np.inf, -0.0, np.nan]
    rings.post(x, 3, 9)  # step 3: slot 1
    assert not requests[0].any()
    got = requests[1]
    assert np.array_equal(got >> np.uint64(32), np.full(x.size, 9, np.uint64))
    sent = (got & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    assert np.array_equal(sent, x.astype(np.float32).reshape(-1), equal_nan=True)
    assert words.tagged(got, 9) and not words.tagged(got, 8) and not words.tagged(got, 10)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_go_two_a_word_where_the_mailbox_has_half_the_words(dtype, host_step):
    """An odd count (21 values in 11 words): the first value of a pair in the low half, the last word's high half
    zero; the words carry the values' own bits."""
    count = BATCH * INPUTS
    rings, requests, _ = _rings(host_step, dtype, words=(count + 1) // 2)
    x = np.random.default_rng(3).standard_normal((BATCH, INPUTS)).astype(dtype)
    x[0, :2] = [np.inf, np.nan]
    rings.post(x, 0, 5)
    got = requests[0]
    assert words.tagged(got, 5) and got.shape == (11,)
    halves = (got & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.uint16)
    assert np.array_equal(halves[:count], x.reshape(-1).view(np.uint16)) and halves[count] == 0
    assert np.array_equal(words.request_words(x, 5, np.empty(11, np.uint64)), got)
    with pytest.raises(ValueError, match="do not go into"):
        words.RequestPacker(count, "float32", 11)


@pytest.mark.parametrize("dtype, words_", [("float32", BATCH * INPUTS), ("float16", (BATCH * INPUTS + 1) // 2)])
def test_an_input_with_the_close_marks_bits_goes_as_other_nans(dtype, words_, host_step):
    rings, requests, _ = _rings(host_step, dtype, words=words_)
    x = np.zeros((BATCH, INPUTS), dtype)
    bits = np.uint16 if dtype == "float16" else np.uint32
    x.reshape(-1).view(bits)[:2] = np.iinfo(bits).max  # every bit set: a float32 value, or a pair of halves
    rings.post(x, 0, 4)
    assert int(requests[0, 0]) == (4 << 32) | words.CLOSE_SENT_AS  # float32 NaN; or the two halves NaN, 0xfffe
    assert np.isnan(np.uint32(words.CLOSE_SENT_AS).view(np.float32))
    assert np.isnan(np.array([words.CLOSE_SENT_AS], np.uint32).view(np.float16)).all()


def test_the_highest_tag_is_told_from_its_neighbours():
    """The tag check is a range of words: exact at the top tag, where the range's end is the last uint64."""
    top = 0xFFFFFFFF
    every = np.full(4, (top << 32) | 0xFFFF, np.uint64)
    assert words.tagged(every, top)
    every[2] = ((top - 1) << 32) | 0xFFFFFFFF
    assert not words.tagged(every, top) and not words.tagged(every, top - 1)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_wait_ends_when_every_response_word_carries_the_tag_and_the_states_are_a_copy(dtype, host_step):
    rings, _, responses = _rings(host_step, dtype)
    values = np.random.default_rng(1).standard_normal((STATES, BATCH, HIDDEN)).astype(dtype)
    _respond(responses, 0, values, 6)
    ended, states = _collected(rings, 2, 6, dtype)
    assert ended == READY and np.array_equal(states, values)
    _respond(responses, 0, values + 1, 8)  # the slot written again two steps later
    assert np.array_equal(states, values)


def test_a_spin_that_sees_the_probe_word_first_waits_for_the_others(host_step):
    """The kernel's threads store in any order: the probe (the slot's last word) tagged while others are stale does
    not end the wait; the stale ones, stored later by a double of the kernel, do (a native spin reads memory again
    every poll, and lets the double's thread run)."""
    rings, _, responses = _rings(host_step)
    values = np.arange(STATES * BATCH * HIDDEN, dtype=np.float32).reshape(STATES, BATCH, HIDDEN)
    _respond(responses, 1, values, 2)  # the step before's words in slot 1
    responses[1].reshape(-1)[-1] = (np.uint64(3) << np.uint64(32)) | values.view(np.uint32).reshape(-1)[-1]
    late = threading.Timer(0.05, _respond, (responses, 1, values, 3))
    late.start()
    start = time.monotonic()
    ended, states = _collected(rings, 1, 3, "float32")
    assert ended == READY
    assert time.monotonic() - start >= 0.04
    late.join()
    assert np.array_equal(states, values)


def test_the_wait_is_bounded_and_ends_at_the_kernels_error(host_step):
    rings, _, responses = _rings(host_step)
    values = np.ones((STATES, BATCH, HIDDEN), np.float32)
    _respond(responses, 0, values, 5, skip_last=True)
    start = time.monotonic()
    assert _collected(rings, 0, 5, "float32", 20_000_000)[0] == TIMED_OUT  # 20 ms
    assert 0.02 <= time.monotonic() - start < 1.0
    error = np.zeros(1, np.uint32)
    rings, _, responses = _rings(host_step, error=error)
    threading.Timer(0.02, error.__setitem__, (0, 7)).start()
    start = time.monotonic()
    assert _collected(rings, 0, 5, "float32", 10**10)[0] == FAILED
    assert time.monotonic() - start < 1.0


def test_a_word_of_another_step_is_never_taken(host_step):
    """Every word of the slot but one carries the step's tag, that one another step's (a stale word, left by the
    step before or by an earlier launch): the wait gives up at its bound, wherever that word is."""
    values = np.arange(STATES * BATCH * HIDDEN, dtype=np.float32).reshape(STATES, BATCH, HIDDEN)
    for stale in (0, 7, STATES * BATCH * HIDDEN - 1):
        for other in (4, 6):
            rings, _, responses = _rings(host_step)
            _respond(responses, 1, values, 5)
            flat = responses[1].reshape(-1)
            flat[stale] = (np.uint64(other) << np.uint64(32)) | (flat[stale] & np.uint64(0xFFFFFFFF))
            assert _collected(rings, 1, 5, "float32", 2_000_000)[0] == TIMED_OUT, (stale, other)


def test_the_close_mark_fills_the_steps_slot():
    rings, requests, _ = _rings("python")
    rings.close(5, 11)
    assert not requests[0].any()
    assert set(requests[1].reshape(-1).tolist()) == {(11 << 32) | words.CLOSE}


def test_a_session_dropped_while_open_is_closed_before_its_memory_goes(monkeypatch):
    """``__del__`` closes an open session (its kernel stops writing to the rings first); a closed one, or one whose
    construction failed early, is left alone."""
    closed = []
    monkeypatch.setattr(Session, "close", lambda self: closed.append(self.name))
    for name, attributes in (
        ("open", {"_closed": False, "_stream": 1}),
        ("closed", {"_closed": True, "_stream": 1}),
        ("half made", {"_closed": False}),
        ("bare", {}),
    ):
        session = Session.__new__(Session)
        session.__dict__.update(attributes, name=name)
        del session
    assert closed == ["open"]

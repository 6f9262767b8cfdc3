"""A compiled layer's call keeps its own buffers (the input projection ``xp``) between calls, per host thread and
stream (``prnn_tvm.runtime.buffers``): made once per length, not per call, and never shared by two threads; the
outputs, which the caller keeps, are new at every call. On the CPU build."""

import threading

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime import limits

B, H = 2, 8


@pytest.fixture(scope="module", params=["lstm", "lstm_h4"])  # a head-wise layer's call is bound the same way
def layer(request):
    return prnn_tvm.compile_cell(request.param, H, B, target="llvm")


def _xp(call):
    """The input projection's buffer of a bound call (what the projection writes and the recurrence reads)."""
    (_, projection), (_, recurrent) = call.launches
    assert projection[-1] is recurrent[0]
    return recurrent[0]


def test_ten_calls_allocate_their_outputs_and_no_projection(layer, monkeypatch):
    inputs = random_inputs(layer.plan, 1, H)
    layer(**inputs)  # the first call of this length makes xp
    made = []
    empty = tvm.runtime.empty

    def counted(shape, dtype, device):
        made.append(tuple(shape))
        return empty(shape, dtype, device)

    monkeypatch.setattr(tvm.runtime, "empty", counted)
    for _ in range(10):
        layer(**inputs)
    outputs = len(layer.signature.outputs)  # out and the final states: the caller's, new every call
    assert len(made) == 10 * outputs, made
    assert (1, B, 4 * H) not in made  # xp (T=1, batch, gates x hidden) was not made again


def test_a_length_keeps_its_buffer_and_another_length_replaces_it(layer):
    one = _xp(layer.bind(**random_inputs(layer.plan, 3, H)))
    assert _xp(layer.bind(**random_inputs(layer.plan, 3, H))) is one
    other = _xp(layer.bind(**random_inputs(layer.plan, 4, H)))
    assert other is not one and tuple(other.shape) == (4, B, 4 * H)
    assert _xp(layer.bind(**random_inputs(layer.plan, 4, H))) is other


def test_two_host_threads_never_share_a_buffer(layer):
    inputs = random_inputs(layer.plan, 2, H)
    mine = _xp(layer.bind(**inputs))
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(_xp(layer.bind(**inputs))))
    worker.start()
    worker.join()
    assert theirs and theirs[0] is not mine
    assert _xp(layer.bind(**inputs)) is mine


def test_calls_on_kept_buffers_give_each_calls_own_results(layer):
    first, second = (random_inputs(layer.plan, 5, H, seed=s) for s in (1, 2))
    want = layer(**first)
    layer(**second)  # writes the kept xp with other values
    again = layer(**first)
    assert np.array_equal(again[0], want[0])
    assert all(np.array_equal(a, w) for a, w in zip(again[1], want[1]))


def test_a_chunked_call_keeps_its_pieces(layer, monkeypatch):
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 4 * H * B * 3)  # three steps of xp per launch
    inputs = random_inputs(layer.plan, 7, H)
    first, second = layer.bind(**inputs), layer.bind(**inputs)
    assert first.chunks == second.chunks == 3

    def pieces(call):  # where each chunk's recurrent launch reads its projection
        return [args[0].data_ptr() for name, args in call.launches if name == "recurrent"]

    assert pieces(first) == pieces(second)
    want = layer(**inputs)
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2**31 - 1)
    whole = layer(**inputs)
    assert np.allclose(whole[0], want[0], atol=1e-6)


def test_the_memory_check_counts_a_kept_buffer_once(layer, monkeypatch):
    from prnn_tvm.errors import InputError
    from prnn_tvm.runtime import binding

    steps = 6
    inputs = random_inputs(layer.plan, steps, H)
    layer.bind(**inputs)  # keeps xp of six steps
    xp = steps * B * 4 * H * 4
    outputs = steps * B * H * 4 + 2 * B * H * 4  # out, h_n, c_n (float32)
    copied = sum(a.nbytes for a in inputs.values())  # NumPy inputs go to the device
    monkeypatch.setattr(binding, "_free_memory", lambda device: copied + outputs + xp // 2)
    layer.bind(**inputs)  # xp is there already: only the outputs are new
    with pytest.raises(InputError, match=r"needs .* GiB .* \(x, .*xp\)"):
        layer.bind(**random_inputs(layer.plan, steps + 1, H))  # a new xp would not fit


def test_omitted_states_and_lengths_are_read_from_constants_made_once(layer):
    inputs = random_inputs(layer.plan, 3, H)
    given = {k: v for k, v in inputs.items() if k not in ("h0", "c0")}
    first, second = layer.bind(**given), layer.bind(**given)
    (_, a), (_, b) = first.launches[1], second.launches[1]  # the recurrent launch: xp, W_hh, b_hh, h0, c0, lengths
    assert all(x is y for x, y in zip(a[3:6], b[3:6]))
    assert not a[3].numpy().any() and (a[5].numpy() == 3).all()
    out, _ = layer(**given)  # NumPy in: NumPy out, as when the states were NumPy zeros
    assert isinstance(out, np.ndarray)
    want, _ = layer(**given, h0=np.zeros((B, H), np.float32), c0=np.zeros((B, H), np.float32))
    assert np.array_equal(out, want)

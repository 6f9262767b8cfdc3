"""The repeated call's plan (:mod:`prnn_tvm.torch.repeat`) over awkward shapes, on the CPU build: its outputs are the
module's own path's bit for bit (the same kernels on the same arguments) and within the dtype's tolerance of
float64 NumPy's, for hidden 1, one row, odd sizes, an input width unlike hidden, one to three layers, every input
layout, with and without initial states, float32 and the CPU's half path."""

import copy

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch import dispatch, repeat  # noqa: E402
from prnn_tvm.torch.arguments import aligned_state  # noqa: E402

CASES = [  # (cell, layers, input size, hidden, batch, steps, form, states given, dtype)
    ("lstm", 1, 1, 1, 1, 1, "time-major", True, torch.float32),  # hidden 1, one row
    ("lstm", 1, 5, 3, 1, 1, "time-major", False, torch.float32),
    ("lstm", 2, 6, 7, 3, 1, "batch_first", True, torch.float32),  # odd sizes (batch 3: no bucket)
    ("lstm", 3, 4, 9, 2, 1, "time-major", True, torch.float32),
    ("lstm", 2, 3, 5, 1, 1, "unbatched", True, torch.float32),
    ("lstm", 3, 2, 4, 4, 3, "unbatched", False, torch.float32),
    ("lstm", 2, 8, 8, 2, 4, "time-major", True, torch.float32),  # a few steps
    ("lstm", 3, 4, 16, 1, 1, "time-major", True, torch.float32),  # rows of 64 bytes: final states in place
    ("lstm", 2, 3, 16, 1, 1, "unbatched", False, torch.float32),
    ("gru", 2, 5, 6, 1, 1, "time-major", True, torch.float32),
    ("rnn_tanh", 1, 3, 7, 2, 1, "batch_first", False, torch.float32),
    ("lstm", 1, 5, 3, 2, 1, "time-major", True, torch.float16),  # the CPU's half path
    ("lstm", 2, 4, 16, 2, 1, "batch_first", True, torch.float16),
    ("gru", 1, 3, 5, 3, 1, "unbatched", False, torch.bfloat16),
]
_TORCH = {
    "lstm": torch.nn.LSTM,
    "gru": torch.nn.GRU,
    "rnn_tanh": torch.nn.RNN,
    "rnn_relu": lambda *a, **k: torch.nn.RNN(*a, nonlinearity="relu", **k),
}


def _inputs(cell, layers, width, hidden, batch, steps, form, given, dtype):
    shape = {"time-major": (steps, batch, width), "batch_first": (batch, steps, width), "unbatched": (steps, width)}
    x = torch.randn(shape[form]).to(dtype)
    state_shape = (layers, hidden) if form == "unbatched" else (layers, batch, hidden)
    states = [torch.randn(state_shape).to(dtype) for _ in range(2 if cell == "lstm" else 1)]
    return x, (None if not given else tuple(states) if cell == "lstm" else states[0])


def _flat(result):
    out, finals = result
    return [out, *(finals if isinstance(finals, tuple) else (finals,))]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_a_planned_call_is_the_modules_own_path_bit_for_bit(case, in_place, monkeypatch):
    """``in_place``: the final states written into the tensors the call returns, as on the GPU."""
    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu") if in_place else ("cuda",))
    _compare_with_own_path(case, "cpu", monkeypatch)


GPU_CASES = [  # as CASES, on the GPU: float32 with b_ih folded too, a stack layer by layer (wavefront off)
    ("lstm", 2, 128, 128, 1, 1, "time-major", True, torch.float32),
    ("lstm", 1, 640, 640, 8, 1, "time-major", True, torch.float16),
    ("lstm", 1, 5, 3, 1, 1, "batch_first", False, torch.float32),
    ("lstm", 3, 24, 40, 2, 1, "unbatched", True, torch.float32),
    ("lstm", 2, 16, 32, 8, 2, "time-major", True, torch.bfloat16),
    ("gru", 2, 12, 24, 4, 1, "time-major", True, torch.float32),
    ("rnn_tanh", 1, 7, 9, 1, 1, "time-major", False, torch.float16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("wavefront", [True, False])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_gpu_a_planned_call_is_the_modules_own_path_bit_for_bit(case, wavefront, monkeypatch, no_tf32):
    """The projection a launch of its own, as the module's own path runs it (``ONE_LAUNCH`` off)."""
    monkeypatch.setattr(repeat, "ONE_LAUNCH", False)
    _compare_with_own_path(case, "cuda", monkeypatch, wavefront)


ONE_LAUNCH_CASES = [  # T=1: each layer's input (a wavefront stack's first layer's) projected in its recurrent kernel
    *(c for c in GPU_CASES if c[5] == 1),
    ("lstm", 1, 1, 1, 1, 1, "time-major", True, torch.float32),  # hidden 1, one row, an input of one value
    ("gru", 1, 1, 13, 3, 1, "batch_first", True, torch.float16),
    ("rnn_relu", 2, 33, 17, 1, 1, "time-major", True, torch.float32),
    ("lstm", 3, 480, 480, 1, 1, "time-major", True, torch.float32),  # the 3x480
    ("gru", 1, 640, 640, 8, 1, "time-major", False, torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("wavefront", [True, False])
@pytest.mark.parametrize("case", ONE_LAUNCH_CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_gpu_a_one_launch_plan_is_the_two_launch_path_within_tolerance(case, wavefront, monkeypatch, no_tf32):
    """At T=1 every layer one launch (``recurrent_projected``; a wavefront stack one launch in all): its projection
    sums in float32 in another order than torch's GEMM, so the planned call is the module's own path within the
    dtype's tolerance."""
    _compare_with_own_path(case, "cuda", monkeypatch, wavefront, one_launch=True)


def _compare_with_own_path(case, device, monkeypatch, wavefront=True, one_launch=False):
    """The third call of ``case`` (its plan's), the first (the module's own path, before any plan) and one with plans
    off: the same tensors bit for bit (``one_launch``: each layer one launch, every layer's, and within the dtype's
    tolerance of the own path), each within the dtype's tolerance of float64 torch.nn on the same values."""
    cell, layers, width, hidden, batch, steps, form, given, dtype = case
    torch.manual_seed(1)
    reference = _TORCH[cell](width, hidden, layers, batch_first=form == "batch_first").to(device).eval()
    ours = pt.from_torch(reference).to(dtype).eval()  # the same parameters: the reference's rounded to dtype
    ours.batch_buckets, ours.wavefront = False, wavefront  # every batch its own rows: a padded one is not planned
    x, hx = _inputs(*case)
    x, hx = x.to(device), None if hx is None else _moved(hx, lambda t: t.to(device))
    with torch.no_grad():
        calls = [ours(x, hx) for _ in range(3)]  # the third runs the plan the second made
        plan = ours._plans[repeat.call_key(ours, x, hx)]
        assert type(plan) is repeat.Plan and (wavefront or not plan.stack)
        projected = [step.project is aligned_state for step in plan.steps]
        assert projected == [one_launch] * len(plan.steps)
        rows = 1 if form == "unbatched" else batch
        in_place = x.device.type in dispatch.WRITTEN_IN_PLACE and rows * hidden * dtype.itemsize % 64 == 0
        assert (plan.whole is not None) == in_place
        with monkeypatch.context() as plans_off:
            plans_off.setattr(repeat, "call_key", lambda *_: None)
            own = ours(x, hx)
        want = copy.deepcopy(reference).double()(x.double(), None if hx is None else _moved(hx, torch.Tensor.double))
    for planned, mine, first, expected in zip(_flat(calls[2]), _flat(own), _flat(calls[0]), _flat(want)):
        assert planned.shape == mine.shape == expected.shape and planned.dtype == mine.dtype == dtype
        bound = tolerance(str(dtype).removeprefix("torch."), steps * layers)
        assert torch.equal(mine, first)
        if one_launch:
            assert (planned.double() - mine.double()).abs().max().item() <= bound
        else:
            assert torch.equal(planned, mine)
        error = (planned.double() - expected).abs().max().item()
        assert error <= bound, error


def _moved(hx, move):
    return tuple(move(t) for t in hx) if isinstance(hx, tuple) else move(hx)


@pytest.mark.parametrize("device", ["cpu", "cpu in place", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("wavefront", [True, False])
def test_a_planned_call_returns_tensors_of_its_own(device, wavefront, monkeypatch):
    """Each call's outputs are new tensors (a decoder keeps them, and passes the states back in): the next planned
    call writes none of the last one's, and shares no memory with them (``in place``: the final states written into
    the tensors the call returns, as on the GPU, the output and they views of one allocation)."""
    if device == "cpu in place":
        monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu"))
        device = "cpu"
    torch.manual_seed(2)
    ours = pt.from_torch(torch.nn.LSTM(16, 16, 2).to(device)).eval()
    ours.wavefront = wavefront
    x = torch.randn(1, 2, 16, device=device)
    with torch.no_grad():
        out, state = ours(x)
        kept = [out.clone(), *(t.clone() for t in state)]
        for _ in range(4):  # states in, states out, as a decoder steps
            out2, state2 = ours(x, state)
            assert all(torch.equal(a, b) for a, b in zip(kept, [out, *state]))  # the last call's, untouched
            storages = {t.untyped_storage().data_ptr() for t in (out, *state)}
            assert not storages & {t.untyped_storage().data_ptr() for t in (out2, *state2)}
            out, state = out2, state2
            kept = [out.clone(), *(t.clone() for t in state)]
        plan = ours._plans[repeat.call_key(ours, x, state)]
        assert type(plan) is repeat.Plan
        if plan.whole:  # the output and the final states: views of one allocation
            assert len({t.untyped_storage().data_ptr() for t in (out, *state)}) == 1


@pytest.mark.parametrize("steps,layers,states", [(1, 1, 1), (1, 2, 2), (1, 3, 2), (3, 2, 3)])
def test_the_written_layout_is_the_own_paths(steps, layers, states):
    """A plan's output, final states and the rows its launches write (:class:`~prnn_tvm.torch.repeat.Written`): views
    of one new allocation each call, the rows the final states' layers in the own path's launch order
    (``dispatch.final_slots``), each on a 64-byte boundary."""
    written = repeat.Written(steps, layers, states, 2, 8)  # rows of 64 bytes in float32
    like = torch.zeros(steps, 2, 8)
    output, finals, rows = written(like)
    assert output.shape == (steps, 2, 8) and [f.shape for f in finals] == [(layers, 2, 8)] * states
    assert output.dtype == like.dtype and all(f.dtype == like.dtype for f in finals)
    want = dispatch.final_slots(finals, layers)[1]
    assert len(rows) == len(want) == layers * states
    for row, slot in zip(rows, want):
        assert row.shape == slot.shape == (2, 8) and row.stride() == slot.stride()
        assert row.data_ptr() == slot.data_ptr() and row.data_ptr() % 64 == 0
    storage = output.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == storage for t in (*finals, *rows))
    # one after another, none overlapping: the output, then each state's layers
    offsets = [0, *((steps + state * layers) * 16 for state in range(states))]  # 16 elements a (2, 8) row
    assert [t.storage_offset() for t in (output, *finals)] == offsets
    assert written(like)[0].untyped_storage().data_ptr() != storage  # each call's own allocation


def test_the_written_rows_are_unbound_from_the_final_states_alone(monkeypatch):
    """A call's host work does not grow with its steps: the rows come from one ``unbind`` of the final states' part of
    the allocation, not of the output's steps (a view a step: ~1 ms a call at T=1024 on the GPU's host)."""
    unbound, unbind = [], torch.Tensor.unbind
    monkeypatch.setattr(torch.Tensor, "unbind", lambda t, dim=0: unbound.append(t.shape[dim]) or unbind(t, dim))
    output, finals, rows = repeat.Written(1024, 3, 2, 2, 8)(torch.zeros(1, 2, 8))
    assert unbound == [6] and len(rows) == 6 and output.shape == (1024, 2, 8)

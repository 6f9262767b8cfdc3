"""A prnn_tvm.torch module called one timestep at a time (T=1, states passed in and out), on the CPU build: what a
call keeps for the next (the launch's weights, made once per weight update) follows its parameters, changed in place
or replaced, and a step loop gives torch.nn's results."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402
from prnn_tvm import InputError  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402

H, B, STEPS = 16, 2, 4


def _pair(bidirectional=False):
    torch.manual_seed(0)
    reference = torch.nn.LSTM(H, H, 1, bidirectional=bidirectional).eval()
    return reference, pt.from_torch(reference).eval()  # the same Parameter objects


def _steps(module, xs, state):
    """``module`` called a step at a time over ``xs``: the outputs, and the last states."""
    outs = []
    for x in xs:
        out, state = module(x[None], state)
        outs.append(out)
    return torch.cat(outs), state


def _close(got, want):
    got, want = got.detach().numpy().astype(np.float64), want.detach().numpy().astype(np.float64)
    assert np.abs(got - want).max() <= tolerance("float32", STEPS), np.abs(got - want).max()


def _check(reference, ours, directions=1):
    xs = torch.randn(STEPS, B, H)
    state = (torch.randn(directions, B, H), torch.randn(directions, B, H))
    with torch.no_grad():
        (want, (h, c)), (got, (gh, gc)) = _steps(reference, xs, state), _steps(ours, xs, state)
    for g, w in ((got, want), (gh, h), (gc, c)):
        _close(g, w)


def test_a_step_loop_gives_torch_nns_results_and_reuses_its_launch_weights():
    reference, ours = _pair()
    _check(reference, ours)
    layer = ours.layer_for(B, torch.device("cpu"), torch.float32, H)
    x, initial = torch.zeros(1, B, H), [torch.zeros(B, H)] * 2
    first, second = (ours._launch_arguments(layer, x, "_l0", initial) for _ in range(2))
    assert all(a is b for a, b in zip(first[1:5], second[1:5]))  # W_ih, b_ih, W_hh, b_hh: kept, not made again


@pytest.mark.parametrize("name", ["weight_hh_l0", "bias_ih_l0", "weight_ih_l0_reverse"])
def test_a_parameter_changed_in_place_reaches_the_next_call(name):
    bidirectional = name.endswith("reverse")  # both directions' W_ih joined into one: a tensor made from them
    reference, ours = _pair(bidirectional)
    directions = 2 if bidirectional else 1
    _check(reference, ours, directions)
    with torch.no_grad():
        getattr(reference, name).mul_(-0.5)  # the module's own parameter: the same object
    _check(reference, ours, directions)


def test_a_replaced_parameter_reaches_the_next_call():
    reference, ours = _pair()
    _check(reference, ours)
    replaced = torch.nn.Parameter(torch.randn_like(reference.weight_hh_l0) * 0.2)
    reference.weight_hh_l0 = replaced
    ours.weight_hh_l0 = replaced
    _check(reference, ours)
    ours.weight_hh_l0 = torch.nn.Parameter(torch.randn(H, H))  # a wrong shape: refused by name, as before
    with pytest.raises(InputError, match="parameter weight_hh_l0 has shape"):
        with torch.no_grad():
            ours(torch.zeros(1, B, H))


def _stack_pair(hidden, layers=2):
    torch.manual_seed(0)
    reference = torch.nn.LSTM(hidden, hidden, layers).eval()
    return reference, pt.from_torch(reference).eval()


@pytest.fixture(params=[False, True], ids=["stacked-after", "written-in-place"])
def in_place(request, monkeypatch):
    """Whether a stack's launch writes its final states where the call returns them (on the GPU it does; here
    both ways)."""
    from prnn_tvm.torch import dispatch

    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu") if request.param else ("cuda",))
    return request.param


@pytest.mark.parametrize("hidden", [16, 5])  # 5: a layer's final states 20 bytes apart, no 64-byte boundary
def test_a_stack_step_loop_gives_torch_nns_results(hidden, in_place):
    reference, ours = _stack_pair(hidden)
    xs = torch.randn(STEPS, B, hidden)
    state = (torch.randn(2, B, hidden), torch.randn(2, B, hidden))
    with torch.no_grad():
        (want, (h, c)), (got, (gh, gc)) = _steps(reference, xs, state), _steps(ours, xs, state)
    assert ours.stack_for(B, torch.device("cpu")) is not None  # one wavefront launch ran
    for g, w in ((got, want), (gh, h), (gc, c)):
        assert g.shape == w.shape and g.is_contiguous()
        _close(g, w)


def test_a_stacks_final_states_are_written_where_the_call_returns_them(monkeypatch):
    from prnn_tvm.torch import dispatch

    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu"))  # as on the GPU
    reference, ours = _stack_pair(H)
    x, state = torch.randn(1, B, H), (torch.randn(2, B, H), torch.randn(2, B, H))
    with torch.no_grad():
        want, (h, c) = reference(x, state)

        def refused(*args, **kwargs):
            raise AssertionError("the final states were stacked after the launch")

        monkeypatch.setattr(torch, "stack", refused)
        got, (gh, gc) = ours(x, state)
    for g, w in ((got, want), (gh, h), (gc, c)):
        _close(g, w)
    assert gh.data_ptr() != gc.data_ptr() and gh._base is None and gc._base is None  # fresh, one per state


def test_a_stack_run_in_pieces_gives_its_final_states_too(monkeypatch, in_place):
    from prnn_tvm.runtime import limits

    reference, ours = _stack_pair(H)
    assert ours.stack_for(B, torch.device("cpu")) is not None  # compiled first: the limit bounds its weights too
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 4 * H * B * 2)  # two steps of xp per launch: a call in pieces
    xs, state = torch.randn(5, B, H), (torch.randn(2, B, H), torch.randn(2, B, H))
    # packed, with each row's length: the CPU build's chunked call checks lengths against the sequence
    packed = torch.nn.utils.rnn.pack_padded_sequence(xs, [5, 3])
    with torch.no_grad():
        (want, (h, c)), (got, (gh, gc)) = reference(packed, state), ours(packed, state)
    assert next(iter(ours._launchers.values())).max_steps < 5
    for g, w in ((got.data, want.data), (gh, h), (gc, c)):
        _close(g, w)

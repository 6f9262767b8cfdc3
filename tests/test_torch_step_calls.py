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

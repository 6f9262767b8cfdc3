"""The runtime's :class:`Launcher`: one launch of a layer called again and again with the caller's arrays (what
``prnn_tvm.torch`` runs its CUDA kernels through), here on the CPU build: the same values as the layer's own
call, by TVM's arrays or torch's, a long sequence in chunks, and refusals that say what failed."""

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm.errors import InputError, LaunchError
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime import limits
from prnn_tvm.runtime.launcher import Launcher

T, B, H = 5, 2, 8


@pytest.fixture(scope="module")
def layer():
    return prnn_tvm.compile_cell("lstm", H, B, target="llvm")


def _recurrent_inputs(layer, steps=T):
    """The recurrent launch's data arguments (NumPy, kernel order) and the layer's own call's results."""
    given = random_inputs(layer.plan, steps, H)
    xp = (given["x"] @ given["W_ih"].T + given["b_ih"]).astype(np.float32)
    lengths = np.array([steps, max(1, steps - 2)], np.int32)
    data = [xp, given["W_hh"], given["b_hh"], given["h0"], given["c0"], lengths]
    out, finals = layer.recurrent(*data)
    return data, [out, *finals]


def test_a_launch_gives_the_layers_own_results_in_tvm_arrays(layer):
    data, want = _recurrent_inputs(layer)
    launcher = Launcher(layer)  # the recurrent launch, TVM's arrays on the layer's device
    for _ in range(2):  # the argument list is reused: a second call is the same
        got = launcher([tvm.runtime.tensor(a) for a in data])
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(isinstance(g, tvm.runtime.Tensor) and np.array_equal(g.numpy(), w) for g, w in zip(got, want))


def test_a_launch_gives_the_layers_own_results_in_torch_tensors(layer):
    torch = pytest.importorskip("torch")
    from prnn_tvm.torch.dispatch import torch_arrays

    data, want = _recurrent_inputs(layer)
    cpu = torch.device("cpu")
    got = Launcher(layer, "recurrent", torch_arrays(cpu), tvm.cpu(0))([torch.from_numpy(a) for a in data])
    assert all(isinstance(g, torch.Tensor) and np.array_equal(g.numpy(), w) for g, w in zip(got, want))


def test_a_sequence_past_the_element_limit_runs_as_the_layers_chunked_call(layer, monkeypatch):
    data, want = _recurrent_inputs(layer, steps=40)
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 4 * H * B * 7)  # seven steps of xp per launch
    launcher = Launcher(layer)
    assert launcher.max_steps == 7
    got = launcher([tvm.runtime.tensor(a) for a in data])
    assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want))
    projection = Launcher(layer, "projection")  # only the recurrent launch carries its states across pieces
    with pytest.raises(InputError, match="40 steps of projection of 'lstm' need buffers past"):
        projection([tvm.runtime.tensor(np.zeros((40, B, H), np.float32))])


def test_a_refused_launch_says_which_and_why(layer):
    data, _ = _recurrent_inputs(layer)
    data[1] = data[1].astype(np.float64)  # W_hh of the wrong type: TVM refuses the call
    with pytest.raises(LaunchError, match="launching 'recurrent' of lstm failed: .*W_hh"):
        Launcher(layer)([tvm.runtime.tensor(a) for a in data])


def test_a_launch_writes_into_the_callers_arrays_where_given(layer):
    torch = pytest.importorskip("torch")
    from prnn_tvm.torch.dispatch import torch_arrays

    data, want = _recurrent_inputs(layer)
    cpu = torch.device("cpu")
    launcher = Launcher(layer, "recurrent", torch_arrays(cpu), tvm.cpu(0))
    finals = torch.full((2, B, H), float("nan"))  # both final states, views of one tensor
    into = [None, *finals.unbind(0)]
    got = launcher([torch.from_numpy(a) for a in data], into=into)
    assert got[1] is into[1] and got[2] is into[2] and got[0] is not None
    assert np.array_equal(got[0].numpy(), want[0])
    assert np.array_equal(finals.numpy(), np.stack(want[1:]))

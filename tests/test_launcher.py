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


def test_a_bound_launch_gives_the_launchers_own_results(layer):
    """:meth:`Launcher.bound`: the arguments that stay the same placed once (a repeated call's weights, params and
    lengths), a call passing the rest, gives the launcher's whole call bit for bit, call after call."""
    torch = pytest.importorskip("torch")
    from prnn_tvm.torch.dispatch import torch_arrays

    data, want = _recurrent_inputs(layer)
    tensors = [torch.from_numpy(a) for a in data]
    launcher = Launcher(layer, "recurrent", torch_arrays(torch.device("cpu")), tvm.cpu(0))
    bound = launcher.bound([None, *tensors[1:3], None, None, tensors[5]], T)  # xp and the states per call
    for _ in range(2):
        got = bound([tensors[0], *tensors[3:5]])
        assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want))
        assert all(torch.equal(g, w) for g, w in zip(got, launcher(tensors)))
    finals = torch.full((2, B, H), float("nan"))
    got = bound([tensors[0], *tensors[3:5]], into=[None, *finals.unbind(0)])
    assert np.array_equal(finals.numpy(), np.stack(want[1:])) and got[0] is not None
    assert launcher.bound([None, *tensors[1:]], launcher.max_steps + 1) is None  # runs in pieces: the whole call


class _Recorded:
    """A runtime module whose every function records the arguments it is called with."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, name):
        return lambda *args: self.calls.append(args)


@pytest.fixture(scope="module")
def cuda_signature():
    """A CUDA layer's signature (owned workspace and barrier state, the scalars), built without a GPU."""
    return prnn_tvm.compile_cell("lstm", H, B, target="cuda", arch="sm_90").signature


def test_a_bound_launch_follows_the_launch_state_and_the_scalars(cuda_signature):
    """What a bound launch places once per stream is placed again when it changes: the layer's scalars (a new
    barrier timeout, a stall step), the stream's launch state (made anew after a timeout), another stream's."""
    torch = pytest.importorskip("torch")
    from prnn_tvm.runtime.base import RuntimeLayer
    from prnn_tvm.torch.dispatch import torch_arrays

    module = _Recorded()
    runtime = RuntimeLayer(cuda_signature, module, False)  # launched on the host: the recorder's calls
    launcher = Launcher(runtime, "recurrent", torch_arrays(torch.device("cpu")), tvm.cpu(0))
    names = [a.name for a in cuda_signature.launch("recurrent").args]
    weights = [torch.zeros(4 * H, H), torch.zeros(4 * H)]
    bound = launcher.bound([None, *weights, None, None, torch.zeros(B, dtype=torch.int32)], 1)
    states = [torch.zeros(B, H), torch.zeros(B, H)]

    def passed(stream=0):
        bound([torch.zeros(1, B, 4 * H), *states], stream)
        return dict(zip(names, module.calls[-1]))

    first = passed()
    assert first["timeout_us"] == runtime.barrier_timeout_us and first["stall_step"] == -1
    assert first["h0"] is states[0] and first["W_hh"] is passed()["W_hh"]  # converted once
    runtime.barrier_timeout_us, runtime.debug_stall_step = 1234, 3
    changed = passed()
    assert changed["timeout_us"] == 1234 and changed["stall_step"] == 3
    assert changed["workspace"].data_ptr() == first["workspace"].data_ptr()  # the stream's own, kept
    runtime._states.clear()  # what a barrier timeout does: the next launch starts on a fresh state
    fresh = passed()
    assert fresh["workspace"].data_ptr() == runtime.launch_state(0)["workspace"].data_ptr()
    assert fresh["workspace"].data_ptr() != first["workspace"].data_ptr()
    other = passed(stream=7)["workspace"].data_ptr()
    assert other == runtime.launch_state(7)["workspace"].data_ptr() != fresh["workspace"].data_ptr()
    assert runtime.scalars() is runtime.scalars()  # one dict while its values stay

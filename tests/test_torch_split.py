"""A prnn_tvm.torch module split over GPUs (``LSTM(..., devices=[0, 1])``, ``from_torch(m, devices=[...])``), on the
CPU: what it is made of and what it refuses, each naming the fix (training, both directions, no biases, autocast's
casts, tensors off its first GPU, a bad device list, torch.export). Its calls on the GPUs, against float64, are in
``test_gpu_split.py``."""

import contextlib
import copy

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the importorskip
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.errors import ConfigError, UnsupportedError  # noqa: E402


def split_lstm(**options):
    return pt.LSTM(8, 6, device="cpu", devices=[0, 1], **options)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(devices=[0]), "2 GPUs or more"),
        (dict(devices=[1, 1]), "names a GPU twice"),
        (dict(devices=2), "list of CUDA device indices"),
        (dict(devices=[0, 1], bidirectional=True), "one direction"),
        (dict(devices=[0, 1], bias=False), "bias=True"),
    ],
)
def test_what_a_split_module_cannot_be_is_refused_at_construction(options, message):
    with pytest.raises(ConfigError, match=message):
        pt.LSTM(8, 6, device="cpu", **options)


def test_from_torch_shares_the_parameters_and_keeps_the_devices():
    module = torch.nn.LSTM(8, 6, num_layers=2)
    ours = pt.from_torch(module, devices=[0, 1])
    assert ours.devices == (0, 1)
    assert ours.weight_hh_l1 is module.weight_hh_l1
    assert copy.deepcopy(ours).devices == (0, 1)  # a copy compiles its own layers, over the same GPUs
    assert pt.LSTM(8, 6).devices is None


def test_a_call_that_needs_gradients_is_refused():
    with pytest.raises(UnsupportedError, match=r"inference only: call it under torch.no_grad\(\)"):
        split_lstm()(torch.randn(3, 2, 8))


def test_a_call_off_the_first_gpu_is_refused_naming_it():
    with torch.no_grad(), pytest.raises(UnsupportedError, match=r"parameters are on cpu.*\.to\('cuda:0'\)"):
        split_lstm()(torch.randn(3, 2, 8))


def test_autocast_is_refused():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(UnsupportedError, match="not torch.autocast's"):
            split_lstm()(torch.randn(3, 2, 8))


def test_the_operator_does_not_carry_the_devices():
    """torch.compile runs a split module eagerly (a graph break), torch.export refuses it: the operator
    ``prnn_tvm::layers`` names no devices."""
    assert "split over GPUs [0, 1]" in split_lstm()._operator_refusal()


def test_each_gpu_gets_its_rows_of_the_projection_kept_until_a_parameter_changes():
    """GPU 1's rows of ``W_ih`` and ``b_ih`` as the NumPy call picks them (``SplitLayer.own_columns``: zero rows past
    hidden), kept between calls, made again after an in-place update."""
    import numpy as np

    import prnn_tvm
    from prnn_tvm.torch.split import SplitLayers

    module = pt.LSTM(3, 10, device="cpu", devices=[0, 1])
    layer = prnn_tvm.compile_cell("lstm", 10, 2, input_size=3, arch="sm_90", tuning_logs=[], devices=[0, 1],
                                  config=dict(units_per_cta=3, k_split=4, rows_per_thread=2, batch_tile=2, vec=2),
                                  cache=False)
    split, cpu = SplitLayers(), torch.device("cpu")
    W, b = split._projection_rows(module, layer, 0, 1, cpu)
    want = layer.own_columns({"W_ih": module.weight_ih_l0.detach().numpy(),
                              "b_ih": module.bias_ih_l0.detach().numpy()}, 1)
    np.testing.assert_array_equal(W.numpy(), want["W_ih"])
    np.testing.assert_array_equal(b.numpy(), want["b_ih"])
    assert split._projection_rows(module, layer, 0, 1, cpu)[0] is W
    with torch.no_grad():
        module.bias_ih_l0.add_(1.0)
    again = split._projection_rows(module, layer, 0, 1, cpu)[1]
    np.testing.assert_array_equal(again.numpy()[:4], want["b_ih"][:4] + 1.0)
    assert not again[4:6].any()  # past hidden: still zero rows


class _EmulatedCall:
    """What ``SplitLayer.bind_each`` returns, its launches emulated on the host (``prnn_tvm.verify.split``)."""

    def __init__(self, layer, per_gpu: list):
        self.layer, self.per_gpu, self.outputs = layer, per_gpu, None

    def run(self) -> None:
        from prnn_tvm.verify.split import run_each

        arrays = [{name: t.numpy() for name, t in named.items()} for named in self.per_gpu]
        outputs, words = run_each(self.layer, arrays, arrays[0]["xp"].shape[0])
        assert words == [0] * len(arrays)
        self.outputs = [[torch.from_numpy(a.copy()) for a in own] for own in outputs]


@pytest.mark.skipif("not __import__('prnn_tvm.verify.emulator').verify.emulator.available()",
                    reason="emulating a kernel needs g++")
def test_a_stack_of_split_layers_as_the_gpus_run_it(monkeypatch):
    """The module's whole call over two GPUs with every GPU the host (its streams none, its kernels emulated): each
    GPU's rows of the projection, the states in and out, the packed rows' lengths, each GPU's units gathered, the
    second layer fed the first's output; against torch.nn in float64."""
    from torch.nn.utils.rnn import pack_padded_sequence

    import prnn_tvm.torch.modules as modules
    from prnn_tvm.runtime.split import SplitLayer
    from prnn_tvm.torch import split

    monkeypatch.setattr(split, "gpu", lambda index: torch.device("cpu"))
    monkeypatch.setattr(split, "current_stream", lambda device: 0)
    monkeypatch.setattr(split.tvm_ffi, "use_raw_stream", lambda device, stream: contextlib.nullcontext())
    monkeypatch.setattr(modules, "call_refusal", lambda *args: None)
    monkeypatch.setattr(SplitLayer, "bind_each", lambda layer, per_gpu, recurrent: _EmulatedCall(layer, per_gpu))
    monkeypatch.setattr(SplitLayer, "check", lambda layer, wait=True: None)
    torch.manual_seed(0)
    exact = torch.nn.LSTM(3, 10, num_layers=2).double()
    ours = pt.LSTM(3, 10, num_layers=2, device="cpu", devices=[0, 1], arch="sm_90",
                   config=dict(units_per_cta=3, k_split=4, rows_per_thread=2, batch_tile=2, vec=2))
    ours.load_state_dict({k: v.float() for k, v in exact.state_dict().items()})
    x, h0, c0 = torch.randn(5, 3, 3), torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    packed = pack_padded_sequence(x, torch.tensor([5, 2, 4]), enforce_sorted=False)
    with torch.no_grad():
        got, (h_n, c_n) = ours(packed, (h0, c0))
        want, (h_w, c_w) = exact(packed.to(torch.float64), (h0.double(), c0.double()))
    assert ours._split.layers and all(layer.devices == (0, 1) for layer in ours._split.layers.values())
    for a, b in ((got.data, want.data), (h_n, h_w), (c_n, c_w)):
        assert (a.double() - b).abs().max().item() <= tolerance("float32", 5)

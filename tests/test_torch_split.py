"""A prnn_tvm.torch module split over GPUs (``LSTM(..., devices=[0, 1])``, ``from_torch(m, devices=[...])``), on the
CPU: what it is made of and what it refuses, each naming the fix (training, both directions, no biases, autocast's
casts, tensors off its first GPU, a bad device list, torch.export). Its calls on the GPUs, against float64, are in
``test_gpu_split.py``."""

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
    W_ih, b_ih = module.weight_ih_l0.detach(), module.bias_ih_l0.detach()
    W, b = split._projection_rows(layer, 0, 1, W_ih, b_ih, cpu)
    want = layer.own_columns({"W_ih": W_ih.numpy(), "b_ih": b_ih.numpy()}, 1)
    np.testing.assert_array_equal(W.numpy(), want["W_ih"])
    np.testing.assert_array_equal(b.numpy(), want["b_ih"])
    assert split._projection_rows(layer, 0, 1, W_ih, b_ih, cpu)[0] is W
    with torch.no_grad():
        module.bias_ih_l0.add_(1.0)
    again = split._projection_rows(layer, 0, 1, W_ih, b_ih, cpu)[1]
    np.testing.assert_array_equal(again.numpy()[:4], want["b_ih"][:4] + 1.0)
    assert not again[4:6].any()  # past hidden: still zero rows
    assert split._projection_rows(layer, 0, 1, W_ih, None, cpu)[1] is None  # b_ih folded into the params


def test_what_a_call_derives_is_made_again_only_when_a_parameter_changes(monkeypatch):
    """The weights on every other GPU and each GPU's ``[W_ih | b_ih | 0]`` (a half projection of 2^24 elements and
    more) are made at the first call, kept while the parameters stay the same, made again after an in-place update
    or a replaced parameter, and never from a stale tensor that happens to sit at the same address."""
    from prnn_tvm.torch.split import SplitLayers

    split, made = SplitLayers(), []

    def make(t):
        made.append(t)
        return t.clone()

    W = torch.randn(4, 3)
    first = split._kept(("W",), (W,), lambda: make(W))
    assert split._kept(("W",), (W,), lambda: make(W)) is first and len(made) == 1
    W.add_(1.0)  # in place: its version moves
    second = split._kept(("W",), (W,), lambda: make(W))
    assert second is not first and len(made) == 2
    other = W.view(4, 3)  # another tensor at the same address and version: not the one the copy was made from
    assert split._kept(("W",), (other,), lambda: make(other)) is not second and len(made) == 3
    b = torch.randn(4)
    split._kept(("Wb",), (W, b), lambda: make(W))
    split._kept(("Wb",), (W, None), lambda: make(W))  # b_ih folded away: another set of sources
    assert len(made) == 5


class _EmulatedLauncher:
    """What ``SplitLayer.launcher`` returns, its launches emulated on the host (``prnn_tvm.verify.split``)."""

    def __init__(self, layer):
        self.layer = layer

    def __call__(self, per_gpu: list, streams: list) -> list:
        from prnn_tvm.verify.split import run_each

        assert streams == [0] * len(per_gpu)
        arrays = [{name: t.numpy() for name, t in named.items()} for named in per_gpu]
        outputs, words = run_each(self.layer, arrays, arrays[0]["xp"].shape[0])
        assert words == [0] * len(arrays)
        return [[torch.from_numpy(a.copy()) for a in own] for own in outputs]


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
    monkeypatch.setattr(modules, "call_refusal", lambda *args: None)
    monkeypatch.setattr(split.SplitLayers, "launcher", lambda self, layer, devices: _EmulatedLauncher(layer))
    monkeypatch.setattr(SplitLayer, "check", lambda layer, wait=True: None)
    torch.manual_seed(0)
    exact = torch.nn.LSTM(3, 10, num_layers=2).double()
    ours = pt.LSTM(3, 10, num_layers=2, device="cpu", devices=[0, 1], arch="sm_90",
                   config=dict(units_per_cta=3, k_split=4, rows_per_thread=2, batch_tile=2, vec=2))
    ours.load_state_dict({k: v.float() for k, v in exact.state_dict().items()})
    phases = []
    ours._split.phase = phases.append
    x, h0, c0 = torch.randn(5, 3, 3), torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    packed = pack_padded_sequence(x, torch.tensor([5, 2, 4]), enforce_sorted=False)
    with torch.no_grad():
        got, (h_n, c_n) = ours(packed, (h0, c0))
        want, (h_w, c_w) = exact(packed.to(torch.float64), (h0.double(), c0.double()))
    assert ours._split.layers and all(layer.devices == (0, 1) for layer in ours._split.layers.values())
    # the benchmark's breakdown, per layer
    assert phases == ["arguments", "inputs", "projections", "recurrent", "gather"] * 2
    for a, b in ((got.data, want.data), (h_n, h_w), (c_n, c_w)):
        assert (a.double() - b).abs().max().item() <= tolerance("float32", 5)

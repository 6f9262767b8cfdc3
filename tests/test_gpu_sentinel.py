"""The ``sentinel`` exchange on the GPU (``pytest -m gpu``): every cell that takes it, in every dtype, at
awkward sizes and with row lengths; stacks; torch modules with it, called at two lengths and replayed from a graph.
Timeouts, many launches and the barrier base: ``test_gpu_barrier.py`` (every stateful barrier)."""

import copy

import numpy as np
import pytest

from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_inputs, random_lengths

from .test_gpu_barrier import assert_a_stall_gives_up
from .test_gpu_half import error_of
from .test_sentinel import sentinel_layer, stack_layer
from .test_stack import compare_with_one_by_one

pytestmark = pytest.mark.gpu
CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_peephole"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize(
    "hidden, batch, knobs",
    [
        (1, 1, {"units_per_cta": 1}),
        (133, 11, {"units_per_cta": 8, "k_groups": 2}),  # partial CTAs, rows of 133 (2-byte polls), two batch passes
        (256, 16, {"units_per_cta": 16, "k_groups": 4, "n_tiles": 2}),  # 16-byte polls, one pass
        (64, 33, {"units_per_cta": 4, "n_tiles": 2}),
    ],
)  # three passes, the last of one row
def test_the_sentinel_exchange_changes_no_bit(dtype, cell, hidden, batch, knobs):
    """Outputs and final states equal, bit for bit, those of the same config with ``counter`` (the exchange
    moves the same rounded values), at T=1 (no poll), 7 and 64, and with rows that stop at their own lengths
    (a length-1 row, a full one); and within the float64 bound. float32 layers take their default config."""
    layer = sentinel_layer(cell, hidden, batch, dtype, **knobs)
    counter = sentinel_layer(cell, hidden, batch, dtype, barrier="counter", **knobs)
    assert layer.report.config["barrier"] == "sentinel"
    assert_same_bits(layer, counter, batch)
    assert error_of(layer, 64, seed=1) <= tolerance(dtype, 64)
    assert error_of(layer, 40, seed=1, lengths=random_lengths(batch, 40, seed=2)) <= tolerance(dtype, 40)


def assert_same_bits(layer, other, batch: int) -> None:
    """``layer`` and ``other`` (the same cell and sizes) give bitwise equal outputs and final states at T=1 (no
    exchange), 7 and 64, and with rows that stop at their own lengths (a length-1 row, a full one)."""
    for seq_len, lengths in ((1, None), (7, None), (64, None), (40, random_lengths(batch, 40, seed=2))):
        inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seq_len)
        if lengths is not None:
            inputs["lengths"] = lengths
        (out, finals), (want, want_finals) = layer(**inputs), other(**inputs)
        assert np.array_equal(out, want) and all(np.array_equal(a, b) for a, b in zip(finals, want_finals))


def test_a_torch_module_with_the_sentinel_exchange():
    """Its output sequence comes from torch's allocator, which hands back what earlier calls left there:
    every launch marks its own slots before its one barrier, so a shorter call and graph replays see no
    stale value."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.manual_seed(3)
    half = torch.nn.LSTM(96, 256).cuda().half().eval()
    exact = copy.deepcopy(half).double()
    fast = pt.from_torch(half, config={"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "barrier": "sentinel"})
    x = torch.randn(64, 8, 96, device="cuda").half()
    module_matches_float64(fast, exact, x, 5)
    assert fast.layer_for(8, x.device).report.config["barrier"] == "sentinel"


def module_matches_float64(fast, exact, x, short: int) -> None:
    """A half ``prnn_tvm.torch`` module ``fast`` against ``exact`` (its float64 torch.nn twin) on ``x`` and on its
    first ``short`` steps, then that call replayed from a CUDA graph (three times): equal to the eager one."""
    import torch

    from prnn_tvm.bench.baselines import captured

    with torch.no_grad():
        out = fast(x)[0]
        for steps, got in ((len(x), out), (short, fast(x[:short])[0])):
            want = exact(x[:steps].double())[0]
            assert (got.double() - want).abs().max().item() <= tolerance("float16", steps)
        graph, (replayed, _) = captured(lambda: fast(x))
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(replayed, out)
    fast.check()


@pytest.mark.parametrize(
    "dtype, cell, hidden, batch, layers, knobs",
    [
        ("float16", "lstm", 512, 8, 4, {"units_per_cta": 16}),  # issue 16's stack
        ("bfloat16", "gru", 133, 5, 3, {"units_per_cta": 8, "k_groups": 2}),  # odd sizes, a partial last CTA
        ("float16", "rnn_tanh", 64, 33, 2, {"units_per_cta": 4, "n_tiles": 2, "layout": "shared"}),  # 3 passes
        ("float32", "lstm", 256, 4, 3, {}),
    ],
)
def test_a_sentinel_stack_changes_no_bit(dtype, cell, hidden, batch, layers, knobs):
    """Each layer's state through a sequence of its own (the lower layers' the call's exchange sequence): the
    same bits as the same stack across a ``counter`` barrier each step, at T=1, 7, 64 and with rows that stop
    at their own lengths, and within the float64 bound of the layers run one by one."""
    layer = stack_layer(cell, hidden, batch, layers, dtype, **knobs)
    counter = stack_layer(cell, hidden, batch, layers, dtype, barrier="counter", **knobs)
    assert layer.kernel.config.barrier == "sentinel" and layer.signature.scratch
    assert_same_bits(layer, counter, batch)
    assert compare_with_one_by_one(layer, cell, layers, 64, seed=3) <= tolerance(dtype, 64)


@pytest.mark.parametrize("layout, units", [("split", 16), ("shared", 8)])
def test_a_stalled_sentinel_stack_gives_up_in_time(layout, units):
    """Block 0 never publishes kernel step 3: the blocks that wait on it, in polls that also wait on their own
    layer's state (split) or on two layers' states (shared), give up within the 20 ms bound, the timeout is
    raised, and the next call is right."""
    layer = stack_layer("lstm", 256, 8, 3, "float16", units_per_cta=units, layout=layout)
    assert_a_stall_gives_up(layer, match="after step 3 of")
    assert compare_with_one_by_one(layer, "lstm", 3, 16, seed=3) <= tolerance("float16", 16)


def test_a_torch_stack_with_the_sentinel_exchange(monkeypatch):
    """A stacked torch module whose wavefront launch exchanges through sentinels: its exchange sequence comes
    from torch's allocator with each call (and from the graph's pool when captured)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt
    from prnn_tvm.torch import dispatch

    compile_cell = dispatch.compile_cell

    def sentinel_stacks(*args, **kwargs):
        if kwargs.get("layers", 1) > 1:
            kwargs["config"] = {
                "units_per_cta": 16,
                "k_groups": 1,
                "n_tiles": 1,
                "layout": "split",
                "barrier": "sentinel",
            }
        return compile_cell(*args, **kwargs)

    monkeypatch.setattr(dispatch, "compile_cell", sentinel_stacks)  # where the modules compile their layers
    torch.manual_seed(7)
    half = torch.nn.LSTM(96, 256, num_layers=3).cuda().half().eval()
    exact = copy.deepcopy(half).double()
    fast = pt.from_torch(half)
    x = torch.randn(40, 8, 96, device="cuda").half()
    module_matches_float64(fast, exact, x, 3)
    stack = fast.stack_for(8, x.device)
    assert stack.kernel.config.barrier == "sentinel" and stack.signature.scratch

"""The persistent kernel on a real GPU against the float64 NumPy reference (``pytest -m gpu``)."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import BOUND_MAGNITUDE, tolerance
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules.persistent_config import PersistentConfig
from prnn_tvm.target import gpu_spec

from .two_state_cell import TWO_STATE

pytestmark = pytest.mark.gpu
CELLS = ["rnn_tanh", "rnn_relu", "lstm", "gru"]
_LAYERS = {}


def layer_for(cell, hidden, batch):
    key = (cell, hidden, batch)
    if key not in _LAYERS:
        _LAYERS[key] = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda")
    return _LAYERS[key]


def run_and_compare(layer, seq_len, seed=0, lengths=None):
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    result = layer(*[inputs.get(n) for n in layer.arg_names])
    if lengths is not None:  # zeros past each row's length
        assert all(not result[0][n:, b].any() for b, n in enumerate(lengths))
    return max_abs_error(layer.plan, result, reference_layer(layer.plan, inputs), BOUND_MAGNITUDE)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden", [128, 512, 1024])
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("seq_len", [1, 7, 256])
def test_gpu_matches_reference(cell, hidden, batch, seq_len):
    layer = layer_for(cell, hidden, batch)
    assert layer.report.spill_bytes == 0, layer.report.format()
    err = run_and_compare(layer, seq_len, seed=seq_len)
    assert err <= tolerance("float32", seq_len), f"max abs error {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden, batch", [(128, 1), (512, 5), (1024, 33)])
def test_rows_stop_at_their_lengths(cell, hidden, batch):
    """Unsorted per-row lengths with a full-length and a length-1 row (more batch tiles than one at B=33)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda")
    err = run_and_compare(layer, 64, seed=2, lengths=random_lengths(batch, 64, seed=batch))
    assert err <= tolerance("float32", 64), f"max abs error {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_odd_hidden_and_batch_tiles(cell):
    """Sizes that leave partial CTAs, padded k lanes and a partial last batch tile."""
    gpu = gpu_spec()
    cfg = PersistentConfig(units_per_cta=3, k_split=16, rows_per_thread=2, batch_tile=2, vec=4)
    layer = prnn_tvm.compile_cell(cell, 133, 5, target="cuda", arch=gpu.arch, config=cfg)
    assert run_and_compare(layer, 9) <= tolerance("float32", 9)
    assert run_and_compare(layer, 9, lengths=np.int32([9, 1, 4, 0, 7])) <= tolerance("float32", 9)


@pytest.mark.parametrize("rows_per_thread", [1, 2, 4])
def test_two_products_over_two_states(rows_per_thread):
    """Threads of one CTA multiply different states with the rows of different products."""
    cfg = PersistentConfig(units_per_cta=4, k_split=16, rows_per_thread=rows_per_thread, batch_tile=3, vec=4)
    layer = prnn_tvm.compile_cell(TWO_STATE, 256, 3, target="cuda", config=cfg)
    assert run_and_compare(layer, 17) <= tolerance("float32", 17)


def test_back_to_back_launches_are_bitwise_identical():
    layer = layer_for("lstm", 512, 4)
    inputs = random_inputs(layer.plan, 64, layer.input_size, seed=3)
    args = [inputs.get(n) for n in layer.arg_names]
    runs = [layer(*args) for _ in range(3)]
    for out, finals in runs[1:]:
        assert np.array_equal(out, runs[0][0])
        for a, b in zip(finals, runs[0][1]):
            assert np.array_equal(a, b)


def test_grid_too_large_is_refused_before_launch():
    """A layer compiled for a GPU of 512 SMs: 512 CTAs of 65 KB shared memory each (and ~180 registers per
    thread: one per SM), which that GPU holds.

    At most 3 such CTAs fit on one SM of the real GPU (228 KB), so it holds at most 3 x SMs < 512 of them.
    """
    gpu = gpu_spec()
    pretend = dataclasses.replace(gpu, sms=512)
    cfg = PersistentConfig(units_per_cta=2, k_split=32, rows_per_thread=1, batch_tile=16, vec=4)
    layer = prnn_tvm.compile_cell("lstm", 1024, 16, target="cuda", arch=pretend, config=cfg)
    assert layer.report.ctas == 512 > 3 * gpu.sms
    inputs = random_inputs(layer.plan, 4, layer.input_size)
    args = [inputs.get(n) for n in layer.arg_names]
    with pytest.raises(prnn_tvm.LaunchError, match="cannot be co-resident"):
        layer(*args)
    # Without the project's check, CUDA's cooperative launch refuses it too: an error, never a hang.
    layer._check_coresidency = lambda: None
    with pytest.raises(prnn_tvm.LaunchError, match="launching 'recurrent'"):
        layer(*args)
    # and the GPU is still usable afterwards
    assert run_and_compare(layer_for("rnn_tanh", 128, 1), 3) <= tolerance("float32", 3)

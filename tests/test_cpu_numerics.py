"""The CPU reference build of every built-in cell against its float64 NumPy reference."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import check_against_reference, max_abs_error
from prnn_tvm.dtypes import BOUND_MAGNITUDE, tolerance
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer

from .two_state_cell import TWO_STATE

CELLS = sorted(prnn_tvm.builtin_cells())
_LAYERS = {}


def cpu_layer(cell, hidden, batch, input_size=None):
    key = (cell, hidden, batch, input_size)
    if key not in _LAYERS:
        _LAYERS[key] = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, target="llvm")
    return _LAYERS[key]


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden", [1, 7, 64, 256])
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("seq_len", [1, 5, 64])
def test_cpu_matches_reference(cell, hidden, batch, seq_len):
    res = check_against_reference(cpu_layer(cell, hidden, batch), seq_len, tolerance("float32", seq_len), seed=seq_len)
    assert res.ok, f"max abs error {res.max_abs_error:.2e} > {res.tolerance:.1e}"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden, batch, seq_len", [(1, 1, 1), (7, 3, 9), (64, 8, 33)])
def test_rows_stop_at_their_lengths(cell, hidden, batch, seq_len):
    """Unsorted lengths (a full-length and a length-1 row): states stop at each row's length, outputs are 0 after."""
    layer = cpu_layer(cell, hidden, batch)
    lengths = random_lengths(batch, seq_len, seed=hidden)
    res = check_against_reference(layer, seq_len, tolerance("float32", seq_len), seed=3, lengths=lengths)
    assert res.ok, f"max abs error {res.max_abs_error:.2e} > {res.tolerance:.1e}"
    inputs = random_inputs(layer.plan, seq_len, hidden, seed=3)
    out, finals = layer(**inputs, lengths=lengths)
    full, _ = layer(**inputs)
    for b, n in enumerate(lengths):
        assert np.array_equal(out[:n, b], full[:n, b]) and not out[n:, b].any()
    _, finals0 = layer(**{**inputs, "lengths": np.zeros(batch, np.int32)})  # length 0: the initial states
    assert all(np.array_equal(f, inputs[f"{s.name}0"]) for f, s in zip(finals0, layer.plan.states))


@pytest.mark.parametrize("cell", CELLS)
def test_input_size_differs_from_hidden(cell):
    res = check_against_reference(cpu_layer(cell, 12, 2, input_size=5), 6, tolerance("float32", 6))
    assert res.ok


def test_zero_initial_states_when_omitted():
    layer = cpu_layer("lstm", 7, 3)
    inputs = random_inputs(layer.plan, 4, 7)
    inputs["h0"][:] = 0
    inputs["c0"][:] = 0
    out, _ = layer(inputs["x"], inputs["W_ih"], inputs["b_ih"], inputs["W_hh"], inputs["b_hh"])
    ref, _ = reference_layer(layer.plan, inputs)
    assert np.abs(out - ref).max() <= tolerance("float32", 4)


def test_precomputed_projection_gives_the_same_result():
    layer = cpu_layer("gru", 64, 3)
    inputs = random_inputs(layer.plan, 5, 64, seed=4)
    out, finals = layer(**inputs)
    xp = (inputs["x"].astype(np.float64) @ inputs["W_ih"].T + inputs["b_ih"]).astype(np.float32)
    out2, finals2 = layer.recurrent(xp, inputs["W_hh"], inputs["b_hh"], h0=inputs["h0"])
    assert np.abs(out - out2).max() <= 1e-5
    assert np.abs(finals[0] - finals2[0]).max() <= 1e-5


@pytest.mark.parametrize("hidden, batch", [(1, 1), (7, 3), (64, 8)])
def test_two_products_over_two_states(hidden, batch):
    layer = prnn_tvm.compile_cell(TWO_STATE, hidden, batch, target="llvm")
    assert check_against_reference(layer, 9, tolerance("float32", 9)).ok


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden, batch, input_size", [(1, 1, 3), (7, 3, None), (64, 8, 17)])
def test_cpu_half_matches_reference(dtype, cell, hidden, batch, input_size):
    """Half storage, float32 math: the reference gets the same rounded inputs, weights and states."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="llvm")
    assert layer.signature.launches[1].args[0].dtype == "float32"  # the projection stays float32
    for seq_len in (1, 64):
        res = check_against_reference(layer, seq_len, tolerance(dtype, seq_len), seed=seq_len)
        assert res.ok, f"T={seq_len}: max abs error {res.max_abs_error:.2e} > {res.tolerance:.1e}"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden, batch, input_size", [(1, 1, 3), (7, 3, None), (33, 5, 17)])
def test_cpu_float64_matches_reference_to_rounding(cell, hidden, batch, input_size):
    """The double-precision CPU build (what gradient checks run) agrees with NumPy's float64 step."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype="float64", target="llvm")
    assert {a.dtype for x in layer.signature.launches for a in x.args if a.name != "lengths"} == {"float64"}
    for seq_len in (1, 64):
        res = check_against_reference(layer, seq_len, tolerance("float64", seq_len), seed=seq_len)
        assert res.ok and res.max_abs_error < 1e-13, f"T={seq_len}: max abs error {res.max_abs_error:.2e}"


def test_errors_of_large_values_count_relative_to_them():
    """The dtype bounds are absolute up to magnitude 4 (their floor: half a unit in the last place there) and
    relative beyond: a ReLU cell's fp16 output of 12 stored to the nearest half is 2^-8 off, within bounds."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("rnn_relu"), 1, 1)
    ref = (np.array([[[12.0]]]), {"h": np.array([[12.0]])})
    got = (np.array([[[12.0 + 2.0**-8]]]), [np.array([[12.0]])])
    assert max_abs_error(plan, got, ref) == 2.0**-8
    assert max_abs_error(plan, got, ref, BOUND_MAGNITUDE) == 2.0**-8 / 3 < tolerance("float16", 4)
    small = (np.array([[[0.5]]]), {"h": np.array([[0.5]])})
    assert max_abs_error(plan, ((small[0] + 1e-3), [small[1]["h"]]), small, BOUND_MAGNITUDE) == pytest.approx(1e-3)

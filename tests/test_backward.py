"""The compiled CPU backward (``compiler.compile_backward``) against backpropagation through time from the
plan in float64 NumPy (``reference.plan_gradients``, itself checked against finite differences and torch's
autograd in ``test_derivative.py``)."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import ConfigError, InputError, compile_backward
from prnn_tvm.checks import check_gradients, layer_gradients, max_error
from prnn_tvm.compiler import compile_training
from prnn_tvm.reference import plan_gradients, random_inputs, random_lengths
from prnn_tvm.runtime import limits
from prnn_tvm.schedules import backward_mma_config, persistent_backward
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc

from .two_state_cell import TWO_STATE

CELLS = sorted(prnn_tvm.builtin_cells())


def compare(cell, hidden, batch, seq_len, input_size, dtype, lengths=None, seed=0) -> float:
    """Max abs difference, over every argument's gradient, of the compiled backward to the plan's in float64."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="llvm")
    inputs = random_inputs(layer.plan, seq_len, input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    rng = np.random.default_rng(seed + 1)
    grad_dtype = layer.plan.policy.compute
    d_out = rng.standard_normal((seq_len, batch, hidden)).astype(grad_dtype)
    d_finals = {s.name: rng.standard_normal((batch, hidden)).astype(grad_dtype) for s in layer.plan.states}
    want = plan_gradients(layer.plan, inputs, d_out, d_finals)
    got = layer_gradients(layer, inputs, d_out, d_finals)
    assert set(got) == set(want), set(got) ^ set(want)
    return max_error((got[n], want[n]) for n in want)


@pytest.mark.parametrize("cell", [*CELLS, TWO_STATE])
@pytest.mark.parametrize("hidden, batch, seq_len, input_size", [(1, 1, 1, 1), (5, 3, 6, 4), (16, 2, 9, 16)])
def test_float64_backward_equals_the_plans(cell, hidden, batch, seq_len, input_size):
    assert compare(cell, hidden, batch, seq_len, input_size, "float64") < 1e-12


@pytest.mark.parametrize("cell", ["lstm", "gru_cho", "stacked_rnn", "indrnn"])
def test_rows_past_their_length_pass_their_gradients_through(cell):
    """Unsorted lengths with a length-0, a length-1 and a full-length row."""
    lengths = np.array([7, 0, 1, 4], np.int32)
    assert compare(cell, 6, 4, 7, 3, "float64", lengths=lengths) < 1e-12
    assert compare(cell, 6, 4, 7, 3, "float64", lengths=random_lengths(4, 7, seed=2), seed=3) < 1e-12


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "mgu"])
def test_float32_backward_is_close_to_the_float64_plans(cell):
    """float32 arithmetic throughout (the forward recomputed in float32 too): rounding, growing with T."""
    assert compare(cell, 33, 5, 40, 17, "float32") < 2e-4


def test_the_backward_is_compiled_once_per_layer():
    layer = prnn_tvm.compile_cell("gru", 4, 2, target="llvm", dtype="float64")
    assert compile_backward(layer) is compile_backward(layer)
    assert compile_backward(layer).arg_names[-3:] == ["lengths", "d_out", "d_h_n"]


def test_a_sequence_too_long_for_one_backward_pass_is_refused(monkeypatch):
    """The backward walks time backwards: it cannot run in chunks as a long forward call does."""
    layer = prnn_tvm.compile_cell("lstm", 4, 2, input_size=3, target="llvm")
    inputs = random_inputs(layer.plan, 50, 3)
    d_out = np.zeros((50, 2, 4), np.float32)
    assert compare("lstm", 4, 2, 50, 3, "float32") < 1e-4  # one pass at the real limit
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2 * 4 * 4 * 49)  # the per-step size (4 gates) x 49 steps
    with pytest.raises(InputError, match="backpropagation through 50 steps needs buffers of 1600 elements"):
        layer_gradients(layer, inputs, d_out, {})


@pytest.mark.parametrize("cell", [*CELLS, TWO_STATE])
def test_the_gradient_check_passes_for_every_cell(cell):
    """What ``prnn-tvm compile`` reports: the derived backward against central differences of the forward."""
    res = check_gradients(cell)
    assert res.ok and res.max_abs_error < 1e-7, res.max_abs_error


def test_the_gradient_check_fails_a_wrong_backward(monkeypatch):
    """The check can fail: a backward whose W_hh gradient is 1% off."""
    import prnn_tvm.checks as checks

    made = checks.layer_gradients
    monkeypatch.setattr(checks, "layer_gradients", lambda *a: {**(g := made(*a)), "W_hh": 1.01 * g["W_hh"]})
    assert not check_gradients("lstm").ok


def test_a_cuda_layer_trains_through_its_training_kernels():
    layer = prnn_tvm.compile_cell("lstm", 64, 2, target="cuda", arch="sm_90")
    with pytest.raises(ConfigError, match="CPU build's backward .*compile_training"):
        compile_backward(layer)
    with pytest.raises(ConfigError, match="compile_backward"):
        compile_training(prnn_tvm.compile_cell("lstm", 8, 2, target="llvm"))


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        *((c, 256, 4, "float32") for c in CELLS),
        *((c, 1024, 64, "float32") for c in ("lstm", "gru", "rnn_tanh", "gru_cho")),
        ("lstm", 1024, 64, "float16"),
        ("gru", 1024, 16, "bfloat16"),
        ("lstm", 1536, 16, "float16"),  # the tensor-core backward, a third of its fragments in shared memory
    ],
)
def test_training_kernels_have_no_spills(cell, hidden, batch, dtype):
    """ptxas's figures of the training forward and the backward for their default configs (no GPU needed:
    the CUDA source is compiled here for sm_90); the forward keeps the layer's config, in the shared layout."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    refused = persistent_backward.refusal(layer.plan)
    if refused:  # sums over units: the CPU build trains them (test_unit_sums.py)
        pytest.skip(refused)
    training = compile_training(layer)
    lines = training.report.splitlines()
    assert [line.split(":")[0] for line in lines] == ["recurrent_save", "recurrent_backward"]
    assert all(", 0 spill bytes" in line for line in lines), training.report
    saving, forward = training.forward.signature.launches[0].grid, layer.signature.launch("recurrent").grid
    if layer.kernel.config.layout == "split":  # saved columns come from items of the whole step: the shared layout
        knobs = pc if dtype == "float32" else mc
        assert knobs.saving_config(layer.kernel.config, layer.plan, layer.gpu).layout == "shared"
        assert saving.ctas < forward.ctas
    else:
        assert (saving.ctas, saving.threads, saving.dynamic_smem_bytes) == (
            forward.ctas,
            forward.threads,
            forward.dynamic_smem_bytes,
        )
    source = layer._training.forward.module.imports[0].inspect_source()
    assert "recurrent_save_kernel(" in source and "recurrent_backward_kernel(" in source
    assert compile_training(layer) is training  # built once per layer


def test_training_kernels_that_do_not_fit_say_so(monkeypatch):
    """A float16 LSTM of hidden 1536 runs (tensor-core fragments), and so does its backward on the tensor cores
    (``test_backward_mma.py``), but the float32 backward's widened transposed weights do not fit in the registers
    of the grid: where no backward fits, compile_training says why."""
    layer = prnn_tvm.compile_cell("lstm", 1536, 2, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])

    def none_fits(plan, gpu, limit=4):
        raise ConfigError("no tensor-core backward config fits (as if)")

    monkeypatch.setattr(backward_mma_config, "ranked_configs", none_fits)
    with pytest.raises(
        ConfigError,
        match="tensor-core backward config fits .*; no persistent backward config fits .* transposed weights in "
        "float32.*train this layer on the CPU build",
    ):
        compile_training(layer)

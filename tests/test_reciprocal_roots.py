"""Reciprocal square roots on the GPU (``codegen.pointwise.reciprocal_roots``): a cell's float32 ``a / sqrt(v)`` is
``a * rsqrtf(v)`` in every GPU kernel (float32 layers and the half types' float32 math, forward and backward),
the same function; float64 keeps the IEEE form. The kernels as emitted, on the host (``verify.emulator``), against
the float64 reference: the layer-normalized LSTM's forward (its sums over units: ``test_unit_sums.py``) and a cell
written here, whose training kernels the GPU builds. GPU runs: ``test_gpu_unit_sums.py``."""

import numpy as np
import pytest
import tvm
from tvm import te, tirx

import prnn_tvm
from prnn_tvm import Cell
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.codegen.pointwise import gpu_math, reciprocal_roots
from prnn_tvm.dtypes import tolerance
from prnn_tvm.frontend.texpr import evaluate, rebuild
from prnn_tvm.schedules import gpu_backward
from prnn_tvm.verify import emulator

from .test_emulated import T, emulated, emulated_gradients, knobs


def _externs(expr) -> list:
    """The names of the extern functions ``expr`` calls, sorted."""
    names = []

    def visit(node):
        if getattr(getattr(node, "op", None), "name", None) == "tirx.call_pure_extern":
            names.append(node.args[0].value)
        return None

    rebuild(expr, visit)
    return sorted(names)


def test_a_float32_reciprocal_root_is_rsqrtf_and_the_same_function():
    x, a = tirx.Var("x", "float32"), tirx.Var("a", "float32")
    alone = reciprocal_roots(1.0 / tirx.sqrt(x * x + 0.5))
    assert alone.op.name == "tirx.call_pure_extern" and alone.args[0].value == "rsqrtf"
    tvm.ir.assert_structural_equal(alone.args[1], x * x + 0.5)  # no multiply by one
    scaled = a / tirx.sqrt(x * x + 0.5)
    values = {x: np.linspace(-30, 30, 601), a: np.linspace(-2, 3, 601)}
    np.testing.assert_allclose(evaluate(reciprocal_roots(scaled), values), evaluate(scaled, values), rtol=1e-12)
    nested = 1.0 / tirx.sqrt(1.0 / tirx.sqrt(x * x + 0.5))  # a root inside a root's argument
    assert _externs(gpu_math(nested, fast_math=False)) == ["rsqrtf", "rsqrtf"]
    assert _externs(gpu_math(tirx.sigmoid(scaled), fast_math=True)) == ["__expf", "__fdividef", "rsqrtf"]


def test_float64_and_other_quotients_keep_the_ieee_form():
    x = tirx.Var("x", "float64")
    for expr in (1.0 / tirx.sqrt(x), tirx.sqrt(x) / 2.0):
        tvm.ir.assert_structural_equal(reciprocal_roots(expr), expr)
    y = tirx.Var("y", "float32")
    tvm.ir.assert_structural_equal(reciprocal_roots(y / (tirx.sqrt(y) + 1.0)), y / (tirx.sqrt(y) + 1.0))


@pytest.mark.parametrize("hidden, batch, dtype", [(8, 2, "float32"), (7, 3, "float16"), (256, 4, "bfloat16")])
def test_a_layer_norms_kernel_computes_rsqrtf(hidden, batch, dtype):
    # its three scales 1 / sqrt(var + eps) a step, wherever the compiler's simplifier copies them: none left as an
    # IEEE square root and division
    src = prnn_tvm.compile_cell(
        "lstm_layernorm", hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[]
    ).cuda_source
    assert src.count("rsqrtf(") >= 3 and src.count("sqrtf(") == src.count("rsqrtf("), src.count("rsqrtf(")


def scaled_step(c):
    """An RNN whose state is scaled by reciprocal roots of itself and of its input: no sums over units, so the GPU
    builds its training kernels."""
    x, h = c.input(), c.state("h")
    hw = c.matvec(h, c.weight("W_hh"), name="hw")
    scale = c.pointwise(lambda n, j: 1.0 / te.sqrt(1.0 + h[n, j] * h[n, j]), name="scale")
    return {
        "h": c.pointwise(
            lambda n, j: te.tanh(x[n, j] + hw[n, j]) * scale[n, j] + 0.5 * h[n, j] / te.sqrt(2.0 + x[n, j] * x[n, j]),
            name="h_new",
        )
    }


def scaled_reference(x, state, p):
    h = state["h"]
    return {"h": np.tanh(x + h @ p["W_hh"].T) / np.sqrt(1.0 + h * h) + 0.5 * h / np.sqrt(2.0 + x * x)}


SCALED = Cell("scaled_rnn", scaled_step, scaled_reference)


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize("cell, config", [("lstm_layernorm", knobs(4, 4, 2, 2)), (SCALED, knobs(4, 4, 2, 2))])
def test_the_forward_as_emitted_matches_the_float64_reference(cell, config):
    err, layer = emulated(cell, 8, 3, config)
    assert "rsqrtf(" in layer.cuda_source
    assert err <= tolerance("float32", T), err


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
def test_the_training_kernels_as_emitted_match_float64_gradients():
    layer = prnn_tvm.compile_cell(
        SCALED, 8, 3, input_size=3, target="cuda", arch="sm_90", tuning_logs=[], config=knobs(4, 4, 2, 2)
    )
    backward = next(iter(gpu_backward(layer.plan, layer.gpu)))
    assert "rsqrtf" in str(backward.func)  # the recomputed scale as the forward's, and the adjoint's 0.5 / sqrt(v)
    got, want = emulated_gradients(layer)
    assert set(got) == set(want)
    errors = {n: relative_error(got[n], want[n]) for n in want}
    assert worst(errors.values()) <= 1e-5, errors

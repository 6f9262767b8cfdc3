"""LLVM's own optimization level, the one a user's build takes: the rest of the suite builds its CPU layers and the
host code of its CUDA layers at level 0 (``PRNN_TVM_CPU_OPT_LEVEL``, set by tests/conftest.py to save CPU time), so
this module builds every built-in cell's CPU layer without it and checks it against the float64 reference, a float64
layer's derived backward against central differences, on a GPU a CUDA layer (its host code), and the variable's own
handling."""

import pytest

import prnn_tvm
from prnn_tvm.checks import check_against_reference, check_gradients, max_abs_error
from prnn_tvm.dtypes import BOUND_MAGNITUDE, tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.target import CPU_OPT_LEVEL, cpu_target, gpu_spec

CELLS = sorted(prnn_tvm.builtin_cells())


@pytest.fixture
def shipped_level(monkeypatch):
    """No ``PRNN_TVM_CPU_OPT_LEVEL``: builds take LLVM's own level, as outside the suite."""
    monkeypatch.delenv(CPU_OPT_LEVEL, raising=False)


def test_the_suite_builds_at_level_0_and_a_user_at_llvms_own():
    assert cpu_target({CPU_OPT_LEVEL: "0"}).attrs["opt-level"] == 0
    assert "opt-level" not in cpu_target({}).attrs  # LLVM's own: 3
    assert cpu_target({CPU_OPT_LEVEL: " "}).attrs.get("opt-level") is None
    assert gpu_spec("sm_90").target().host.attrs["opt-level"] == 0  # a CUDA build's host code: the same level


@pytest.mark.parametrize("level", ["4", "-1", "O2", "fast"])
def test_another_level_is_refused_naming_the_variable(level):
    with pytest.raises(ConfigError, match=f"{CPU_OPT_LEVEL}='{level}': .* one of 0, 1, 2, 3"):
        cpu_target({CPU_OPT_LEVEL: level})


@pytest.mark.parametrize("cell", CELLS)
def test_every_cell_at_the_shipped_level_matches_the_reference(cell, shipped_level):
    layer = prnn_tvm.compile_cell(cell, 7, 3, input_size=5, target="llvm")
    assert "opt-level" not in layer.target.attrs
    for seq_len in (1, 33):
        res = check_against_reference(layer, seq_len, tolerance("float32", seq_len), seed=seq_len)
        assert res.ok, f"T={seq_len}: max abs error {res.max_abs_error:.2e} > {res.tolerance:.1e}"


def test_the_backward_at_the_shipped_level_passes_the_gradient_check(shipped_level):
    res = check_gradients("lstm")
    assert res.ok and res.max_abs_error < 1e-7, res.max_abs_error


def test_a_layer_of_one_level_is_not_the_cached_layer_of_the_other(shipped_level, monkeypatch):
    shipped = prnn_tvm.compile_cell("gru", 5, 2, target="llvm")
    monkeypatch.setenv(CPU_OPT_LEVEL, "1")
    lower = prnn_tvm.compile_cell("gru", 5, 2, target="llvm")
    assert shipped.cache_key != lower.cache_key
    assert lower.target.attrs["opt-level"] == 1 and "opt-level" not in shipped.target.attrs


@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_cuda_layer_with_host_code_at_the_shipped_level_matches_the_reference(cell, shipped_level):
    layer = prnn_tvm.compile_cell(cell, 128, 4, target="cuda")
    assert "opt-level" not in layer.target.host.attrs
    inputs = random_inputs(layer.plan, 7, layer.input_size, seed=1)
    result = layer(*[inputs.get(n) for n in layer.arg_names])
    assert max_abs_error(layer.plan, result, reference_layer(layer.plan, inputs), BOUND_MAGNITUDE) <= tolerance(
        "float32", 7
    )

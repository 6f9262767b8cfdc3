"""The input projection ``xp`` in a half layer's own type (the tensor-core template's knob ``xp``): its rounding
against the dtype's tolerance on the CPU build, and what the GPU build's launches and generated code take. The GPU
runs: ``test_gpu_half_xp.py``."""

import dataclasses

import ml_dtypes  # noqa: F401  (NumPy's 'bfloat16')
import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import BOUND_MAGNITUDE, TENSOR_CORE_DTYPES, tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import by_name, saving_forward
from prnn_tvm.target import gpu_spec

CELLS = sorted(prnn_tvm.builtin_cells())
MMA = by_name("persistent_mma")


def cuda_layer(cell, hidden, batch, dtype="float16", config=None, **options):
    return prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[],
                                 config=config, **options)


def xp_of(layer) -> tuple:
    """The type the projection writes ``xp`` in and the type the recurrent kernel reads it in."""
    projection, recurrent = (layer.signature.launch(f) for f in ("projection", "recurrent"))
    return projection.arg("xp").dtype, recurrent.arg("xp").dtype


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden, batch, input_size", [(1, 1, 3), (7, 3, None), (64, 8, 17)])
def test_a_half_xp_is_within_the_unchanged_tolerance(dtype, cell, hidden, batch, input_size):
    """The CPU build of a half layer (half storage, float32 math, its states rounded as the GPU's) run on the float64
    projection rounded once to the half type, as the GPU's projection writes it: against the float64 reference on the
    exact projection, within the dtype's own bound, at T=1 and T=64 with rows of their own lengths. The rounding
    is there to see: the rounded projection differs from the exact one."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="llvm")
    for seq_len in (1, 64):
        inputs = random_inputs(layer.plan, seq_len, input_size or hidden, seed=seq_len)
        inputs["lengths"] = random_lengths(batch, seq_len, seed=seq_len)
        x, w, b = (inputs[k].astype(np.float64) for k in ("x", "W_ih", "b_ih"))
        exact = x @ w.T + b
        rounded = exact.astype(dtype).astype(np.float32)  # one rounding, widened exactly
        assert np.abs(rounded - exact).max() > 0
        recurrent = {k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")}
        got = layer.recurrent(rounded, **recurrent)
        err = max_abs_error(layer.plan, got, reference_layer(layer.plan, inputs), BOUND_MAGNITUDE)
        assert err <= tolerance(dtype, seq_len), f"T={seq_len}: max abs error {err:.2e}"


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
def test_the_untuned_default_reads_a_half_xp_and_a_config_gets_float32_back(dtype):
    layer = cuda_layer("lstm", 64, 4, dtype)
    assert layer.kernel.config.xp == "half" and layer.report.config["xp"] == "half"
    assert xp_of(layer) == (dtype, dtype)
    back = cuda_layer("lstm", 64, 4, dtype, dataclasses.replace(layer.kernel.config, xp="float32"))
    assert xp_of(back) == ("float32", "float32") and "xp" not in back.kernel.config.as_dict()


def test_records_from_before_the_knob_mean_float32():
    """A tuning record's config without ``xp`` (every record before the knob) builds the float32 projection it was
    timed with; the knob round-trips through a record's dict."""
    cfg = MMA.config_from_dict({"units_per_cta": 8, "k_groups": 4, "n_tiles": 2, "barrier": "counter"})
    assert cfg.xp == "float32" and not cfg.half_xp
    half = dataclasses.replace(cfg, xp="half")
    assert MMA.config_from_dict(half.as_dict()) == half and half.as_dict()["xp"] == "half"


def test_an_unknown_xp_type_is_refused_naming_the_knob():
    layer = cuda_layer("lstm", 64, 4)
    with pytest.raises(ConfigError, match=r"xp='float64'.*float32, half"):
        cuda_layer("lstm", 64, 4, config=dataclasses.replace(layer.kernel.config, xp="float64"))


def test_the_space_offers_both_projections():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 4, 64, "float16")
    space = MMA.space(plan, gpu_spec("sm_90"))
    assert {c.xp for c in space} == {"float32", "half"}
    assert sum(c.half_xp for c in space) * 2 == len(space)  # every config either way
    assert MMA.features(space[0], plan, gpu_spec("sm_90"))["half_xp"] in (0.0, 1.0)


@pytest.mark.parametrize("cell", ["lstm", "gru_cho", "lstm_h4"])
def test_training_keeps_a_float32_projection(cell):
    """The saving forward of a half-xp layer reads float32 ``xp``: what ``CudaBackprop``'s projection gives it and
    the GPU backward reads."""
    layer = cuda_layer(cell, 64, 4)
    assert layer.kernel.config.half_xp
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    save = saving_forward(layer.plan, target, gpu_spec("sm_90"), layer.kernel.config)
    assert save.launch.arg("xp").dtype == "float32" and save.config.xp == "float32"


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("lstm", 896, 16, "float16"),  # issue 51's shapes
        ("lstm", 1024, 16, "float16"),
        ("lstm_h12", 768, 16, "bfloat16"),  # issue 49's heads: in_warp
        ("lstm_h24", 768, 16, "bfloat16"),
        ("gru_cho", 1024, 8, "float16"),  # two phases
        ("lstm_layernorm", 1024, 8, "float16"),  # sums over units (grid_sync)
        ("lstm", 256, 1, "bfloat16"),  # tags
        ("rnn_tanh", 7, 3, "float16"),  # odd width: a store per value
    ],
)
def test_generated_code_reads_and_writes_a_half_xp_without_spills(cell, hidden, batch, dtype):
    """The default of each touched template path: the recurrent kernel and the projection take ``xp`` as the half
    type's pointer, the pointwise math widens it, and ptxas reports no spills in either."""
    layer = cuda_layer(cell, hidden, batch, dtype)
    c_type = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    assert layer.kernel.config.half_xp and xp_of(layer) == (dtype, dtype)
    assert layer.cuda_source.count(f"{c_type}* __restrict__ xp") == 2, layer.cuda_source[:2000]
    assert layer.report.spill_bytes == 0 and " 0 B spills" in layer.report.projection_ptxas, layer.report.format()


def test_a_session_and_the_projected_launch_keep_their_float32_projection():
    """Kernels that project their own input (in shared memory, float32) take a half-xp config as it is."""
    from prnn_tvm.projected_build import compile_projected
    from prnn_tvm.session_build import compile_session

    layer = cuda_layer("lstm", 256, 8)
    assert layer.kernel.config.half_xp
    projected = compile_projected(layer)
    assert "xp" not in [a.name for a in projected.launch.args]
    assert "xp" not in [a.name for a in compile_session(layer).resident.args]

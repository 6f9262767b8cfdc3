"""Sessions of layers whose weights pass registers (issue 47's 3-layer x 960 LSTM targets): the deep stack's configs
with weight tiers (fp16: shared memory; fp32: shared memory and the streamed L2 tier), the layers and their session
kernels built by ptxas without spills, and the streamed and shared tiers in session mode as emitted, run on the host
against the float64 reference. The GPU runs are ``tests/test_gpu_session.py``."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.compiler import compile_session
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.reference import random_inputs
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify import emulator
from prnn_tvm.verify.session import run_session

from .test_session import _reference_steps
from .test_streamed_weights import knobs

H100 = gpu_spec("sm_90")
DEEP = "lstm_d3"


@pytest.fixture(scope="module", params=["float16", "float32"])
def deep_layer(request):
    """The 3 x 960 deep stack at batch 1, compiled once per dtype (the layer cache keeps it for later runs)."""
    return prnn_tvm.compile_cell(DEEP, 960, 1, dtype=request.param, target="cuda", arch="sm_90")


def test_the_3x960_stacks_rank_tiered_configs_that_validate():
    """fp16 (37 MB of weights): registers and shared memory hold them, on 120 CTAs; fp32 (74 MB): shared memory and
    the streamed tier beside registers."""
    half = analyze(resolve(DEEP), 1, 960, "float16")
    ranked = mc.ranked_configs(half, H100)
    assert ranked and all(cfg.smem_k_tiles > 0 for cfg in ranked)
    for cfg in ranked:
        g = mc.validate(cfg, half, H100)
        assert g.ctas <= H100.sms and g.smem_ws > 0
    single = analyze(resolve(DEEP), 1, 960, "float32")
    ranked = pc.ranked_configs(single, H100)
    assert ranked and all(cfg.l2_chunks > 0 and cfg.smem_chunks > 0 for cfg in ranked)
    for cfg in ranked:
        g = pc.validate(cfg, single, H100)
        assert g.l2_ws > 0 and g.ctas <= H100.sms


def test_the_3x960_layer_and_its_session_build_without_spills(deep_layer):
    """The layer's kernel and its session kernel (the tags exchange, 4 SMs free, the step's input in static shared
    memory beside the config's dynamic) by ptxas: 0 spill bytes, launchable shared memory, every weight on chip or in
    the streamed tier."""
    report = deep_layer.report
    assert report.spill_bytes == 0, report.format()
    assert report.weight_smem_bytes > 0
    if deep_layer.plan.dtype == "float32":
        assert report.weight_l2_bytes > 0
    kernels = compile_session(deep_layer)
    assert "0 spill bytes" in kernels.report, kernels.report
    grid = kernels.resident.grid
    assert grid.ctas <= H100.sms - 4
    assert grid.dynamic_smem_bytes + grid.static_smem_bytes <= H100.smem_per_block
    assert grid.static_smem_bytes >= 4 * 960  # the step's input
    tiers = kernels.config.as_dict()
    assert tiers.get("smem_k_tiles", tiers.get("smem_chunks", 0)) > 0
    if deep_layer.plan.dtype == "float32":
        assert tiers["l2_chunks"] > 0


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize("transport", ["device", "host"])
def test_a_session_with_streamed_and_shared_weights_serves_every_step(transport):
    """A deep stack whose weights sit in all three tiers (registers, shared memory, streamed from global memory)
    runs as a session: each step's states equal the float64 reference."""
    config = knobs(3, 2, 3, 2, smem_chunks=1, l2_chunks=1, barrier="tags")
    layer = prnn_tvm.compile_cell(DEEP, 10, 2, input_size=4, target="cuda", arch="sm_90", tuning_logs=[],
                                  config=config)
    kernels = compile_session(layer)
    assert kernels.config.l2_chunks == 1 and kernels.config.smem_chunks == 1
    T = 4
    inputs = random_inputs(layer.plan, T, 4, seed=2)
    steps, finals, error, _ = run_session(kernels, inputs, T, transport=transport)
    want = _reference_steps(layer.plan, inputs)
    assert error == 0
    for name in want:
        assert np.abs(steps[name] - want[name]).max() < 1e-5, name
        assert np.abs(finals[name] - want[name][-1]).max() < 1e-5, name

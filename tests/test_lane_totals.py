"""The blocks' partial sums over units as the persistent templates add them up (``schedules/persistent_sums.py``):
each (sum, batch row) by a group of lanes in a fixed order, after a grid barrier per phase of sums (three a step of
the layer-normalized LSTM), and the kind each template's defaults take for them. Emulated numerics:
``test_unit_sums.py``; GPU runs: ``test_gpu_unit_sums.py``, ``test_gpu_heads.py``."""

import pytest

import prnn_tvm
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules.persistent_sums import MAX_PER_LANE, WARP, lane_groups
from prnn_tvm.target import gpu_spec

from .test_emulated import knobs

SM90 = gpu_spec("sm_90")


@pytest.mark.parametrize(
    "pairs, warps, ctas", [(32, 8, 128), (16, 8, 128), (8, 8, 128), (32, 8, 264), (100, 4, 2), (6, 4, 3), (1, 1, 1)]
)
def test_every_pair_has_a_group_of_lanes_and_no_lane_loads_too_many(pairs, warps, ctas):
    lanes, rounds = lane_groups(pairs, warps, ctas)
    assert WARP % lanes == 0 and rounds * warps * (WARP // lanes) >= pairs
    assert -(-ctas // lanes) <= max(MAX_PER_LANE, -(-ctas // WARP))
    assert (rounds - 1) * warps * (WARP // lanes) < pairs  # no round without a pair


@pytest.mark.parametrize("barrier", ["counter", "grid_sync"])
def test_a_layer_normalized_step_meets_after_each_phase_and_adds_partials_by_lane_groups(barrier):
    """Three phases a step (the gates' sums, the cell state's, the new state): a grid barrier after each (the last
    step's end guarded), and each phase's totals met through xor shuffles."""
    layer = prnn_tvm.compile_cell(
        "lstm_layernorm", 8, 2, input_size=3, target="cuda", arch="sm_90", tuning_logs=[],
        config=knobs(4, 4, 2, 2, barrier=barrier),
    )
    source = layer.cuda_source
    kernel = source[source.index(") {", source.index(" recurrent_kernel(")) :]  # its definition
    loop = kernel[kernel.index("for (int v = 0; v < seq_len; ++v)") : kernel.find("__global__")]
    call = "tvm_builtin_cuda_grid_sync(" if barrier == "grid_sync" else "prnn_barrier_counter("
    assert loop.count(call) == 3
    assert "__shfl_xor_sync" in loop


@pytest.mark.parametrize("hidden, batch", [(1024, 8), (1024, 16), (256, 1)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_tensor_core_default_of_a_cell_that_sums_over_units_is_grid_sync(hidden, batch, dtype):
    """Every untuned choice of the half template spread over the grid takes ``grid_sync`` for the layer-normalized
    LSTM, while the plain LSTM at the same size keeps ``tags`` or ``counter``."""
    ranked = mc.ranked_configs(prnn_tvm.analyze(prnn_tvm.resolve("lstm_layernorm"), batch, hidden, dtype), SM90)
    assert ranked and {c.barrier for c in ranked} <= {mc.SUMS_BARRIER, "block"}, ranked
    assert ranked[0].barrier == "grid_sync"
    plain = mc.ranked_configs(prnn_tvm.analyze(prnn_tvm.resolve("lstm"), batch, hidden, dtype), SM90)
    assert "grid_sync" not in {c.barrier for c in plain}


@pytest.mark.parametrize("hidden, batch", [(1024, 8), (256, 4)])
def test_the_float32_default_of_a_cell_that_sums_over_units_is_counter(hidden, batch):
    """``tags`` moves the values products multiply and refuses sums over units, so the float32 template keeps the
    kind its configs are ranked with."""
    ranked = pc.ranked_configs(prnn_tvm.analyze(prnn_tvm.resolve("lstm_layernorm"), batch, hidden), SM90)
    assert ranked[0].barrier == "counter", ranked[0]

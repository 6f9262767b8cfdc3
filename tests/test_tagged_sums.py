"""The blocks' partial sums over units as the persistent templates exchange them (``schedules/persistent_sums.py``):
added up by groups of lanes in a fixed order, and tagged with their step under a kind with a base (``counter``,
``tags``), so that a step of the layer-normalized LSTM meets at one grid barrier where it met at three. Emulated
block against block (the tags across launches, a stalled block), and the generated code's barriers. GPU runs:
``test_gpu_heads.py``."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.schedules.persistent_sums import MAX_PER_LANE, WARP, lane_groups
from prnn_tvm.signature import ArgRole
from prnn_tvm.verify import emulator

from .test_emulated import knobs

needs_gxx = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def layer_of(barrier: str, hidden: int = 8, batch: int = 2, **more):
    return prnn_tvm.compile_cell(
        "lstm_layernorm", hidden, batch, input_size=3, target="cuda", arch="sm_90", tuning_logs=[],
        config=knobs(4, 4, 2, 2, barrier=barrier), **more,
    )


@pytest.mark.parametrize(
    "pairs, warps, ctas", [(32, 8, 128), (16, 8, 128), (8, 8, 128), (32, 8, 264), (100, 4, 2), (6, 4, 3), (1, 1, 1)]
)
def test_every_pair_has_a_group_of_lanes_and_no_lane_loads_too_many(pairs, warps, ctas):
    lanes, rounds = lane_groups(pairs, warps, ctas)
    assert WARP % lanes == 0 and rounds * warps * (WARP // lanes) >= pairs
    assert -(-ctas // lanes) <= max(MAX_PER_LANE, -(-ctas // WARP))
    assert (rounds - 1) * warps * (WARP // lanes) < pairs  # no round without a pair


@pytest.mark.parametrize("barrier, waits", [("counter", 1), ("grid_sync", 3), ("tags", 0)])
def test_a_step_meets_once_where_its_partials_carry_their_step(barrier, waits):
    """Where the partial sums are tagged, only the step's end is a barrier: the phases between meet by polling the
    partials; grid_sync (no base to tag by) keeps a barrier between the phases."""
    layer = layer_of(barrier)
    source = layer.cuda_source
    kernel = source[source.index(") {", source.index(" recurrent_kernel(")) :]  # its definition
    loop = kernel[kernel.index("for (int v = 0; v < seq_len; ++v)") : kernel.find("__global__")]
    call = "tvm_builtin_cuda_grid_sync(" if barrier == "grid_sync" else "prnn_barrier_counter("
    assert loop.count(call) == waits
    assert ("prnn_tag_sum<" in source) == (barrier != "grid_sync")


@needs_gxx
@pytest.mark.parametrize("barrier", ["counter", "tags"])
def test_tagged_partials_of_a_launch_are_never_taken_for_the_next_ones(barrier):
    """Two launches on the same workspace and barrier state, each of an odd number of steps (the last step's
    partials lie in the slot the next launch's first step polls): the second still matches the reference."""
    layer = layer_of(barrier)
    launch = layer.signature.launch("recurrent")
    kept = [a.name for a in launch.args if a.role in (ArgRole.WORKSPACE, ArgRole.SYNC)]
    carried = {}
    for seed in (0, 1):
        inputs = random_inputs(layer.plan, 5, 3, seed=seed)
        run = emulator.run_launch(layer.cuda_source, launch, {
            **inputs, **carried, "xp": emulator.projection(inputs, launch.arg("xp").dtype)}, 5)
        assert run.error_word == 0
        written = [a.name for a in launch.args if a.role in (ArgRole.OUTPUT, ArgRole.FINAL)]
        got = (run.buffers[written[0]], [run.buffers[n] for n in written[1:]])
        assert max_abs_error(layer.plan, got, reference_layer(layer.plan, inputs)) <= tolerance("float32", 5), seed
        carried = {name: run.buffers[name] for name in kept}


@needs_gxx
@pytest.mark.parametrize("barrier", ["counter", "tags"])
def test_a_stalled_block_times_out_with_tagged_partials(barrier):
    """Block 0 skips its part of step 2: every waiter gives up (at the barrier, or polling partials that never
    come), the error word records the step, every output and final state is NaN."""
    layer = layer_of(barrier)
    out, finals, word = emulator.run_recurrent(layer, random_inputs(layer.plan, 5, 3), timeout_us=100_000,
                                               stall_step=2)
    assert layer.signature.launch("recurrent").sync.where(word - 1) == "after step 2", word
    assert np.isnan(out).all() and all(np.isnan(f).all() for f in finals)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tagged_partials_lie_on_whole_words_after_an_odd_exchange(dtype):
    """Batch 1, hidden 7 in a half type: the exchange's slots end off a 64-bit boundary, the partials start on
    the next one."""
    layer = prnn_tvm.compile_cell("lstm_layernorm", 7, 1, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    assert layer.report.config["barrier"] in ("counter", "tags")
    source = layer.cuda_source
    assert "prnn_tag_store(" in source and layer.report.spill_store_bytes == 0

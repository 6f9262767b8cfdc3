"""The third weight tier (``l2_chunks`` of the float32 template): the first chunks of each lane's rows read in place
from the weight matrix every step. Its emitted CUDA run on the host (``prnn_tvm.verify.emulator``) against the float64
reference; validation's refusals; the space offering it only past registers and shared memory together; ptxas at the
sizes it is for; the report; the launch's streamed argument. The GPU runs are ``tests/test_gpu_streamed_weights.py``."""

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.runtime.launcher import streamed_weight
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules.ranking import offers_streaming
from prnn_tvm.target import STATIC_SMEM_RESERVE, gpu_spec
from prnn_tvm.verify import emulator

from .test_emulated import emulated, knobs
from .test_weight_tiers import plan_of

H100 = gpu_spec("sm_90")
emulates = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, config, steps",
    [
        ("lstm", 16, 3, knobs(4, 4, 3, 2, l2_chunks=1), 5),  # one of two chunks streamed, a short last tile
        ("lstm", 16, 3, knobs(4, 4, 3, 2, l2_chunks=2), 5),  # every chunk streamed
        ("lstm", 10, 3, knobs(3, 2, 3, 2, smem_chunks=1, l2_chunks=1), 5),  # all three tiers, a partial last CTA
        ("gru", 12, 1, knobs(5, 2, 4, 1, vec=4, l2_chunks=1), 5),  # 16-byte loads, rows past the CTA's, batch 1
        ("rnn_tanh", 12, 4, knobs(6, 8, 4, 4, vec=1, smem_chunks=0, l2_chunks=1, barrier="tags"), 1),  # one step
    ],
)
def test_streamed_weights_as_emitted(cell, hidden, batch, config, steps):
    """The streamed chunks' in-place loads give the reference's numbers (the emulator stops on a read past the weight
    matrix)."""
    err, layer = emulated(cell, hidden, batch, config, seq_len=steps)
    assert layer.report.config["l2_chunks"] == config["l2_chunks"]
    assert layer.report.weight_l2_bytes > 0
    assert layer.kernel.launch.grid.streamed == "W_hh"
    assert err <= tolerance("float32", steps), (err, layer.report.config)


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, config, steps",
    [
        ("lstm_d2", 16, 3, knobs(4, 4, 4, 2, l2_chunks=1), 5),  # two layers: three products, two phases
        ("lstm_d3", 10, 2, knobs(3, 2, 3, 2, smem_chunks=1, l2_chunks=1, barrier="tags"), 4),  # all tiers, 5 products
        ("gru_cho", 12, 1, knobs(4, 2, 4, 1, vec=4, l2_chunks=1), 5),  # 16-byte loads, a product per phase
        ("lstm_d2", 16, 3, knobs(4, 4, 4, 2, l2_chunks=1, layout="split"), 5),  # each layer's CTAs its products
    ],
)
def test_several_products_stream_from_their_own_matrices(cell, hidden, batch, config, steps):
    """Where a cell has several products (a deep stack's five a unit), each thread reads its streamed chunks from the
    matrix of the product its rows belong to; the launch names no one matrix for the L2 window."""
    err, layer = emulated(cell, hidden, batch, config, seq_len=steps)
    assert len(layer.plan.reductions) > 1
    assert layer.report.weight_l2_bytes > 0
    assert layer.kernel.launch.grid.streamed == ""
    assert err <= tolerance("float32", steps), (err, layer.report.config)


@pytest.mark.parametrize(
    "cell, hidden, config, message",
    [
        ("lstm", 256, pc.PersistentConfig(2, 8, 4, 4, 4, l2_chunks=-1), "l2_chunks=-1"),
        ("lstm", 256, pc.PersistentConfig(2, 8, 4, 4, 4, smem_chunks=5, l2_chunks=4), "together at most 8"),
        ("lstm_h4", 256, pc.PersistentConfig(2, 8, 4, 4, 4, l2_chunks=1), "has products over heads"),
        ("lstm", 250, pc.PersistentConfig(2, 8, 4, 4, 4, l2_chunks=1), "vec must divide hidden"),
        ("lstm", 250, pc.PersistentConfig(2, 8, 4, 4, 2, l2_chunks=16), "lie within it"),
    ],
)
def test_validate_refuses_what_cannot_stream(cell, hidden, config, message):
    with pytest.raises(ConfigError, match=message):
        pc.validate(config, plan_of(cell, hidden, 4), H100)


def test_streaming_moves_registers_to_global_memory():
    plan = plan_of("lstm", 256, 4)
    g0 = pc.validate(pc.PersistentConfig(2, 8, 4, 4, 4), plan, H100)
    g = pc.validate(pc.PersistentConfig(2, 8, 4, 4, 4, smem_chunks=2, l2_chunks=3), plan, H100)
    assert g.weights_per_thread == g0.weights_per_thread - 4 * 5 * 4 and g.register_chunks == 3
    assert g.l2_ws == 4 * g.threads * 4 * 3 * 4 and g.smem_ws == 4 * g.threads * 4 * 2 * 4
    assert g.smem_from == 6
    assert pc.PersistentConfig(2, 8, 4, 4, 4).as_dict() == pc.PersistentConfig(2, 8, 4, 4, 4, l2_chunks=0).as_dict()
    assert "l2_chunks" not in pc.PersistentConfig(2, 8, 4, 4, 4).as_dict()


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 1792, 4), ("gru", 1792, 16), ("lstm", 1024, 4)])
def test_not_offered_where_registers_and_shared_memory_hold_the_weights(cell, hidden, batch):
    plan = plan_of(cell, hidden, batch)
    assert not offers_streaming(plan, H100)
    assert all(cfg.l2_chunks == 0 for cfg in pc.space(plan, H100))


@pytest.mark.parametrize("batch", [4, 16])
def test_default_streams_past_the_chip(batch):
    """LSTM fp32 2048 (67 MB of weights): no config holds them in registers and shared memory; every ranked default
    streams part of them, within the block's shared memory and the register cap."""
    plan = plan_of("lstm", 2048, batch)
    assert offers_streaming(plan, H100)
    ranked = pc.ranked_configs(plan, H100)
    assert ranked and all(cfg.l2_chunks > 0 for cfg in ranked)
    for cfg in ranked:
        g = pc.validate(cfg, plan, H100)
        assert g.smem_bytes + STATIC_SMEM_RESERVE <= H100.smem_per_block
        assert g.ctas <= H100.sms
    space = pc.space(plan, H100)
    assert any(cfg.l2_chunks for cfg in space) and any(cfg.smem_chunks and not cfg.l2_chunks for cfg in space)


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 2048, 4), ("lstm", 2048, 16), ("gru", 2560, 4)])
def test_ptxas_builds_the_default_without_spills(cell, hidden, batch):
    """The untuned choice past the chip, as ptxas builds it for sm_90 (skipped without nvcc)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda", arch="sm_90", tuning_logs=[])
    report = layer.report
    if report.spill_bytes is None:
        pytest.skip(f"no ptxas report: {report.ptxas_note}")
    assert report.spill_bytes == 0 and report.weight_l2_bytes > 0, report.format()
    assert report.config["l2_chunks"] > 0


def test_report_and_launch_say_what_streams():
    layer = prnn_tvm.compile_cell("lstm", 16, 3, target="cuda", arch="sm_90", tuning_logs=[],
                                  config=knobs(4, 4, 3, 2, smem_chunks=1, l2_chunks=1))
    g = pc.validate(layer.kernel.config, layer.plan, H100)
    report = layer.report
    assert report.weight_l2_bytes == g.l2_ws > 0
    assert (f"weights     {report.weight_register_bytes} B in registers, {g.smem_ws} B in shared memory, {g.l2_ws} B "
            "in global memory (L2) per CTA") in report.format()
    launch = layer.signature.launch("recurrent")
    index, nbytes = streamed_weight(launch)
    assert launch.args[index].name == "W_hh" and nbytes == 4 * 16 * 16 * 4
    plain = prnn_tvm.compile_cell("lstm", 16, 3, target="cuda", arch="sm_90", tuning_logs=[], config=knobs(4, 4, 3, 2))
    assert streamed_weight(plain.signature.launch("recurrent")) is None and plain.report.weight_l2_bytes == 0


def test_window_structures_match_the_cuda_runtime():
    """``cudaAccessPolicyWindow`` is 32 bytes (pointer, size_t, float, two enums, padded) and ``cudaStreamAttrValue``
    64 (driver_types.h of CUDA 12 and 13); the window can be switched off and on for the process."""
    import ctypes

    from prnn_tvm.runtime import l2

    assert ctypes.sizeof(l2.AccessPolicyWindow) == 32 and ctypes.sizeof(l2.StreamAttrValue) == 64
    assert l2.AccessPolicyWindow.hitRatio.offset == 16 and l2.AccessPolicyWindow.missProp.offset == 24
    assert not l2.window_enabled()  # off by default
    assert l2.Window(0, 0, 1 << 20, 0).value is None  # off: no runtime call at all
    l2.use_window(True)
    try:
        assert l2.window_enabled()
    finally:
        l2.use_window(False)

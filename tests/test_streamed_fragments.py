"""The tensor-core template's third weight tier (``l2_k_tiles``): the first k tiles of each warp read in place from the
weight matrix every pass. The emulator runs no tensor-core instruction, so here: the build (ptxas, 0 spills, every
shared access inside the launch's allocation), validation's refusals, the geometry's accounting, the space offering it
only past registers and shared memory together, the defaults at the sizes it is for, the report and the launch's
streamed argument. The numbers against the float64 reference are ``tests/test_gpu_streamed_fragments.py``."""

import pytest

import prnn_tvm
from prnn_tvm.errors import ConfigError
from prnn_tvm.runtime.launcher import streamed_weight
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import saving_forward
from prnn_tvm.schedules.ranking import offers_streaming
from prnn_tvm.schedules.template import config_from_dict
from prnn_tvm.target import STATIC_SMEM_RESERVE, gpu_spec
from prnn_tvm.verify import bounds

from .test_weight_tiers import plan_of

H100 = gpu_spec("sm_90")
# forced on small layers (the knob is usable at any size; the space offers it only past the chip)
FORCED = [
    ("lstm", 64, 4, "float16", dict(units_per_cta=16, k_groups=1, n_tiles=1, smem_k_tiles=1, l2_k_tiles=2)),
    ("lstm", 64, 12, "float16", dict(units_per_cta=16, k_groups=1, n_tiles=2, l2_k_tiles=4)),  # every k tile, ldmatrix
    ("lstm", 96, 4, "bfloat16", dict(units_per_cta=8, k_groups=2, n_tiles=1, m_tiles_per_warp=2, l2_k_tiles=1)),
    ("gru", 80, 5, "float16", dict(units_per_cta=16, k_groups=1, n_tiles=1, smem_k_tiles=1, l2_k_tiles=3)),  # odd
    ("rnn_tanh", 64, 8, "float16", dict(units_per_cta=16, k_groups=1, n_tiles=1, barrier="sentinel",
                                        operand_path="direct", l2_k_tiles=2)),
    ("lstm", 128, 16, "bfloat16", dict(units_per_cta=8, k_groups=2, n_tiles=2, barrier="tags", smem_k_tiles=1,
                                       l2_k_tiles=2)),
    ("lstm", 256, 4, "float16", dict(units_per_cta=16, k_groups=1, n_tiles=1, smem_k_tiles=2, l2_k_tiles=12)),
]


@pytest.mark.parametrize("cell, hidden, batch, dtype, config", FORCED)
def test_forced_streaming_builds_inside_the_launch(cell, hidden, batch, dtype, config):
    """The streamed loads and the streamed range's B fragments build (0 spills where ptxas runs), every shared access
    of every thread inside the allocation; the training forward of the same config too; the launch names the weight
    the L2 window covers."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[],
                                  config=config)
    g = mc.validate(layer.kernel.config, layer.plan, H100)
    report = layer.report
    assert report.weight_l2_bytes == g.l2_ws == 16 * g.threads * config.get("m_tiles_per_warp", 1) * g.l2_k_tiles > 0
    assert report.spill_bytes in (0, None), report.format()
    assert "ld.global.nc" in layer.cuda_source or "__ldg" in layer.cuda_source
    assert bounds.launch_problems(layer.kernel.func, layer.kernel.launch.grid) == [], report.format()
    assert layer.kernel.launch.grid.streamed == "W_hh"
    save = saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)
    assert bounds.launch_problems(save.func, save.launch.grid) == []


@pytest.mark.parametrize(
    "cell, hidden, config, message",
    [
        ("lstm", 256, mc.MmaConfig(16, 2, 1, l2_k_tiles=-1), "l2_k_tiles=-1"),
        ("lstm", 256, mc.MmaConfig(16, 2, 1, smem_k_tiles=5, l2_k_tiles=4), "together at most 8"),
        ("gru_cho", 256, mc.MmaConfig(16, 2, 1, l2_k_tiles=1), "has 2 products"),
        ("lstm", 100, mc.MmaConfig(16, 1, 1, l2_k_tiles=1), "not a multiple of 8"),
        ("lstm", 40, mc.MmaConfig(8, 2, 1, l2_k_tiles=1), "past hidden=40"),
        ("lstm", 256, mc.MmaConfig(16, 2, 1, barrier="sentinel", operand_path="direct", l2_k_tiles=3),
         "multiple of 2"),
    ],
)
def test_validate_refuses_what_cannot_stream(cell, hidden, config, message):
    with pytest.raises(ConfigError, match=message):
        mc.validate(config, plan_of(cell, hidden, 4, "float16"), H100)


def test_streaming_moves_registers_to_global_memory():
    plan = plan_of("lstm", 256, 4, "float16")
    g0 = mc.validate(mc.MmaConfig(16, 2, 1), plan, H100)
    g = mc.validate(mc.MmaConfig(16, 2, 1, smem_k_tiles=2, l2_k_tiles=3), plan, H100)
    assert g.weights_per_thread == g0.weights_per_thread - 4 * 5 and g.register_k_tiles == 3
    assert g.l2_ws == 16 * g.threads * 3 and g.smem_ws == 16 * g.threads * 2
    assert g.regs_estimate > g0.regs_estimate - 4 * 5  # the loads in flight take registers back
    assert mc.MmaConfig(16, 2, 1).as_dict() == mc.MmaConfig(16, 2, 1, l2_k_tiles=0).as_dict()
    assert "l2_k_tiles" not in mc.MmaConfig(16, 2, 1).as_dict()
    assert config_from_dict(mc.MmaConfig, {"units_per_cta": 16, "k_groups": 2, "l2_k_tiles": 3}).l2_k_tiles == 3


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 2048, 4), ("gru", 2560, 16), ("lstm", 1024, 4)])
def test_not_offered_where_the_chip_holds_the_weights(cell, hidden, batch):
    plan = plan_of(cell, hidden, batch, "float16")
    assert not offers_streaming(plan, H100)
    assert all(cfg.l2_k_tiles == 0 for cfg in mc.space(plan, H100))


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 4096, 4), ("gru", 3072, 4)])
def test_default_streams_past_the_chip(cell, hidden, batch):
    """LSTM fp16 4096 (134 MB of weights) and GRU fp16 3072 (57 MB): registers and shared memory hold no config's
    weights; every ranked default streams part of them, within the block's shared memory and the register cap."""
    plan = plan_of(cell, hidden, batch, "float16")
    assert offers_streaming(plan, H100)
    ranked = mc.ranked_configs(plan, H100)
    assert ranked and all(cfg.l2_k_tiles > 0 for cfg in ranked)
    for cfg in ranked:
        g = mc.validate(cfg, plan, H100)
        assert g.smem_bytes + STATIC_SMEM_RESERVE <= H100.smem_per_block
        assert g.ctas <= H100.sms


@pytest.mark.parametrize("cell, hidden, batch, dtype", [("lstm", 4096, 4, "float16"), ("gru", 3072, 4, "float16"),
                                                        ("lstm", 4096, 4, "bfloat16")])
def test_ptxas_builds_the_default_without_spills(cell, hidden, batch, dtype):
    """The untuned choice past the chip, as ptxas builds it for sm_90 (skipped without nvcc): no "no tensor-core
    config fits" any more, and the report says how much of each CTA's weights stream."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    report = layer.report
    assert report.template == "persistent_mma" and report.config["l2_k_tiles"] > 0
    assert f"{report.weight_l2_bytes} B in global memory (L2) per CTA" in report.format()
    if report.spill_bytes is None:
        pytest.skip(f"no ptxas report: {report.ptxas_note}")
    assert report.spill_bytes == 0, report.format()


def test_launch_names_the_streamed_weight():
    config = dict(units_per_cta=16, k_groups=1, n_tiles=1, l2_k_tiles=2)
    layer = prnn_tvm.compile_cell("lstm", 64, 4, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[],
                                  config=config)
    index, nbytes = streamed_weight(layer.signature.launch("recurrent"))
    assert layer.signature.launch("recurrent").args[index].name == "W_hh" and nbytes == 4 * 64 * 64 * 2
    plain = prnn_tvm.compile_cell("lstm", 64, 4, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[],
                                  config=dict(config, l2_k_tiles=0))
    assert streamed_weight(plain.signature.launch("recurrent")) is None and plain.report.weight_l2_bytes == 0

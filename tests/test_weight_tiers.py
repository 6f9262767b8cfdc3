"""The weight tiers (part of each CTA's weights in shared memory): ``smem_chunks`` of the float32 template, its
emitted CUDA run on the host (``prnn_tvm.verify.emulator``) against the float64 reference for splits from one chunk
to every chunk, odd hidden sizes, batch 1 and one step; ``smem_k_tiles`` of the tensor-core template, whose ``mma``
the emulator does not run, checked here for its shared-memory bounds (``prnn_tvm.verify.bounds``) and on the GPU;
validation's limits, the tuning spaces, the untuned choice where registers alone do not fit, and the report. The
GPU runs (the sizes past registers, forced splits of both templates) are ``tests/test_gpu_weight_tiers.py``."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.schedules import gpu_backward, saving_forward
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules.ranking import offers_tiers
from prnn_tvm.target import STATIC_SMEM_RESERVE, gpu_spec, max_regs_per_thread
from prnn_tvm.verify import bounds, emulator

from .test_emulated import emulated, knobs

H100 = gpu_spec("sm_90")
emulates = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def plan_of(cell: str, hidden: int, batch: int, dtype: str = "float32"):
    return analyze(resolve(cell), batch, hidden, dtype)


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, config, steps",
    [
        ("lstm", 10, 3, knobs(4, 4, 3, 2, smem_chunks=1), 5),  # one of two chunks shared, a short last tile
        ("lstm", 10, 3, knobs(4, 4, 3, 2, smem_chunks=2), 5),  # every weight in shared memory
        ("gru", 13, 1, knobs(5, 2, 3, 1, vec=4, smem_chunks=1), 5),  # odd hidden, batch 1, vec 4
        ("gru", 13, 1, knobs(5, 2, 3, 1, vec=4, smem_chunks=2), 1),  # every chunk shared, one step
        ("rnn_tanh", 12, 4, knobs(6, 8, 4, 4, vec=1, smem_chunks=1, barrier="tags"), 5),  # 2 chunks of 1, tags
        ("gru_cho", 9, 2, knobs(3, 4, 3, 2, vec=1, smem_chunks=2), 5),  # two phases of products, 3 chunks
    ],
)
def test_shared_weights_as_emitted(cell, hidden, batch, config, steps):
    """The shared chunks' prologue stores and per-tile loads give the reference's numbers (the emulator stops on a
    shared-memory access past the block's allocation)."""
    err, layer = emulated(cell, hidden, batch, config, seq_len=steps)
    assert layer.report.config["smem_chunks"] == config["smem_chunks"]
    assert layer.report.weight_smem_bytes > 0
    assert err <= tolerance("float32", steps), (err, layer.report.config)


def test_no_knob_is_every_weight_in_registers():
    """A config (or tuning record) from before the knob means smem_chunks=0, and its dict stays as it was."""
    cfg = prnn_tvm.schedules.by_name("persistent_cuda").config_from_dict(knobs(4, 4, 3, 2))
    assert cfg.smem_chunks == 0
    assert "smem_chunks" not in cfg.as_dict()
    g = pc.validate(cfg, plan_of("lstm", 64, 4), H100)
    assert g.smem_ws == 0 and g.register_chunks == g.k_chunks
    old_half = prnn_tvm.schedules.by_name("persistent_mma").config_from_dict(dict(units_per_cta=16, k_groups=2))
    assert old_half.smem_k_tiles == 0 and "smem_k_tiles" not in old_half.as_dict()


@pytest.mark.parametrize("config", [pc.PersistentConfig(12, 32, 6, 4, 2, smem_chunks=10),
                                    mc.MmaConfig(16, 2, 1, smem_k_tiles=15)])
def test_a_tiered_config_round_trips_as_a_record_dict(config):
    """What a tuning record stores (``as_dict``) names the knob and reads back as the same config."""
    template = prnn_tvm.schedules.by_name("persistent_cuda" if isinstance(config, pc.PersistentConfig)
                                          else "persistent_mma")
    knobs = config.as_dict()
    assert knobs.get("smem_chunks", knobs.get("smem_k_tiles")) in (10, 15)
    assert template.config_from_dict(knobs) == config


def test_shared_weights_move_registers_to_shared_memory():
    plan = plan_of("lstm", 256, 4)
    base = pc.PersistentConfig(2, 8, 4, 4, 4)
    g0, g3 = pc.validate(base, plan, H100), pc.validate(pc.PersistentConfig(2, 8, 4, 4, 4, smem_chunks=3), plan, H100)
    assert g3.weights_per_thread == g0.weights_per_thread - 4 * 3 * 4
    assert g3.smem_ws == 4 * g3.threads * 4 * 3 * 4
    assert g3.weights_offset % 16 == 0 and g3.weights_offset >= g0.smem_hs + g0.smem_gs
    assert g3.smem_bytes == g3.weights_offset + g3.smem_ws


@pytest.mark.parametrize(
    "config, message",
    [
        (pc.PersistentConfig(2, 8, 4, 4, 4, smem_chunks=-1), "smem_chunks=-1"),
        (pc.PersistentConfig(2, 8, 4, 4, 4, smem_chunks=9), "at most 8 can be in shared memory"),
    ],
)
def test_validate_refuses_bad_splits(config, message):
    with pytest.raises(ConfigError, match=message):
        pc.validate(config, plan_of("lstm", 256, 4), H100)


def test_validate_refuses_past_the_block_limit():
    """LSTM 1536 with every weight of a 12-unit CTA in shared memory: 294 KB, past sm_90's 227 KB per block."""
    plan = plan_of("lstm", 1536, 4)
    cfg = pc.PersistentConfig(12, 32, 6, 1, 4, smem_chunks=12)
    with pytest.raises(ConfigError, match=r"bytes of shared memory per CTA, sm_90 allows 232448 with up to 1024 of "
                                          r"static shared memory: lower batch_tile or smem_chunks \(\d+ B of them "
                                          r"weights\)"):
        pc.validate(cfg, plan, H100)


def test_register_refusal_names_the_tiers():
    with pytest.raises(ConfigError, match="raise smem_chunks"):
        pc.validate(pc.PersistentConfig(12, 32, 6, 1, 4), plan_of("lstm", 1536, 4), H100)


def test_space_offers_tiers_only_past_registers():
    """A config gains shared-memory tiers only where its register estimate passes the cap of a CTA of its
    threads; the first tier offered is the fewest chunks that bring it under."""
    plan = plan_of("lstm", 1536, 4)
    large = pc.space(plan, H100)
    firsts = {}
    for cfg in large:
        if cfg.smem_chunks:
            base = dataclasses.replace(cfg, smem_chunks=0)
            firsts[base] = min(firsts.get(base, cfg.smem_chunks), cfg.smem_chunks)
    assert firsts
    for base, least in list(firsts.items())[:200]:
        g = pc.geometry(base, plan)
        cap = max_regs_per_thread(g.threads, H100)
        assert g.regs_estimate > cap
        assert pc.geometry(dataclasses.replace(base, smem_chunks=least), plan).regs_estimate <= cap
        if least > 1:
            assert pc.geometry(dataclasses.replace(base, smem_chunks=least - 1), plan).regs_estimate > cap


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 1536, 4), ("gru", 1792, 16), ("rnn_tanh", 3072, 4)])
def test_default_takes_the_tier_where_registers_do_not_fit(cell, hidden, batch):
    """Past registers the untuned choice keeps part of the weights in shared memory, within the block's limit;
    below, every weight stays in registers."""
    plan = plan_of(cell, hidden, batch)
    ranked = pc.ranked_configs(plan, H100)
    assert ranked and all(cfg.smem_chunks > 0 for cfg in ranked)
    for cfg in ranked:
        g = pc.validate(cfg, plan, H100)
        assert g.smem_bytes + STATIC_SMEM_RESERVE <= H100.smem_per_block
    assert pc.default_config(plan_of(cell, 512, batch), H100).smem_chunks == 0


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, config",
    [
        ("lstm", 10, 3, "float32", knobs(4, 4, 3, 2, smem_chunks=2)),
        ("gru_cho", 64, 8, "float32", knobs(8, 8, 4, 4, vec=4, smem_chunks=1)),
        ("lstm", 64, 4, "float16", dict(units_per_cta=16, k_groups=2, n_tiles=1, smem_k_tiles=1)),
        ("lstm", 72, 12, "float16", dict(units_per_cta=8, k_groups=1, n_tiles=2, m_tiles_per_warp=2, smem_k_tiles=5)),
        ("gru", 96, 16, "bfloat16", dict(units_per_cta=8, k_groups=2, n_tiles=2, smem_k_tiles=3)),  # every k tile
        ("rnn_tanh", 64, 8, "float16", dict(units_per_cta=16, k_groups=2, n_tiles=1, barrier="sentinel",
                                            operand_path="direct", smem_k_tiles=1)),
    ],
)
def test_shared_weights_stay_inside_the_launch(cell, hidden, batch, dtype, config):
    """Every shared access of every thread, the tiers' prologue stores and per-pass loads among them, inside the
    allocation the launch makes; the training forward of the same config too."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[],
                                  config=config)
    assert layer.report.weight_smem_bytes > 0, layer.report.format()
    assert layer.report.spill_bytes in (0, None)
    assert bounds.launch_problems(layer.kernel.func, layer.kernel.launch.grid) == [], layer.report.format()
    save = saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)
    assert bounds.launch_problems(save.func, save.launch.grid) == []


def test_the_gpu_backward_keeps_every_weight_in_registers():
    plan = plan_of("lstm", 48, 4)
    assert all(kernel.config.smem_chunks == 0 for kernel in gpu_backward(plan, H100))


def test_mma_tiers_validate_and_refuse():
    plan = plan_of("lstm", 2048, 4, "float16")
    with pytest.raises(ConfigError, match="raise smem_k_tiles"):
        mc.validate(mc.MmaConfig(16, 2, 1), plan, H100)
    g = mc.validate(mc.MmaConfig(16, 2, 1, smem_k_tiles=20), plan, H100)
    assert g.register_k_tiles == g.k_tiles_per_warp - 20 and g.smem_ws == 16 * g.threads * 20
    assert g.weights_per_thread == 4 * g.register_k_tiles
    with pytest.raises(ConfigError, match="smem_k_tiles=65: a warp has 64 k tiles"):
        mc.validate(mc.MmaConfig(16, 2, 1, smem_k_tiles=65), plan, H100)
    with pytest.raises(ConfigError, match="smem_k_tiles=-1"):
        mc.validate(mc.MmaConfig(16, 2, 1, smem_k_tiles=-1), plan, H100)
    with pytest.raises(ConfigError, match=r"lower n_tiles or k_groups or smem_k_tiles \(\d+ B of them weights\)"):
        mc.validate(mc.MmaConfig(16, 1, 1, smem_k_tiles=128), plan, H100)


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 2048, 4), ("gru", 2560, 16)])
def test_mma_default_takes_the_tier_where_registers_do_not_fit(cell, hidden, batch):
    plan = plan_of(cell, hidden, batch, "float16")
    ranked = mc.ranked_configs(plan, H100)
    assert ranked and all(cfg.smem_k_tiles > 0 for cfg in ranked)
    for cfg in ranked:
        assert mc.validate(cfg, plan, H100).smem_bytes + STATIC_SMEM_RESERVE <= H100.smem_per_block
    assert mc.ranked_configs(plan_of(cell, 1024, batch, "float16"), H100)[0].smem_k_tiles == 0


def test_report_says_where_the_weights_live():
    config = knobs(4, 4, 3, 2, smem_chunks=1)
    layer = prnn_tvm.compile_cell("lstm", 10, 3, target="cuda", arch="sm_90", tuning_logs=[], config=config)
    g = pc.validate(layer.kernel.config, layer.plan, H100)
    report = layer.report
    assert report.weight_smem_bytes == g.smem_ws
    assert report.weight_register_bytes == 4 * g.threads * g.weights_per_thread
    assert report.weight_l2_bytes == 0
    assert (f"weights     {report.weight_register_bytes} B in registers, {g.smem_ws} B in shared memory, 0 B in global "
            "memory (L2) per CTA") in report.format()
    cpu = prnn_tvm.compile_cell("lstm", 10, 3, target="llvm")
    assert cpu.report.weight_register_bytes is None and "weights " not in cpu.report.format()


def test_registers_first_where_they_fit_tiers_after():
    """LSTM 1280 (26 MB of weights) fits registers: the untuned choice stays every weight in registers, as before the
    tiers, and the fallbacks for a build that spills hold part of the weights in shared memory."""
    plan = plan_of("lstm", 1280, 4)
    first, *fallbacks = pc.ranked_configs(plan, H100)
    assert first.smem_chunks == 0
    assert fallbacks and all(cfg.smem_chunks > 0 for cfg in fallbacks)
    assert not offers_tiers(plan_of("lstm", 1024, 4), H100)
    assert {cfg.smem_chunks for cfg in pc.space(plan_of("lstm", 1024, 4), H100)} == {0}


def test_a_deep_stack_that_no_register_geometry_holds_is_offered_tiers():
    """Three LSTM layers of 480 (five products per unit): 154 KB of weights a CTA, under the bytes at which tiers are
    offered, yet no thread geometry holds them in registers; the space then offers tiers, and the choice is valid
    (the 3x480 market model, issue 47's session target)."""
    plan = plan_of("lstm_d3", 480, 1)
    assert not offers_tiers(plan, H100)
    space = pc.space(plan, H100)
    untiered = [cfg for cfg in space if not cfg.smem_chunks]
    for cfg in untiered:
        with pytest.raises(ConfigError):
            pc.validate(cfg, plan, H100)
    first = pc.ranked_configs(plan, H100)[0]
    assert first.smem_chunks > 0
    pc.validate(first, plan, H100)

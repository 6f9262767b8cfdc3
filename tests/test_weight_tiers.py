"""The weight tiers of the float32 persistent template (``smem_chunks``: part of each row's weights in shared
memory): the emitted CUDA run on the host (``prnn_tvm.verify.emulator``) against the float64 reference for splits
from one chunk to every chunk, odd hidden sizes, batch 1 and one step; validation's limits; the tuning space; the
untuned choice where registers alone do not fit; and, on the GPU, the sizes past registers (``test_gpu_*``
pattern: ``tests/test_gpu_weight_tiers.py``)."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.target import STATIC_SMEM_RESERVE, gpu_spec, max_regs_per_thread
from prnn_tvm.verify import emulator

from .test_emulated import emulated, knobs

H100 = gpu_spec("sm_90")
emulates = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def plan_of(cell: str, hidden: int, batch: int):
    return analyze(resolve(cell), batch, hidden, "float32")


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

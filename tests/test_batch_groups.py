"""Batch groups (the tensor-core template's ``batch_groups``), without a GPU: where they are refused, what the
space offers, the grid they make, and that every per-row argument is indexed from the group's first row with
the whole batch's strides. On the GPU: ``test_gpu_batch_groups.py``."""

import dataclasses
import re

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec

SM90 = gpu_spec("sm_90")


def plan_of(cell="lstm", hidden=256, batch=16):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, "float16")


@pytest.mark.parametrize(
    "batch, cfg, why",
    [
        (6, mc.MmaConfig(16, 1, 1, "sentinel", batch_groups=4), "the batch of 6 does not split into 4 equal groups"),
        (16, mc.MmaConfig(16, 1, 1, "counter", batch_groups=2), "not across the grid barrier of 'counter'"),
        (16, mc.MmaConfig(16, 1, 1, "grid_sync", batch_groups=2), "not across the grid barrier of 'grid_sync'"),
        (16, mc.MmaConfig(16, 1, 1, "sentinel", batch_groups=3), "must be one of 1, 2, 4"),
        (16, mc.MmaConfig(16, 1, 2, "sentinel", batch_groups=4), "the batch group of 4 rows needs at most 1"),
        (
            16,
            mc.MmaConfig(8, 8, 1, "sentinel", m_tiles_per_warp=2, batch_groups=2),  # 2 x 128 CTAs on 132 SMs
            "cannot be co-resident.*raise units_per_cta or lower batch_groups",
        ),
    ],
)
def test_batch_groups_are_refused_with_the_reason(batch, cfg, why):
    hidden = 1024 if cfg.m_tiles_per_warp > 1 else 256
    with pytest.raises(ConfigError, match=why):
        mc.validate(cfg, plan_of(batch=batch, hidden=hidden), SM90)


def test_batch_groups_take_the_shared_layout():
    cfg = mc.MmaConfig(16, 1, 1, "tags", layout="split", batch_groups=2)
    with pytest.raises(ConfigError, match="batch_groups=2 takes the shared layout"):
        mc.validate(cfg, plan_of("gru_bi", batch=8), SM90)


@pytest.mark.parametrize(
    "cell, batch, groups",
    [("lstm", 16, {1, 2, 4}), ("gru", 8, {1, 2}), ("lstm", 4, {1}), ("lstm", 33, {1}), ("rnn_tanh", 12, {1, 2})],
)
def test_the_space_splits_the_batch_into_groups_of_at_least_four_rows_with_data_carried_barriers(cell, batch, groups):
    """Kinds that poll values: groups of at least GROUP_MIN_ROWS rows; ``block`` (a single block of every unit here):
    any equal groups, down to one row (test_heads_batch_groups.py); grid-wide kinds: none."""
    space = mc.space(plan_of(cell, batch=batch), SM90)
    assert {c.batch_groups for c in space if c.barrier in ("tags", "sentinel")} == groups
    assert {c.batch_groups for c in space if c.barrier == "block"} == {G for G in mc.BATCH_GROUPS if batch % G == 0}
    assert all(c.barrier in ("tags", "sentinel", "block") and c.layout == "shared" for c in space if c.batch_groups > 1)
    # a group's passes cover its rows, not the whole batch's
    assert all(c.batch_tile <= -(-batch // c.batch_groups // 8) * 8 for c in space)


def test_a_group_runs_its_rows_on_ctas_of_its_own():
    plan = plan_of(batch=16)
    one = mc.validate(mc.MmaConfig(16, 1, 1, "sentinel"), plan, SM90)
    two = mc.validate(mc.MmaConfig(16, 1, 1, "sentinel", batch_groups=2), plan, SM90)
    assert (one.ctas, two.ctas) == (16, 32) and two.threads == one.threads
    assert two.batch_chunks == 1 and two.smem_gs < one.smem_gs  # partial sums of 8 rows, not 16
    assert two.tagged_per_thread == one.tagged_per_thread  # one pass of at most 8 rows either way


@pytest.mark.parametrize("barrier", ["sentinel", "tags"])
def test_the_kernel_indexes_a_group_rows_with_the_whole_batch_strides(barrier):
    """Row ``b`` of group ``g`` is row ``g * 8 + b`` of the batch of 16: every per-row access adds the group's
    first row, and the steps of a sequence stay 16 rows apart (TVM 0.27 lowers a buffer view by its shape and
    drops explicit strides: a view shaped to the group's 8 rows would put step t at 8 * t rows)."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        256,
        16,
        dtype="float16",
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 16, "k_groups": 1, "n_tiles": 1, "barrier": barrier, "batch_groups": 2},
    )
    src = layer.cuda_source
    assert layer.report.ctas == 32 and layer.report.spill_bytes == 0
    assert "int group_row0 = ((((int)blockIdx.x) >> 4) * 8);" in src
    group = r"\(\(\(int\)blockIdx\.x\) >> 4\) \* "
    xp = re.findall(r"xp_ptr\[([^\]]*)\]", src)
    assert xp and all(re.search(r"\* 16384\)", i) and re.search(group + "8192", i) for i in xp)  # t * 16 * 1024
    for buffer in ("h_n", "c_n", "lengths"):
        accesses = re.findall(rf"{buffer}_ptr\[([^\]]*)\]", src)
        assert accesses and all(re.search(group, i) for i in accesses), buffer
    if barrier == "sentinel":
        (fill,) = re.findall(r"prnn_sentinel_fill<half>\(\(&\(out_ptr\[([^\]]*)\]", src)
        assert re.search(r"\* 4096\)", fill) and re.search(group + "2048", fill)  # t * 16 * 256, g * 8 * 256
    else:
        assert re.findall(r"workspace_ptr\[[^\]]*" + group + "2048", src)


def test_the_training_forward_runs_one_group():
    plan = plan_of(batch=16)
    cfg = mc.MmaConfig(16, 1, 1, "sentinel", batch_groups=2)
    assert mc.saving_config(cfg, plan, SM90) == dataclasses.replace(cfg, barrier="counter", batch_groups=1)
    tags = mc.MmaConfig(16, 1, 1, "tags", batch_groups=4)
    assert mc.saving_config(tags, plan, SM90) == dataclasses.replace(tags, batch_groups=1)

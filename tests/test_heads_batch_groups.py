"""Batch groups with head-wise products and barrier ``block`` (``schedules/persistent_mma_config.py``: ``batch_groups``,
``grouped``), without a GPU: what validation accepts and refuses, the space, the untuned default (up to
``BLOCK_GROUPS_MOST`` groups: two), the training forward's groups, and the kernels as ptxas builds them, each per-row
argument indexed from the group's first row. Their numbers on the GPU: test_gpu_heads_batch_groups.py."""

import dataclasses
import re

import pytest

import prnn_tvm
from prnn_tvm.codegen.build import build_functions
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import by_name, saving_forward
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import ctas_per_sm, gpu_spec, max_regs_per_thread
from prnn_tvm.tune.space import ConfigSpace

from .test_ptxas import kernel_source, loop_steps, steps_a_turn, time_loops

GPU = gpu_spec("sm_90")
# lstm_h12 (heads of 64) at 768 x 16, a head a CTA, a unit's gates in one warp, 8 groups of 2 rows: 96 CTAs
GROUPED = mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=8)
HEADS = {16: "lstm_h48", 32: "lstm_h24", 64: "lstm_h12", 128: "lstm_h6"}  # at hidden 768


def plan(cell, hidden=768, batch=16, dtype="bfloat16"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


def one_group(p):
    """The untuned default of one batch group (the first ranked config of one group: the fallback of the grouped)."""
    return next(c for c in mc.ranked_configs(p, GPU) if c.batch_groups == 1)


def build(cell, config, hidden=768, batch=16, dtype="bfloat16"):
    return prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config,
                                 tuning_logs=[])


@pytest.mark.parametrize(
    "cell, hidden, batch, config, message",
    [
        ("lstm_h12", 768, 16, dataclasses.replace(GROUPED, barrier="tags", gate_layout="by_gate"),
         "head-wise products exchange by span of heads.*across blocks with 'tags'.*or barrier 'block'"),
        ("lstm_h12", 768, 16, dataclasses.replace(GROUPED, barrier="counter", gate_layout="by_gate"),
         "not across the grid barrier of 'counter'"),
        ("lstm_h12", 768, 16, dataclasses.replace(GROUPED, batch_groups=3), "must be one of 1, 2, 4, 8, 16"),
        ("lstm_h12", 768, 12, GROUPED, "the batch of 12 does not split into 8 equal groups"),
        ("lstm_h12", 768, 16, dataclasses.replace(GROUPED, batch_groups=2, n_tiles=2),
         "covers 16 batch rows per pass; the batch group of 8 rows needs at most 1"),
        ("lstm_layernorm", 64, 8, mc.MmaConfig(64, 1, 1, "block", batch_groups=2), "sums over units"),
    ],
)
def test_batch_groups_it_cannot_place_are_refused_with_the_reason(cell, hidden, batch, config, message):
    with pytest.raises(ConfigError, match=message):
        mc.validate(config, plan(cell, hidden, batch), GPU)


@pytest.mark.parametrize(
    "cell, batch, config, ctas, threads",
    [
        ("lstm_h12", 16, dataclasses.replace(GROUPED, batch_groups=2), 24, 256),
        ("lstm_h12", 16, GROUPED, 96, 256),
        ("lstm_h12", 4, dataclasses.replace(GROUPED, batch_groups=4), 48, 256),  # groups of one row
        ("lstm_h12", 12, dataclasses.replace(GROUPED, batch_groups=4), 48, 256),  # groups of 3 rows
        ("lstm_h6", 16, mc.MmaConfig(128, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=16),
         96, 512),
        ("lstm_h48", 16, mc.MmaConfig(16, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=2),
         96, 64),
        ("lstm_h12", 32, mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, batch_groups=2), 24, 256),  # 2 passes
    ],
)
def test_a_group_of_whole_heads_runs_its_rows_on_ctas_of_its_own(cell, batch, config, ctas, threads):
    """A grid of ``batch_groups`` runs of the heads' CTAs, each CTA a group's rows only: a lane's in_warp items are
    those of one batch tile, the operand tiles as tall as a pass."""
    p = plan(cell, batch=batch)
    g = mc.validate(config, p, GPU)
    one = mc.geometry(dataclasses.replace(config, batch_groups=1), p)
    assert (g.ctas, g.threads) == (ctas, threads) and g.ctas == config.batch_groups * one.ctas
    assert g.batch_chunks == -(-(batch // config.batch_groups) // config.batch_tile)
    assert g.weights_per_thread == one.weights_per_thread  # every group holds all its heads' weights


def test_a_dense_cell_of_one_block_takes_groups_too():
    """Not only heads: a dense LSTM whose one block holds every unit (``block``) splits its batch the same way."""
    g = mc.validate(mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=16),
                    plan("lstm", 64, 16), GPU)
    assert g.ctas == 16


def test_the_space_offers_groups_of_any_rows_with_block():
    """Head-wise products: groups only with ``block`` (the kinds that poll values keep one: heads exchange by span),
    down to one row (16 groups of lstm_h12: 192 CTAs, two an SM at 256 threads of 88 registers), and a grid that is
    co-resident."""
    p = plan("lstm_h12")
    space = ConfigSpace(p, GPU, by_name("persistent_mma"))
    grouped = [c for c in space.configs if c.batch_groups > 1]
    assert all(c.barrier == "block" for c in grouped)
    assert {c.batch_groups for c in grouped if c.in_warp and c.units_per_cta == 64} == {2, 4, 8, 16}
    for c in grouped:
        g = mc.geometry(c, p)
        assert g.ctas <= ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, GPU) * GPU.sms
    assert "batch_groups" in space.feature_names


@pytest.mark.parametrize("cell", sorted(HEADS.values()) + ["slstm_h12"])
def test_the_default_takes_two_groups_and_falls_back_to_one(cell, monkeypatch):
    """BLOCK_GROUPS_MOST = 2 (at or below one group at every head size on the H100): the first ranked config is the
    one-group default in two groups, one pass of its group's rows, and the one-group config follows (a fallback).
    Raised, the first takes the most groups (up to it) whose grid keeps within one CTA per SM."""
    p = plan(cell)
    assert mc.BLOCK_GROUPS_MOST == 2
    first, second, *_ = mc.ranked_configs(p, GPU)
    assert first.batch_groups == 2 and first.in_warp and first.barrier == "block", first
    assert second.batch_groups == 1 and first == mc.grouped(second, p, GPU)
    assert mc.validate(first, p, GPU).batch_chunks == 1 and first.n_tiles == 1
    monkeypatch.setattr(mc, "BLOCK_GROUPS_MOST", 1)
    assert mc.ranked_configs(p, GPU)[0] == second
    monkeypatch.setattr(mc, "BLOCK_GROUPS_MOST", 16)
    most_first, *_ = mc.ranked_configs(p, GPU)
    heads = p.reductions[0].heads
    most = max(G for G in mc.BATCH_GROUPS if G * heads <= GPU.sms)
    assert most_first.batch_groups == most and most_first == mc.grouped(second, p, GPU, most=16)
    g = mc.geometry(most_first, p)
    assert g.ctas == most * heads <= GPU.sms and g.batch_chunks == 1


@pytest.mark.parametrize(
    "batch, most, groups, n_tiles",
    [(16, 2, 2, 1), (16, 8, 8, 1), (16, 16, 8, 1), (32, 2, 2, 2), (12, 16, 4, 1), (1, 16, 1, 2), (5, 16, 5 // 5, 1)],
)
def test_grouped_takes_the_most_groups_that_split_the_batch_and_fit(batch, most, groups, n_tiles):
    """lstm_h12: 12 heads a group; 8 groups fit the 132 SMs; 12 rows split into 4 groups of 3 (not 8); a batch of 1
    or 5 has no split (``cfg`` as it is)."""
    p = plan("lstm_h12", batch=batch)
    base = one_group(p)
    got = mc.grouped(base, p, GPU, most=most)
    assert got.batch_groups == groups
    if groups > 1:
        assert got.n_tiles == n_tiles and mc.validate(got, p, GPU).batch_chunks == 1
    else:
        assert got == base


def test_grouped_leaves_a_grid_synchronized_config_as_it_is():
    p = plan("lstm_h3")  # heads of 256: no block holds one, the grid synchronizes
    base = mc.ranked_configs(p, GPU)[0]
    assert base.barrier != "block" and mc.grouped(base, p, GPU, most=16) == base


@pytest.mark.parametrize("cell", sorted(HEADS.values()) + ["slstm_h12"])
def test_the_training_forward_keeps_the_groups(cell):
    """Each group's CTAs save their own rows (``saved``'s rows seen from the group's first, as every per-row
    argument): a grouped config trains in its groups, its projection float32."""
    p = plan(cell)
    for cfg in {mc.grouped(one_group(p), p, GPU, most=G) for G in (2, 16)}:
        assert cfg.batch_groups > 1
        assert mc.saving_config(cfg, p, GPU) == dataclasses.replace(cfg, xp="float32")


SAVING = [  # (cell, hidden, batch, config): the default's two groups, more, a group's rows tiled awkwardly
    ("slstm_h12", 768, 16, mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=2)),
    ("slstm_h12", 768, 16, mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=8)),
    ("lstm_h12", 768, 16, dataclasses.replace(GROUPED, batch_groups=16)),  # a row a group
    ("slstm_h12", 768, 12, dataclasses.replace(GROUPED, batch_groups=4)),  # groups of 3 rows
    ("slstm_h4", 40, 6, mc.MmaConfig(10, 1, 1, "block", batch_groups=2)),  # heads of 10, gates by gate, 3 rows
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cell, hidden, batch, config", SAVING)
def test_the_saving_forward_in_groups_writes_each_group_rows(cell, hidden, batch, config, dtype):
    """The training forward of a grouped config, as ptxas builds it: a grid of the groups' runs of CTAs, no spills,
    and every store to ``saved`` (step, batch row, column) offset by the group's first row, a step the whole batch's
    rows apart. Its numbers against float64 and one group on the GPU: test_gpu_heads_batch_groups.py."""
    layer = build(cell, config, hidden, batch, dtype)
    save = saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)
    assert save.config == dataclasses.replace(config, xp="float32")
    built = build_functions({"recurrent_save": save.func}, layer.target, layer.gpu)
    assert built.ptxas.function("recurrent_save").spills == 0
    per_group = -(-hidden // config.units_per_cta)
    assert save.launch.grid.ctas == config.batch_groups * per_group and save.launch.sync is None
    columns = len(layer.plan.saved_leaves()) * hidden
    rows = batch // config.batch_groups
    stores = re.findall(r"saved_ptr\[([^\]]*)\] = ", built.source)
    divide = f"/ {per_group}" + (f"|>> {per_group.bit_length() - 1}" if per_group & (per_group - 1) == 0 else "")
    group = rf"\(\(\(int\)blockIdx\.x\) (?:{divide})\) \* {rows * columns}\)"
    turn = steps_a_turn(built.source) * batch * columns  # a turn of the time loop: its steps' rows
    assert stores and all(re.search(group, i) and f"v * {turn})" in i for i in stores), stores


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D", sorted(HEADS))
def test_grouped_kernels_build_without_spills(D, dtype):
    """The grouped default of each head size (most=16), as ptxas builds it: no spills, within the CTA's registers,
    one block barrier a step."""
    p = plan(HEADS[D], dtype=dtype)
    config = mc.grouped(one_group(p), p, GPU, most=16)
    layer = build(HEADS[D], config, dtype=dtype)
    rep = layer.report
    assert rep.ctas == mc.geometry(config, p).ctas and config.batch_groups > 1
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
    assert rep.registers <= max_regs_per_thread(rep.threads, GPU), rep.format()
    body = kernel_source(layer)
    begin, end = time_loops(body)[0]
    for text in loop_steps(body[begin:end]):
        step, after = text.split("__syncthreads()")  # one block barrier a step, the outputs copied after it
        assert "out_ptr" not in step and "*(uint4*)(out_ptr + " in after


def test_the_kernel_indexes_a_group_rows_with_the_whole_batch_strides():
    """Row ``b`` of group ``g`` (2 rows, 12 CTAs a group) is row ``2 g + b`` of the batch of 16: every per-row access
    adds the group's first row, and a sequence's steps stay 16 rows apart."""
    layer = build("lstm_h12", GROUPED)
    src = layer.cuda_source
    assert "int group_row0 = ((((int)blockIdx.x) / 12) * 2);" in src
    group = r"\(\(\(int\)blockIdx\.x\) / 12\) \* "
    xp = re.findall(r"xp_ptr\[([^\]]*)\]", src)
    assert xp and all(re.search(group + "6144", i) for i in xp)  # 2 rows x 4 gates x 768
    turn = steps_a_turn(kernel_source(layer))  # a turn of the time loop: its steps
    assert any(f"v * {turn * 49152}" in i for i in xp)  # a step: 16 rows x 3072
    outs = re.findall(r"out_ptr \+ ([^;]*)\)\)", src)
    assert outs and all(re.search(group + "1536", i) and f"v * {turn * 12288}" in i for i in outs)  # 2 x 768; 16 x 768
    for buffer in ("h_n", "c_n", "h0", "c0", "lengths"):
        accesses = re.findall(rf"{buffer}_ptr(?:\[| \+ )([^;]*)", src)
        assert accesses and all(re.search(group, i) for i in accesses), buffer


def test_a_workspace_laid_out_by_span_gives_each_group_a_run_of_its_own():
    """Two passes a step (32 rows in 2 groups, a tile of 8): the values go through the workspace, laid out by span
    of heads ``[span][row][column]`` within each group's run of 16 x 768 values: group g's CTA c at
    ``(12 g + c) x 1024`` (16 rows x 64 columns). A run offset by the group's first row alone would overlap the
    next group's."""
    layer = build("lstm_h12", mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, batch_groups=2), batch=32)
    assert layer.report.spill_bytes == 0
    accesses = re.findall(r"workspace_ptr(?:\[| \+ )([^;]*)", kernel_source(layer))
    assert accesses and all("(((int)blockIdx.x) * 1024)" in i for i in accesses), accesses

"""The persistent template's config: geometry, validation before building, the default."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import ranking
from prnn_tvm.target import ctas_per_sm, gpu_spec, max_regs_per_thread

from .two_state_cell import TWO_STATE

SM90 = gpu_spec("sm_90")


def plan(cell="lstm", batch=4, hidden=1024):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden)


def test_geometry_of_the_lstm_default():
    p = plan()
    cfg = pc.PersistentConfig(units_per_cta=8, k_split=16, rows_per_thread=2, batch_tile=4, vec=4)
    g = pc.validate(cfg, p, SM90)
    assert (g.ctas, g.rows, g.row_groups, g.threads) == (128, 32, 16, 256)
    assert g.k_chunks == 16 and g.k_pad == 1024 and g.weights_per_thread == 128
    assert g.smem_hs == 4 * 4 * 1024 and g.smem_gs == 4 * 4 * 32


@pytest.mark.parametrize("rows, units", [(32, 8), (16, 8), (16, 4), (48, 9), (64, 16), (16, 1), (16, 3), (128, 32)])
def test_partial_sums_are_read_without_bank_conflicts(rows, units):
    # The pointwise items of a warp are 32 consecutive (batch row, unit) pairs; item i reads word
    # b * sum_stride + unit of a gate's partial sums (plus a per-gate offset, the same for the warp).
    stride = mc.gate_sum_stride(rows, units)
    assert rows <= stride < rows + 32
    for warp in range(units):
        items = range(32 * warp, 32 * warp + 32)
        assert len({(i // units * stride + i % units) % 32 for i in items}) == 32
    assert mc.gate_sum_stride(32, 8) == 40 and mc.gate_sum_stride(16, 8) == 24  # not more padding than needed


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(rows_per_thread=16, k_split=4), "registers per thread"),
        (dict(units_per_cta=64, k_split=32, rows_per_thread=1), "threads per CTA"),
        (dict(units_per_cta=1, k_split=32, rows_per_thread=1), "cannot be co-resident"),
        (dict(k_split=3), "power of two"),
        (dict(vec=3), "vec=3"),
        (dict(batch_tile=5), "batch_tile=5"),
        (dict(barrier="spin"), "barrier 'spin' unknown"),
        (dict(units_per_cta=2000), "exceeds hidden"),
    ],
)
def test_validate_rejects_with_a_reason(change, reason):
    base = pc.PersistentConfig(units_per_cta=8, k_split=16, rows_per_thread=2, batch_tile=4, vec=4)
    with pytest.raises(ConfigError, match=reason):
        pc.validate(dataclasses.replace(base, **change), plan(), SM90)


def test_shared_memory_over_budget_is_rejected():
    p = plan("rnn_tanh", batch=64, hidden=1024)
    cfg = pc.PersistentConfig(units_per_cta=8, k_split=32, rows_per_thread=1, batch_tile=64, vec=4)
    with pytest.raises(ConfigError, match="bytes of shared memory"):
        pc.validate(cfg, p, SM90)


def test_register_cap_follows_the_four_subpartitions():
    assert max_regs_per_thread(256, SM90) == 255
    assert max_regs_per_thread(320, SM90) == 168  # three warps on some sub-partition
    assert max_regs_per_thread(1024, SM90) == 64
    assert ctas_per_sm(256, 200, 17_000, SM90) == 1
    assert ctas_per_sm(128, 64, 4_000, SM90) == 8


@pytest.mark.parametrize("cell", sorted(prnn_tvm.builtin_cells()))
@pytest.mark.parametrize("hidden, batch", [(1, 1), (7, 3), (256, 4), (1024, 4), (1024, 16), (512, 64)])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_default_config_is_valid_and_spreads_over_the_gpu(cell, hidden, batch, arch):
    gpu = gpu_spec(arch)
    p = plan(cell, batch, hidden)
    cfg = pc.default_config(p, gpu)
    g = pc.validate(cfg, p, gpu)
    assert g.ctas <= gpu.sms
    # a stack's layers run on CTAs of their own where they fit (layout 'split'): one run of CTAs per layer
    assert cfg.layout == "shared" or p.cta_parts
    assert g.ctas == len(ranking.parts(cfg.layout, p)) * -(-hidden // cfg.units_per_cta)


def test_space_is_pruned_by_validate():
    p = plan()
    space = pc.space(p, SM90)
    valid = []
    for cfg in space:
        try:
            pc.validate(cfg, p, SM90)
            valid.append(cfg)
        except ConfigError:
            pass
    assert 0 < len(valid) < len(space)
    assert pc.default_config(p, SM90) in valid


def test_rows_of_a_thread_multiply_one_state():
    p = prnn_tvm.analyze(TWO_STATE, 3, 256)
    ok = pc.PersistentConfig(units_per_cta=4, k_split=16, rows_per_thread=2, batch_tile=3)
    assert pc.validate(ok, p, SM90).rows == 8
    with pytest.raises(ConfigError, match="must divide the rows of each recurrent product"):
        pc.validate(dataclasses.replace(ok, rows_per_thread=3), p, SM90)


# ---------------------------------------------------------------- the tensor-core template (half precision)
def half_plan(cell="lstm", batch=16, hidden=1024, dtype="float16"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


def test_mma_geometry_pads_products_to_row_tiles():
    g = mc.validate(mc.MmaConfig(units_per_cta=8, k_groups=8, n_tiles=2), half_plan(), SM90)
    assert (g.ctas, g.m_tiles, g.rows, g.threads) == (128, 2, 32, 512)  # 4 gates x 8 units: two 16-row tiles
    assert g.k_tiles_per_warp == 8 and g.k_pad == 1024 and g.weights_per_thread == 32
    assert g.stride == 1024 + mc.ROW_SKEW and g.sum_stride == 40 and g.smem_gs == 4 * 8 * 16 * 40
    gru = mc.geometry(mc.MmaConfig(units_per_cta=10, k_groups=4), half_plan("gru_cho"))
    assert gru.m_tiles == 3  # 20 rows of r, z in two tiles; 10 rows of n in a third, never mixed


def test_two_row_tiles_per_warp_halve_the_warps_and_double_their_fragments():
    one = mc.validate(mc.MmaConfig(units_per_cta=8, k_groups=8, n_tiles=2), half_plan(), SM90)
    two = mc.validate(mc.MmaConfig(8, 8, 2, m_tiles_per_warp=2), half_plan(), SM90)
    assert (two.m_tiles, two.warp_rows, two.threads) == (2, 1, 256) and (one.warp_rows, one.threads) == (2, 512)
    assert two.weights_per_thread == 2 * one.weights_per_thread == 64
    assert two.regs_estimate - one.regs_estimate == 32 + 4 * 2  # the fragments and a second set of accumulators
    # a new knob stays out of the records at its default, so older records read the same
    assert "m_tiles_per_warp" not in mc.MmaConfig(8, 8, 2).as_dict()
    assert mc.MmaConfig(8, 8, 2, m_tiles_per_warp=2).as_dict()["m_tiles_per_warp"] == 2
    space = mc.space(half_plan(), SM90)
    assert {c.m_tiles_per_warp for c in space} == {1, 2, 4}  # 4: every row tile of an LSTM CTA of 16 units
    assert {c.m_tiles_per_warp for c in mc.ranked_configs(half_plan(), SM90)} == {1}  # a tuning choice only


def test_a_warps_row_tiles_multiply_one_operand():
    """GRU at 16 units per CTA: 48 rows, three tiles; a pair would straddle two products of a stack's layer."""
    with pytest.raises(ConfigError, match=r"row tiles must come in groups of 2; at units_per_cta=16 they are \[3\]"):
        mc.validate(mc.MmaConfig(16, 4, 1, m_tiles_per_warp=2), half_plan("gru", batch=4), SM90)
    stack = prnn_tvm.analyze(prnn_tvm.resolve("lstm_x2"), 4, 512, "float16")
    with pytest.raises(ConfigError, match=r"they are \[3\]"):  # layer 0's W_hh: 12 units x 4 gates
        mc.validate(mc.MmaConfig(12, 2, 1, "counter", "split", 2), stack, SM90)
    assert mc.validate(mc.MmaConfig(8, 2, 1, "counter", "split", 2), stack, SM90).warp_rows == 2


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(k_groups=1), "registers per thread"),
        (dict(m_tiles_per_warp=3), "m_tiles_per_warp=3: must be one of 1, 2"),
        (dict(k_groups=32), "k_groups=32"),
        (dict(n_tiles=3), "n_tiles=3"),
        (dict(units_per_cta=16, k_groups=16), "threads per CTA"),
        (dict(units_per_cta=2), "cannot be co-resident"),
        (dict(barrier="spin"), "barrier 'spin' unknown"),
    ],
)
def test_mma_validate_rejects_with_a_reason(change, reason):
    base = mc.MmaConfig(units_per_cta=8, k_groups=8, n_tiles=2)
    with pytest.raises(ConfigError, match=reason):
        mc.validate(dataclasses.replace(base, **change), half_plan(), SM90)


def test_mma_validate_refuses_float32_old_gpus_and_batch_tiles_past_the_batch():
    cfg = mc.MmaConfig(units_per_cta=8, k_groups=8, n_tiles=1)
    with pytest.raises(ConfigError, match="places float16, bfloat16 cells, not float32"):
        mc.validate(cfg, plan(), SM90)
    with pytest.raises(ConfigError, match=r"sm_80 or newer\), not sm_75"):
        mc.validate(cfg, half_plan(), gpu_spec("sm_75"))
    with pytest.raises(ConfigError, match="the batch of 4 needs at most 1"):
        mc.validate(dataclasses.replace(cfg, n_tiles=2), half_plan(batch=4), SM90)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell", sorted(prnn_tvm.builtin_cells()))
def test_mma_default_is_valid_and_spreads_over_the_gpu(dtype, cell):
    p = half_plan(cell, batch=33, hidden=512, dtype=dtype)
    ranked = mc.ranked_configs(p, SM90)
    g = mc.validate(ranked[0], p, SM90)
    # a cell whose step splits into parts (stacked_rnn's two layers) runs each on CTAs of its own first
    assert ranked[0].layout == ("split" if p.cta_parts else "shared")
    runs = len(p.cta_parts) if p.cta_parts else 1
    assert ranked[0].units_per_cta == -(-runs * 512 // SM90.sms) and g.ctas <= SM90.sms
    for layout in ("split", "shared"):  # then the shared layout's ladder
        ladder = [c for c in ranked if c.layout == layout]
        # fallbacks hold fewer weights per thread; the last resort, if any, fills whole row tiles
        aligned = [mc.row_aligned(p, c.units_per_cta) for c in ladder]
        if ladder and not any(aligned[:-1]) and aligned[-1]:
            ladder = ladder[:-1]
        weights = [mc.geometry(c, p).weights_per_thread for c in ladder]
        assert weights == sorted(set(weights), reverse=True)
    assert any(mc.row_aligned(p, c.units_per_cta) for c in ranked) or not p.reductions


def test_accumulator_chains_take_the_k_tiles_in_turn():
    """``k_chains``: a warp with one accumulator set and a long k range keeps several, each a chain of its own
    (H100, the 4-layer LSTM fp16 512x8 stack: 2.43 -> 2.26 us per step with four)."""
    one = mc.validate(mc.MmaConfig(8, 4, 1), half_plan(batch=4), SM90)
    four = mc.validate(mc.MmaConfig(8, 4, 1, k_chains=4), half_plan(batch=4), SM90)
    assert four.regs_estimate - one.regs_estimate == 3 * 4  # three more sets of four accumulators
    assert (four.threads, four.weights_per_thread) == (one.threads, one.weights_per_thread)
    assert "k_chains" not in mc.MmaConfig(8, 4, 1).as_dict()  # older records read the same
    assert mc.MmaConfig(8, 4, 1, k_chains=2).as_dict()["k_chains"] == 2
    with pytest.raises(ConfigError, match="k_chains=3: must be one of 1, 2, 4"):
        mc.validate(mc.MmaConfig(8, 4, 1, k_chains=3), half_plan(batch=4), SM90)
    with pytest.raises(ConfigError, match="k_chains=4: a warp has 2 k tiles"):  # hidden 256 over 8 k groups
        mc.validate(mc.MmaConfig(2, 8, 1, k_chains=4), half_plan(hidden=256, batch=4), SM90)
    space = mc.space(half_plan(), SM90)
    assert {c.k_chains for c in space} == {1, 2, 4}
    # only where a warp has at most two accumulator sets (row tiles x batch tiles) and at least 8 k tiles
    assert all(
        c.n_tiles * c.m_tiles_per_warp <= 2 and -(-64 // c.k_groups) >= mc.CHAIN_MIN_K_TILES
        for c in space
        if c.k_chains > 1
    )
    assert any(c.m_tiles_per_warp == 2 for c in space if c.k_chains > 1)  # the tuned 1024 x 16 config's two sets
    assert {c.k_chains for c in mc.ranked_configs(half_plan(), SM90)} == {1}  # a tuning choice only

"""Configs carried over from the tuning records of neighbouring hidden sizes (``prnn_tvm.neighbours``,
``schedules.ranking.carried_over``): which records a shape without its own takes, what the tensor-core template
makes of them, and that the carried configs build (ptxas, sm_90) without spills. On the GPU: the numerics test
at the end (``-m gpu``)."""

import dataclasses
import json

import pytest

import prnn_tvm
from prnn_tvm import records
from prnn_tvm.checks import plan_tolerance
from prnn_tvm.choice import tuned_configs
from prnn_tvm.errors import ConfigError
from prnn_tvm.neighbours import carried_seeds, neighbour_keys
from prnn_tvm.report import ConfigOrigin
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import template_for
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune.space import ConfigSpace

SM90 = gpu_spec("sm_90")
TUNED = (256, 512, 1024)  # the hidden sizes of LSTM float16 at batch 16 the shipped log had records for
UNTUNED = (384, 640, 768, 896)


def plan_of(hidden, batch=16, dtype="float16", cell="lstm"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


@pytest.fixture(scope="module")
def neighbour_log(tmp_path_factory):
    """The shipped records of LSTM float16 at batch 16 and hidden 256, 512 and 1024 alone: whatever the shipped log
    gains at the other sizes, these have none of their own."""
    path = tmp_path_factory.mktemp("logs") / "sm_90.jsonl"
    keys = {records.key_for(plan_of(h), SM90, "persistent_mma") for h in TUNED}
    kept = [r for r in records.load(records.default_log("sm_90")) if r.key in keys]
    assert {r.key.hidden for r in kept if r.ok} == set(TUNED)
    records.append(path, kept)
    return path


def expected(hidden: int, log) -> tuple:
    """What the rule says, worked out here from the log: the nearest tuned hidden size by ratio (a tie to the
    larger), its fastest config that carries over (the units raised to the least multiple of 4 (LSTM's whole row
    tiles) whose grid keeps to 132 CTAs, the most row tiles per warp, up to the record's, that divide the CTA's; a
    config that then does not validate at ``hidden``, say its k groups do not divide its k tiles, is passed over
    for the next fastest)."""
    near = min(TUNED, key=lambda h: (max(h, hidden) / min(h, hidden), -h))
    plan = plan_of(hidden)
    for record in records.ranked(records.load(log), records.key_for(plan_of(near), SM90, "persistent_mma")):
        knobs = dict(record.config)
        units = knobs["units_per_cta"]
        while -(-hidden // units) * knobs.get("batch_groups", 1) > SM90.sms:
            units += 4
        tiles = 4 * units // 16
        most = knobs.get("m_tiles_per_warp", 1)
        knobs["m_tiles_per_warp"] = max(m for m in (1, 2, 4) if m <= most and tiles % m == 0)
        cfg = mc.MmaConfig(**dict(knobs, units_per_cta=units))
        try:
            mc.validate(cfg, plan, SM90)
        except ConfigError:
            continue
        return near, cfg
    raise AssertionError(f"no record at hidden={near} carries over to {hidden}")


@pytest.mark.parametrize("hidden", UNTUNED)
def test_a_shape_without_records_takes_its_nearest_neighbours_fastest_config(hidden, neighbour_log):
    plan = plan_of(hidden)
    template = template_for(plan, SM90.target())
    choices, why = tuned_configs(plan, [template], SM90, [neighbour_log])
    near, cfg = expected(hidden, neighbour_log)
    assert why.startswith("no tuning record for this cell, shapes and GPU")
    assert choices and all(c.origin is ConfigOrigin.DEFAULT for c in choices)
    assert choices[0].config == cfg, (choices[0].config, cfg)
    assert f"carried over from the record at hidden={near} (" in choices[0].reason
    assert len({c.config for c in choices}) == len(choices) <= 3
    for choice in choices:  # every one valid, its grid within the SMs, in the tuning space (a tuner can seed it)
        assert mc.validate(choice.config, plan, SM90).ctas <= SM90.sms
    space = ConfigSpace(plan, SM90, template)
    assert all(space.index(c.config) is not None for c in choices)


def test_the_rule_at_the_sizes_cudnn_runs():
    """What the shipped records gave at the time the rule was written (H100 records at 256, 512, 1024): 384 takes
    512's config as it is (96 CTAs), 640 the same with 20 units (160 CTAs of 16 would pass the 132 SMs), 768 and
    896 take 1024's (96 and 112 CTAs)."""
    at_512 = mc.MmaConfig(16, 4, 1, "sentinel", m_tiles_per_warp=4, batch_groups=4)
    at_1024 = mc.MmaConfig(16, 4, 1, "sentinel", m_tiles_per_warp=2, batch_groups=2)
    assert mc.carried(at_512, plan_of(384), SM90) == at_512
    assert mc.carried(at_512, plan_of(640), SM90) == dataclasses.replace(at_512, units_per_cta=20, m_tiles_per_warp=1)
    assert mc.carried(at_1024, plan_of(768), SM90) == at_1024
    assert mc.carried(at_1024, plan_of(896), SM90) == at_1024
    # 768 from 512's: 24 units (six row tiles: two per warp) keep four groups within the SMs
    assert mc.carried(at_512, plan_of(768), SM90) == dataclasses.replace(at_512, units_per_cta=24, m_tiles_per_warp=2)


def test_nothing_is_carried_where_no_config_of_those_knobs_fits():
    """1280 from 1024's config: 16 units make 160 CTAs in two groups, and 20 or more units do not fit registers."""
    at_1024 = mc.MmaConfig(16, 4, 1, "sentinel", m_tiles_per_warp=2, batch_groups=2)
    assert mc.carried(at_1024, plan_of(1280), SM90) is None


def test_neighbours_are_the_same_key_within_a_factor_of_two_nearest_first(neighbour_log):
    found = records.load(neighbour_log)
    key = records.key_for(plan_of(384), SM90, "persistent_mma")
    assert [k.hidden for k in neighbour_keys(found, key)] == [512, 256]  # 4/3 before 3/2
    assert [k.hidden for k in neighbour_keys(found, dataclasses.replace(key, hidden=768))] == [1024, 512]
    assert [k.hidden for k in neighbour_keys(found, dataclasses.replace(key, hidden=1536))] == [1024]
    assert [k.hidden for k in neighbour_keys(found, dataclasses.replace(key, hidden=2304))] == []
    assert neighbour_keys(found, dataclasses.replace(key, batch=8)) == []  # another batch is no neighbour
    # bfloat16 has none of its own: float16's serve it, as its own records would
    bf16 = dataclasses.replace(key, dtype="bfloat16")
    assert [(k.hidden, k.dtype) for k in neighbour_keys(found, bf16)] == [(512, "float16"), (256, "float16")]


def test_records_of_the_shape_itself_come_before_any_neighbour(neighbour_log, tmp_path):
    plan = plan_of(768)
    template = template_for(plan, SM90.target())
    log = tmp_path / "sm_90.jsonl"
    log.write_text(neighbour_log.read_text())
    own = {"units_per_cta": 24, "k_groups": 4, "n_tiles": 1, "barrier": "sentinel", "batch_groups": 4}
    line = json.loads(log.read_text().splitlines()[0])
    line.update(config=own, key=dict(line["key"], hidden=768), costs=[1e-3], seq_len=1024, error=None)
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")
    choices, why = tuned_configs(plan, [template], SM90, [log])
    assert why == "" and choices[0].origin is ConfigOrigin.TUNED and choices[0].config.as_dict() == own


@pytest.mark.parametrize("hidden", UNTUNED)
def test_the_tuning_seeds_start_with_the_carried_default_and_lie_in_the_space(hidden, neighbour_log):
    """``bench/tune_neighbours.py``'s first configs: what a compile carries over first, then every neighbour's
    fastest records in 2 and 4 batch groups, each valid and distinct (the script seeds those the space holds: not a
    poll sleep on groups of 4 rows, say)."""
    plan = plan_of(hidden)
    template = template_for(plan, SM90.target())
    key = records.key_for(plan, SM90, template.name)
    seeds = carried_seeds(records.load(neighbour_log), plan, template, SM90, key, 3, "batch_groups", (2, 4))
    assert seeds[0] == expected(hidden, neighbour_log)[1]
    assert len(set(seeds)) == len(seeds) <= 2 * 3 * 3
    assert 2 in {cfg.batch_groups for cfg in seeds}  # 4 groups too where their units fit (not at 896)
    space = ConfigSpace(plan, SM90, template)
    assert all(mc.validate(cfg, plan, SM90).ctas <= SM90.sms for cfg in seeds)
    assert space.index(seeds[0]) is not None and sum(space.index(cfg) is not None for cfg in seeds) >= len(seeds) - 2


def test_no_logs_no_carrying():
    plan = plan_of(768)
    assert tuned_configs(plan, [template_for(plan, SM90.target())], SM90, []) == ([], "tuning records not consulted")


def test_float32_carries_nothing_over():
    plan = plan_of(768, dtype="float32")
    template = template_for(plan, SM90.target())
    assert template.carried_over(template.default_configs(plan, SM90.target(), SM90)[0], plan, SM90) is None


@pytest.mark.parametrize("hidden", [384, 640, 768, 896])
def test_the_space_holds_16_units_and_the_units_that_fill_the_grid_per_batch_split(hidden):
    units = {cfg.units_per_cta for cfg in mc.space(plan_of(hidden), SM90)}
    fill = {G: next(u for u in range(4, hidden, 4) if -(-hidden // u) * G <= SM90.sms) for G in (1, 2, 4)}
    assert {16, *fill.values()} <= units, (sorted(units), fill)


@pytest.mark.parametrize("hidden", UNTUNED)
def test_the_carried_default_builds_without_spills(hidden, neighbour_log):
    layer = prnn_tvm.compile_cell(
        "lstm", hidden, 16, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[neighbour_log]
    )
    rep = layer.report
    assert rep.registers is not None, rep.ptxas_note
    assert rep.config_origin is ConfigOrigin.DEFAULT and "carried over from the record at hidden=" in rep.config_detail
    assert rep.config == expected(hidden, neighbour_log)[1].as_dict(), rep.format()  # the first carried: no spills
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0, rep.format()
    assert rep.ctas <= SM90.sms


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden", UNTUNED)
def test_gpu_the_carried_default_matches_float64(hidden, dtype, neighbour_log):
    """The tensor-core template has no host emulation (its mma): its carried configs are checked here."""
    from .test_gpu_half import error_of

    layer = prnn_tvm.compile_cell("lstm", hidden, 16, dtype=dtype, tuning_logs=[neighbour_log])
    assert "carried over from the record at hidden=" in layer.report.config_detail, layer.report.format()
    for seq_len in (1, 7, 256):
        assert error_of(layer, seq_len, seed=seq_len) <= plan_tolerance(layer.plan, seq_len), layer.report.format()

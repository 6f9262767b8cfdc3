"""The auto-tuner on the CPU: space, records, the search loop against known costs, compile's lookup, CLI.

GPU measurements of the tuner are in tests/test_gpu_tune.py.
"""

import dataclasses
import json
import logging
import math
import multiprocessing

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import records
from prnn_tvm.errors import ConfigError, PrnnError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.records import ErrorKind, Record, TuneKey
from prnn_tvm.report import ConfigOrigin
from prnn_tvm.schedules import by_name
from prnn_tvm.schedules.persistent_config import PersistentConfig, ranked_configs, space, validate
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune import tune
from prnn_tvm.tune.measure import CpuRunner
from prnn_tvm.tune.model import XGBoostCostModel
from prnn_tvm.tune.replay import replay
from prnn_tvm.tune.search import GridSearch, ModelSearch, RandomSearch
from prnn_tvm.tune.space import ConfigSpace
from prnn_tvm.tune.tuner import with_knob

from .cli_run import run_cli
from .conftest import HAS_GPU
from .record_appends import append_each

GPU = gpu_spec("sm_90")
PERSISTENT = by_name("persistent_cuda")


@pytest.fixture(scope="module")
def lstm_space():
    return ConfigSpace(analyze(resolve("lstm"), 4, 1024, "float32"), GPU, PERSISTENT)


# ---------------------------------------------------------------- space
def test_space_keeps_exactly_the_configs_validate_accepts(lstm_space):
    plan, raw = lstm_space.plan, space(lstm_space.plan, GPU)
    assert len(lstm_space) + lstm_space.rejected == len(raw)
    assert lstm_space.rejected > 0
    for cfg in raw:
        try:
            validate(cfg, plan, GPU)
            valid = True
        except ConfigError:
            valid = False
        assert (lstm_space.index(cfg) is not None) == valid, cfg


def test_space_encodes_configs_by_index_and_dict(lstm_space):
    for i in (0, len(lstm_space) // 2, len(lstm_space) - 1):
        cfg = lstm_space.configs[i]
        assert lstm_space.index(cfg) == i == lstm_space.index(cfg.as_dict())
    assert lstm_space.index({"units_per_cta": 8, "bogus": 1}) is None
    assert lstm_space.index(PersistentConfig(8, 1, 16, 4)) is None  # 1024 threads x 16 rows: pruned
    assert lstm_space.defaults()[0] == lstm_space.index(ranked_configs(lstm_space.plan, GPU)[0])


def test_features_are_stable_and_ptxas_figures_replace_estimates(lstm_space):
    again = ConfigSpace(lstm_space.plan, GPU, PERSISTENT)
    names = again.feature_names
    assert lstm_space.features.shape == (len(lstm_space), len(names)) and names[-1] == "spill_bytes"
    np.testing.assert_array_equal(again.features, lstm_space.features)
    regs = names.index("registers")
    assert again.features[3, regs] == again.features[3, names.index("regs_estimate")]
    again.record_ptxas(3, 201, 16)
    assert again.features[3, regs] == 201 and again.features[3, names.index("spill_bytes")] == 16


# ---------------------------------------------------------------- records
def key(batch=4, hidden=1024, **kw):
    fields = dict(
        fingerprint="abc",
        batch=batch,
        hidden=hidden,
        dtype="float32",
        arch="sm_90",
        sms=132,
        template="persistent_cuda",
        tvm="0.27.0.post1",
    )
    return TuneKey(**{**fields, **kw})


CFG = {"units_per_cta": 8, "k_split": 16, "rows_per_thread": 2, "batch_tile": 4, "vec": 4, "barrier": "tags"}


def test_record_round_trips_through_json():
    rec = Record(key(), CFG, (1e-3, 2e-3, 3e-3), 256, None, "", "lstm", 235, 0, 1e-6, 0.7, "H100")
    back = Record.from_json(rec.to_json())
    assert back == rec and back.per_step_s == pytest.approx(2e-3 / 256)
    failed = Record(key(), CFG, (), 256, ErrorKind.SPILL, "ptxas spills 64 bytes")
    back = Record.from_json(failed.to_json())
    assert back.error is ErrorKind.SPILL and not back.ok and math.isinf(back.per_step_s)
    assert json.loads(rec.to_json())["schema"] == records.SCHEMA


def test_corrupt_lines_are_skipped_with_a_warning_and_nothing_is_lost(tmp_path, caplog):
    path = tmp_path / "sm_90.jsonl"
    good = [Record(key(), CFG, (float(i + 1),), 1) for i in range(3)]
    records.append(path, good[:2])
    with open(path, "a") as f:
        f.write('{"schema": 1, "key": {"fingerprint": "abc"}, "trunc\n')  # a torn line
        f.write("not json at all\n")
        f.write(json.dumps({"schema": 99}) + "\n")  # a future schema
    records.append(path, good[2:])
    with caplog.at_level(logging.WARNING):
        assert records.load(path) == good
    assert [m for m in caplog.messages if "corrupt tuning record" in m and "sm_90.jsonl:3" in m]
    assert sum("corrupt tuning record" in m for m in caplog.messages) == 2
    assert [m for m in caplog.messages if "skipping 1 record(s) of schema 99 (lines 5-5)" in m]  # once per file


def test_a_log_is_parsed_once_per_version_and_warns_at_every_load(tmp_path, caplog, monkeypatch):
    """Every compile loads the shipped log: an unchanged file is not parsed again, a load of it still says its
    warnings, and a file that gained records (a new size and modification time) is read again."""
    path = tmp_path / "sm_90.jsonl"
    first = [Record(key(), CFG, (float(i + 1),), 1) for i in range(2)]
    records.append(path, first)
    with open(path, "a") as f:
        f.write("not json at all\n")
    parsed, from_dict = [], Record.from_dict
    monkeypatch.setattr(Record, "from_dict", lambda d: parsed.append(d) or from_dict(d))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert records.load(path) == first
        assert sum("sm_90.jsonl:3: skipping a corrupt tuning record" in m for m in caplog.messages) == 1
    assert len(parsed) == 2
    loaded = records.load(path)
    loaded.clear()  # the caller's list: the next load is whole
    assert records.load(path) == first
    more = Record(key(), CFG, (9.0,), 1)
    records.append(path, [more])
    assert records.load(path) == [*first, more] and len(parsed) == 5


def _batches(tag, n):
    return [[Record(key(), {**CFG, "detail": tag}, (float(i + 1),), 1, detail=tag * 200)] * 3 for i in range(n)]


def test_concurrent_appends_from_two_processes_do_not_interleave(tmp_path):
    path = tmp_path / "log.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=append_each, args=(path, _batches(tag, 60))) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 2 * 60 * 3
    loaded = records.load(path)  # every line parses: no torn or interleaved bytes
    assert len(loaded) == len(lines)
    assert {r.detail[0] for r in loaded} == {"a", "b"}


def test_best_picks_the_fastest_successful_record_of_the_exact_key():
    recs = [
        Record(key(), {**CFG, "vec": 1}, (3.0,), 10),
        Record(key(), {**CFG, "vec": 2}, (2.0, 9.0, 2.0), 10),  # median 2.0
        Record(key(), CFG, (), 10, ErrorKind.WRONG, "max abs error 1"),  # failed: never best
        Record(key(batch=8), CFG, (0.5,), 10),  # another key
        Record(key(tvm="0.28"), CFG, (0.5,), 10),
        Record(key(), {**CFG, "vec": 4}, (25.0,), 100),
    ]  # 0.25 s/step: per step wins
    best = records.best(recs, key())
    assert best.config["vec"] == 2 and best.per_step_s == pytest.approx(0.2)
    assert records.best(recs, key(hidden=512)) is None


def test_ranked_gives_each_configs_fastest_record_fastest_first():
    """Per step, over records of different sequence lengths: ranked per sequence, the order (1, 4, 2) and vec 1's
    record (the 1.0 s one) would differ."""
    recs = [
        Record(key(), {**CFG, "vec": 1}, (1.0,), 10),  # 0.1 s per step
        Record(key(), {**CFG, "vec": 2}, (8.0,), 100),  # 0.08: slower per sequence
        Record(key(), {**CFG, "vec": 1}, (5.0,), 100),  # measured again: 0.05 per step
        Record(key(), {**CFG, "vec": 4}, (), 10, ErrorKind.WRONG, "max abs error 1"),
        Record(key(), {**CFG, "vec": 4}, (4.0,), 10),
    ]  # 0.4
    ranked = records.ranked(recs, key())
    assert [(r.config["vec"], r.per_step_s) for r in ranked] == [
        (1, pytest.approx(0.05)),
        (2, pytest.approx(0.08)),
        (4, pytest.approx(0.4)),
    ]
    assert records.ranked(recs, key(), 2) == ranked[:2] and records.best(recs, key()) == ranked[0]


# ---------------------------------------------------------------- compile uses the best record
@pytest.fixture(scope="module")
def small_lstm():
    return analyze(resolve("lstm"), 2, 64, "float32")


def test_compile_uses_the_best_record_and_says_so(tmp_path, small_lstm):
    default = ranked_configs(small_lstm, GPU)[0]
    other = next(c for c in space(small_lstm, GPU) if c != default and _valid(c, small_lstm))
    k = records.key_for(small_lstm, GPU, "persistent_cuda")
    path = tmp_path / "log.jsonl"
    records.append(
        path,
        [
            Record(k, default.as_dict(), (2.0,), 1),
            Record(k, other.as_dict(), (1.0,), 1),
            Record(k, {**other.as_dict(), "vec": 1}, (), 1, ErrorKind.TIMEOUT),
        ],
    )
    layer = prnn_tvm.compile_cell("lstm", 64, 2, target="cuda", arch="sm_90", tuning_logs=[path])
    assert layer.report.config == other.as_dict()
    assert layer.report.config_origin is ConfigOrigin.TUNED and "(tuned: " in layer.report.format()
    layer = prnn_tvm.compile_cell("lstm", 64, 3, target="cuda", arch="sm_90", tuning_logs=[path])
    assert layer.report.config == ranked_configs(layer.plan, GPU)[0].as_dict()
    assert layer.report.config_origin is ConfigOrigin.DEFAULT
    assert layer.report.config_detail == "default: no tuning record for this cell, shapes and GPU in log.jsonl"


def test_a_tuned_config_that_no_longer_fits_falls_back_to_the_default(tmp_path, small_lstm, caplog):
    k = records.key_for(small_lstm, GPU, "persistent_cuda")
    path = tmp_path / "log.jsonl"
    records.append(path, [Record(k, {**CFG, "units_per_cta": 64, "k_split": 1, "rows_per_thread": 1}, (1.0,), 1)])
    with caplog.at_level(logging.WARNING):
        layer = prnn_tvm.compile_cell("lstm", 64, 2, target="cuda", arch="sm_90", tuning_logs=[path])
    assert layer.report.config_detail == "default: the tuned config does not fit this GPU"
    assert any("ignoring the tuned config" in m for m in caplog.messages)


def _valid(cfg, plan):
    try:
        validate(cfg, plan, GPU)
        return True
    except ConfigError:
        return False


# ---------------------------------------------------------------- search against known costs
def synthetic_cost(cfg) -> float:
    """A smooth cost over the knobs with one optimum, unrelated to the analytic estimate."""
    return 1e-6 * (
        2
        + 0.3 * (math.log2(cfg.k_split) - 3.5) ** 2
        + 0.2 * (cfg.rows_per_thread - 2) ** 2
        + 0.5 * (cfg.barrier != "tags")
        + 0.3 * (cfg.vec != 4)
        + 0.2 * abs(cfg.batch_tile - 2)
    )


@pytest.fixture(scope="module")
def synthetic(lstm_space):
    table = {i: synthetic_cost(c) for i, c in enumerate(lstm_space.configs)}
    table[5] = math.inf  # a failing config among them
    return table


def test_model_search_finds_the_known_optimum_and_beats_random(lstm_space, synthetic):
    seeds = range(6)
    tuned = replay(lstm_space, synthetic, ModelSearch, budgets=(32, 64), seeds=seeds)
    rand = replay(lstm_space, synthetic, RandomSearch, budgets=(32, 64), seeds=seeds)
    assert tuned.hit_rate(1.0)[-1] == 1.0, tuned.fractions  # the optimum itself within 64 trials, every seed
    assert (tuned.mean() > rand.mean()).all(), (tuned.fractions, rand.fractions)
    assert rand.hit_rate(1.0)[-1] < 1.0


def test_both_model_objectives_learn_the_order():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(80, 4))
    seconds = np.exp(3 * x[:, 0] - 2 * x[:, 1])
    for objective in ("rank", "regression"):
        model = XGBoostCostModel(objective)
        model.fit(x[:60], seconds[:60])
        corr = np.corrcoef(model.predict(x[60:]), np.log(seconds[60:]))[0, 1]
        assert corr > 0.8, (objective, corr)
    with pytest.raises(ValueError, match="objective 'magic' unknown"):
        XGBoostCostModel("magic")


def test_grid_search_measures_every_config_once(lstm_space, synthetic):
    res = replay(lstm_space, synthetic, GridSearch, budgets=(len(lstm_space),), seeds=[0])
    assert res.fractions[0, 0] == 1.0


# ---------------------------------------------------------------- the real loop, built and run on the CPU
def test_tune_builds_runs_records_and_resumes(tmp_path):
    path = tmp_path / "sm_90.jsonl"
    first = tune(
        "rnn_tanh",
        32,
        2,
        seq_len=4,
        arch="sm_90",
        trials=3,
        batch_size=2,
        log_path=path,
        runner=CpuRunner(),
        progress=False,
    )
    assert len(first.new) == 3 and all(r.ok for r in first.new), [r.detail for r in first.new]
    assert all(r.registers and r.spill_bytes == 0 and r.max_abs_error < 1e-5 for r in first.new)
    again = tune(
        "rnn_tanh", 32, 2, seq_len=4, arch="sm_90", trials=2, log_path=path, runner=CpuRunner(), progress=False
    )
    configs = [json.dumps(r.config, sort_keys=True) for r in records.load(path)]
    assert len(configs) == 5 and len(set(configs)) == 5  # the second run measured new configs only
    assert again.best == records.best(records.load(path), first.key)


def test_tune_refuses_unknown_strategy():
    with pytest.raises(PrnnError, match="search strategy 'annealing' unknown"):
        tune("lstm", 32, 2, arch="sm_90", strategy="annealing", runner=CpuRunner())


def cli(*args):
    """``prnn-tvm *args``, in the test process (``tests/cli_run.py``)."""
    return run_cli(*args)


@pytest.mark.skipif(HAS_GPU, reason="checks the message on a machine without a GPU")
def test_cli_tune_without_gpu_exits_with_a_clear_message(tmp_path):
    r = cli("tune", "lstm", "--hidden", "64", "--batch", "2", "--log", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "there is none here" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_records_show_and_best(tmp_path):
    path = tmp_path / "log.jsonl"
    records.append(
        path,
        [
            Record(key(), CFG, (2e-3,), 256, cell="lstm"),
            Record(key(), {**CFG, "vec": 2}, (), 256, ErrorKind.SPILL, cell="lstm"),
        ],
    )
    show = cli("records", "show", "--log", str(path))
    assert show.returncode == 0 and "lstm" in show.stdout and "2 trials, 1 errors, best 7.81 us/step" in show.stdout
    best = cli("records", "best", "--log", str(path))
    assert "7.81 us/step" in best.stdout and "k_split=16" in best.stdout
    assert "no records" in cli("records", "show", "--log", str(tmp_path / "none.jsonl")).stdout


# ---------------------------------------------------------------- the records shipped in tuning_logs/
SHIPPED = records.load(records.default_log("sm_90"))


def test_shipped_records_cover_the_benchmark_matrix():
    shapes = {(r.cell, r.key.hidden, r.key.batch) for r in SHIPPED if r.ok and r.key.dtype == "float32"}
    assert {(c, h, b) for c in ("rnn_tanh", "lstm", "gru") for h in (256, 512, 1024) for b in (1, 4, 16)} <= shapes
    half = {(r.cell, r.key.hidden, r.key.batch) for r in SHIPPED if r.ok and r.key.dtype == "float16"}
    assert {(c, h, b) for c in ("rnn_tanh", "lstm", "gru") for h in (256, 512, 1024) for b in (1, 4, 16, 64)} <= half
    assert {("lstm", h, b) for h in (256, 512, 1024) for b in (8, 32)} <= half  # where cuDNN's persistent LSTM runs


def test_a_half_dtype_without_records_takes_the_other_half_dtypes():
    # bfloat16 has no shipped records; the float16 record of the same cell and shapes is used, and said so
    f16 = records.key_for(analyze(resolve("gru"), 4, 256, "float16"), gpu_spec("sm_90"), "persistent_mma")
    assert records.best(SHIPPED, f16) is not None
    assert records.best(SHIPPED, dataclasses.replace(f16, dtype="bfloat16")) is None
    rep = prnn_tvm.compile_cell("gru", 256, 4, dtype="bfloat16", target="cuda", arch="sm_90").report
    assert rep.config == records.best(SHIPPED, f16).config and rep.config_origin is ConfigOrigin.TUNED
    assert "measured for float16 on" in rep.format()


def test_a_half_dtypes_own_record_comes_first(tmp_path):
    plan = analyze(resolve("gru"), 4, 256, "bfloat16")
    own = {"units_per_cta": 2, "k_groups": 8, "n_tiles": 1, "barrier": "counter"}
    log_path = tmp_path / "bf16.jsonl"
    key = records.key_for(plan, gpu_spec("sm_90"), "persistent_mma")
    records.append(log_path, [Record(key=key, config=own, costs=(1e-4,) * 3, seq_len=64, cell="gru")])
    shipped = records.default_log("sm_90")
    rep = prnn_tvm.compile_cell(
        "gru", 256, 4, dtype="bfloat16", target="cuda", arch="sm_90", tuning_logs=[shipped, log_path]
    ).report
    assert rep.config == own and "measured for" not in rep.format()


@pytest.mark.parametrize(
    "key",
    list(dict.fromkeys(r.key for r in SHIPPED)),
    ids=lambda k: f"{k.fingerprint}-{k.dtype}-h{k.hidden}-b{k.batch}",
)
def test_shipped_records_compile_to_tuned_spill_free_kernels(key):
    """Each key's best record, or where the kernels changed since it was measured and it spills now (the
    report says so), one of the next fastest."""
    cell = next(r.cell for r in SHIPPED if r.key == key)
    layer = prnn_tvm.compile_cell(cell, key.hidden, key.batch, dtype=key.dtype, target="cuda", arch=key.arch)
    rep = layer.report
    ranked = [r.config for r in records.ranked(SHIPPED, key, prnn_tvm.choice.TUNED_CANDIDATES)]
    assert rep.config_origin is ConfigOrigin.TUNED and rep.config in ranked, rep.format()
    assert (rep.config == ranked[0]) == ("; the faster" not in rep.config_detail), rep.format()
    assert rep.spill_bytes == 0 and rep.stack_bytes == 0, rep.format()


def test_a_config_whose_build_raises_a_tvm_error_is_recorded_not_raised(monkeypatch):
    """TVM 0.27 raises builtin exception types (``tvm.error.InternalError`` is a RuntimeError; there is no
    ``tvm.error.TVMError``): a build that fails inside TVM is that config's BUILD record, and the session
    goes on."""
    import tvm

    from prnn_tvm.target import gpu_spec
    from prnn_tvm.tune import measure

    def fails(*args, **kwargs):
        raise tvm.error.InternalError("lowering failed")

    monkeypatch.setattr(measure, "compile_cell", fails)
    task = measure.TuneTask("lstm", 64, 4, 8, "float16", gpu_spec("sm_90"), "persistent_mma")
    built = measure._build(task, 3, {"units_per_cta": 1}, "unused", False, 0)
    assert built.error is ErrorKind.BUILD and built.index == 3 and "InternalError: lowering failed" in built.detail


def test_the_given_configs_are_measured_first_in_their_order(tmp_path):
    """``tune(first=...)``: the configs in the space and not in the log yet come first, in order; one outside
    the space is passed over; then the search's own."""
    plan = analyze(resolve("rnn_tanh"), 2, 32, "float32")
    configs = ConfigSpace(plan, GPU, PERSISTENT).configs
    path = tmp_path / "sm_90.jsonl"
    tune(
        "rnn_tanh",
        32,
        2,
        seq_len=4,
        arch="sm_90",
        trials=1,
        log_path=path,
        runner=CpuRunner(),
        progress=False,
        strategy="grid",
        first=[configs[7]],
    )
    outside = dict(configs[3].as_dict(), units_per_cta=1000)
    res = tune(
        "rnn_tanh",
        32,
        2,
        seq_len=4,
        arch="sm_90",
        trials=3,
        batch_size=2,
        log_path=path,
        runner=CpuRunner(),
        progress=False,
        strategy="grid",
        first=[configs[5], outside, configs[7], configs[2].as_dict()],
    )
    assert [r.config for r in res.new] == [configs[5].as_dict(), configs[2].as_dict(), configs[0].as_dict()]


def test_remeasure_measures_the_given_configs_again(tmp_path):
    """``tune(first=..., remeasure=True)``: configs the log has are measured again (after a change to the
    kernels), and count as trials; without it they are passed over."""
    plan = analyze(resolve("rnn_tanh"), 2, 32, "float32")
    configs = ConfigSpace(plan, GPU, PERSISTENT).configs
    path = tmp_path / "sm_90.jsonl"
    common = dict(seq_len=4, arch="sm_90", log_path=path, runner=CpuRunner(), progress=False, strategy="grid")
    tune("rnn_tanh", 32, 2, trials=2, first=[configs[7], configs[4]], **common)
    again = tune("rnn_tanh", 32, 2, trials=2, first=[configs[7], configs[4]], remeasure=True, **common)
    assert [r.config for r in again.new] == [configs[7].as_dict(), configs[4].as_dict()]
    assert [r.config for r in records.load(path)].count(configs[7].as_dict()) == 2
    skipped = tune("rnn_tanh", 32, 2, trials=1, first=[configs[7]], **common)
    assert [r.config for r in skipped.new] == [configs[0].as_dict()]


def test_with_knob_seeds_a_case_without_records_from_the_untuned_defaults():
    """``bench/tune_knob.py`` on shapes the log has no record of: the template's ranked defaults stand for the records,
    in their order (a default equal to an earlier one but for the knob adds nothing), and a record, once there,
    takes their place."""
    plan = analyze(resolve("lstm_h2"), 4, 32, "bfloat16")
    template = by_name("persistent_mma")
    space = ConfigSpace(plan, GPU, template)
    defaults = [c.as_dict() for c in template.default_configs(plan, GPU.target(), GPU)]
    first = defaults[0]
    second = next(d for d in defaults if dict(d, batch_groups=1) != dict(first, batch_groups=1))
    assert first["batch_groups"] == 2 and first["barrier"] == "block"
    assert with_knob(space, [], "batch_groups", (1, 2, 4), 2, defaults) == [
        *({**first, "batch_groups": G} for G in (1, 2, 4)),
        *({**second, "batch_groups": G} for G in (1, 2, 4)),
    ]
    assert with_knob(space, [], "batch_groups", (4,), 1) == []  # neither records nor defaults
    measured = Record(key(), {**second, "batch_groups": 2}, (1e-4,), 256)
    assert with_knob(space, [measured], "batch_groups", (4,), 2, defaults) == [{**second, "batch_groups": 4}]


def test_with_knob_takes_the_fastest_distinct_configs_that_stay_valid_with_the_knob():
    plan = analyze(resolve("lstm"), 16, 256, "float16")
    space = ConfigSpace(plan, GPU, by_name("persistent_mma"))
    k = key()
    sentinel = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "barrier": "sentinel", "batch_groups": 2}
    recs = [
        Record(k, {"units_per_cta": 16, "k_groups": 2, "n_tiles": 2, "barrier": "counter"}, (1e-4,), 256),
        Record(k, sentinel, (2e-4,), 256),
        Record(k, sentinel, (3e-4,), 256),  # measured twice: one config
        Record(k, dict(sentinel, k_groups=4), (4e-4,), 256),
        Record(k, dict(sentinel, k_groups=1), (5e-4,), 256),
        Record(k, dict(sentinel, k_groups=8), (1e-5,), 256, error=ErrorKind.RUNTIME),
    ]
    seeds = with_knob(space, recs, "poll_sleep", (256, 512), top=2)
    # counter cannot sleep, the failed record is not a base, the second measurement of a config adds nothing
    assert seeds == [
        dict(sentinel, poll_sleep=256),
        dict(sentinel, poll_sleep=512),
        dict(sentinel, k_groups=4, poll_sleep=256),
        dict(sentinel, k_groups=4, poll_sleep=512),
    ]
    assert with_knob(space, recs, "poll_sleep", (256,), top=0) == []
    # two configs that differ in the knob alone are one seed, and the next distinct config fills the top
    slept = [
        Record(k, dict(sentinel, poll_sleep=512), (1e-4,), 256),
        Record(k, sentinel, (2e-4,), 256),
        Record(k, dict(sentinel, k_groups=4), (4e-4,), 256),
    ]
    assert with_knob(space, slept, "poll_sleep", (256,), top=2) == [
        dict(sentinel, poll_sleep=256),
        dict(sentinel, k_groups=4, poll_sleep=256),
    ]

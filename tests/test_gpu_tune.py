"""The tuner on the GPU: a short real tuning run, its records, compile's use of them, wrong answers caught."""

import pytest

import prnn_tvm
from prnn_tvm import records
from prnn_tvm.records import ErrorKind
from prnn_tvm.tune import tune
from prnn_tvm.tune.measure import GpuRunner

pytestmark = pytest.mark.gpu


def test_short_tuning_run_records_times_and_compile_uses_the_best(tmp_path):
    log = tmp_path / "tune.jsonl"
    res = tune("rnn_tanh", 128, 2, seq_len=16, trials=6, batch_size=3, log_path=log, workers=2, progress=False)
    assert len(res.new) == 6 and len(records.load(log)) == 6
    ok = [r for r in res.new if r.ok]
    assert ok and all(r.max_abs_error < 1e-4 and len(r.costs) == 5 and min(r.costs) > 0 for r in ok)
    assert res.best is not None and res.best.per_step_s == min(r.per_step_s for r in ok)
    layer = prnn_tvm.compile_cell("rnn_tanh", 128, 2, target="cuda", tuning_logs=[log])
    assert layer.report.config == res.best.config and layer.report.config_detail.startswith("tuned: ")


def test_a_wrong_answer_is_an_error_record_not_a_time(tmp_path):
    log = tmp_path / "tune.jsonl"
    # a tolerance of zero: every fp32 result differs from float64 somewhere, so each trial must be refused
    res = tune("lstm", 64, 1, seq_len=8, trials=2, log_path=log, runner=GpuRunner(tolerance=0.0), progress=False)
    assert [r.error for r in res.new] == [ErrorKind.WRONG] * 2 and res.best is None
    assert all("max abs error" in r.detail for r in res.new)

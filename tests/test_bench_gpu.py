"""The benchmark harness end to end on a real GPU, at a tiny size (``pytest -m gpu``; needs PyTorch)."""

import math

import pytest

from prnn_tvm.bench import outputs, runner, table
from prnn_tvm.dtypes import tolerance

pytestmark = pytest.mark.gpu


def test_tiny_run_measures_checks_and_writes_outputs(tmp_path):
    pytest.importorskip("torch", reason="the benchmark's baselines need PyTorch")
    if runner.missing_requirements():
        pytest.skip(runner.missing_requirements())
    rows = runner.run(
        ["lstm", "gru"], [128], [2], seq_len=16, dtypes=["float32", "bfloat16", "float64"], repeats=5, progress=False
    )
    assert [(r["cell"], r["dtype"], r["status"]) for r in rows] == [
        ("lstm", "float32", "ok"),
        ("lstm", "bfloat16", "ok"),
        ("lstm", "float64", "error"),
        ("gru", "float32", "ok"),
        ("gru", "bfloat16", "ok"),
        ("gru", "float64", "error"),
    ]
    for row in rows:
        if row["status"] == "error":
            assert "float64 is for the CPU build" in row["error"]
            continue
        bound = tolerance(row["dtype"], 16)
        assert row["max_abs_err"] < bound and row["graph_max_err"] < 2 * bound  # both sides rounded
        for name in table.TIMED:
            assert 0 < row[f"{name}_min_ms"] <= row[f"{name}_ms"] < 100, name
        # The kernel is part of the layer. Their fastest repeats are compared: the medians, timed apart while
        # other test processes share the GPU, once came out the other way round.
        assert row["prnn_kernel_min_ms"] < row["prnn_layer_min_ms"] * 1.05
        assert 0 < row["prnn_host_us"] < 1e5 and 0 < row["cudnn_host_us"]
        assert 0 < row["barrier_us"] < row["floor_step_us"] < 1e3
        assert row["config_origin"].startswith(("default: ", "tuned: "))  # the words, not the enum's repr
        assert row["ctas"] >= 1 and row["spill_bytes"] == 0
        assert row["gpu"] and row["sms"] > 0 and row["cudnn"] and row["driver"]
        assert all(math.isfinite(v) for v in table.ratios(row).values())
    paths = outputs.write_outputs(rows, tmp_path, "tiny", "prnn-tvm bench --cells lstm gru --hidden 128")
    back = table.read_csv(paths["csv"])
    assert [r["status"] for r in back] == ["ok", "ok", "error", "ok", "ok", "error"]
    assert back[0]["cudnn_ms"] == pytest.approx(rows[0]["cudnn_ms"])
    assert "## lstm float32" in paths["md"].read_text() and paths["png"].stat().st_size > 10_000


def test_a_tiny_step_latency_run_measures_every_mode_and_writes_its_files(tmp_path, capsys):
    """``prnn-tvm bench --step-latency`` at a tiny size: every mode of each model measured in one run (ours,
    our module's plain call and cuDNN's, input on the host and on the GPU, the chains), and its four files written."""
    pytest.importorskip("torch", reason="the benchmark's baselines need PyTorch")
    if runner.missing_requirements():
        pytest.skip(runner.missing_requirements())
    from prnn_tvm.bench import step_table
    from prnn_tvm.cli import main

    argv = ["bench", "--step-latency", "--model", "2", "64", "1", "float32", "--model", "1", "128", "8", "float16"]
    assert main([*argv, "--steps", "300", "--chain", "10", "--out", str(tmp_path), "--name", "t", "--no-progress"]) == 0
    rows, histograms = step_table.read(tmp_path / "t.csv")
    assert [(r["model"], r["mode"], r["status"]) for r in rows] == [
        (model, mode, "ok")
        for model in ("LSTM 2x64 B=1 float32", "LSTM 1x128 B=8 float16")
        for mode in step_table.MODES
    ]
    for row in rows:
        assert 0 < row["min_us"] <= row["p50_us"] <= row["p99_us"], row
        assert row["samples"] == (300 if row["input"] != "graph" else 50)
        assert row["session"].startswith("recurrent_session")
    timed_alone = [mode for mode, given in step_table.MODES.items() if given != "graph"]  # each step a sample
    assert sum(b["count"] for b in histograms) == 300 * len(timed_alone) * 2  # the host and GPU modes of two models
    assert (tmp_path / "t.png").is_file() and "| LSTM 2x64 B=1 float32 |" in (tmp_path / "t.md").read_text()

"""The benchmark harness end to end on a real GPU, at a tiny size (``pytest -m gpu``; needs PyTorch)."""

import math

import pytest

from prnn_tvm.bench import outputs, runner, table

pytestmark = pytest.mark.gpu


def test_tiny_run_measures_checks_and_writes_outputs(tmp_path):
    pytest.importorskip("torch", reason="the benchmark's baselines need PyTorch")
    if runner.missing_requirements():
        pytest.skip(runner.missing_requirements())
    rows = runner.run(["lstm", "gru"], [128], [2], seq_len=16, dtypes=["float32", "float16"], repeats=5,
                      progress=False)
    assert [(r["cell"], r["dtype"], r["status"]) for r in rows] == [
        ("lstm", "float32", "ok"), ("lstm", "float16", "error"), ("gru", "float32", "ok"), ("gru", "float16", "error")]
    for row in rows:
        if row["status"] == "error":
            assert "float16 is not supported" in row["error"]
            continue
        assert row["max_abs_err"] < 1e-4 and row["graph_max_err"] < 1e-4
        for name in table.TIMED:
            assert 0 < row[f"{name}_min_ms"] <= row[f"{name}_ms"] < 100, name
        assert row["prnn_kernel_ms"] < row["prnn_layer_ms"] * 1.05  # the kernel is part of the layer
        assert 0 < row["barrier_us"] < row["floor_step_us"] < 1e3
        assert row["config_origin"].startswith(("default: ", "tuned: "))  # the words, not the enum's repr
        assert row["ctas"] >= 1 and row["spill_bytes"] == 0
        assert row["gpu"] and row["sms"] > 0 and row["cudnn"] and row["driver"]
        assert all(math.isfinite(v) for v in table.ratios(row).values())
    paths = outputs.write_outputs(rows, tmp_path, "tiny", "prnn-tvm bench --cells lstm gru --hidden 128")
    back = table.read_csv(paths["csv"])
    assert [r["status"] for r in back] == ["ok", "error", "ok", "error"]
    assert back[0]["cudnn_ms"] == pytest.approx(rows[0]["cudnn_ms"])
    assert "## lstm float32" in paths["md"].read_text() and paths["png"].stat().st_size > 10_000

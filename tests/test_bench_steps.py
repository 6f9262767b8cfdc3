"""``prnn-tvm bench --step-latency`` without a GPU: its arguments, a mode's samples summed up, the CSVs, the table
and the histogram plot made from them (the measuring half needs the GPU: ``test_bench_gpu.py``)."""

import numpy as np
import pytest

from prnn_tvm import InputError
from prnn_tvm.bench import step_outputs, step_table
from prnn_tvm.bench.runner import missing_requirements
from prnn_tvm.bench.step_cases import DEFAULT_MODELS, StepModel, check_steps, models_from
from prnn_tvm.cli import build_parser, main

MODELS = (StepModel(2, 128, 1, "float32"), StepModel(3, 960, 1, "float32"))
ENV = {"gpu": "NVIDIA H100 80GB HBM3", "sms": 132, "torch": "2.9.0"}


def _samples(p50: float, n: int, seed: int) -> np.ndarray:
    return p50 * np.random.default_rng(seed).lognormal(0.0, 0.1, n)


@pytest.fixture
def run_rows():
    """A run's rows and histogram rows as step_latency.run makes them: every mode of the first model, the second
    model's session not built (its cuDNN rows and our module's plain call only)."""
    rows, histograms = [], []
    for i, model in enumerate(MODELS):
        described = {**model.as_dict(), **ENV}
        for j, (mode, where) in enumerate(step_table.MODES.items()):
            if i == 1 and mode.startswith("ours") and not mode.startswith("ours eager"):  # the session's modes
                rows.append(
                    {**described, "mode": mode, "input": where, "status": "error", "error": "not built: too big"}
                )
                continue
            p50 = 10.0 * (j + 1) if mode.startswith("ours") else 100.0 * (j + 1)
            samples = _samples(p50, 50 if where == "graph" else 2000, seed=10 * i + j)
            rows.append({**step_table.summary(described, mode, samples), "session": "recurrent_session: 124 CTAs"})
            if where != "graph":
                histograms += step_table.histogram(model.name, mode, samples)
    return rows, histograms


def test_models_default_to_issue_47s_and_are_checked():
    assert models_from(None) == DEFAULT_MODELS and len(DEFAULT_MODELS) == 5
    assert models_from([["3", "480", "1", "float32"], ["1", "640", "8", "float16"], ["3", "480", "1", "float32"]]) == (
        StepModel(3, 480, 1, "float32"),
        StepModel(1, 640, 8, "float16"),
    )
    assert StepModel(1, 640, 8, "float16").cell == "lstm" and StepModel(3, 480, 1, "float32").cell == "lstm_d3"
    for words, message in (
        (["0", "128", "1", "float32"], "LAYERS must be a positive integer, got '0'"),
        (["2", "1e3", "1", "float32"], "HIDDEN must be a positive integer"),
        (["2", "128", "1", "bfloat16"], "DTYPE must be one of float32, float16"),
    ):
        with pytest.raises(InputError, match=message):
            models_from([words])
    assert check_steps(10_000) == 10_000
    with pytest.raises(InputError, match="--steps must be at least 100"):
        check_steps(99)


def test_the_command_line_parses_the_step_mode():
    args = build_parser().parse_args(
        ["bench", "--step-latency", "--model", "2", "128", "1", "float32", "--model", "1", "640", "8", "float16"]
    )
    assert args.step_latency and args.steps == 10_000 and args.chain == 100
    assert models_from(args.model) == (StepModel(2, 128, 1, "float32"), StepModel(1, 640, 8, "float16"))
    assert not build_parser().parse_args(["bench"]).step_latency


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--step-latency", "--cells", "gru"], "--cells do not apply"),
        (["--step-latency", "--seq", "64", "--repeats", "3"], "--seq, --repeats do not apply"),
        (["--steps", "20000"], "--steps choose what --step-latency times: add --step-latency"),
        (["--model", "2", "128", "1", "float32"], "--model choose what --step-latency times"),
        (["--step-latency", "--steps", "10"], "--steps must be at least 100"),
        (["--step-latency", "--model", "2", "128", "one", "float32"], "BATCH must be a positive integer"),
    ],
)
def test_the_command_line_refuses_options_of_the_other_mode(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(missing_requirements() is None, reason="this machine can run the benchmark")
def test_without_a_gpu_the_step_mode_says_so(capsys):
    assert main(["bench", "--step-latency", "--steps", "100"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prnn-tvm bench cannot measure here: missing" in err[0]


def test_a_modes_summary_and_histogram():
    samples = np.concatenate([_samples(20.0, 997, seed=1), [0.5, 3e4, 4e4]])  # outside the bins: counted at the ends
    row = step_table.summary({"model": "m"}, "ours host", samples)
    assert row["input"] == "host" and row["samples"] == 1000 and row["status"] == "ok"
    assert row["p50_us"] == pytest.approx(np.percentile(samples, 50), abs=1e-3)
    assert row["p99_us"] == pytest.approx(np.percentile(samples, 99), abs=1e-3)
    assert row["min_us"] == 0.5 and row["p50_us"] < row["p99_us"] < row["mean_us"] * 2
    bins = step_table.histogram("m", "ours host", samples)
    assert sum(b["count"] for b in bins) == 1000
    assert bins[0]["low_us"] == 1.0 and bins[-1]["high_us"] == pytest.approx(1e4)
    assert all(b["low_us"] < b["high_us"] for b in bins)


def test_the_run_files_round_trip_and_render(run_rows, tmp_path):
    rows, histograms = run_rows
    paths = step_outputs.write_outputs(rows, histograms, tmp_path, "steps", "prnn-tvm bench --step-latency")
    assert set(paths) == {"csv", "histogram", "md", "png"}
    read, read_histograms = step_table.read(paths["csv"])
    assert len(read) == len(rows) == 22 and read[0]["samples"] == 2000 and isinstance(read[0]["p50_us"], float)
    assert read[0]["layers"] == 2 and read[0]["sms"] == 132 and read[0]["torch"] == "2.9.0"
    assert [r["error"] for r in read if r["status"] == "error"] == ["not built: too big"] * 4
    # the host and GPU modes: nine of the first model; cuDNN's four and our plain call's two of the second
    assert sum(b["count"] for b in read_histograms) == 2000 * (9 + 6)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths["md"].read_text()
    first, second = (next(line for line in md.splitlines() if line.startswith(f"| {m.name} |")) for m in MODELS)
    ours, graph = (
        next(r for r in rows if r["model"] == MODELS[0].name and r["mode"] == m)
        for m in ("ours host", "cudnn graph host")
    )
    assert f"| {ours['p50_us']:.1f} / {ours['p99_us']:.1f} |" in first
    assert f"{graph['p50_us'] / ours['p50_us']:.2f}x" in first
    assert second.count("—") == 6  # four of ours, and both ratios
    assert f"- {MODELS[1].name}, ours host, ours host python, ours gpu, ours chain: not built: too big" in md
    assert "    prnn-tvm bench --step-latency" in md and "![latency per step](steps.png)" in md


def test_the_table_and_plot_render_again_from_the_csvs(run_rows, tmp_path, capsys):
    run = tmp_path / "run"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths = step_outputs.write_outputs(*run_rows, run, "steps", "prnn-tvm bench --step-latency --name steps")
    argv = ["bench", "--step-latency", "--from-csv", str(paths["csv"]), "--out", str(elsewhere), "--name", "again"]
    assert main(argv) == 0
    assert (elsewhere / "again.png").is_file()
    assert (elsewhere / "again.md").read_text().replace("again.png", "steps.png") == paths["md"].read_text()
    assert main(["bench", "--step-latency", "--from-csv", str(paths["csv"]), "--out", str(run)]) == 2
    assert "would overwrite" in capsys.readouterr().err
    assert main([*argv, "--steps", "20000"]) == 2
    assert "re-renders a run's table and plot; --steps do not apply" in capsys.readouterr().err
    paths["histogram"].unlink()
    with pytest.raises(InputError, match="steps-histogram.csv is not beside it"):
        step_outputs.render_csv(paths["csv"], elsewhere)

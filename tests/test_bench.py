"""The benchmark harness without a GPU: CSV, ratios, Markdown table, plot, case matrix and the CLI."""

import pytest

import prnn_tvm
from prnn_tvm.bench import matrix, outputs, table
from prnn_tvm.bench.runner import missing_requirements
from prnn_tvm.target import gpu_spec

from . import cli_run

T = 256
ENV = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "sms": 132,
    "arch": "sm_90",
    "peak_fp32_tflops": 66.91,
    "driver": "570.1",
    "cuda": "12.8",
    "tvm": "0.27.0",
    "torch": "2.11.0",
    "cudnn": "91900",
    "prnn_tvm": "0.1.0",
}
CONFIG = '{"units_per_cta": 8, "k_split": 16, "rows_per_thread": 2, "batch_tile": 4, "vec": 4, "barrier": "tags"}'


def ok_row(
    cell,
    hidden,
    batch,
    layer_ms,
    kernel_ms,
    cudnn_ms,
    graph_ms,
    floor_us,
    call_ms=None,
    graph_call_ms=None,
    host_us=None,
):
    return {
        "cell": cell,
        "dtype": "float32",
        "hidden": hidden,
        "batch": batch,
        "seq_len": T,
        "status": "ok",
        "config": CONFIG,
        "config_origin": "default: no tuning record for this cell",
        "ctas": 128,
        "threads": 256,
        "registers": 235,
        "spill_bytes": 0,
        "compile_s": 1.5,
        "max_abs_err": 1.8e-7,
        "graph_max_err": 2e-7,
        "repeats": 5,
        "prnn_call_ms": call_ms,
        "prnn_graph_ms": graph_call_ms,
        "prnn_layer_ms": layer_ms,
        "prnn_layer_min_ms": layer_ms * 0.99,
        "prnn_kernel_ms": kernel_ms,
        "prnn_kernel_min_ms": kernel_ms * 0.99,
        "cudnn_ms": cudnn_ms,
        "cudnn_min_ms": cudnn_ms,
        "graph_layer_ms": graph_ms,
        "graph_layer_min_ms": graph_ms,
        "graph_recurrent_ms": graph_ms * 0.8,
        "graph_recurrent_min_ms": graph_ms * 0.8,
        "barrier_us": 0.97,
        "flop_layer_ms": 0.1,
        "flop_recurrent_ms": 0.05,
        "floor_step_us": floor_us,
        **ENV,
        **({"prnn_host_us": host_us[0], "cudnn_host_us": host_us[1]} if host_us else {}),
    }


def error_row(cell, hidden, batch, message):
    return {
        "cell": cell,
        "dtype": "float32",
        "hidden": hidden,
        "batch": batch,
        "seq_len": T,
        "status": "error",
        "error": message,
        **ENV,
    }


ROWS = [
    ok_row(
        "lstm",
        1024,
        4,
        layer_ms=1.28,
        kernel_ms=0.768,
        cudnn_ms=3.2,
        graph_ms=4.48,
        floor_us=2.0,
        call_ms=1.6,
        graph_call_ms=1.344,
        host_us=(14.6, 21.2),
    ),
    ok_row("lstm", 1024, 16, layer_ms=2.56, kernel_ms=1.536, cudnn_ms=3.84, graph_ms=5.12, floor_us=4.0),
    error_row("lstm", 1024, 64, "LaunchError: launching 'recurrent' of lstm failed: too many resources | x"),
    ok_row("gru", 512, 4, layer_ms=0.512, kernel_ms=0.256, cudnn_ms=2.048, graph_ms=1.024, floor_us=0.5),
]


@pytest.fixture
def csv_path(tmp_path):
    return table.write_csv(ROWS, tmp_path / "run.csv")


def test_csv_round_trip_keeps_types_and_empties(csv_path):
    rows = table.read_csv(csv_path)
    assert len(rows) == 4 and list(rows[0]) == table.COLUMNS
    assert rows[0]["hidden"] == 1024 and isinstance(rows[0]["hidden"], int)
    assert rows[0]["prnn_layer_ms"] == pytest.approx(1.28) and rows[0]["max_abs_err"] == pytest.approx(1.8e-7)
    assert rows[0]["config"] == CONFIG and rows[0]["cudnn"] == "91900"  # versions stay text
    assert rows[2]["status"] == "error" and rows[2]["prnn_layer_ms"] is None and rows[2]["error"].startswith("Launch")


def test_unknown_column_is_refused(tmp_path):
    with pytest.raises(ValueError):
        table.write_csv([{**ROWS[0], "surprise": 1}], tmp_path / "bad.csv")


def test_ratios(csv_path):
    r = table.ratios(table.read_csv(csv_path)[0])
    assert r["cudnn_over_call"] == pytest.approx(3.2 / 1.6)  # module call against module call
    assert r["cudnn_over_prnn"] == pytest.approx(3.2 / 1.28)
    assert r["graph_over_prnn"] == pytest.approx(4.48 / 1.28)
    assert r["prnn_over_floor"] == pytest.approx(0.768e3 / T / 2.0)  # 3.0 us/step over a 2 us floor
    assert table.ratios(table.read_csv(csv_path)[2]) == {
        "cudnn_over_call": None,
        "cudnn_over_prnn": None,
        "graph_over_prnn": None,
        "prnn_over_floor": None,
    }
    assert table.ratios(table.read_csv(csv_path)[1])["cudnn_over_call"] is None  # a CSV from before the column
    assert table.per_step_us(ROWS[0], "floor_step_us") == 2.0  # already per step
    assert table.per_step_us(ROWS[0], "cudnn_ms") == pytest.approx(12.5)


def test_markdown_table(csv_path):
    md = table.markdown(table.read_csv(csv_path), "title", command="prnn-tvm bench --cells lstm gru")
    lines = md.splitlines()
    assert lines[0] == "# title" and "NVIDIA H100 80GB HBM3" in md and "cuDNN 91900" in md
    assert "    prnn-tvm bench --cells lstm gru" in lines
    assert "## lstm float32" in lines and "## gru float32" in lines
    b4 = next(line for line in lines if line.startswith("| 1024 | 4 |"))
    cells = [c.strip() for c in b4.strip("|").split("|")]
    assert cells[2:9] == ["6.25", "5.25", "5.00", "3.00", "12.50", "17.50", "2.00"]  # us per step
    assert cells[9:13] == ["2.00", "2.50", "3.50", "1.50"]  # cuDNN/call, cuDNN/ours, graph/ours, ours/floor
    assert cells[13] == "15 / 21"  # host us per call, ours / cuDNN's
    assert cells[14] == "1.8e-07" and cells[15] == "U=8 ks=16 r=2 bt=4 v=4 tags (default)"
    b16 = [c.strip() for c in next(ln for ln in lines if ln.startswith("| 1024 | 16 |")).strip("|").split("|")]
    assert b16[3] == "" and b16[13] == ""  # a CSV from before the graph and host columns: empty cells
    err = next(line for line in lines if line.startswith("| 1024 | 64 |"))
    assert "error: LaunchError: launching 'recurrent' of lstm failed: too many resources / x" in err
    header = next(line for line in lines if line.startswith("| H |"))
    assert err.count("|") == header.count("|") == b4.count("|")  # the error row keeps the table's shape
    gru = next(line for line in lines if line.startswith("| 512 | 4 |"))
    assert "| 4.00 | 2.00 |" in gru  # 2.048/0.512 and 1.024/0.512


def test_plot_writes_a_png(csv_path, tmp_path):
    png = outputs.plot(table.read_csv(csv_path), tmp_path / "run.png", "title")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_survives_a_panel_where_every_case_failed(tmp_path):
    rows = [*ROWS, {**error_row("gru", 512, 4, "ConfigError: dtype float64 is not supported yet"), "dtype": "float64"}]
    png = outputs.plot(rows, tmp_path / "run.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_from_csv(csv_path, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    paths = outputs.render_csv(csv_path, out)
    assert paths["md"] == out / "run.md" and paths["png"] == out / "run.png"
    md = paths["md"].read_text()
    assert "half-precision rows" in md and "![time per step vs batch](run.png)" in md and "error: LaunchError" in md
    assert paths["png"].stat().st_size > 10_000


def test_flops_formula():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 4, 1024)
    layer, recurrent = matrix.flops(plan, 1024, T)
    assert layer == 2 * 4 * 4 * 1024 * (1024 + 1024) * T and recurrent == 2 * 4 * 4 * 1024 * 1024 * T
    gru = prnn_tvm.analyze(prnn_tvm.resolve("gru"), 2, 256)
    assert matrix.flops(gru, 128, 8) == (2 * 2 * 3 * 256 * (128 + 256) * 8, 2 * 2 * 3 * 256 * 256 * 8)


def test_largest_hidden_is_the_edge_of_validity():
    gpu = gpu_spec("sm_90")
    largest = matrix.largest_hidden("lstm", gpu, [1, 64])
    assert largest % matrix.HIDDEN_STEP == 0 and largest >= 1024
    assert matrix.config_fits("lstm", largest, 64, gpu)
    # the next size's weights pass every SM's registers and shared memory together: past them a layer streams
    # part of its weights from L2 (a tier of its own, which "max" does not reach for)
    on_chip = gpu.sms * (4 * gpu.regs_per_sm + gpu.smem_per_sm)
    assert 4 * (largest + matrix.HIDDEN_STEP) ** 2 * 4 > on_chip >= 4 * largest**2 * 4
    # a spill at the largest steps the search down
    assert matrix.largest_hidden("lstm", gpu, [1], compiles_clean=lambda h: h < largest) == largest - 128


def test_build_cases_resolves_largest_and_lists_unsupported_dtypes():
    gpu = gpu_spec("sm_90")
    cases = matrix.build_cases(
        ["lstm"],
        [256, matrix.LARGEST],
        [1, 4],
        32,
        ["float32", "float64"],
        gpu,
        compiles_clean=lambda cell, dtype, hidden: True,
    )
    largest = matrix.largest_hidden("lstm", gpu, [1, 4])
    assert [(c.hidden, c.batch, c.dtype) for c in cases] == [
        (256, 1, "float32"),
        (256, 4, "float32"),
        (largest, 1, "float32"),
        (largest, 4, "float32"),
        (256, 1, "float64"),
        (256, 4, "float64"),
    ]
    assert all(c.seq_len == 32 for c in cases)


def run_cli(*args, cwd=None):
    """``prnn-tvm bench *args``, in the test process (``tests/cli_run.py``)."""
    return cli_run.run_cli("bench", *args, cwd=cwd)


@pytest.mark.skipif(missing_requirements() is None, reason="this machine can run the benchmark")
def test_cli_without_gpu_or_torch_says_what_is_missing():
    r = run_cli("--cells", "lstm", "--batch", "1")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "prnn-tvm bench cannot measure here: missing" in lines[0], r.stderr
    assert any(what in lines[0] for what in ("PyTorch", "a CUDA GPU", "matplotlib"))


def test_cli_renders_an_existing_csv_anywhere(csv_path, tmp_path):
    """Into the working folder, never over the run's own files beside the CSV (they name its command)."""
    beside = csv_path.with_suffix(".md")
    beside.write_text("# a run\n\n    prnn-tvm bench --cells lstm --name run\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_cli("--from-csv", str(csv_path), cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "run.png").exists()
    assert "prnn-tvm bench --cells lstm --name run" in (elsewhere / "run.md").read_text()  # the run's command kept
    assert beside.read_text().startswith("# a run") and not csv_path.with_suffix(".png").exists()
    r = run_cli("--from-csv", str(csv_path), "--out", str(csv_path.parent))
    assert r.returncode == 2 and "would overwrite" in r.stderr and "--out DIR" in r.stderr, r.stderr
    assert beside.read_text().startswith("# a run")


def test_cli_refuses_a_bad_hidden_size():
    r = run_cli("--hidden", "512", "huge")
    assert r.returncode == 2 and "expected a positive integer, got 'huge'" in r.stderr

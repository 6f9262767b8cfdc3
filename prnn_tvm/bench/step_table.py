"""The step-latency benchmark's rows (``prnn-tvm bench --step-latency``): the CSV schemas, a mode's samples summed
up, the latency histogram's rows and the Markdown table.

Pure (no GPU, no torch): a run writes ``<name>.csv`` (a row per model and mode: p50, p99, mean and minimum in
microseconds per step) and ``<name>-histogram.csv`` (each mode's samples counted in fixed log-spaced bins), and the
table and plot are made from those two files alone, so they can be made again from committed files anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError
from . import table as sequences
from .csv_rows import CsvSchema
from .table import ENV_COLUMNS

# mode -> where its step's input is written and its output read: "host" (NumPy in, NumPy out, one step per call),
# "gpu" (tensors on the GPU, the caller waiting for each step), "graph" (a chain of dependent steps replayed
# from one CUDA graph: a sample is one replay's time per step)
MODES = {
    "ours host": "host",
    "ours host python": "host",
    "ours eager host": "host",
    "cudnn eager host": "host",
    "cudnn graph host": "host",
    "ours gpu": "gpu",
    "ours eager gpu": "gpu",
    "cudnn eager gpu": "gpu",
    "cudnn graph gpu": "gpu",
    "ours chain": "graph",
    "cudnn chain": "graph",
}
MODEL_COLUMNS = ["model", "layers", "hidden", "batch", "dtype"]
FIGURES = ["p50_us", "p99_us", "mean_us", "min_us"]
COLUMNS = MODEL_COLUMNS + ["mode", "input", "samples", *FIGURES, "status", "error", "session"] + ENV_COLUMNS
SCHEMA = CsvSchema(
    "step-latency CSV",
    tuple(COLUMNS),
    ("model", "mode", "status"),
    frozenset({"layers", "hidden", "batch", "samples"}) | (sequences.SCHEMA.ints & set(ENV_COLUMNS)),
    frozenset({"model", "dtype", "mode", "input", "status", "error", "session"})
    | (sequences.SCHEMA.texts & set(ENV_COLUMNS)),
    "prnn_tvm.bench.step_table.COLUMNS",
)
HISTOGRAM_SCHEMA = CsvSchema(
    "step-latency histogram CSV",
    ("model", "mode", "low_us", "high_us", "count"),
    ("model", "mode", "low_us", "high_us", "count"),
    frozenset({"count"}),
    frozenset({"model", "mode"}),
    "prnn_tvm.bench.step_table.HISTOGRAM_SCHEMA",
)
EDGES = np.logspace(0, 4, 161)  # 1 us to 10 ms, 40 bins a decade; a sample outside counts in the nearest bin


def summary(model: dict, mode: str, samples) -> dict:
    """The row of ``mode`` (:data:`MODES`) for ``model`` (its :data:`MODEL_COLUMNS`) from its samples (us per
    step)."""
    values = np.asarray(samples, dtype=float)
    figures = (np.percentile(values, 50), np.percentile(values, 99), values.mean(), values.min())
    return {
        **model,
        "mode": mode,
        "input": MODES[mode],
        "samples": len(values),
        **{name: round(float(v), 3) for name, v in zip(FIGURES, figures)},
        "status": "ok",
    }


def failure(model: dict, error: str) -> dict:
    """The row of a model none of whose modes was measured, saying why."""
    return {**model, "mode": "", "status": "error", "error": error}


def histogram(model: str, mode: str, samples) -> list[dict]:
    """``samples`` (us) counted in the bins of :data:`EDGES`, the bins that hold any."""
    clipped = np.clip(np.asarray(samples, dtype=float), EDGES[0], EDGES[-1])
    counts, _ = np.histogram(clipped, EDGES)
    return [
        {"model": model, "mode": mode, "low_us": float(EDGES[i]), "high_us": float(EDGES[i + 1]), "count": int(c)}
        for i, c in enumerate(counts)
        if c
    ]


def histogram_path(csv_path: str | Path) -> Path:
    """Where a run's histogram CSV lies: beside its CSV, ``<stem>-histogram.csv``."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}-histogram.csv")


def read(csv_path: str | Path) -> tuple[list[dict], list[dict]]:
    """A run's rows and histogram rows, from its CSV and the histogram CSV beside it (InputError if that is
    missing)."""
    rows = SCHEMA.read(csv_path)
    beside = histogram_path(csv_path)
    if not beside.is_file():
        raise InputError(f"{csv_path}: its histogram {beside.name} is not beside it (a step-latency run writes both)")
    return rows, HISTOGRAM_SCHEMA.read(beside)


def _pair(row: dict | None) -> str:
    if row is None or row.get("status") != "ok":
        return "—"
    return f"{row['p50_us']:.1f} / {row['p99_us']:.1f}" if row["input"] != "graph" else f"{row['p50_us']:.2f}"


def _ratio(rows: dict, baseline: str, ours: str) -> str:
    a, b = rows.get(baseline), rows.get(ours)
    if a is None or b is None or a.get("status") != "ok" or b.get("status") != "ok" or not b["p50_us"]:
        return "—"
    return f"{a['p50_us'] / b['p50_us']:.2f}x"


def markdown(rows: list[dict], title: str, command: str | None = None) -> str:
    """The run's table: a line per model, p50 / p99 us per step of each mode (the chains: p50 of the replays'
    us per step), and cuDNN's graph step over ours (p50; above 1: ours is faster), host and GPU."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = [f"# {title}", ""]
    if command:
        lines += ["Made with", "", f"    {command}", ""]
    lines += [
        "Microseconds per step. Host: from writing the step's input (NumPy) to reading its output, p50 / p99. "
        "GPU: the input made on the GPU by the step before, the caller waiting for each step, p50 / p99. "
        "Chain: dependent steps replayed from one CUDA graph, p50 over the replays. Ours: a resident session "
        "(`layer.session()`) of the deep stack, its host step native (ours host python: in Python); ours eager: "
        "the `prnn_tvm.torch` module's plain call, one step (T=1) per call, no session; cuDNN: `torch.nn.LSTM`'s "
        "call, eager and replayed from a CUDA graph.",
        "",
        "| model | "
        + " | ".join(mode.replace("cudnn", "cuDNN").replace("gpu", "GPU") for mode in MODES)
        + " | cuDNN graph / ours, host | cuDNN graph / ours, GPU |",
        "|---|" + "---|" * (len(MODES) + 2),
    ]
    notes = []
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        by_mode = {r["mode"]: r for r in mine if r.get("mode")}
        errors = [r for r in mine if r.get("status") != "ok"]
        cells = [_pair(by_mode.get(mode)) for mode in MODES]
        ratios = [_ratio(by_mode, "cudnn graph host", "ours host"), _ratio(by_mode, "cudnn graph gpu", "ours gpu")]
        lines.append(f"| {model} | " + " | ".join(cells + ratios) + " |")
        for error in dict.fromkeys(r.get("error") for r in errors):
            modes = ", ".join(r.get("mode") or "every mode" for r in errors if r.get("error") == error)
            notes.append(f"- {model}, {modes}: {error}")
        session = next((r["session"] for r in mine if r.get("session")), None)
        if session:
            notes.append(f"- {model}: {session}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"

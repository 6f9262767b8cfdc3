"""What a reader is shown of benchmark runs, derived from their rows alone: ratio grids, case tables, ranges.

Pure functions over the rows of :func:`table.read_csv` (no GPU, no torch), so that every figure the docs
quote from a committed CSV is rendered from it (``bench/docs_figures.py``) rather than copied by hand.
A ratio is cuDNN's time over our public call's, per step: above 1, prnn-tvm is faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from .table import per_step_us, ratios

SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
CELL_NAMES = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN (relu)"}


def measured(rows: Iterable[dict]) -> list[dict]:
    """The rows that were measured (an error row has no figures)."""
    return [r for r in rows if r.get("status") == "ok" and r.get("prnn_call_ms") and r.get("cudnn_ms")]


def case_name(row: dict, dtype: bool = False) -> str:
    """``LSTM 1024x16`` (hidden x batch), with the dtype when asked (``LSTM fp16 1024x16``)."""
    cell = CELL_NAMES.get(row["cell"], row["cell"])
    kind = f" {SHORT_DTYPE.get(row['dtype'], row['dtype'])}" if dtype else ""
    return f"{cell}{kind} {row['hidden']}x{row['batch']}"


def ratio(row: dict) -> float:
    """cuDNN / our public call."""
    return ratios(row)["cudnn_over_call"]


def _x(value: float, bold_below_one: bool = False) -> str:
    text = f"{value:.2f}x"
    return f"**{text}**" if bold_below_one and value < 1 else text


def ratio_grid(rows: list[dict], label: str, cells: Iterable[str] = ()) -> str:
    """A Markdown table of cuDNN / our call: a row per cell and hidden size (of ``cells``, default every cell
    of the run), a column per batch; bold where cuDNN is faster."""
    rows = [r for r in measured(rows) if not cells or r["cell"] in cells]
    batches = sorted({r["batch"] for r in rows})
    by_case = {(r["cell"], r["hidden"], r["batch"]): r for r in rows}
    lines = [f"| {label} | " + " | ".join(f"B={b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
    for cell, hidden in dict.fromkeys((r["cell"], r["hidden"]) for r in rows):
        cells = [_x(ratio(by_case[cell, hidden, b]), True) if (cell, hidden, b) in by_case else "-" for b in batches]
        lines.append(f"| {CELL_NAMES.get(cell, cell)} H={hidden} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def case_table(rows: list[dict], cases: list[str]) -> str:
    """The chosen cases (``lstm:1024x4``) with every time per step of the run and the host time per call."""
    lines = [
        "| case | public call | call in a CUDA graph | kernels pre-bound | kernel alone | cuDNN | cuDNN / call "
        "| host us per call, ours / cuDNN |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        row = find(rows, case)
        us = [
            f"{per_step_us(row, c):.2f} us"
            for c in ("prnn_call_ms", "prnn_graph_ms", "prnn_layer_ms", "prnn_kernel_ms", "cudnn_ms")
        ]
        host = f"{row['prnn_host_us']:.0f} / {row['cudnn_host_us']:.0f}"
        lines.append(f"| {case_name(row)} | " + " | ".join(us) + f" | {_x(ratio(row))} | {host} |")
    return "\n".join(lines)


def find(rows: list[dict], case: str) -> dict:
    """The measured row of ``cell:HxB`` (KeyError naming the case when the run has none)."""
    cell, _, shape = case.partition(":")
    hidden, _, batch = shape.partition("x")
    for row in measured(rows):
        if (row["cell"], row["hidden"], row["batch"]) == (cell, int(hidden), int(batch)):
            return row
    raise KeyError(f"no measured row {case} in this run")


def _span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{format(low, fmt)}-{format(high, fmt)}"


def summary(rows: list[dict], floor: bool = False) -> str:
    """Bullets over a whole run: how many cases, the ratios' range and median, every case cuDNN wins, host
    time per call and, with ``floor``, the kernel over the floor where the run has it (a float32 run: a
    tensor-core kernel in batch groups crosses no grid-wide barrier, so its floor is no floor)."""
    ok = measured(rows)
    by_ratio = sorted(ok, key=ratio)
    failed = len(rows) - len(ok)
    losses = [f"{case_name(r, dtype=True)} ({_x(ratio(r))})" for r in by_ratio if ratio(r) < 1]
    lines = [
        f"- {len(ok)} cases measured, {failed} failed; cuDNN / our call from {_x(ratio(by_ratio[0]))} "
        f"({case_name(by_ratio[0], dtype=True)}) to {_x(ratio(by_ratio[-1]))} "
        f"({case_name(by_ratio[-1], dtype=True)}), median {_x(statistics.median(map(ratio, ok)))}.",
        "- cuDNN is faster in " + (", ".join(losses) if losses else "no case") + ".",
    ]
    host = [r for r in ok if r.get("prnn_host_us") is not None and r.get("cudnn_host_us") is not None]
    if host:
        lines.append(
            f"- Host time per call, GPU work excluded: ours {_span([r['prnn_host_us'] for r in host], '.0f')}"
            f" us, cuDNN's {_span([r['cudnn_host_us'] for r in host], '.0f')} us."
        )
    floor = [r for r in ok if ratios(r)["prnn_over_floor"]] if floor else []
    if floor:
        over = sorted(floor, key=lambda r: ratios(r)["prnn_over_floor"])
        lines.append(
            f"- Our kernel alone over the floor (one barrier plus the recurrent FLOPs at peak): "
            f"{_x(ratios(over[0])['prnn_over_floor'])} ({case_name(over[0], dtype=True)}) to "
            f"{_x(ratios(over[-1])['prnn_over_floor'])} ({case_name(over[-1], dtype=True)}) in the "
            f"{len(floor)} cases that cross a barrier per step."
        )
    return "\n".join(lines)


def call_ratio_between(rows: list[dict], other: list[dict], name: str, other_name: str) -> str:
    """Our public call in one run over the same case's in another (e.g. bfloat16 over float16): the range, the
    median, and every case more than 10% away from 1."""
    theirs = {(r["cell"], r["hidden"], r["batch"]): r for r in measured(other)}
    pairs = [
        (r, r["prnn_call_ms"] / theirs[r["cell"], r["hidden"], r["batch"]]["prnn_call_ms"])
        for r in measured(rows)
        if (r["cell"], r["hidden"], r["batch"]) in theirs
    ]
    values = [v for _, v in pairs]
    far = [f"{case_name(r)} {v:.2f}x" for r, v in sorted(pairs, key=lambda p: p[1]) if abs(v - 1) > 0.1]
    return (
        f"Our {name} call over our {other_name} call, case by case ({len(pairs)} cases): "
        f"{_span(values, '.2f')}x, median {statistics.median(values):.2f}x; more than 10% away from 1: "
        + (", ".join(far) if far else "none")
        + "."
    )


def overview(runs: list[tuple[str, list[dict]]]) -> str:
    """One row per run (label, rows): cases, cuDNN / our call at its lowest, median and highest, and the
    cases where cuDNN is faster."""
    lines = [
        "| dtype | cases | cuDNN / our call: lowest | median | highest | cuDNN faster in |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in runs:
        ok = sorted(measured(rows), key=ratio)
        losses = ", ".join(f"{case_name(r)} ({_x(ratio(r))})" for r in ok if ratio(r) < 1) or "none"
        lines.append(
            f"| {label} | {len(ok)} | {_x(ratio(ok[0]))} ({case_name(ok[0])}) | "
            f"{_x(statistics.median(map(ratio, ok)))} | {_x(ratio(ok[-1]))} ({case_name(ok[-1])}) | "
            f"{losses} |"
        )
    return "\n".join(lines)


def environment(rows: list[dict]) -> str:
    """The machine and software a run measured on, from its rows."""
    env = next(r for r in rows if r.get("gpu"))
    return (
        f"{env['gpu']} ({env['arch']}, {env['sms']} SMs), driver {env['driver']}, CUDA {env['cuda']}, "
        f"cuDNN {env['cudnn']}, torch {env['torch']}, TVM {env['tvm']}"
    )

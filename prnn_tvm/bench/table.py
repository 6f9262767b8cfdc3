"""A benchmark run's rows: the CSV schema, reading and writing it, the ratios and the Markdown table.

Pure functions over lists of dicts (no GPU, no torch): the run writes rows with these
columns, and everything shown to a reader is derived from the CSV alone, so a table can
be re-rendered from a committed CSV anywhere.

Times are milliseconds per sequence of ``seq_len`` steps (``*_ms``: median over repeats,
``*_min_ms``: minimum); the barrier and the floor are microseconds per step, the host
times (``*_host_us``) microseconds per call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..schedules import knob_short_names, knob_text
from .csv_rows import CsvSchema

CASE_COLUMNS = ["cell", "dtype", "hidden", "batch", "seq_len", "status", "error"]
CONFIG_COLUMNS = ["config", "config_origin", "ctas", "threads", "registers", "spill_bytes", "compile_s"]
TIMED = ["prnn_call", "prnn_graph", "prnn_layer", "prnn_kernel", "cudnn", "graph_layer", "graph_recurrent"]
FIGURE_COLUMNS = (
    ["max_abs_err", "graph_max_err", "repeats"]
    + [f"{name}{suffix}" for name in TIMED for suffix in ("_ms", "_min_ms")]
    + ["prnn_host_us", "cudnn_host_us"]  # host time of one call, GPU work excluded
    + ["barrier_us", "flop_layer_ms", "flop_recurrent_ms", "floor_step_us"]
)
ENV_COLUMNS = ["gpu", "sms", "arch", "peak_fp32_tflops", "driver", "cuda", "tvm", "torch", "cudnn", "prnn_tvm"]
COLUMNS = CASE_COLUMNS + CONFIG_COLUMNS + FIGURE_COLUMNS + ENV_COLUMNS

_INT = {"hidden", "batch", "seq_len", "ctas", "threads", "registers", "spill_bytes", "repeats", "sms"}
_TEXT = {
    "cell",
    "dtype",
    "status",
    "error",
    "config",
    "config_origin",
    "gpu",
    "arch",
    "driver",
    "cuda",
    "tvm",
    "torch",
    "cudnn",
    "prnn_tvm",
}

# The plot's lines: label -> column (per sequence in ms, or per step in us for ``*_us``)
SERIES = {
    "prnn-tvm public call": "prnn_call_ms",
    "prnn-tvm call in a CUDA graph": "prnn_graph_ms",
    "prnn-tvm layer": "prnn_layer_ms",
    "prnn-tvm kernel": "prnn_kernel_ms",
    "cuDNN layer": "cudnn_ms",
    "graph loop layer": "graph_layer_ms",
    "graph loop recurrent": "graph_recurrent_ms",
    "floor (barrier + FLOPs)": "floor_step_us",
}


SCHEMA = CsvSchema(
    "benchmark CSV",
    tuple(COLUMNS),
    tuple(CASE_COLUMNS),
    frozenset(_INT),
    frozenset(_TEXT),
    "prnn_tvm.bench.table.COLUMNS",
)


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """Write rows with exactly :data:`COLUMNS` (missing values as empty cells; unknown keys are refused)."""
    return SCHEMA.write(rows, path)


def read_csv(path: str | Path) -> list[dict]:
    """Read rows back: empty cells become None, counts int, figures float.

    InputError when the file is missing, has no rows, lacks a case column or holds a
    value that is not a number where a number belongs.
    """
    return SCHEMA.read(path)


def per_step_us(row: dict, column: str) -> float | None:
    """A series' time per step in microseconds (None when not measured)."""
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if column.endswith("_us") else value * 1e3 / row["seq_len"]


def ratios(row: dict) -> dict[str, float | None]:
    """cuDNN / prnn-tvm's public call (module call against module call), cuDNN / prnn-tvm and graph
    loop / prnn-tvm (pre-bound layers), prnn-tvm kernel / floor (per step).

    Above 1 means prnn-tvm is faster than the baseline; the floor ratio is at least 1 for
    a kernel that respects physics, and the issue's target is at most 1.3.
    """
    return {
        "cudnn_over_call": _div(row.get("cudnn_ms"), row.get("prnn_call_ms")),
        "cudnn_over_prnn": _div(row.get("cudnn_ms"), row.get("prnn_layer_ms")),
        "graph_over_prnn": _div(row.get("graph_layer_ms"), row.get("prnn_layer_ms")),
        "prnn_over_floor": _div(per_step_us(row, "prnn_kernel_ms"), row.get("floor_step_us")),
    }


def _div(a, b) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value, spec: str = ".2f") -> str:
    return "" if value is None else format(value, spec)


def _config_text(row: dict) -> str:
    """The config in short form (``U=8 ks=16 r=2 bt=4 v=4 tags``) and where it came from."""
    try:
        knobs = json.loads(row.get("config") or "{}")
    except json.JSONDecodeError:
        return str(row.get("config"))
    text = knob_text(knobs, knob_short_names())
    origin = (row.get("config_origin") or "").partition(":")[0]  # "default", "tuned", ...; the CSV has the why
    return f"{text} ({origin})" if origin else text


def markdown(
    rows: list[dict], title: str = "prnn-tvm benchmark", command: str | None = None, notes: list[str] | None = None
) -> str:
    """The report a reader sees: environment, then one table per cell and dtype.

    Each row gives time per step (us) of prnn-tvm's public call (``prnn_tvm.torch``), eager and
    replayed from a CUDA graph, its pre-bound layer and kernel, cuDNN's layer, the CUDA-graph
    GEMM loop's layer and the floor, then the four ratios and the host time per call. Error
    rows keep their place and say ``error: ...`` so a failed case is never silently missing.
    """
    lines = [f"# {title}", ""]
    env = next((r for r in rows if r.get("gpu")), rows[0] if rows else {})
    if env:
        lines += [
            f"GPU {env.get('gpu')} ({env.get('arch')}, {env.get('sms')} SMs, peak fp32 "
            f"{_fmt(env.get('peak_fp32_tflops'), '.1f')} TFLOP/s), driver {env.get('driver')}, CUDA "
            f"{env.get('cuda')}, cuDNN {env.get('cudnn')}, torch {env.get('torch')}, TVM {env.get('tvm')}, "
            f"prnn-tvm {env.get('prnn_tvm')}. TF32 off everywhere.",
            "",
        ]
    if command:
        lines += ["    " + command, ""]
    lines += [f"- {n}" for n in notes or []] + ([""] if notes else [])
    lines += [
        "Times are microseconds per step (median over repeats, T steps per sequence). *ours call* is "
        "`prnn_tvm.torch.from_torch(m)(x)`, timed exactly like cuDNN's `m(x)`; *in graph* that call captured "
        "in a CUDA graph and replayed; *ours layer* the two kernels with pre-bound arguments. Ratios above 1 "
        "under *cuDNN/call*, *cuDNN/ours* and *graph/ours* mean prnn-tvm is faster; *ours/floor* compares the "
        "persistent kernel with one barrier plus the recurrent FLOPs at peak. *host us* is the CPU time of "
        "one call, ours / cuDNN's, in microseconds per call (not per step).",
        "",
    ]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["cell"], row["dtype"]), []).append(row)
    for (cell, dtype), group in groups.items():
        lines += [
            f"## {cell} {dtype}",
            "",
            "| H | B | ours call | in graph | ours layer | ours kernel | cuDNN | graph loop | floor | cuDNN/call "
            "| cuDNN/ours | graph/ours | ours/floor | host us | max err vs cuDNN | config |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sorted(group, key=lambda r: (r["hidden"], r["batch"])):
            head = f"| {row['hidden']} | {row['batch']} "
            if row.get("status") != "ok":
                lines.append(head + f"| error: {_short(row.get('error'))} |" + " |" * 13)
                continue
            us = [
                _fmt(per_step_us(row, c))
                for c in (
                    "prnn_call_ms",
                    "prnn_graph_ms",
                    "prnn_layer_ms",
                    "prnn_kernel_ms",
                    "cudnn_ms",
                    "graph_layer_ms",
                    "floor_step_us",
                )
            ]
            r = ratios(row)
            host = (
                f"{_fmt(row.get('prnn_host_us'), '.0f')} / {_fmt(row.get('cudnn_host_us'), '.0f')}"
                if row.get("prnn_host_us") is not None
                else ""
            )
            cells = us + [
                _fmt(r["cudnn_over_call"]),
                _fmt(r["cudnn_over_prnn"]),
                _fmt(r["graph_over_prnn"]),
                _fmt(r["prnn_over_floor"]),
                host,
                _fmt(row.get("max_abs_err"), ".1e"),
                _config_text(row),
            ]
            lines.append(head + "| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _short(text: str | None, limit: int = 160) -> str:
    first = (text or "unknown error").strip().splitlines()[0].replace("|", "/")
    return first if len(first) <= limit else first[: limit - 3] + "..."

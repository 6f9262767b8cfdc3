"""A run's three files: the CSV with every figure, the Markdown table of ratios, the PNG plot."""

from __future__ import annotations

import logging
from pathlib import Path

from ..dtypes import GPU_DTYPES
from ..errors import InputError
from .plot import plot
from .table import markdown, read_csv, write_csv

log = logging.getLogger(__name__)

NOTES = [
    f"dtypes: the GPU kernels support {', '.join(GPU_DTYPES)}; half-precision rows run the tensor-core "
    "template against cuDNN in the same dtype (cuDNN's own persistent kernel where PyTorch picks it: float16 LSTM, "
    "batch a multiple of 8).",
    "Every implementation is timed with CUDA events on the same stream (prnn-tvm's two kernels launched on "
    "PyTorch tensors through DLPack); the floor's barrier is the barrier alone for the kernel's own grid "
    "(every CTA reading every CTA's value), timed with TVM's time_evaluator (minimum over repeats).",
    "floor = barrier + recurrent FLOPs per step at peak: the fp32 peak (no tensor cores) for float32, the "
    "dense tensor-core peak for float16 and bfloat16 (none for a `sentinel` kernel, which crosses no barrier per "
    "step); the graph loop is one "
    "input-projection GEMM plus a GEMM and the cell's pointwise math per step, replayed as a CUDA graph.",
]


def write_outputs(rows: list[dict], out_dir: str | Path, name: str, command: str | None = None) -> dict[str, Path]:
    """Write ``<name>.csv``, ``<name>.md`` and ``<name>.png`` under ``out_dir``; returns the paths by kind."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": write_csv(rows, out_dir / f"{name}.csv")}
    return {**paths, **render(rows, out_dir, name, command)}


def render(rows: list[dict], out_dir: str | Path, name: str, command: str | None = None) -> dict[str, Path]:
    """The Markdown table and the plot from rows (e.g. :func:`table.read_csv` of a committed CSV)."""
    out_dir = Path(out_dir)
    gpu = next((r["gpu"] for r in rows if r.get("gpu")), "")
    title = f"prnn-tvm vs cuDNN and a CUDA-graph GEMM loop{f' on {gpu}' if gpu else ''}"
    md = out_dir / f"{name}.md"
    md.write_text(markdown(rows, title, command, NOTES) + f"\n![time per step vs batch]({name}.png)\n")
    png = plot(rows, out_dir / f"{name}.png", title)
    log.info("wrote %s and %s", md, png)
    return {"md": md, "png": png}


def render_csv(csv_path: str | Path, out_dir: str | Path, name: str | None = None, command: str | None = None):
    """Re-render the table and plot of an existing CSV as ``<name>.md`` and ``<name>.png`` (default: the CSV's
    stem) under ``out_dir``. The files beside the CSV are the run's own (its table names the command that made
    it): writing over them is refused, as is a folder that does not exist."""
    csv_path, out_dir = Path(csv_path), Path(out_dir)
    rows = read_csv(csv_path)
    name = rendered_name(csv_path, out_dir, name)
    return render(rows, out_dir, name, command or command_beside(csv_path))


def rendered_name(csv_path: Path, out_dir: Path, name: str | None) -> str:
    """The stem the files re-rendered from ``csv_path`` into ``out_dir`` get (``name``, default the CSV's); InputError
    where the folder does not exist or they would overwrite the run's own files beside the CSV."""
    name = name or csv_path.stem
    if not out_dir.is_dir():
        raise InputError(f"{out_dir} is not a folder; --out names an existing folder for the re-rendered files")
    if (out_dir / name).resolve() == csv_path.with_suffix("").resolve():
        raise InputError(
            f"re-rendering {csv_path} would overwrite {csv_path.with_suffix('.md')} and its plot, the "
            "run's own files; pass --out DIR (another folder) or --name NAME"
        )
    return name


def command_beside(csv_path: Path) -> str | None:
    """The command a run's own table names (its indented ``prnn-tvm bench`` line), if the table is there."""
    md = csv_path.with_suffix(".md")
    lines = md.read_text(errors="replace").splitlines() if md.is_file() else []
    return next((line.strip() for line in lines if line.startswith("    prnn-tvm bench")), None)

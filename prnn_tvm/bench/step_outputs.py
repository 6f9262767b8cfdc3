"""A step-latency run's files (``prnn-tvm bench --step-latency``): ``<name>.csv``, ``<name>-histogram.csv``, the
Markdown table ``<name>.md`` and the histogram plot ``<name>.png``; the last two made again from the first two."""

from __future__ import annotations

import logging
from pathlib import Path

from . import step_table
from .outputs import command_beside, rendered_name
from .step_plot import plot

log = logging.getLogger(__name__)


def write_outputs(rows: list[dict], histograms: list[dict], out_dir, name: str, command: str | None = None) -> dict:
    """Write the run's four files under ``out_dir``; returns their paths by kind."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = step_table.SCHEMA.write(rows, out_dir / f"{name}.csv")
    paths = {
        "csv": csv_path,
        "histogram": step_table.HISTOGRAM_SCHEMA.write(histograms, step_table.histogram_path(csv_path)),
    }
    return {**paths, **render(rows, histograms, out_dir, name, command)}


def render(rows: list[dict], histograms: list[dict], out_dir, name: str, command: str | None = None) -> dict:
    """The Markdown table and the histogram plot from a run's rows and histogram rows."""
    out_dir = Path(out_dir)
    gpu = next((r["gpu"] for r in rows if r.get("gpu")), "")
    title = f"One timestep per call: resident sessions against cuDNN{f' on {gpu}' if gpu else ''}"
    md = out_dir / f"{name}.md"
    md.write_text(step_table.markdown(rows, title, command) + f"\n![latency per step]({name}.png)\n")
    png = plot(histograms, out_dir / f"{name}.png", title)
    log.info("wrote %s and %s", md, png)
    return {"md": md, "png": png}


def render_csv(csv_path, out_dir, name: str | None = None) -> dict:
    """Make the table and plot of a run again from its CSV and the histogram CSV beside it, as ``<name>.md`` and
    ``<name>.png`` (default: the CSV's stem) under ``out_dir``, never over the run's own files."""
    csv_path, out_dir = Path(csv_path), Path(out_dir)
    rows, histograms = step_table.read(csv_path)
    return render(rows, histograms, out_dir, rendered_name(csv_path, out_dir, name), command_beside(csv_path))

"""The step-latency benchmark's figure: per model, a histogram of the microseconds per step of each mode, input on
the host (left) and on the GPU (right).

Pure (histogram rows in, PNG out: :mod:`.step_table`) and headless: matplotlib runs on its Agg backend.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .step_table import MODES

log = logging.getLogger(__name__)

_COLOR = {"ours eager": "tab:green", "ours": "tab:blue", "cudnn eager": "tab:red", "cudnn graph": "tab:orange"}
_INPUTS = {"host": "input on the host", "gpu": "input on the GPU"}


def plot(histograms: list[dict], path: str | Path, title: str = "") -> Path:
    """Write a PNG with a row per model and a panel per input place; each mode's counts drawn as a step line over
    its bins (log microseconds). ValueError where there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in histograms if MODES.get(r["mode"]) in _INPUTS))
    if not models:
        raise ValueError("no host or GPU latency histograms to plot")
    fig, axes = plt.subplots(len(models), len(_INPUTS), figsize=(11, 2.6 * len(models)), squeeze=False)
    for row, model in enumerate(models):
        for col, (where, label) in enumerate(_INPUTS.items()):
            ax = axes[row][col]
            for mode in (m for m, place in MODES.items() if place == where):
                bins = [r for r in histograms if r["model"] == model and r["mode"] == mode]
                if bins:
                    ax.stairs(*_dense(bins), label=mode, color=_color(mode), linewidth=1.4)
            ax.set_xscale("log")
            ax.set_title(f"{model}, {label}", fontsize=9)
            ax.set_ylabel("steps")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("microseconds per step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("wrote %s", path)
    return path


def _dense(bins: list[dict]) -> tuple[list, list]:
    """Counts and edges for a step line from the histogram CSV's bins, which keeps only bins that hold steps: the
    empty intervals between them count zero."""
    edges = sorted({b["low_us"] for b in bins} | {b["high_us"] for b in bins})
    counts = {b["low_us"]: b["count"] for b in bins}
    return [counts.get(e, 0) for e in edges[:-1]], edges


def _color(mode: str) -> str:
    return next((c for prefix, c in _COLOR.items() if mode.startswith(prefix)), "gray")

"""The benchmark's figure: time per step against batch, one panel per cell, dtype and hidden size.

Pure (rows in, PNG out) and headless: matplotlib runs on its Agg backend, so the plot is
made the same way on a GPU machine and in CI.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .table import SERIES, per_step_us

log = logging.getLogger(__name__)

_STYLE = {  # label -> matplotlib line style
    "prnn-tvm public call": dict(color="tab:blue", marker="s", linestyle="-.", linewidth=2),
    "prnn-tvm call in a CUDA graph": dict(color="tab:purple", marker="D", linestyle="-."),
    "prnn-tvm layer": dict(color="tab:blue", marker="o"),
    "prnn-tvm kernel": dict(color="tab:blue", marker="o", linestyle="--"),
    "cuDNN layer": dict(color="tab:red", marker="s"),
    "graph loop layer": dict(color="tab:green", marker="^"),
    "graph loop recurrent": dict(color="tab:green", marker="^", linestyle="--"),
    "floor (barrier + FLOPs)": dict(color="black", marker=".", linestyle=":"),
}


def plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Write a PNG with one log-log panel per (cell, dtype, hidden): us/step vs batch, a line per series.

    Batches whose case failed are marked with a red cross on the panel's x axis, so a
    missing point is visibly an error rather than a gap.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups_in_order = list(dict.fromkeys((r["cell"], r["dtype"]) for r in rows))  # the run's cell order
    panels: dict[tuple, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (groups_in_order.index((r["cell"], r["dtype"])), r["hidden"], r["batch"])):
        panels.setdefault((row["cell"], row["dtype"], row["hidden"]), []).append(row)
    if not panels:
        raise ValueError("no rows to plot")
    keys = list(panels)
    n_cols = max(len([k for k in keys if k[:2] == group]) for group in {k[:2] for k in keys})
    groups = list(dict.fromkeys(k[:2] for k in keys))
    fig, axes = plt.subplots(len(groups), n_cols, figsize=(3.6 * n_cols, 3.0 * len(groups)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    col_of: dict[tuple, int] = {}
    for key in keys:
        r, c = groups.index(key[:2]), col_of.get(key[:2], 0)
        col_of[key[:2]] = c + 1
        _panel(axes[r][c], key, panels[key])
    legend = {}  # every label once, from whichever panel has it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 4), frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97 if title else 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("wrote %s", path)
    return path


def _panel(ax, key: tuple, rows: list[dict]) -> None:
    from matplotlib.ticker import FuncFormatter

    cell, dtype, hidden = key
    ax.set_visible(True)
    ok = [r for r in rows if r.get("status") == "ok"]
    plotted = False
    for label, column in SERIES.items():
        points = [(r["batch"], per_step_us(r, column)) for r in ok]
        points = [(b, us) for b, us in points if us is not None and us > 0]
        if points:
            ax.plot(*zip(*points), label=label, **_STYLE[label])
            plotted = True
    failed = [r["batch"] for r in rows if r.get("status") != "ok"]
    if failed:
        ax.plot(
            failed,
            [0.02] * len(failed),
            "x",
            color="red",
            markersize=9,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label="error",
        )
    ax.set_xscale("log", base=2)
    if plotted:  # a log axis needs a positive value; a panel of failed cases only has none
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    else:
        ax.text(0.5, 0.5, "every case failed", ha="center", va="center", transform=ax.transAxes, color="red")
    batches = sorted({r["batch"] for r in rows})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_title(f"{cell} {dtype} H={hidden}", fontsize=10)
    ax.set_xlabel("batch")
    ax.set_ylabel("us per step")
    ax.grid(True, which="both", alpha=0.3)

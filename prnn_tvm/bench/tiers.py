"""Where each weight tier stops, per cell and dtype: the benchmark's largest-hidden sweep from compile-time analysis.

A layer's untuned config (its template's first ranked default: validation's register, shared-memory and co-residency
model, no build) keeps the recurrent weights in registers, then also in shared memory (the weight tiers), then reads
part of them from global memory every step (the streamed tier), which L2 serves while the bytes streamed per step fit
in it and DRAM past that. :func:`tier_edges` finds, for one cell, dtype and batch, the last hidden size (a multiple
of ``step``) each tier holds, by bisection over hidden sizes (a tier, once left, is taken not to come back at a larger
size), with the weight bytes there against the chip's capacity of each tier: registers, + shared memory, + L2.
:func:`markdown` renders them, with a GPU run's per-step times at those sizes where the run measured them. It needs
no GPU: ``prnn-tvm bench --tiers --arch sm_90``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..target import GpuSpec
from .table import per_step_us

TIERS = ("registers", "+ shared memory", "+ L2 (streamed)", "+ DRAM (streamed)")


@dataclass(frozen=True)
class Placement:
    """Where the untuned config of one layer keeps its recurrent weights, in bytes over the whole grid."""

    hidden: int
    weight_bytes: int   # the layer's recurrent weights
    tier: int | None    # index into TIERS; None where no config fits
    streamed: int = 0   # weights read from global memory every step (each once, however many batch passes)


@dataclass(frozen=True)
class TierEdge:
    """The last hidden size a tier holds for one cell, dtype and batch."""

    cell: str
    dtype: str
    batch: int
    tier: int
    hidden: int | None   # None: no size in the range is in this tier
    weight_bytes: int    # at that size
    capacity: int | None  # of the chip, this tier and those before it (None for DRAM)
    streamed: int = 0    # bytes read from global memory per step at that size
    beyond: bool = False  # the tier still holds at the top of the range searched


def capacities(gpu: GpuSpec) -> list[int | None]:
    """Bytes the chip holds in each tier and those before it: registers, + shared memory, + L2; DRAM: no bound."""
    registers = gpu.sms * 4 * gpu.regs_per_sm
    shared = registers + gpu.sms * gpu.smem_per_sm
    return [registers, shared, shared + gpu.l2_bytes, None]


def placement(cell: str, hidden: int, batch: int, dtype: str, gpu: GpuSpec) -> Placement:
    """Where the untuned config of ``cell`` at ``hidden`` x ``batch`` in ``dtype`` keeps its weights on ``gpu``."""
    from ..frontend.analysis import analyze  # the compiler when asked (the command line reads this package)
    from ..frontend.registry import resolve
    from ..schedules import template_for

    plan = analyze(resolve(cell), batch, hidden, dtype)
    weights = sum(r.slices for r in plan.reductions) * hidden * hidden * plan.policy.itemsize
    target = gpu.target()
    try:
        template = template_for(plan, target)
        config = template.default_configs(plan, target, gpu)[0]
    except (ConfigError, IndexError):
        return Placement(hidden, weights, None)
    g = template.geometry(config, plan)
    # distinct bytes: each batch group's CTAs (the tensor-core template's) read the same weights
    streamed = g.ctas * getattr(g, "l2_ws", 0) // getattr(config, "batch_groups", 1)
    if streamed:
        tier = 2 if streamed <= gpu.l2_bytes else 3
    else:
        tier = 1 if getattr(g, "smem_ws", 0) else 0
    return Placement(hidden, weights, tier, streamed)


def tier_edges(cell: str, dtype: str, batch: int, gpu: GpuSpec, step: int = 128, top: int | None = None,
               place=None) -> list[TierEdge]:
    """The last hidden size (a multiple of ``step``, up to ``top``) of each tier for one cell, dtype and batch.

    ``top`` defaults to the size whose weights are twice registers, shared memory and L2 together. ``place(cell,
    hidden, batch, dtype, gpu)`` is :func:`placement` (a test gives its own)."""
    caps, place = capacities(gpu), place or placement
    if top is None:
        first = place(cell, step, batch, dtype, gpu)
        per_unit2 = first.weight_bytes / step**2  # bytes per hidden^2
        top = max(step, int(math.sqrt(2 * caps[2] / per_unit2)) // step * step)
    found: dict[int, Placement] = {}

    def at(n: int) -> Placement:
        if n not in found:
            found[n] = place(cell, n * step, batch, dtype, gpu)
        return found[n]

    def within(n: int, tier: int) -> bool:
        t = at(n).tier
        return t is not None and t <= tier

    edges = []
    for tier in range(len(TIERS)):
        lo, hi = 0, top // step  # the last n with within(n, tier): bisect (n = 0 is "none")
        if within(hi, tier):
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if within(mid, tier) else (lo, mid)
        p = at(lo) if lo else None
        holds = p is not None and p.tier == tier
        edges.append(TierEdge(cell, dtype, batch, tier, p.hidden if holds else None, p.weight_bytes if holds else 0,
                              caps[tier], p.streamed if holds else 0, holds and lo == top // step))
    return edges


def edge_sizes(edges: list[TierEdge]) -> list[int]:
    """The hidden sizes at which the tiers stop, smallest first (the sizes a GPU run times)."""
    return sorted({e.hidden for e in edges if e.hidden is not None})


def markdown(edges: list[TierEdge], rows: list[dict] | None = None) -> str:
    """A table of the tiers' edges; with a run's ``rows``, prnn-tvm's and cuDNN's time per step at each edge."""
    timed = {(r["cell"], r["dtype"], r["hidden"], r["batch"]): r for r in rows or () if r.get("status") == "ok"}
    head = "| cell | dtype | batch | tier | last hidden | weights (MB) | chip holds (MB) | streamed per step (MB) |"
    rule = "|---|---|---|---|---|---|---|---|"
    if rows is not None:
        head += " prnn-tvm us/step | cuDNN us/step |"
        rule += "---|---|"
    lines = [head, rule]
    for e in edges:
        cap = f"{e.capacity / 1e6:.1f}" if e.capacity is not None else "-"
        size = "none" if e.hidden is None else f"{e.hidden}{'+ (range end)' if e.beyond else ''}"
        weights = f"{e.weight_bytes / 1e6:.1f}" if e.hidden is not None else "-"
        streamed = f"{e.streamed / 1e6:.1f}" if e.streamed else "-"
        line = f"| {e.cell} | {e.dtype} | {e.batch} | {TIERS[e.tier]} | {size} | {weights} | {cap} | {streamed} |"
        if rows is not None:
            row = timed.get((e.cell, e.dtype, e.hidden, e.batch), {})
            ours, cudnn = per_step_us(row, "prnn_layer_ms"), per_step_us(row, "cudnn_ms")
            line += f" {_us(ours)} | {_us(cudnn)} |"
        lines.append(line)
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"

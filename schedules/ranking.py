"""What the persistent templates share about their configs: the resource checks every valid
config passes, and the untuned defaults (valid configs ranked, with a fallback ladder).

For configs with ``units_per_cta`` and a ``barrier`` whose geometry has ``ctas``,
``threads``, ``regs_estimate``, ``smem_bytes`` and ``weights_per_thread``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import GpuSpec, ctas_per_sm, max_regs_per_thread


def check_resources(g, plan: CellPlan, gpu: GpuSpec, holds: str, registers_advice: str, smem_hint: str) -> None:
    """Registers per thread, shared memory per CTA, and a co-resident grid where the plan needs a
    grid barrier; ConfigError with the figures, what a thread ``holds``, and what to change."""
    reg_cap = max_regs_per_thread(g.threads, gpu)
    if g.regs_estimate > reg_cap:
        raise ConfigError(f"needs about {g.regs_estimate} registers per thread ({holds}); a {g.threads}-thread CTA "
                          f"allows {reg_cap}: {registers_advice}")
    if g.smem_bytes > gpu.smem_per_block:
        raise ConfigError(f"needs {g.smem_bytes} bytes of shared memory per CTA, {gpu.arch} allows "
                          f"{gpu.smem_per_block}: {smem_hint}")
    fit = ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, gpu)
    if plan.needs_grid_barrier and g.ctas > fit * gpu.sms:
        raise ConfigError(
            f"grid of {g.ctas} CTAs cannot be co-resident on {gpu.arch}: {fit * gpu.sms} fit "
            f"({gpu.sms} SMs x {fit} per SM at {g.threads} threads, ~{g.regs_estimate} registers, "
            f"{g.smem_bytes} bytes of shared memory): raise units_per_cta")


def ranked_defaults(plan: CellPlan, gpu: GpuSpec, candidates: Iterable, validate: Callable, cost: Callable,
                    limit: int, kind: str, runs: int = 1) -> list:
    """Valid ``candidates`` best first: units spread over every SM (``runs`` runs of CTAs, each over the hidden
    units, side by side), then least ``cost(cfg, geometry)``.

    Fallbacks step down in register pressure: a config that spilled is followed by one
    holding fewer weights per thread, not by a near-twin that spills the same way (the
    register estimate is a model; ptxas decides). At most ``limit`` entries.
    """
    min_units = max(1, math.ceil(runs * plan.hidden / gpu.sms))
    ranked = []
    for cfg in candidates:
        try:
            g = validate(cfg, plan, gpu)
        except ConfigError:
            continue
        ranked.append(((cfg.units_per_cta != min_units, cost(cfg, g), g.threads), cfg, g.weights_per_thread))
    if not ranked:
        raise ConfigError(f"no {kind} config fits cell '{plan.cell.name}' at hidden={plan.hidden}, "
                          f"batch={plan.batch} on {gpu.arch} (the weights may not fit in registers)")
    ranked.sort(key=lambda entry: entry[0])
    ladder = [ranked[0][1:]]
    for _, cfg, weights in ranked[1:]:
        if len(ladder) == limit:
            break
        if weights < ladder[-1][1]:
            ladder.append((cfg, weights))
    return [cfg for cfg, _ in ladder]


def with_barrier(cfg, barrier: str, plan: CellPlan, gpu: GpuSpec, validate: Callable):
    """``cfg`` with ``barrier`` when that still validates, else ``cfg`` as it is."""
    other = dataclasses.replace(cfg, barrier=barrier)
    try:
        validate(other, plan, gpu)
    except ConfigError:
        return cfg
    return other

"""What the persistent templates share about their configs: the resource checks every valid
config passes, the untuned defaults (valid configs ranked, with a fallback ladder) and the
``layout`` knob.

For configs with ``units_per_cta``, a ``barrier`` and a ``layout`` whose geometry has ``ctas``,
``threads``, ``regs_estimate``, ``smem_bytes`` and ``weights_per_thread``.

``layout`` says what a CTA's units cover. ``shared``: every product's rows and every pointwise
group of its units. ``split`` (plans with :attr:`~prnn_tvm.frontend.plan.CellPlan.cta_parts`,
a stack's layers): each part runs on CTAs of its own, ``ceil(hidden / units_per_cta)`` per
part, which hold only that part's weights and read only its operands (a stack's layer reads
its own state and the layer below's, not every layer's); the grid is the parts' runs side by
side.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable

from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import STATIC_SMEM_RESERVE, GpuSpec, ctas_per_sm, launchable_smem, max_regs_per_thread

LAYOUTS = ("shared", "split")
# The kinds of synchronization the untuned defaults take: ranked with the one every config fits (bounded, as fast as
# grid.sync()), each then moved to the preferred one where it still fits (H100: up to 23% faster per step at batch
# 1-4, within 5% elsewhere).
RANKED_WITH, PREFERRED = "counter", "tags"


def knobs_of(cfg) -> dict:
    """A config's knobs as a dict; a knob added after records existed (metadata ``quiet``: ``layout``,
    ``m_tiles_per_warp``) only where it is not its default, so the records and tables of configs from before
    it stay as they were."""
    fields = cfg.__dataclass_fields__
    return {k: getattr(cfg, k) for k, f in fields.items()
            if not f.metadata.get("quiet") or getattr(cfg, k) != f.default}


def parts(layout: str, plan: CellPlan) -> tuple:
    """What the CTAs of each run of the grid do: ``(reductions, operands, pointwise groups)`` per part of the
    split layout, one part (the whole step) for the shared one."""
    if layout == "split" and plan.cta_parts:
        return tuple((part.reductions, part.operands, part.groups) for part in plan.cta_parts)
    return ((plan.reductions, plan.operands, plan.pointwise_groups),)


def check_layout(cfg, plan: CellPlan) -> None:
    """ConfigError for a layout the plan or the barrier cannot take, with the reason."""
    if cfg.layout not in LAYOUTS:
        raise ConfigError(f"layout '{cfg.layout}' unknown; available: {', '.join(LAYOUTS)}")
    kind = barrier(cfg.barrier)
    problem = kind.problem(plan, cfg.layout) or kind.placement_problem(plan, cfg.units_per_cta)
    if problem:
        raise ConfigError(problem)
    if cfg.layout != "split":
        return
    if plan.unit_sums:
        raise ConfigError(f"layout 'split' gives each part of a step CTAs of its own; cell '{plan.cell.name}' sums "
                          "over units, whose partial sums meet over every CTA: use 'shared'")
    if not plan.cta_parts:
        raise ConfigError(f"layout 'split' gives each independent part of a step (a stack's layer) CTAs of its "
                          f"own; cell '{plan.cell.name}' has one part: use 'shared'")


def layouts(plan: CellPlan, barriers: Iterable) -> list:
    """``(layout, runs of CTAs, barriers)`` for a tuning space: the shared layout, and the split one where
    the plan has parts, with the kinds that fit it (``Barrier.problem``: where parts read each other's values,
    of the kinds that poll values only ``sentinel``, whose slots no block overwrites)."""
    found = [("shared", 1, tuple(barriers))]
    if plan.cta_parts:
        takes = [b for b in barriers if barrier(b).problem(plan, "split") is None]
        found.append(("split", len(plan.cta_parts), tuple(takes)))
    return found


def layered_defaults(plan: CellPlan, gpu: GpuSpec, candidates: Iterable, validate: Callable, cost: Callable,
                     limit: int, kind: str, widen: Callable | None = None) -> list:
    """:func:`ranked_defaults` of the split layout's candidates first, where the plan has parts and any fits
    (each part's CTAs read only its operands), then of the shared layout's: a split config that spills
    falls back to a shared one. ``widen(pool, found, runs)`` may extend each layout's ladder."""
    candidates = list(candidates)
    pools = [("split", len(plan.cta_parts))] if plan.cta_parts else []
    pools.append(("shared", 1))
    ladder: list = []
    for layout, runs in pools:
        pool = [cfg for cfg in candidates if cfg.layout == layout]
        try:
            found = ranked_defaults(plan, gpu, pool, validate, cost, limit, kind, runs)
        except ConfigError:
            if ladder or layout == "split":
                continue
            raise
        ladder += widen(pool, found, runs) if widen is not None else found
    return ladder


def block_local(plan: CellPlan, gpu: GpuSpec, space: Callable, validate: Callable, cost: Callable, limit: int,
                kind: str) -> list:
    """The untuned configs of the ``block`` barrier, best first, where a plan's products are head-wise and whole
    heads fit a CTA (``CellPlan.local_to``): a block that holds its heads waits for no other block, so these
    rank before every config that synchronizes the grid. ``space(plan, gpu, barriers)``: the template's space."""
    if plan.heads == 1:
        return []
    pool = [cfg for cfg in space(plan, gpu, ("block",)) if plan.local_to(cfg.units_per_cta)]
    try:
        return ranked_defaults(plan, gpu, pool, validate, cost, limit, kind)
    except ConfigError:
        return []


TIER_STEPS = 3  # shared-memory tiers a space offers past the first that fits registers (fallbacks when ptxas spills)
TIER_FROM = 0.75  # a space offers tiers where a CTA's weights pass this share of an SM's register file


def fewest_units_weights(plan: CellPlan, gpu: GpuSpec) -> int:
    """Bytes of recurrent weights a CTA of the fewest units holds (the hidden units spread over every SM)."""
    rows = sum(r.slices for r in plan.reductions) * math.ceil(plan.hidden / gpu.sms)
    return rows * plan.hidden * plan.policy.itemsize


def offers_tiers(plan: CellPlan, gpu: GpuSpec) -> bool:
    """Whether a space offers weight tiers for ``plan`` at all: where a CTA of the fewest units
    (:func:`fewest_units_weights`) would hold more than ``TIER_FROM`` of an SM's register file in weights. Below,
    every weight fits registers with room for the rest, and the space stays as it was (its size, the time to rank
    it)."""
    return fewest_units_weights(plan, gpu) > TIER_FROM * 4 * gpu.regs_per_sm


def tiers_offered(plan: CellPlan, gpu: GpuSpec, untiered: Iterable, validate: Callable) -> bool:
    """Whether a space offers weight tiers: where :func:`offers_tiers` says so, and also where no config of the
    space ``untiered`` (without tiers) validates, e.g. a deep stack, whose five products per unit no thread
    geometry holds in registers though their bytes stay under ``TIER_FROM`` of the register file. The search
    stops at the first config that validates."""
    if offers_tiers(plan, gpu):
        return True
    for cfg in untiered:
        try:
            validate(cfg, plan, gpu)
            return False
        except ConfigError:
            continue
    return True


def tier_knob(cfg) -> str | None:
    """The name of ``cfg``'s weight-tier knob (the field whose metadata says ``tier``: how many of a thread's weight
    chunks live in shared memory; each more frees registers), or None for a config without one."""
    return next((f.name for f in dataclasses.fields(cfg) if f.metadata.get("tier")), None)


def offers_streaming(plan: CellPlan, gpu: GpuSpec) -> bool:
    """Whether a space offers the third tier (weights read from global memory, served by L2, every step) for
    ``plan``: where a CTA of the fewest units would hold more weights than ``TIER_FROM`` of an SM's register file and
    the most shared memory a block may have, together. Below, registers and shared memory hold them."""
    return fewest_units_weights(plan, gpu) > TIER_FROM * 4 * gpu.regs_per_sm + gpu.smem_per_block


def tier_counts(excess: int, first: int, per_tier: int, most: int) -> list[int]:
    """The weight tiers a space offers a config (how many of a thread's weight chunks go to shared memory): 0, and
    where its register estimate passes the cap by ``excess`` registers, the fewest that bring it under (each tier
    frees ``per_tier`` registers; the first costs ``first`` more, its staging registers) and the next
    ``TIER_STEPS - 1``, at most ``most`` (ptxas decides; each holds fewer weights in registers)."""
    if excess <= 0 or most <= 0:
        return [0]
    least = -(-(excess + first) // per_tier)
    return [0] + list(range(least, min(least + TIER_STEPS, most + 1)))


def weights_offset(other: int) -> int:
    """Byte offset of a CTA's shared-memory weights after ``other`` bytes of everything else: 16-byte aligned,
    as their loads are up to 16 bytes wide."""
    return -(-other // 16) * 16


def tiered_smem(other: int, weights: int) -> int:
    """Dynamic shared memory per CTA, as allocated (``target.launchable_smem``): ``other`` bytes, then
    ``weights`` bytes of weights (the tiers) from :func:`weights_offset`."""
    return launchable_smem(weights_offset(other) + weights if weights else other)


def check_resources(g, plan: CellPlan, gpu: GpuSpec, holds: str, registers_advice: str, smem_hint: str,
                    grid_advice: str = "raise units_per_cta") -> None:
    """Registers per thread, shared memory per CTA, and a co-resident grid where the plan needs a
    grid barrier; ConfigError with the figures, what a thread ``holds``, and what to change."""
    reg_cap = max_regs_per_thread(g.threads, gpu)
    if g.regs_estimate > reg_cap:
        raise ConfigError(f"needs about {g.regs_estimate} registers per thread ({holds}); a {g.threads}-thread CTA "
                          f"allows {reg_cap}: {registers_advice}")
    if g.smem_bytes + STATIC_SMEM_RESERVE > gpu.smem_per_block:  # the static words count against the limit too
        raise ConfigError(f"needs {g.smem_bytes} bytes of shared memory per CTA, {gpu.arch} allows "
                          f"{gpu.smem_per_block} with up to {STATIC_SMEM_RESERVE} of static shared memory: {smem_hint}")
    fit = ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, gpu)
    if plan.needs_grid_barrier and g.ctas > fit * gpu.sms:
        raise ConfigError(
            f"grid of {g.ctas} CTAs cannot be co-resident on {gpu.arch}: {fit * gpu.sms} fit "
            f"({gpu.sms} SMs x {fit} per SM at {g.threads} threads, ~{g.regs_estimate} registers, "
            f"{g.smem_bytes} bytes of shared memory): {grid_advice}")


_PER_PLAN: list = []  # the memos of :func:`per_plan` and :func:`plan_memo`, for :func:`forget_rankings`
PER_PLAN_KEPT = 256  # rankings a memo keeps (the latest asked)


def per_plan(rank: Callable) -> Callable:
    """``rank(plan, gpu, *args)`` answered once per plan object, GPU and arguments in a process, as a new list each
    time: a plan and a GpuSpec are frozen, and :func:`prnn_tvm.analyze` gives one plan object per cell, sizes and
    dtype, so a compile, its config report and a check of its defaults rank the space once (ranking validates
    every config of it). The memo holds each plan it keys by its ``id``. A patch of what a ranking reads forgets
    them (:func:`forget_rankings`; the test suite's ``monkeypatch`` forgets them at every patch and its undoing)."""
    memoized = plan_memo(PER_PLAN_KEPT)(
        lambda plan, gpu, args, kwargs: tuple(rank(plan, gpu, *args, **dict(kwargs)))
    )

    @functools.wraps(rank)
    def ranked(plan: CellPlan, gpu: GpuSpec, *args, **kwargs) -> list:
        return list(memoized(plan, gpu, args, tuple(sorted(kwargs.items()))))

    return ranked


def plan_memo(kept: int) -> Callable:
    """``answer(plan, *args)`` worked out once per plan object and arguments in a process, for answers that no one
    changes (a frozen dataclass, a tuple): what every config of a space asks of its plan again (e.g. the plan's parts
    at one layout and units per CTA). The memo holds each plan it keys by its ``id`` and keeps the latest ``kept``
    answers; :func:`forget_rankings` empties it with the rankings (a patch of what an answer reads)."""

    def memoized(answer: Callable) -> Callable:
        memo: OrderedDict = OrderedDict()
        _PER_PLAN.append(memo)

        @functools.wraps(answer)
        def answered(plan: CellPlan, *args):
            key = (id(plan), *args)
            found = memo.get(key)
            if found is not None and found[0] is plan:
                memo.move_to_end(key)
                return found[1]
            value = answer(plan, *args)
            memo[key] = (plan, value)
            if len(memo) > kept:
                memo.popitem(last=False)
            return value

        return answered

    return memoized


def forget_rankings() -> None:
    """Empty every :func:`per_plan` and :func:`plan_memo` memo."""
    for memo in _PER_PLAN:
        memo.clear()


def ranked_defaults(plan: CellPlan, gpu: GpuSpec, candidates: Iterable, validate: Callable, cost: Callable,
                    limit: int, kind: str, runs: int = 1, spread: bool = True) -> list:
    """Valid ``candidates`` best first: units spread over every SM (``runs`` runs of CTAs, each over the hidden
    units, side by side; not where ``spread`` is False: the cost alone decides), then every weight in registers where
    any such config fits (the weight tiers rank after them: fallbacks there, the choice only past registers), then
    least ``cost(cfg, geometry)``. Weights streamed from global memory (``l2_ws``) rank after those in shared memory.

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
        tiered = (getattr(g, "l2_ws", 0) > 0, getattr(g, "smem_ws", 0) > 0)
        ranked.append(((spread and cfg.units_per_cta != min_units, tiered, cost(cfg, g), g.threads), cfg,
                       g.weights_per_thread))
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


def shared_layout(cfg, plan: CellPlan, gpu: GpuSpec, validate: Callable, ranked_configs: Callable):
    """``cfg`` in the shared layout: what the training forward (``recurrent_save``) of a layer built with ``cfg``
    runs, since it writes every saved column of a (batch row, unit) from one item of the whole step. ``cfg``
    itself where it is shared, else with the shared layout where that fits, else the best untuned shared one. Its batch
    groups stay where the training forward's kind synchronizes each block with itself alone (``block``: each group's
    blocks save their own rows, ``row_view``), else it runs one group."""
    kind = barrier(cfg.barrier).training_kind()  # the training forward exchanges through its workspace
    if kind != cfg.barrier:
        cfg = dataclasses.replace(cfg, barrier=kind)
        if getattr(cfg, "poll_sleep", 0):  # which polls no values
            cfg = dataclasses.replace(cfg, poll_sleep=0)
        if getattr(cfg, "operand_path", "shared") != "shared":  # and loads whole tiles after its barriers
            cfg = dataclasses.replace(cfg, operand_path="shared")
    # one batch group where the training forward's kind synchronizes blocks with each other; a ``block`` forward keeps
    # its groups, each group's blocks saving their own rows
    if getattr(cfg, "batch_groups", 1) > 1 and barrier(kind).grid_wide:
        cfg = dataclasses.replace(cfg, batch_groups=1)
    if cfg.layout == "shared":
        return cfg
    shared = dataclasses.replace(cfg, layout="shared")
    try:
        validate(shared, plan, gpu)
    except ConfigError:
        ranked = [c for c in ranked_configs(plan, gpu) if c.layout == "shared"]
        if not ranked:
            raise ConfigError(f"the training forward of '{plan.cell.name}' runs the shared layout, and no config of it "
                              f"fits at hidden={plan.hidden}, batch={plan.batch} on {gpu.arch}") from None
        return ranked[0]
    return shared


CARRY_UNITS = 4  # a carried-over config's units per CTA grow to at most this many times the record's


def carried_over(cfg, plan: CellPlan, gpu: GpuSpec, validate: Callable, fit: Callable):
    """``cfg``, a tuning record's config at another hidden size, for ``plan``: every knob kept, ``units_per_cta``
    the record's where its grid keeps to one CTA per SM, else the least above it (up to ``CARRY_UNITS`` times) whose
    grid does; ``fit(cfg, same_units)`` fits the knobs that follow the units (None: not these units). None where no
    such config validates.

    Why these knobs and this grid: the records say what carries over between hidden sizes, and it is not the spread
    the cost estimate ranks first (every SM a few units). LSTM float16 at batch 16 on the H100: 16 units per CTA
    and the batch in as many groups as keep the grid within the SMs, at 256, 512 and 1024 alike (128 CTAs each);
    the same knobs past one CTA per SM run far slower (1024 x 16, 256 CTAs: 3.88 us per step against 2.17), while
    the units per CTA matter less than the groups (512 x 16: 4 groups of 32 units 1.48, 2 groups of 16 units 1.70).
    So the batch groups stay the record's and the units grow only as far as the grid needs."""
    first = cfg.units_per_cta
    for units in range(first, min(plan.hidden, CARRY_UNITS * first) + 1):
        candidate = fit(dataclasses.replace(cfg, units_per_cta=units), units == first)
        if candidate is None:
            continue
        try:
            g = validate(candidate, plan, gpu)
        except ConfigError:
            continue
        if g.ctas <= gpu.sms:
            return candidate
    return None


def with_barrier(cfg, barrier: str, plan: CellPlan, gpu: GpuSpec, validate: Callable):
    """``cfg`` with ``barrier`` when that still validates, else ``cfg`` as it is."""
    other = dataclasses.replace(cfg, barrier=barrier)
    try:
        validate(other, plan, gpu)
    except ConfigError:
        return cfg
    return other

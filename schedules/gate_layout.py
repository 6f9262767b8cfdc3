"""Which gate rows a warp of the tensor-core template holds: the ``gate_layout`` knob.

``by_gate`` (what configs and records from before the knob mean): a CTA's rows run product by product, slice by
slice, unit by unit (``persistent_mma_config``), so a warp's row tiles hold rows of one gate and a unit's gates
lie in several warps. The accumulators go to shared partial sums, a block barrier, and each pointwise item reads
its gates back.

``in_warp``: warp ``w`` holds every gate of units ``8 w .. 8 w + 7`` of the CTA. Its row tile ``m`` holds gate
``2 m`` of those units in rows 0-7 and gate ``2 m + 1`` in rows 8-15, so lane ``(grp, quad)``'s accumulators of
batch tile ``nt`` are all the gates of unit ``8 w + grp`` for batch rows ``8 nt + 2 quad`` and ``+ 1``
(``persistent_fragments``: C element ``i`` is row ``grp + 8 (i // 2)``, batch column ``2 quad + i % 2``). The
pointwise math of those ``2 n_tiles`` items runs from the accumulators, with no partial sums and no block barrier
between products and pointwise; each item writes its unit's new state into the other half of a double-buffered
operand tile, and one block barrier ends the step (``persistent_warp_gates``). H100, lstm_h12 bf16 768 x 16,
units_per_cta=64, T=1024: 1.40-1.45 us per step by gate, 0.737-0.740 in one warp (the hand-written prototype,
bench/changes/heads_gates_in_warp.json, 0.95; bench/results/heads-in-warp-h100.md).

``batch_warps`` (``in_warp`` only): the pass's batch tiles split over that many sets of warps, each set holding every
unit's gates (the weights once per set) and multiplying ``n_tiles / batch_warps`` of the tiles: warp ``w`` holds units
``8 (w % W) ..`` and batch tiles from ``(w // W) n_tiles / batch_warps`` (``W``: the warps of one set). A thread has
that many times fewer products, pointwise items and projection loads a step, and the CTA that many times more warps
to hide their latencies; 1 is what configs and records from before the knob mean.

It takes a step whose values stay in the block (barrier ``block``) in one batch pass, one product of ``2 m`` slices
with ``m = m_tiles_per_warp``, its whole k range in each warp (``k_groups=1``) and every head holding whole warps
of units (a multiple of 8).
"""

from __future__ import annotations

from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan

GATE_LAYOUTS = ("by_gate", "in_warp")
BATCH_WARPS = (1, 2, 4, 8)
UNITS_PER_WARP = 8  # a row tile's 16 rows hold two gates of 8 units (one per lane group ``grp``)


def in_warp_tiles(plan: CellPlan) -> int | None:
    """The ``m_tiles_per_warp`` that puts every gate of a unit in one warp for ``plan`` (its one product's slices
    over the two gates a row tile holds), or None where no config can (several products, an odd slice count)."""
    if len(plan.reductions) != 1 or plan.reductions[0].slices % 2:
        return None
    return plan.reductions[0].slices // 2


def in_warp_problem(cfg, plan: CellPlan, batch_chunks: int) -> str | None:
    """Why ``gate_layout="in_warp"`` cannot place ``plan`` with ``cfg`` (None where it can); ``batch_chunks``:
    the config's batch passes per step."""
    mw = in_warp_tiles(plan)
    if mw is None:
        products = ", ".join(f"{r.name} ({r.slices} slices)" for r in plan.reductions) or "none"
        return (f"puts a unit's gates in the accumulators of one warp, for a cell of one recurrent product of an even "
                f"number of slices; cell '{plan.cell.name}' has products {products}")
    if cfg.barrier != "block":
        return (f"writes each unit's new state straight into the block's next operand tile, so the block must hold "
                f"every unit it reads: barrier 'block', not '{cfg.barrier}'")
    if plan.phases != 1 or plan.unit_sums:
        return f"runs the step's pointwise math from the accumulators in one phase; cell '{plan.cell.name}' has more"
    if cfg.m_tiles_per_warp != mw:
        return (f"holds the {2 * mw} gates of a unit in a warp's row tiles, two gates per tile: take "
                f"m_tiles_per_warp={mw}, not {cfg.m_tiles_per_warp}")
    if cfg.k_groups != 1:
        return f"keeps each gate's whole sum in one warp's accumulators: take k_groups=1, not {cfg.k_groups}"
    if cfg.units_per_cta % UNITS_PER_WARP:
        return (f"gives each warp {UNITS_PER_WARP} units: units_per_cta={cfg.units_per_cta} must be a multiple of "
                f"{UNITS_PER_WARP}")
    D = plan.reductions[0].head_size(plan.hidden)
    if D % UNITS_PER_WARP:
        return (f"multiplies a warp's {UNITS_PER_WARP} units with one head's state values: heads of {D} units are "
                f"not a multiple of {UNITS_PER_WARP}")
    if batch_chunks != 1 or cfg.direct or cfg.layout != "shared":
        return ("keeps every batch row of a step (of its batch group) in one pass through the shared operand tile: "
                "take n_tiles covering the batch group's rows, operand_path='shared' and the shared layout")
    return None


def check_batch_warps(cfg) -> None:
    """ConfigError where ``cfg.batch_warps`` cannot split its pass's batch tiles, with the reason (before the
    geometry, which divides by it)."""
    bw = cfg.batch_warps
    if bw not in BATCH_WARPS:
        raise ConfigError(f"batch_warps={bw}: must be one of {', '.join(map(str, BATCH_WARPS))} (sets of warps over "
                          "a pass's batch tiles)")
    if bw > 1 and not cfg.in_warp:
        raise ConfigError(f"batch_warps={bw} splits the batch tiles of a unit's gates held in one warp: take "
                          "gate_layout='in_warp', or batch_warps=1")
    if cfg.n_tiles % bw:
        raise ConfigError(f"batch_warps={bw} gives each set of warps n_tiles / batch_warps batch tiles: n_tiles="
                          f"{cfg.n_tiles} does not split into {bw}; take a batch_warps that divides it")


def check_gate_layout(cfg, plan: CellPlan, batch_chunks: int) -> None:
    """ConfigError where ``cfg.gate_layout`` is unknown or cannot place ``plan``, with the reason."""
    if cfg.gate_layout not in GATE_LAYOUTS:
        raise ConfigError(f"gate_layout '{cfg.gate_layout}' unknown; available: {', '.join(GATE_LAYOUTS)}")
    problem = in_warp_problem(cfg, plan, batch_chunks) if cfg.gate_layout == "in_warp" else None
    if problem:
        raise ConfigError(f"gate_layout='in_warp' {problem}")

"""Knobs of the persistent CUDA template, their derived geometry, validation and default.

A thread block (CTA) owns ``units_per_cta`` hidden units with every gate row of every
recurrent product ("rows"). Inside it, ``k_split`` adjacent lanes share one row's dot
product, each holding ``rows_per_thread`` rows x ceil(hidden / k_split) weights in
registers; lane ``ks`` takes k in chunks of ``vec`` contiguous elements,
k = vec * (ks + k_split * q) + v, so its state reads are ``vec``-wide shared-memory loads
that neighbouring lanes issue on neighbouring addresses. The batch is processed in
tiles of ``batch_tile`` rows, each a pass over the register-resident weights. ``smem_chunks``
(the weight tiers): of each row's ``k_chunks`` chunks per lane, the last ``smem_chunks`` live in
shared memory instead of registers (``persistent_weights`` gives their layout), so a CTA holds
more weights than its registers do; 0 (every weight in registers) is what configs and tuning
records from before the knob mean. ``l2_chunks`` (the third tier, for layers past registers and shared memory
together): the first ``l2_chunks`` of each row's chunks stay in global memory, read in place from its weight matrix
(16-byte loads where ``vec`` is 4) every batch tile of every step, served by L2 (the runtime puts an L2 persistence
window on the weight buffer: ``prnn_tvm.runtime.l2``); chunks ``[l2_chunks, k_chunks - smem_chunks)`` are in
registers. ``layout``
(``shared``, or ``split``: each part of the step on CTAs of its own) is explained in
``ranking``.

``atomic_sums`` (cells that sum over units, ``c.mean``): 0, each block reads every block's partial sum after the
barrier in a fixed order (deterministic); R in 1, 2, 4, 8, the blocks add their partials into R accumulators by
atomics and a total is R loads (not bit-deterministic from run to run): ``persistent_sums``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.dtypes import GPU_DTYPES, itemsize, policy
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import STATIC_SMEM_RESERVE, GpuSpec, ctas_per_sm, max_regs_per_thread

from .head_columns import OperandColumns, check_heads, fitting_units
from .persistent_sums import atomic_sums_offered, check_atomic_sums, unit_sum_bytes
from .persistent_weights import lane_shuffles
from .ranking import (
    PREFERRED,
    RANKED_WITH,
    TIER_STEPS,
    block_local,
    check_layout,
    check_resources,
    knobs_of,
    layered_defaults,
    layouts,
    offers_streaming,
    parts,
    per_plan,
    plan_memo,
    shared_layout,
    tier_counts,
    tiered_smem,
    tiers_offered,
    weights_offset,
    with_barrier,
)

DTYPES = tuple(d for d in GPU_DTYPES if policy(d).mma is None)  # what multiplies on CUDA cores (float32)

REG_OVERHEAD = 40  # registers a thread needs besides weights, accumulators and private states
PHASE_OVERHEAD = 32  # more registers live across a step's phases of products (ptxas, Cho's GRU at hidden 1024)
L2_BYTES_PER_CYCLE = 64  # what one SM reads from L2 per cycle, at best (a guess for the cost model, unmeasured)
TILE_OVERHEAD = 800  # cycles per batch tile: an L2 round trip for the states and two block barriers


@dataclass(frozen=True)
class PersistentConfig:
    """One point in the persistent template's space (all sizes in elements; metadata: short names)."""

    units_per_cta: int = field(metadata={"short": "U"})
    k_split: int = field(metadata={"short": "ks"})
    rows_per_thread: int = field(metadata={"short": "r"})
    batch_tile: int = field(metadata={"short": "bt"})
    vec: int = field(default=4, metadata={"short": "v"})
    barrier: str = field(default=RANKED_WITH, metadata={"short": ""})
    layout: str = field(default="shared", metadata={"short": "", "quiet": True})
    smem_chunks: int = field(default=0, metadata={"short": "sc", "quiet": True, "tier": True})
    l2_chunks: int = field(default=0, metadata={"short": "lc", "quiet": True})
    atomic_sums: int = field(default=0, metadata={"short": "as", "quiet": True})

    def as_dict(self) -> dict:
        return knobs_of(self)


@dataclass(frozen=True)
class Geometry:
    """What a config implies for one cell plan: grid, registers, shared memory."""

    ctas: int
    threads: int
    rows: int              # gate rows per CTA over all its recurrent products (the most any part has)
    row_groups: int        # threads along rows (each with k_split lanes)
    k_chunks: int          # vec-wide chunks of k per lane
    k_pad: int             # hidden rounded up to vec * k_split * k_chunks
    weights_per_thread: int
    batch_chunks: int
    items_per_thread: int  # (pointwise group, batch row, unit) items per thread (CellPlan.pointwise_groups)
    tagged_per_thread: int  # ``tags`` barrier: loads of tagged state words each thread polls per batch tile
    smem_hs: int           # bytes: the operand tiles (states, stages) of one batch tile
    smem_gs: int           # bytes: reduced gate sums of the whole batch
    regs_estimate: int
    tile_stride: int = 0   # elements between batch rows of a shared operand tile, where not k_pad (heads)
    smem_us: int = 0       # bytes: the shares and totals of the sums over units (``persistent_sums``)
    smem_chunks: int = 0   # of each row's k_chunks per lane, those in shared memory (the weight tiers)
    smem_ws: int = 0       # bytes: the weights in shared memory, after everything else (``weights_offset``)
    l2_chunks: int = 0     # of each row's k_chunks per lane, the first ones, read from global memory every step
    l2_ws: int = 0         # bytes: the weights a CTA reads from global memory (L2) per batch tile and step

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA, as allocated (:func:`~prnn_tvm.target.launchable_smem`)."""
        return tiered_smem(self.smem_hs + self.smem_gs + self.smem_us, self.smem_ws)

    @property
    def weights_offset(self) -> int:
        """Byte offset of the shared-memory weights: after the operand tiles, gate sums and sums over units."""
        return weights_offset(self.smem_hs + self.smem_gs + self.smem_us)

    @property
    def register_chunks(self) -> int:
        """Of each row's ``k_chunks`` per lane, those held in registers (from chunk ``l2_chunks``)."""
        return self.k_chunks - self.smem_chunks - self.l2_chunks

    @property
    def smem_from(self) -> int:
        """The first of each row's chunks in shared memory (the last ``smem_chunks``)."""
        return self.k_chunks - self.smem_chunks

    @property
    def stride(self) -> int:
        """Elements between batch rows of a shared operand tile: ``k_pad``, or with head-wise products the span
        of the CTA's heads and the last head's padding (``head_columns.OperandColumns.tile_width``)."""
        return self.tile_stride or self.k_pad



def group_span(items: int, groups: int) -> int:
    """Item numbers each pointwise group takes: its ``items`` (batch rows x units per CTA), rounded up to whole
    warps where there are several groups, so that each runs on warps of its own (not serialized within a
    warp by divergence)."""
    return items if groups == 1 else -(-items // 32) * 32




@dataclass(frozen=True)
class Placement:
    """What :func:`geometry` and :func:`validate` read of a plan at one ``layout`` and ``units_per_cta``, the same
    whatever the other knobs (:func:`placement`)."""

    runs: tuple            # ``ranking.parts``: (reductions, operands, pointwise groups) of each run of CTAs
    problem: str | None    # why the units fit no head (``OperandColumns.of``); then nothing below is worked out
    cols: OperandColumns | None = None
    headed: bool = False   # ``cols.headed``
    K: int = 0             # weights per row: hidden, or the largest head
    row: int = 0           # a tile row's values to load
    ctas: int = 0
    rows: int = 0
    item_spans: tuple = ()  # per run: its groups' item numbers (``group_span``), spread over a CTA's threads
    n_ops: int = 0
    smem_us: int = 0
    product_phases: int = 1
    checks: tuple = ()     # per run: (reductions, head sizes of its head-wise products, rows of each product, whether
    #                        its products read different operands or run in different phases)


def placement(plan: CellPlan, layout, units) -> Placement:
    """:class:`Placement` of ``plan``, worked out once per plan object, layout and units in a process
    (``ranking.plan_memo``: every config of a space asks, twice) where they are a string and an int."""
    if type(layout) is str and type(units) is int:
        return _placements(plan, layout, units)
    return placed(plan, layout, units)


def placed(plan: CellPlan, layout, units) -> Placement:
    """:class:`Placement` of ``plan`` at ``layout`` and ``units``, worked out."""
    H, B = plan.hidden, plan.batch
    runs = parts(layout, plan)
    try:
        cols = OperandColumns.of(plan.reductions, H, units)
    except ConfigError as e:
        return Placement(runs, str(e))
    slices = max(sum(r.slices for r in reductions) for reductions, _, _ in runs)
    rows = slices * units
    checks = []
    for reductions, _, _ in runs:
        headed = tuple(sorted({r.head_size(H) for r in reductions} - {H}))
        checks.append((reductions, headed, tuple(r.slices * units for r in reductions),
                       len({(r.operand, r.phase) for r in reductions}) > 1))
    return Placement(runs, None, cols, cols.headed, cols.k_extent,
                     max((cols.span(op) for op in cols.sizes), default=H), len(runs) * math.ceil(H / units), rows,
                     tuple(len(groups) * group_span(B * units, len(groups)) for _, _, groups in runs),
                     max(len(operands) for _, operands, _ in runs), unit_sum_bytes(plan, B, units),
                     plan.product_phases, tuple(checks))


_placements = plan_memo(4096)(placed)


def geometry(cfg: PersistentConfig, plan: CellPlan) -> Geometry:
    """What ``cfg`` implies for ``plan``; ConfigError where its units fit no head of a head-wise product."""
    return placed_geometry(cfg, plan, placement(plan, cfg.layout, cfg.units_per_cta))


def placed_geometry(cfg: PersistentConfig, plan: CellPlan, at: Placement) -> Geometry:
    """:func:`geometry` of ``cfg`` from its :func:`placement` ``at``."""
    B, policy = plan.batch, plan.policy
    if at.problem:  # the units fit no head
        raise ConfigError(at.problem)
    K, row, rows = at.K, at.row, at.rows
    row_groups = max(1, math.ceil(rows / cfg.rows_per_thread))
    threads = _round_up(row_groups * cfg.k_split, 32)
    k_chunks = math.ceil(K / (cfg.vec * cfg.k_split)) if rows else 0
    k_pad = k_chunks * cfg.vec * cfg.k_split
    stride = _round_up(at.cols.tile_width(k_pad), 4) if at.headed else 0
    sc = min(cfg.smem_chunks, k_chunks)
    lc = min(cfg.l2_chunks, k_chunks - sc)
    weights = cfg.rows_per_thread * (k_chunks - sc - lc) * cfg.vec if rows else 0
    smem_ws = policy.itemsize * threads * cfg.rows_per_thread * sc * cfg.vec
    l2_ws = policy.itemsize * threads * cfg.rows_per_thread * lc * cfg.vec
    # (group, batch row, unit) items, each group on warps of its own
    ipt = max(math.ceil(span / threads) for span in at.item_spans)
    n_ops = at.n_ops
    smem_hs = policy.itemsize * n_ops * cfg.batch_tile * (stride or k_pad)
    smem_gs = itemsize(policy.accumulate) * B * rows
    # the loads the kind's poll holds while it waits (none for a kind that polls no values)
    tagged, poll_regs = barrier(cfg.barrier).polled_loads(cfg.batch_tile * row if n_ops else 0, threads, row,
                                                          policy.itemsize, n_ops)
    regs = (weights + cfg.rows_per_thread * cfg.batch_tile + cfg.vec + ipt * plan.item_values
            + poll_regs * tagged + REG_OVERHEAD + PHASE_OVERHEAD * (at.product_phases - 1))
    if sc or lc:  # a chunk's state vectors of the whole tile and one weight vector (persistent_weights)
        regs += cfg.batch_tile * cfg.vec + cfg.vec
    if lc:  # a streamed chunk's weight vectors of every row, loaded together, and each row's offset
        regs += (cfg.rows_per_thread - 1) * cfg.vec + cfg.rows_per_thread
    return Geometry(at.ctas, threads, rows, row_groups, k_chunks, k_pad, weights, math.ceil(B / cfg.batch_tile), ipt,
                    tagged, smem_hs, smem_gs, regs, stride, at.smem_us, sc, smem_ws, lc, l2_ws)


def refusal(plan: CellPlan, arch: str) -> str | None:
    """Why this template does not place ``plan`` on a GPU of ``arch`` at all, or None."""
    if plan.dtype not in DTYPES:
        return f"the persistent template places {', '.join(DTYPES)} cells, not {plan.dtype}"
    return None


def validate(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> Geometry:
    """Check a config before building; raise ConfigError with the reason, else return its geometry."""
    reason = refusal(plan, gpu.arch)
    if reason:
        raise ConfigError(reason)
    barrier(cfg.barrier)  # a kind it knows
    check_layout(cfg, plan)
    if cfg.k_split not in (1, 2, 4, 8, 16, 32):
        raise ConfigError(f"k_split={cfg.k_split}: must be a power of two from 1 to 32 (lanes of one warp)")
    if cfg.vec not in (1, 2, 4):
        raise ConfigError(f"vec={cfg.vec}: must be 1, 2 or 4")
    if cfg.units_per_cta < 1 or cfg.rows_per_thread < 1:
        raise ConfigError("units_per_cta and rows_per_thread must be at least 1")
    if not 1 <= cfg.batch_tile <= plan.batch:
        raise ConfigError(f"batch_tile={cfg.batch_tile}: must be between 1 and the batch ({plan.batch})")
    if cfg.units_per_cta > plan.hidden:
        raise ConfigError(f"units_per_cta={cfg.units_per_cta} exceeds hidden={plan.hidden}")
    if cfg.smem_chunks < 0:
        raise ConfigError(f"smem_chunks={cfg.smem_chunks}: the weight chunks a lane keeps in shared memory, 0 or more")
    check_atomic_sums(cfg, plan)
    at = placement(plan, cfg.layout, cfg.units_per_cta)
    g = placed_geometry(cfg, plan, at)
    if cfg.smem_chunks > g.k_chunks:
        raise ConfigError(f"smem_chunks={cfg.smem_chunks}: a lane's row has {g.k_chunks} chunks of {cfg.vec} weights "
                          f"(hidden {plan.hidden} over k_split {cfg.k_split}); at most {g.k_chunks} can be in shared "
                          "memory")
    check_streamed(cfg, g, plan, at)
    for reductions, headed, _, _ in at.checks:
        if at.headed:
            check_heads(at.cols, reductions, cfg.rows_per_thread, "rows_per_thread", "a thread's rows")
        if any(D % cfg.vec for D in headed):
            raise ConfigError(f"vec={cfg.vec}: a head-wise product's rows read their head's values from a multiple of "
                              f"its head size ({', '.join(map(str, headed))} units), in loads of vec values: vec must "
                              "divide it")
    if g.tagged_per_thread > 32:
        raise ConfigError(f"the '{cfg.barrier}' exchange polls {g.tagged_per_thread} state loads per thread "
                          f"(batch_tile {cfg.batch_tile} x hidden {plan.hidden} over {g.threads} threads, for each "
                          "operand one poll waits on); at most 32: "
                          "lower batch_tile")
    for _, _, products, mixed in at.checks:  # the products of one CTA
        if mixed and any(rows % cfg.rows_per_thread for rows in products):
            raise ConfigError(f"rows_per_thread={cfg.rows_per_thread} must divide the rows of each recurrent product "
                              f"({', '.join(map(str, products))}) when products read different operands or run in "
                              "different phases: a thread's rows must all belong to one product")
    if g.rows and cfg.rows_per_thread > g.rows:
        raise ConfigError(f"rows_per_thread={cfg.rows_per_thread} exceeds the {g.rows} rows of a CTA")
    if g.threads > 1024:
        raise ConfigError(f"{g.threads} threads per CTA ({g.row_groups} row groups x k_split {cfg.k_split}); "
                          "at most 1024: raise rows_per_thread or lower units_per_cta")
    check_resources(g, plan, gpu, f"{g.weights_per_thread} weights, {cfg.rows_per_thread * cfg.batch_tile} "
                    "accumulators", "lower rows_per_thread or batch_tile, raise k_split, or keep more weights in "
                    "shared memory (raise smem_chunks) or in global memory (raise l2_chunks)",
                    f"lower batch_tile{' or smem_chunks' if g.smem_ws else ''}"
                    f"{f' ({g.smem_ws} B of them weights)' if g.smem_ws else ''}")
    return g


def check_streamed(cfg: PersistentConfig, g: Geometry, plan: CellPlan, at: Placement) -> None:
    """ConfigError where ``l2_chunks`` cannot be read in place from the weight matrix, with the reason (``at``: the
    config's :func:`placement`)."""
    if cfg.l2_chunks < 0:
        raise ConfigError(f"l2_chunks={cfg.l2_chunks}: the weight chunks a lane reads from global memory, 0 or more")
    if not cfg.l2_chunks:
        return
    if cfg.smem_chunks + cfg.l2_chunks > g.k_chunks:
        raise ConfigError(f"smem_chunks={cfg.smem_chunks} and l2_chunks={cfg.l2_chunks}: a lane's row has "
                          f"{g.k_chunks} chunks of {cfg.vec} weights; together at most {g.k_chunks}")
    problem = streaming_problem(plan)
    if problem:
        raise ConfigError(f"l2_chunks={cfg.l2_chunks}: {problem}: use l2_chunks=0")
    for _, _, products, _ in at.checks:  # a thread reads one product's matrix
        if len(products) > 1 and any(rows % cfg.rows_per_thread for rows in products):
            raise ConfigError(f"l2_chunks={cfg.l2_chunks}: a thread reads its streamed chunks from one product's "
                              f"weight matrix, so rows_per_thread={cfg.rows_per_thread} must divide the rows of each "
                              f"product ({', '.join(map(str, products))})")
    if plan.hidden % cfg.vec or cfg.l2_chunks * cfg.vec * cfg.k_split > plan.hidden:
        raise ConfigError(f"l2_chunks={cfg.l2_chunks}: the streamed chunks are read in place, {cfg.vec} weights at a "
                          f"time, from the first {cfg.l2_chunks * cfg.vec * cfg.k_split} columns of each row: vec must "
                          f"divide hidden ({plan.hidden}) and those columns must lie within it: lower l2_chunks or vec")


def streaming_problem(plan: CellPlan) -> str | None:
    """Why ``plan``'s weights cannot stream from global memory (``l2_chunks``), or None. Products over heads have no
    dense matrix to read in place. A wavefront stack or a bidirectional layer of several products is not streamed:
    past the chip it runs as a launch per layer or per direction (``prnn_tvm.torch``), each holding its weights on
    chip, where one launch would read most of them from L2 every step."""
    if plan.heads > 1:
        return (f"the streamed chunks are read in place from dense recurrent weight matrices; cell '{plan.cell.name}' "
                "has products over heads")
    if len(plan.reductions) > 1 and (plan.lag or plan.reversed_states):
        return (f"cell '{plan.cell.name}' is a wavefront stack or runs both directions: past the chip it runs a launch "
                "per layer or direction, each on chip, rather than one streaming most of its weights")
    return None


def space(plan: CellPlan, gpu: GpuSpec, barriers: tuple = tuple(BARRIERS)) -> list[PersistentConfig]:
    """Candidate configs for a plan on a GPU (unvalidated): the template's tuning space."""
    H, B = plan.hidden, plan.batch
    tiles = sorted({t for t in (1, 2, 4, 8, 16, B) if t <= B})
    out = []
    sums = atomic_sums_offered(plan)
    for layout, runs, layout_barriers in layouts(plan, barriers):
        kinds = [(b, a) for b in layout_barriers for a in sums]
        min_units = math.ceil(runs * H / gpu.sms)
        units = sorted({u for u in (min_units, min_units + 1, 2 * min_units, 4 * min_units) if u <= H}
                       | fitting_units(plan, min_units))
        slices = max(sum(r.slices for r in reductions) for reductions, _, _ in parts(layout, plan))
        for u in units:
            rows = max(1, slices * u)
            # powers of two, and divisors of the CTA's rows so that no row group idles
            per_thread = sorted({r for r in range(1, 17) if r & (r - 1) == 0 or rows % r == 0})
            for ks in (1, 2, 4, 8, 16, 32):
                for r in per_thread:
                    for bt in tiles:
                        for vec in (1, 2, 4):
                            out.extend(PersistentConfig(u, ks, r, bt, vec, b, layout, atomic_sums=a) for b, a in kinds)
    tiered = out
    if tiers_offered(plan, gpu, out, validate):
        tiered = [dataclasses.replace(base, smem_chunks=sc) for base in out for sc in weight_tiers(base, plan, gpu)]
    if not offers_streaming(plan, gpu):
        return tiered
    return tiered + [dataclasses.replace(base, smem_chunks=sc, l2_chunks=lc) for base in out
                     for sc, lc in streamed_tiers(base, plan, gpu)]


def weight_tiers(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> list[int]:
    """The ``smem_chunks`` a space offers for ``cfg`` (``ranking.tier_counts``)."""
    try:
        g = geometry(cfg, plan)
    except ConfigError:  # validate says why
        return [0]
    excess = g.regs_estimate - max_regs_per_thread(g.threads, gpu)
    # each chunk frees a register per row and vec; the first adds a tile's state vectors and a weight vector
    return tier_counts(excess if g.rows else 0, cfg.batch_tile * cfg.vec + cfg.vec, cfg.rows_per_thread * cfg.vec,
                       g.k_chunks)


def streamed_tiers(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> list[tuple[int, int]]:
    """The ``(smem_chunks, l2_chunks)`` a space offers for ``cfg`` past registers and shared memory together: as many
    chunks in shared memory as the block's limit takes, and the fewest streamed chunks that bring the register estimate
    under the cap, with the next ``TIER_STEPS - 1`` (fallbacks where ptxas spills); none where shared memory alone
    suffices (``weight_tiers`` offers that) or the config cannot stream (``check_streamed``)."""
    try:
        g = geometry(cfg, plan)
    except ConfigError:
        return []
    if not g.rows or streaming_problem(plan) or plan.hidden % cfg.vec:
        return []
    chunk = plan.policy.itemsize * g.threads * cfg.rows_per_thread * cfg.vec  # bytes of one chunk over the CTA
    room = gpu.smem_per_block - STATIC_SMEM_RESERVE - weights_offset(g.smem_hs + g.smem_gs + g.smem_us)
    sc = max(0, min(g.k_chunks, room // chunk))
    excess = g.regs_estimate - max_regs_per_thread(g.threads, gpu)
    staging = cfg.batch_tile * cfg.vec + cfg.vec + (cfg.rows_per_thread - 1) * cfg.vec + cfg.rows_per_thread
    needed = -(-(excess + staging) // (cfg.rows_per_thread * cfg.vec))  # chunks out of registers
    most = min(g.k_chunks - sc, plan.hidden // (cfg.vec * cfg.k_split))  # streamed columns within the row
    least = needed - sc
    if excess <= 0 or least <= 0 or least > most:
        return []
    return [(sc, lc) for lc in range(least, min(least + TIER_STEPS, most + 1))]


GEOMETRY_FEATURES = ("ctas", "threads", "rows", "k_chunks", "weights_per_thread", "batch_chunks",
                     "items_per_thread", "tagged_per_thread", "smem_bytes", "smem_ws", "l2_ws")


def features(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> dict:
    """The cost model's view of a valid config: knobs, barrier one-hot, geometry, occupancy, estimate."""
    g = geometry(cfg, plan)
    row = {k: getattr(cfg, k) for k in ("units_per_cta", "k_split", "rows_per_thread", "batch_tile", "vec",
                                        "smem_chunks", "l2_chunks", "atomic_sums")}
    row.update({f"barrier={b}": float(cfg.barrier == b) for b in BARRIERS})
    row["layout=split"] = float(cfg.layout == "split")
    row.update({k: getattr(g, k) for k in GEOMETRY_FEATURES})
    row.update(regs_estimate=g.regs_estimate, ctas_per_sm=ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, gpu),
               log2_estimated_cycles=math.log2(estimated_cycles(cfg, g)), registers=g.regs_estimate)
    return row


def estimated_cycles(cfg: PersistentConfig, g: Geometry) -> float:
    """A rough per-step cost in SM cycles, used only to pick the untuned default.

    Per batch tile: FMAs issue at 4 warp-instructions per cycle; shared memory delivers
    one 128-byte wavefront (one 32-bit word for each lane of a warp) per cycle, however
    wide the load, and each load instruction adds a quarter cycle; a shuffle costs about
    3 cycles per warp with its dependent add (``lane_shuffles``: the lane reduction halves
    what it exchanges at each distance); the tile pays an L2 round trip for the states and
    two block barriers (``TILE_OVERHEAD``). Fewer than 8 warps cannot hide latency (last
    factor).

    Calibrated on an H100 sweep of LSTM hidden=1024 batch=4 (``prnn-tvm tune --search grid``), which
    ranked k_split=16/rows_per_thread=2 (3.0 us/step) ahead of 32/4 (3.3) and 8/1 (4.0) while every
    lane summed every value. With the halving it ranks 32/4 first: on the H100 2.73 us per step
    against 2.99 for 16/2, and lower or level at every default it changed (LSTM 512x16 4.21 against
    5.18, 1024x64 18.4 against 24.0; Cho's GRU 512x4 and RNN 512x1 level).

    Weights in shared memory (``smem_chunks``) are read again for every batch tile: ``vec`` wavefronts and a
    load instruction per chunk and row (an uncalibrated guess: no H100 figures yet). Weights read from global
    memory (``l2_chunks``) cost their bytes at ``L2_BYTES_PER_CYCLE`` per SM, every tile (a guess too).
    """
    warps = g.threads / 32
    words = cfg.batch_tile * g.k_chunks * cfg.vec  # state words each thread reads per tile
    fma = warps / 4 * words * cfg.rows_per_thread
    lds = warps * words + warps * cfg.batch_tile * g.k_chunks / 4  # wavefronts + load instructions
    shared_weights = cfg.rows_per_thread * g.smem_chunks  # vec-wide weight loads per thread and tile (the tiers)
    lds += warps * shared_weights * (cfg.vec + 0.25)
    streamed = g.l2_ws / L2_BYTES_PER_CYCLE
    shfl = 3 * warps * lane_shuffles(cfg.rows_per_thread * cfg.batch_tile, cfg.k_split)
    per_tile = (max(fma, lds, streamed) + shfl) * max(1.0, 8 / warps) + TILE_OVERHEAD
    return g.batch_chunks * per_tile


@per_plan
def ranked_configs(plan: CellPlan, gpu: GpuSpec, limit: int = 4) -> list[PersistentConfig]:
    """The untuned choices, best first: one CTA per SM at most, then least estimated cost.

    Each takes the barrier ``tags`` when it fits as it is (on an H100 it was up to 23%
    faster per step at batch 1-4, and within 5% elsewhere), else ``counter`` (as fast as
    cooperative ``grid.sync()``, and bounded). Later entries, each with fewer weights per
    thread, are what a build falls back to when ptxas spills (the register estimate is a
    model; ptxas decides).
    """
    local = block_local(plan, gpu, space, validate, estimated_cycles, limit, "persistent")
    ladder = layered_defaults(plan, gpu, space(plan, gpu, barriers=(RANKED_WITH,)), validate, estimated_cycles, limit,
                              "persistent")
    return local + [with_barrier(cfg, PREFERRED, plan, gpu, validate) for cfg in ladder]


def saving_config(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> PersistentConfig:
    """The config of the training forward (``recurrent_save``) of a layer built with ``cfg``
    (``ranking.shared_layout``)."""
    return shared_layout(cfg, plan, gpu, validate, ranked_configs)


def carried(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> None:
    """None: no record of this template is carried over to another hidden size (``ranking.carried_over``, which the
    tensor-core template takes, rests on half-precision records; nothing has measured it on these configs)."""
    return None


def default_config(plan: CellPlan, gpu: GpuSpec) -> PersistentConfig:
    """The untuned choice (the first of :func:`ranked_configs`)."""
    return ranked_configs(plan, gpu, limit=1)[0]



def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m

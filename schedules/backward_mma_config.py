"""Knobs of the tensor-core backward (``backward_mma``): the forward's ``MmaConfig`` over the transposed weights.

Per step the backward multiplies the gate gradients (B x gate rows) by the recurrent weights: what each
operand's unit receives is ``sum_k W[k, unit] d_gates[b, k]``. On the tensor cores the transposed weights are
the A operand (rows: (operand, unit), the operands one after another, each from a row tile boundary; k: every
product's gate rows, zero for the products of other operands), the gate gradients of a batch tile the B
operand (N = 8 batch rows), float32 accumulators. A CTA of ``units_per_cta`` units holds
``ceil(units_per_cta / 16)`` row tiles per operand; ``k_groups`` warps split a row tile's k range, as in the
forward (``persistent_mma_config``); ``n_tiles``, ``m_tiles_per_warp`` and ``k_chains`` mean what they mean
there. The exchange is the float32 backward's: the gate gradients through the workspace between plain grid
barriers (here in the half type), a CTA copying every product's into its shared tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.dtypes import itemsize
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.signature import Grid
from prnn_tvm.target import GpuSpec, resident_ctas

from . import persistent_backward as fb
from . import persistent_mma_config as mc
from .cluster_copy import CLUSTERS, GRANULE
from .persistent_config import REG_OVERHEAD
from .persistent_mma_config import K_GROUPS, ROW_SKEW, TILE_K, TILE_M, TILE_N, MmaConfig, MmaGeometry
from .ranking import RANKED_WITH, check_resources, per_plan, ranked_defaults


@dataclass(frozen=True)
class BackwardMmaConfig(MmaConfig):
    """The forward's knobs, and ``shared_k_tiles``: of each warp's k tiles, how many (the last) keep their A
    fragments in shared memory rather than registers, read back (16 bytes a lane) at every product. A CTA's row
    tile holds 16 rows of every gate row whatever its units: at fp16 LSTM 1536 that is 16 x 6144 weights, 96
    registers per thread at 512 threads besides the ~50 the step takes, and ptxas spilled every config; with a
    third of the k tiles in shared memory it does not.

    ``copy_stages``: where each k group is one warp (``warp_rows`` 1: one row tile of one operand, as LSTM
    1024 x 16 at 16 units), each warp copies only the gate gradients its own products read (its k group's
    columns), in that many stages (at most one per k tile of the warp), each its own ``cp.async`` group: it waits
    for a stage's group alone (no block barrier) and multiplies it while the later stages land. 0: the block
    copies the whole tile, waits for all of it and meets at a block barrier before any product (what warps that
    share a k group always do).

    ``prefetch_steps``: how many steps on (backwards) each item asks the forward's values it will read there (its
    ``xp``, ``saved`` columns and ``d_out``: float32, from DRAM, read once) into L2 (``prefetch.global.L2``), as the
    forward does for its ``xp``; 0: none.

    ``cluster``: CTAs per thread-block cluster (sm_90+), which share one copy of each pass's gate gradients: each
    fetches ``1/cluster`` of them and multicasts it into every CTA of the cluster (``cluster_copy``), the grid
    reading them from L2 once per cluster; 1: none, each CTA copies all of them (``copy_stages``). In clusters
    ``copy_stages`` 0 is the block's wait for the whole tile, 1 each warp's wait for its own k group's columns
    alone (where it would copy them alone, in a cell of one phase; else the block's). It takes a tile that holds
    the whole batch (one pass per phase), gate gradient rows of whole 16-byte granules and a barrier with an error
    word (the copy's waits give up with it)."""

    shared_k_tiles: int = field(default=0, metadata={"short": "skt", "quiet": True})
    copy_stages: int = field(default=2, metadata={"short": "cs", "quiet": True})
    prefetch_steps: int = field(default=2, metadata={"short": "pf", "quiet": True})
    cluster: int = field(default=1, metadata={"short": "cl", "quiet": True})


# what the backward's exchange takes of the forward's knobs (anything else is refused by validate)
FIXED = {"layout": "shared", "batch_groups": 1, "poll_sleep": 0, "operand_path": "shared", "smem_k_tiles": 0,
         "l2_k_tiles": 0}  # its own tiers: shared_k_tiles
# Copying the gate gradients' tile: every CTA reads all of them (128 KB a step at LSTM 1024 x 16, 4x the forward's
# state), bounded by an SM's share of L2 reads and by L2 itself over the grid, from the forward's figure on the
# H100 (DESIGN.md: 4 MB of state reads a step cost about a barrier, 1.3 us, ~1750 bytes per cycle). By that
# bound fewer CTAs of more units copy less in all: at LSTM 1024 x 16, 64 CTAs of 16 units (whose row tiles hold no
# padding) rank before 128 of 8 (an estimate: measure both, bench/training.py).
L2_BYTES_PER_CYCLE = 64
L2_GRID_BYTES_PER_CYCLE = 1750
SHARED_TILE_CYCLES = 16  # per k tile of A fragments a warp reads back from shared memory, per pass (a guess)
# registers the backward's step takes beyond the forward's estimate: ptxas spilled fp16 LSTM 1536 x 16 at k_groups
# 8 (192 weight registers, estimated 253 of 255) and took 52-82 registers besides the weights at LSTM 1024 x 16
REG_MARGIN = 16
A_TILE_BYTES = 32 * 16  # a warp's A fragments of one row tile and k tile: 16 bytes a lane
COPY_STAGES = (0, 1, 2, 4)  # ``copy_stages``: 0 the block's whole-tile copy, else a warp's own columns in stages
MAX_PREFETCH_STEPS = 8  # ``prefetch_steps``: lines asked into L2 stay there for a few steps, not for long
# The clusters the untuned default takes, best first, each with its ``copy_stages`` (measured on the H100 at fp16
# LSTM 1024 x 16, bench/results/training-clusters-h100.md: training step 2.537 ms at one copy per CTA, 2.348 in
# clusters of 8 with the block's wait, 2.395 in clusters of 4 with each warp's; the backward's step 4.96 -> 4.26 us)
CLUSTERED_DEFAULTS = ((8, 0), (4, 1))


def refusal(plan: CellPlan, arch: str) -> str | None:
    """Why this template cannot place the backward of ``plan`` on ``arch`` (the float32 backward may), or None."""
    reason = fb.refusal(plan) or mc.refusal(plan, arch)
    if reason:
        return reason
    if fb.head_size(plan) != plan.hidden:
        return (f"cell '{plan.cell.name}' has head-wise products; the tensor-core backward multiplies dense ones "
                "(the float32 backward takes it)")
    return None


def tiles_per_operand(units: int) -> int:
    """Row tiles of one operand's units in a CTA."""
    return math.ceil(units / TILE_M)


def geometry(cfg: BackwardMmaConfig, plan: CellPlan) -> MmaGeometry:
    H, B, U = plan.hidden, plan.batch, cfg.units_per_cta
    K = fb.gate_rows(plan) * H
    m_tiles = len(plan.operands) * tiles_per_operand(U) if plan.reductions else 0
    mw = cfg.m_tiles_per_warp
    warp_rows = math.ceil(m_tiles / mw)
    threads = 32 * max(1, warp_rows * cfg.k_groups)
    kt = math.ceil(math.ceil(K / TILE_K) / cfg.k_groups) if m_tiles else 0
    k_pad = TILE_K * kt * cfg.k_groups if m_tiles else mc._round_up(max(1, K), TILE_K)
    ipt = math.ceil(B * U / threads)
    item_regs = 2 * len(plan.states) + len(plan.exchanged_stages) + sum(p.slices for p in plan.params) + 1
    weights = 4 * (kt - cfg.shared_k_tiles) * mw
    accumulators = 4 * mw * cfg.k_chains * cfg.n_tiles
    regs = weights + accumulators + 2 * cfg.n_tiles + ipt * item_regs + REG_OVERHEAD + REG_MARGIN
    # the gate gradients' tile, then the A fragments kept in shared memory (``shared_k_tiles``)
    smem_ops = itemsize(plan.dtype) * cfg.batch_tile * (k_pad + ROW_SKEW) + shared_fragment_bytes(cfg, threads)
    sum_stride = mc.gate_sum_stride(m_tiles * TILE_M, U)
    smem_gs = mc._round_up(itemsize(plan.policy.accumulate) * cfg.k_groups * B * sum_stride, 16)
    return MmaGeometry(math.ceil(H / U), threads, m_tiles, warp_rows, m_tiles * TILE_M, sum_stride, kt, k_pad,
                       weights, math.ceil(B / cfg.batch_tile), ipt, 0, smem_ops, smem_gs, regs)


def shared_fragment_bytes(cfg: BackwardMmaConfig, threads: int) -> int:
    """Bytes of the A fragments in shared memory: ``shared_k_tiles`` k tiles of every row tile of every warp."""
    return threads // 32 * cfg.m_tiles_per_warp * cfg.shared_k_tiles * A_TILE_BYTES


def validate(cfg: BackwardMmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaGeometry:
    """Check a config before building; ConfigError with the reason, else its geometry."""
    reason = refusal(plan, gpu.arch)
    if reason:
        raise ConfigError(reason)
    if barrier(cfg.barrier).polls_values:
        raise ConfigError(f"the backward's barrier is one of {', '.join(fb.PLAIN)}, not '{cfg.barrier}'")
    problem = barrier(cfg.barrier).placement_problem(plan, cfg.units_per_cta)
    if problem:
        raise ConfigError(problem)
    if cfg.batch_groups != 1:
        raise ConfigError(f"batch_groups={cfg.batch_groups}: the tensor-core backward multiplies dense products, "
                          "whose blocks meet over the grid every step: groups of batch rows would wait for each other "
                          "there and only add CTAs to the barrier (the float32 backward takes batch groups, for "
                          "head-wise products a CTA holds whole: backward_groups); take batch_groups=1")
    fixed = {k: v for k, v in FIXED.items() if getattr(cfg, k) != v}
    if fixed:
        raise ConfigError(f"the tensor-core backward takes {', '.join(f'{k}={v!r}' for k, v in FIXED.items())}, "
                          f"not {', '.join(f'{k}={getattr(cfg, k)!r}' for k in fixed)}")
    if not 1 <= cfg.units_per_cta <= plan.hidden:
        raise ConfigError(f"units_per_cta={cfg.units_per_cta} must be in [1, hidden={plan.hidden}]")
    if cfg.k_groups not in K_GROUPS:
        raise ConfigError(f"k_groups={cfg.k_groups}: must be one of {', '.join(map(str, K_GROUPS))}")
    if cfg.n_tiles not in (1, 2, 4, 8) or cfg.batch_tile > mc._round_up(plan.batch, TILE_N):
        raise ConfigError(f"n_tiles={cfg.n_tiles}: 1, 2, 4 or 8 batch tiles of 8 rows per pass, at most "
                          f"{mc._round_up(plan.batch, TILE_N) // TILE_N} for a batch of {plan.batch}")
    per_operand = tiles_per_operand(cfg.units_per_cta)
    if cfg.m_tiles_per_warp not in mc.M_TILES_PER_WARP or per_operand % cfg.m_tiles_per_warp:
        raise ConfigError(f"m_tiles_per_warp={cfg.m_tiles_per_warp}: one of {mc.M_TILES_PER_WARP} dividing the "
                          f"{per_operand} row tiles of an operand's {cfg.units_per_cta} units (a warp's rows send "
                          "back in one phase)")
    g = geometry(cfg, plan)
    k_tiles = math.ceil(fb.gate_rows(plan) * plan.hidden / TILE_K)
    if g.m_tiles and cfg.k_groups > k_tiles:
        raise ConfigError(f"k_groups={cfg.k_groups} exceeds the {k_tiles} k tiles of the gate gradients")
    if cfg.k_chains not in mc.K_CHAINS or cfg.k_chains > max(1, g.k_tiles_per_warp):
        raise ConfigError(f"k_chains={cfg.k_chains}: one of {mc.K_CHAINS}, at most the {g.k_tiles_per_warp} k "
                          "tiles of a warp")
    if not 0 <= cfg.shared_k_tiles <= g.k_tiles_per_warp:
        raise ConfigError(f"shared_k_tiles={cfg.shared_k_tiles}: between 0 and the {g.k_tiles_per_warp} k tiles of a "
                          "warp")
    if cfg.copy_stages not in COPY_STAGES:
        raise ConfigError(f"copy_stages={cfg.copy_stages}: one of {', '.join(map(str, COPY_STAGES))}")
    if not 0 <= cfg.prefetch_steps <= MAX_PREFETCH_STEPS:
        raise ConfigError(f"prefetch_steps={cfg.prefetch_steps}: between 0 and {MAX_PREFETCH_STEPS}")
    if g.threads > 1024:
        raise ConfigError(f"{g.threads} threads per CTA ({g.m_tiles} row tiles x k_groups {cfg.k_groups}); at most "
                          "1024: lower k_groups or units_per_cta, or raise m_tiles_per_warp")
    check_resources(g, plan, gpu, f"{g.weights_per_thread} of transposed weight fragments",
                    "raise k_groups or shared_k_tiles, or lower n_tiles", "lower n_tiles or shared_k_tiles")
    check_cluster(cfg, g, plan, gpu)
    return g


def check_cluster(cfg: BackwardMmaConfig, g: MmaGeometry, plan: CellPlan, gpu: GpuSpec) -> None:
    """ConfigError where ``cluster`` cannot share the copy of the gate gradients (``cluster_copy``): the
    architecture, the grid, the copy's shape, the barrier, and whole clusters co-resident."""
    c = cfg.cluster
    if c not in CLUSTERS:
        raise ConfigError(f"cluster={c}: one of {', '.join(map(str, CLUSTERS))} CTAs per thread-block cluster")
    if c == 1:
        return
    if not gpu.gpcs:
        raise ConfigError(f"cluster={c}: thread-block clusters need sm_90 or later, not {gpu.arch}; take cluster=1")
    if not g.m_tiles:
        raise ConfigError(f"cluster={c}: cell '{plan.cell.name}' sends no gate gradients back; take cluster=1")
    if g.ctas % c:
        fits = [u for u in range(cfg.units_per_cta, plan.hidden + 1) if math.ceil(plan.hidden / u) % c == 0][:3]
        raise ConfigError(f"cluster={c}: the grid's {g.ctas} CTAs (hidden {plan.hidden} / units_per_cta "
                          f"{cfg.units_per_cta}) are not whole clusters of {c}; take units_per_cta in "
                          f"{fits or 'none'} or another cluster")
    row = fb.gate_rows(plan) * plan.hidden * itemsize(plan.dtype)
    if row % GRANULE or row // GRANULE < c:
        raise ConfigError(f"cluster={c}: a batch row of the gate gradients is {row} bytes, which the bulk copy cannot "
                          f"split into {c} parts of whole {GRANULE}-byte granules; take cluster=1")
    if g.batch_chunks != 1:
        raise ConfigError(f"cluster={c}: the shared tile must hold the whole batch (one copy a phase, whose landing "
                          f"the peers' next copy waits for through the grid barrier): take n_tiles="
                          f"{mc._round_up(plan.batch, TILE_N) // TILE_N}")
    if cfg.copy_stages > 1:
        raise ConfigError(f"cluster={c}: the cluster's copy lands as one, waited for by the block (copy_stages=0) or "
                          f"by each warp for its own columns (1), not in copy_stages={cfg.copy_stages}; take 0 or 1")
    if barrier(cfg.barrier).state_words is None:
        raise ConfigError(f"cluster={c}: the copy's wait gives up with the grid barrier's error word, which "
                          f"'{cfg.barrier}' has none of; take a barrier with one ({', '.join(with_error_word())})")
    grid = Grid(g.ctas, g.threads, g.smem_bytes, True, registers=g.regs_estimate, cluster=c)
    fit = resident_ctas(grid, gpu)
    if g.ctas > fit:
        raise ConfigError(f"cluster={c}: {g.ctas // c} clusters of {c} CTAs cannot be co-resident on {gpu.arch}: "
                          f"{fit // c} fit (at least: {gpu.sms} SMs in up to {gpu.gpcs} GPCs, a cluster in one, at "
                          f"{g.threads} threads, ~{g.regs_estimate} registers, {g.smem_bytes} bytes of shared memory "
                          "per CTA); take a smaller cluster or raise units_per_cta")


def with_error_word() -> list[str]:
    """The backward's barriers whose state has the error word a cluster's copy gives up with."""
    return [name for name in fb.PLAIN if barrier(name).state_words is not None]


def space(plan: CellPlan, gpu: GpuSpec, clusters: tuple = CLUSTERS) -> list[BackwardMmaConfig]:
    """The configs the default is ranked from: units spread over the SMs (also whole row tiles of them), the
    forward's k groups, batch tiles, row tiles per warp and chains (these only where a warp has one accumulator
    set), and none, a quarter, a third or half of a warp's k tiles in shared memory; each in ``clusters`` (a
    cluster's with the block's wait or each warp's, ``copy_stages`` 0 or 1)."""
    H = plan.hidden
    least = math.ceil(H / gpu.sms)
    units = sorted({u for u in (least, least + 1, mc._round_up(least, TILE_M), 2 * least) if u <= H})
    most = mc._round_up(plan.batch, TILE_N) // TILE_N
    k_tiles = math.ceil(fb.gate_rows(plan) * H / TILE_K)

    def shared(kg: int) -> list[int]:
        kt = math.ceil(k_tiles / kg)
        return sorted({0, kt // 4, kt // 3, kt // 2})

    copies = [{"cluster": 1}] * (1 in clusters) + [{"cluster": c, "copy_stages": s} for c in clusters if c > 1
                                                   for s in (0, 1)]
    return [BackwardMmaConfig(u, kg, nt, RANKED_WITH, m_tiles_per_warp=mw, k_chains=kc, shared_k_tiles=skt, **copy)
            for u in units for kg in K_GROUPS for nt in (1, 2, 4, 8) if nt <= most
            for mw in mc.M_TILES_PER_WARP for kc in mc.K_CHAINS if kc == 1 or nt * mw == 1 for skt in shared(kg)
            for copy in copies]


def estimated_cycles(cfg: BackwardMmaConfig, g: MmaGeometry) -> float:
    """The forward's estimate (``persistent_mma_config.estimated_cycles``) plus each pass's copy of the gate
    gradients' tile from L2 (every CTA reads all of them: ``k_pad`` columns of ``batch_tile`` rows; in clusters a
    CTA reads ``1/cluster`` of them, an estimate to check on the GPU) and its reads of the A fragments kept in
    shared memory."""
    tile = cfg.batch_tile * g.k_pad * 2
    copy = max(tile / L2_BYTES_PER_CYCLE, g.ctas * tile / L2_GRID_BYTES_PER_CYCLE) / cfg.cluster
    fragments = cfg.shared_k_tiles * cfg.m_tiles_per_warp * SHARED_TILE_CYCLES
    return mc.estimated_cycles(cfg, g) + g.batch_chunks * (copy + fragments)


@per_plan
def ranked_configs(plan: CellPlan, gpu: GpuSpec, limit: int = 4) -> list[BackwardMmaConfig]:
    """The untuned choices, least estimated cost first (not units spread over every SM first, as the forward's:
    the copy of the gate gradients favours fewer CTAs), each later one holding fewer weight registers per thread
    (what a build falls back to when ptxas spills), each in the first cluster of ``CLUSTERED_DEFAULTS`` it takes
    (:func:`clustered`); ConfigError where none fits."""
    reason = refusal(plan, gpu.arch)
    if reason:
        raise ConfigError(reason)
    ranked = ranked_defaults(plan, gpu, space(plan, gpu, (1,)), validate, estimated_cycles, limit,
                             "tensor-core backward", spread=False)
    return [clustered(cfg, plan, gpu) for cfg in ranked]


def clustered(cfg: BackwardMmaConfig, plan: CellPlan, gpu: GpuSpec) -> BackwardMmaConfig:
    """``cfg`` in the first cluster (with its ``copy_stages``) of ``CLUSTERED_DEFAULTS`` that it validates in (the
    grid in whole clusters, co-resident, the copy splittable: :func:`check_cluster`), else ``cfg`` itself. The
    ranking's estimate keeps one copy per CTA: the cluster's gain is a measured one, not the estimate's."""
    for c, stages in CLUSTERED_DEFAULTS:
        candidate = replace(cfg, cluster=c, copy_stages=stages)
        try:
            validate(candidate, plan, gpu)
        except ConfigError:
            continue
        return candidate
    return cfg

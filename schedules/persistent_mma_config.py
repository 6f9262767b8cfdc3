"""Knobs of the tensor-core persistent template, their geometry, validation and default.

The recurrent products run as ``mma.sync.m16n8k16`` (half-precision operands, float32
accumulators): the weights are the A operand (16 gate rows x 16 hidden columns per tile),
the exchanged state the B operand (16 hidden x 8 batch rows), so a batch of 1 to 8 costs
one tile and any batch is padded to a multiple of 8 inside the kernel.

A CTA owns ``units_per_cta`` hidden units; product ``i`` gets ``ceil(slices_i * units / 16)``
row tiles of its own (rows past its end are zero weights), so a tile never mixes products.
Each row tile is split along k over ``k_groups`` warps: warp ``(m, kg)`` holds the A
fragments of ``m_tiles_per_warp`` row tiles from ``m * m_tiles_per_warp`` for k tiles
``kg * k_tiles_per_warp ..`` in registers for the whole launch, and the ``k_groups`` partial
sums meet in shared memory. The batch runs in passes of ``n_tiles`` x 8 rows. A warp with two
row tiles loads each B fragment from shared memory once for both (half the shared reads of
the state per step, fewer warps). ``k_chains`` sets of accumulators take the warp's k tiles in turn
(summed before the partial sums are stored): ``k_chains`` independent chains of mma steps where one
would wait on each step before the next.

``batch_groups`` splits the batch into that many equal groups of rows, each on CTAs of its own that hold
all the weights and exchange only their group's rows: batch rows never read each other, so with a barrier
that synchronizes through the data (``tags``, ``sentinel``) a group never waits for another, and each
exchanges a tile of B / batch_groups rows among H / units_per_cta CTAs (as many as one group of that
batch alone would). With ``block`` (every block holds whole heads, or a single block every unit) no CTA waits for
any other at all, so a group can be as small as one row: ``batch_groups`` x (a group's CTAs), each a span of heads for
its own group's rows, the weights once per group. Its point is the step's latency where few CTAs hold the heads
(issue 49: 12 CTAs of heads of 64 run every pointwise item of all 16 rows while 120 SMs idle): each CTA does the
products and pointwise math of B / batch_groups rows. The untuned default takes them up to :data:`BLOCK_GROUPS_MOST`
(:func:`grouped`).

``poll_sleep`` (nanoseconds; those barriers only) makes a thread that polls for values not written yet
sleep about that long between polls (``prnn_poll_pause``). Where many CTAs poll large tiles, the polls of
the same L2 lines slow the very stores they wait for (H100, LSTM fp16, us per step: 1024x16 in two groups
2.36 -> 2.22 at 256 ns, 1024x32 in two groups 3.80 -> 3.30 at 512, 512x32 in four groups 2.05 -> 1.88 at
256); on small tiles the sleep only adds latency (512x4 1.19 -> 1.56 at 256), so the space offers it from
SLEEP_MIN_ROWS rows per group up.

``operand_path`` says how a warp gets the B fragments (the exchanged state) it multiplies. ``shared``: the
CTA copies the state tile into shared memory (polled there with ``sentinel`` and ``tags``), a block barrier, then
each warp reads its fragments with ``ldmatrix``. ``direct`` (``sentinel`` only): each lane polls its own fragments
from the output sequence straight into registers, with 16-byte loads of the k range its warp multiplies, and starts
its products as soon as they hold no sentinel: no shared tile, no block barrier before the products, and the k
groups' partial sums double-buffered by step parity, so one block barrier a step. The k order inside a warp's range
is permuted so that each 16-byte load of a lane holds whole fragments and a warp's loads are contiguous
(:func:`direct_k`), the same permutation applied to the weights' columns. Over more than one batch tile the tiles
run in turn, each published before the next is multiplied (``PersistentBuilder.tile_by_tile``). It is what cuDNN's
persistent LSTM kernel does (its SASS: ``LDG.E.128.STRONG.GPU`` into the ``HMMA`` operands, every warp holding all
the CTA's row tiles, the k range split over the warps, two passes of 8 rows at batch 16); with ``m_tiles_per_warp``
below the CTA's row tiles, warps sharing a k range load the same values.

``smem_k_tiles`` (the weight tiers): of each warp's ``k_tiles_per_warp`` k tiles, the last ``smem_k_tiles`` keep
their A fragments in shared memory instead of registers, loaded once before the time loop and read again in every
pass (``persistent_fragments`` gives their layout), so a CTA holds more weights than its registers do; 0 (every
fragment in registers) is what configs and tuning records from before the knob mean.

``l2_k_tiles`` (the third tier, past registers and shared memory together): the first ``l2_k_tiles`` of each warp's
k tiles keep their A fragments in global memory, read in place every pass (``streamed_tier`` says how); 0 is what
configs and records from before the knob mean.

``xp`` (``float32`` or ``half``): the type of the input projection ``xp``, float32 or the layer's half type (as
cuDNN keeps it): the projection's GEMM accumulates in float32 and rounds once as it stores (half its bytes written),
and each step reads half the bytes, widened to float32 in registers where the pointwise math reads them. It rounds
each gate pre-activation's input part once more (2^-11 relative for float16, 2^-8 for bfloat16), the size of the
rounding of each step's new state that the dtype's tolerance already bounds (``tests/test_half_xp.py`` runs the CPU
build on such an ``xp`` against float64 with the unchanged bounds). ``float32`` is what configs and tuning records
from before the knob mean; the untuned defaults take ``half`` (:data:`XP_DEFAULT`). A training forward keeps
float32 (``saving_config``), as does a kernel that projects its own input (a session's, the one-step projected
launch: their projection stays in shared memory, in float32).

``layout`` (``shared`` or ``split``: each part of the step on CTAs of its own) is explained in
``ranking``, which both persistent templates share.

``atomic_sums`` (cells that sum over units, ``c.mean``): 0, each block reads every block's partial sum after the
barrier in a fixed order (deterministic); R in 1, 2, 4, 8, the blocks add their partials into R accumulators by
atomics and a total is R loads (not bit-deterministic from run to run): ``persistent_sums``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.dtypes import M16N8K16, TENSOR_CORE_DTYPES, itemsize, mma_dims, policy
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import GpuSpec, ctas_per_sm, max_regs_per_thread

from .gate_layout import BATCH_WARPS, check_batch_warps, check_gate_layout, in_warp_problem, in_warp_tiles
from .head_columns import OperandColumns, check_heads, fitting_units
from .persistent_config import REG_OVERHEAD, group_span
from .persistent_sums import atomic_sums_offered, check_atomic_sums, unit_sum_bytes
from .ranking import (
    PREFERRED,
    RANKED_WITH,
    block_local,
    carried_over,
    check_layout,
    check_resources,
    knobs_of,
    layered_defaults,
    layouts,
    offers_streaming,
    parts,
    per_plan,
    ranked_defaults,
    shared_layout,
    tier_counts,
    tiered_smem,
    tiers_offered,
    weights_offset,
    with_barrier,
)
from .streamed_tier import check_streamed, direct_loads, staging_regs, streamed_cycles, streamed_tiers

SHAPE = M16N8K16  # the mma shape whose fragment layouts persistent_fragments places
DTYPES = tuple(d for d in TENSOR_CORE_DTYPES if policy(d).mma.shape == SHAPE)  # storage dtypes it places
TILE_M, TILE_N, TILE_K = mma_dims(SHAPE)
ROW_SKEW = 8  # extra elements per shared operand row: consecutive rows start 4 banks apart
MMA_CYCLES = 8  # per dependent mma.sync step, as it overlaps with the loads (fitted, see estimated_cycles)
TILE_OVERHEAD = 800  # cycles per batch pass: an L2 round trip for the states and two block barriers
MAX_K_GROUPS = 16
TAGS_MAX_ROWS = 8  # a tagged half value moves 8 bytes: worth it at small batches (H100: 1.25x at batch 1)
# The kind of a plan that sums over units (``persistent_sums``: a grid barrier after each phase of sums, three a step
# of the layer-normalized LSTM): H100, lstm_layernorm fp16 1024 x 8 at 8 units and 4 k groups a block, grid.sync()
# 5.833 us a step against counter's 6.592 (bench/results/heads-flashrnn-h100.md)
SUMS_BARRIER = "grid_sync"
# and the sums' exchange the default takes (``atomic_sums``): one accumulator the blocks add into by atomics, a total
# one load (not bit-deterministic; 0, every block reading each block's partial in a fixed order, is): H200,
# lstm_layernorm fp16 1024 x 8, the same config, 4.454 us a step against the partials' 6.051 (2 replicas 4.461, 4
# 4.698, 8 4.769; bench/results/layernorm-atomics-h200.md)
SUMS_ATOMICS = 1
K_GROUPS = (1, 2, 3, 4, 6, 8, 12, 16)  # the space's; 3, 6, 12 fit where a power of two has too many registers
M_TILES_PER_WARP = (1, 2, 4)
OPERAND_PATHS = ("shared", "direct")
K_CHAINS = (1, 2, 4)
CHAIN_MIN_K_TILES = 8  # the space offers more chains to a warp with at least this many k tiles
CHAIN_MAX_SETS = 2  # and at most this many accumulator sets (two: a chain of k_tiles_per_warp steps each)
BATCH_GROUPS = (1, 2, 4, 8, 16)
GROUP_MIN_ROWS = 4  # a polling kind's space splits the batch only into groups of at least this many rows (each holds
POLLED_GROUPS_MOST = 4  # all weights) and at most this many (the range its tuning records were run over)
# The most batch groups the untuned default of a ``block`` config takes (:func:`grouped`: the most that keep its grid
# within one CTA per SM, up to this). H100, bench/batch_warps.py --groups (LSTM with heads, bf16 768 x 16, T=1024, us
# per step, one group -> 2 / 4 / 8 / 16): heads of 16 0.568 -> 0.566 / 0.653 / 0.632 / 0.571; of 32 0.588 -> 0.584 /
# 0.674 / 0.659 / 0.547; of 64 0.638 -> 0.591 / 0.707 / 0.682 / 0.623; of 128 1.400 -> 0.733 / 0.757 / 0.736 / 0.613.
# Two groups are at or below one group at every head size; more are faster at some sizes only (16 at heads of 32 and
# 128), which tuning records find (the space offers every count).
BLOCK_GROUPS_MOST = 2
POLL_SLEEPS = (0, 256, 512)  # nanoseconds between the polls of a data-carried exchange
SLEEP_MIN_ROWS = 8  # the space offers a sleep only where a group polls at least this many batch rows
SHARED_FRAGMENT_REGS = 8  # registers of A fragments loaded from shared memory (the tiers): two in flight
# More registers live across a step's phases of products, each after the first: far fewer than the float32
# template's PHASE_OVERHEAD (a phase's partial sums go to shared memory, not registers). ptxas (CUDA 13, sm_90), fp16
# batch 1, registers past the weight fragments: LSTM 960 58; Cho's GRU 960 (two phases) 66; two LSTM layers of 480
# (split) 73; three of 480 (shared layout) 68 at 160 threads, 53 at 320.
MMA_PHASE_OVERHEAD = 8
# The untuned default splits an in_warp pass's batch tiles over more sets of warps (``batch_warps``) while its CTA has
# fewer warps than this. H200, bench/batch_warps.py (768 x 16, bf16, us per step; heads-batch-warps-h200.md): heads of
# 16 at 4 -> 8 warps 0.668 -> 0.605 (2 -> 4 warps, a head a CTA: 0.653 -> 0.588), of 32 0.670 -> 0.605, of 64 at
# 8 -> 16 warps 0.717 -> 0.678; 32 warps (1024 threads, 64 registers) never measured.
BATCH_WARPS_BELOW = 16
XP_TYPES = ("float32", "half")  # the input projection's type (``xp``, module doc)
# What the untuned defaults take for ``xp`` (module doc): the projection's GEMM into bf16 at 768 x 16, T=1024
# (H100, bench/half_xp.py) 116.7 us against 202.2 into float32, and half the bytes each step reads
XP_DEFAULT = "half"


@dataclass(frozen=True)
class MmaConfig:
    """One point in the tensor-core template's space (metadata: short names)."""

    units_per_cta: int = field(metadata={"short": "U"})
    k_groups: int = field(metadata={"short": "kg"})
    n_tiles: int = field(default=1, metadata={"short": "nt"})
    barrier: str = field(default=RANKED_WITH, metadata={"short": ""})
    layout: str = field(default="shared", metadata={"short": "", "quiet": True})
    m_tiles_per_warp: int = field(default=1, metadata={"short": "mw", "quiet": True})
    k_chains: int = field(default=1, metadata={"short": "kc", "quiet": True})
    batch_groups: int = field(default=1, metadata={"short": "bg", "quiet": True})
    poll_sleep: int = field(default=0, metadata={"short": "ps", "quiet": True})
    operand_path: str = field(default="shared", metadata={"short": "", "quiet": True})
    smem_k_tiles: int = field(default=0, metadata={"short": "sk", "quiet": True, "tier": True})
    l2_k_tiles: int = field(default=0, metadata={"short": "lk", "quiet": True})
    gate_layout: str = field(default="by_gate", metadata={"short": "", "quiet": True})
    batch_warps: int = field(default=1, metadata={"short": "bw", "quiet": True})
    xp: str = field(default="float32", metadata={"short": "xp", "quiet": True})
    atomic_sums: int = field(default=0, metadata={"short": "as", "quiet": True})

    @property
    def half_xp(self) -> bool:
        """Whether the kernel reads the input projection in the layer's half type (``xp="half"``)."""
        return self.xp == "half"

    @property
    def in_warp(self) -> bool:
        """Whether a warp holds every gate of its units (``gate_layout="in_warp"``, ``gate_layout``)."""
        return self.gate_layout == "in_warp"

    @property
    def warp_n_tiles(self) -> int:
        """Batch tiles a warp multiplies each pass: the pass's ``n_tiles`` over its ``batch_warps`` sets of warps
        (``gate_layout``)."""
        return self.n_tiles // self.batch_warps

    @property
    def direct(self) -> bool:
        """Whether each lane loads its B fragments from the exchange itself (``operand_path="direct"``)."""
        return self.operand_path == "direct"

    @property
    def batch_tile(self) -> int:
        """Batch rows per pass (the shared operand tile's rows)."""
        return TILE_N * self.n_tiles

    def as_dict(self) -> dict:
        return knobs_of(self)


@dataclass(frozen=True)
class MmaGeometry:
    """What a config implies for one cell plan: grid, tiles, registers, shared memory."""

    ctas: int
    threads: int
    m_tiles: int               # row tiles per CTA over all its products (the most any part has)
    warp_rows: int             # row-tile rows of warps: ceil(m_tiles / m_tiles_per_warp)
    rows: int                  # m_tiles * 16: gate rows per CTA, padding included
    sum_stride: int            # words between batch rows of the shared partial sums (see gate_sum_stride)
    k_tiles_per_warp: int
    k_pad: int                 # hidden rounded up to whole k tiles of every k group
    weights_per_thread: int    # 32-bit registers of A fragments (every row tile of the warp)
    batch_chunks: int          # passes over the batch
    items_per_thread: int      # (pointwise group, batch row, unit) items per thread
    tagged_per_thread: int
    smem_ops: int              # bytes: the operand tiles of one pass, its batch rows (none with operand_path="direct")
    smem_gs: int               # bytes: the k groups' partial sums for the whole batch (two sets: "direct")
    regs_estimate: int
    tile_width: int = 0        # columns of a shared operand tile's row before the skew, where not k_pad (heads)
    smem_us: int = 0           # bytes: the shares and totals of the sums over units (``persistent_sums``)
    smem_k_tiles: int = 0      # of a warp's k tiles, those whose A fragments are in shared memory (the tiers)
    smem_ws: int = 0           # bytes: those fragments, after everything else (``weights_offset``)
    l2_k_tiles: int = 0        # of a warp's k tiles, the first ones, whose A fragments are read from global memory
    l2_ws: int = 0             # bytes: those fragments, read by the CTA every pass (``streamed_tier``)

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA, as allocated (:func:`~prnn_tvm.target.launchable_smem`)."""
        return tiered_smem(self.smem_ops + self.smem_gs + self.smem_us, self.smem_ws)

    @property
    def weights_offset(self) -> int:
        """Byte offset of the shared-memory fragments: after the partial sums, operand tiles and sums over units."""
        return weights_offset(self.smem_ops + self.smem_gs + self.smem_us)

    @property
    def register_k_tiles(self) -> int:
        """Of a warp's k tiles, those whose A fragments are in registers (from k tile ``l2_k_tiles``)."""
        return self.k_tiles_per_warp - self.smem_k_tiles - self.l2_k_tiles

    @property
    def stride(self) -> int:
        """Elements between batch rows of a shared operand tile: ``k_pad`` (or with head-wise products the span of
        the CTA's heads and the last head's padding, ``head_columns.OperandColumns.tile_width``) and the skew."""
        return (self.tile_width or self.k_pad) + ROW_SKEW


def product_tiles(reductions, units: int) -> list[int]:
    """Row tiles of each of the recurrent products ``reductions`` in a CTA of ``units`` hidden units."""
    return [math.ceil(r.slices * units / TILE_M) for r in reductions]


def group_rows(cfg: MmaConfig, plan: CellPlan) -> int:
    """Batch rows of one batch group (the whole batch with one group)."""
    return plan.batch // cfg.batch_groups


def geometry(cfg: MmaConfig, plan: CellPlan) -> MmaGeometry:
    H, B = plan.hidden, group_rows(cfg, plan)  # a CTA sees its batch group's rows only
    runs = parts(cfg.layout, plan)
    cols = OperandColumns.of(plan.reductions, H, cfg.units_per_cta)  # ConfigError where units fit no head
    K = cols.k_extent  # weights per row: hidden, or the largest head
    m_tiles = max(sum(product_tiles(reductions, cfg.units_per_cta)) for reductions, _, _ in runs)
    ctas = cfg.batch_groups * len(runs) * math.ceil(H / cfg.units_per_cta)
    mw = cfg.m_tiles_per_warp
    warp_rows = math.ceil(m_tiles / mw)
    warps = max(1, warp_rows * cfg.k_groups * cfg.batch_warps)
    threads = 32 * warps
    kt = math.ceil(math.ceil(K / TILE_K) / cfg.k_groups) if m_tiles else 0
    k_pad = TILE_K * kt * cfg.k_groups if m_tiles else _round_up(H, TILE_K)
    width = _round_up(cols.tile_width(k_pad), 8) if cols.headed else 0  # 16-byte rows for ldmatrix
    row = max((cols.span(op) for op in cols.sizes), default=H)  # a tile row's values to load
    sk = min(cfg.smem_k_tiles, kt)
    lk = min(max(0, cfg.l2_k_tiles), kt - sk)
    weights = 4 * (kt - sk - lk) * mw
    smem_ws = 16 * threads * mw * sk  # a lane's A fragment of a row tile and k tile: 16 bytes
    l2_ws = 16 * threads * mw * lk
    # (group, batch row, unit) items, each group on warps of its own
    ipt = max(math.ceil(len(groups) * group_span(B * cfg.units_per_cta, len(groups)) / threads)
              for _, _, groups in runs)
    n_ops = max(len(operands) for _, operands, _ in runs)
    stride = (width or k_pad) + ROW_SKEW
    # a tile holds the pass's batch rows, no more (at batch 1 one row, not eight: rows past it are never multiplied
    # into a stored sum, and their fragments read its last row instead, ``FragmentWeights.tile_products``); in_warp:
    # whole tiles, the one read this step and the one written for the next, and no partial sums (gate_layout)
    tile_rows = 2 * cfg.batch_tile if cfg.in_warp else min(cfg.batch_tile, B)
    smem_ops = 0 if cfg.direct else itemsize(plan.dtype) * n_ops * tile_rows * stride
    sum_stride = gate_sum_stride(m_tiles * TILE_M, cfg.units_per_cta)
    smem_gs = 0 if cfg.in_warp else (
        _round_up(itemsize(plan.policy.accumulate) * cfg.k_groups * B * sum_stride, 16) * (2 if cfg.direct else 1))
    if cfg.in_warp:  # a lane's items: its unit's batch rows 2 quad, 2 quad + 1 of each of its warp's batch tiles
        ipt = 2 * cfg.warp_n_tiles
    accumulators = 4 * mw * cfg.k_chains * cfg.warp_n_tiles
    if cfg.direct:  # the lane's fragments of every k tile are its poll's registers
        tagged = cfg.n_tiles * direct_loads(kt)[1]
        fragments = 2 * kt * cfg.n_tiles
    else:  # the loads the kind's poll holds while it waits (none for a kind that polls no values)
        tagged, poll_regs = barrier(cfg.barrier).polled_loads(min(cfg.batch_tile, B) * row if n_ops else 0, threads,
                                                              row, itemsize(plan.dtype), n_ops)
        fragments = 2 * cfg.warp_n_tiles + poll_regs * tagged
    regs = (weights + accumulators + fragments + ipt * plan.item_values + REG_OVERHEAD
            + MMA_PHASE_OVERHEAD * (plan.product_phases - 1) + (SHARED_FRAGMENT_REGS if sk else 0)
            + staging_regs(cfg, kt, lk))
    return MmaGeometry(ctas, threads, m_tiles, warp_rows, m_tiles * TILE_M, sum_stride, kt, k_pad, weights,
                       math.ceil(B / cfg.batch_tile), ipt, tagged, smem_ops, smem_gs, regs, width,
                       unit_sum_bytes(plan, B, cfg.units_per_cta), sk, smem_ws, lk, l2_ws)


@functools.lru_cache(maxsize=None)  # a few hundred (rows, units) pairs; every config's geometry asks
def gate_sum_stride(rows: int, units: int) -> int:
    """Words between batch rows of the shared partial sums: the least stride from the CTA's ``rows`` up at
    which every warp's pointwise reads hit 32 distinct banks. A warp's items are 32 consecutive (batch
    row, unit) pairs, read at ``b * stride + unit``; unpadded, batch rows ``rows`` words apart share
    banks (4-way at 8 units and 32 rows). A stride of ``units`` mod 32 always works; a smaller one
    often does (24 for 8 units and 16 rows)."""
    def conflict_free(stride: int) -> bool:
        return all(len({(item // units * stride + item % units) % 32 for item in range(first, first + 32)}) == 32
                   for first in range(0, 32 * units, 32))  # the pattern repeats every 32 * units items

    if rows == 0:  # no products: no partial sums
        return 0
    return next(s for s in range(rows, rows + 32) if conflict_free(s))


def arch_number(arch: str) -> int:
    """``sm_90a`` -> 90."""
    digits = "".join(ch for ch in arch if ch.isdigit())
    return int(digits) if digits else 0


def refusal(plan: CellPlan, arch: str) -> str | None:
    """Why this template does not place ``plan`` on a GPU of ``arch`` at all (its dtype, the tensor cores), or
    None."""
    if plan.dtype not in DTYPES:
        return f"the tensor-core template places {', '.join(DTYPES)} cells, not {plan.dtype}"
    mma = plan.policy.mma
    if arch_number(arch) < mma.min_arch:
        return f"{plan.dtype} layers need mma.sync {mma.shape} (sm_{mma.min_arch} or newer), not {arch}"
    return None


def check_target(plan: CellPlan, gpu: GpuSpec) -> None:
    """The dtype and GPU this template can place at all (before any config is looked at)."""
    reason = refusal(plan, gpu.arch)
    if reason:
        raise ConfigError(reason)


def validate(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaGeometry:
    """Check a config before building; raise ConfigError with the reason, else return its geometry."""
    check_target(plan, gpu)
    barrier(cfg.barrier)  # a kind it knows
    if cfg.units_per_cta < 1 or cfg.units_per_cta > plan.hidden:
        raise ConfigError(f"units_per_cta={cfg.units_per_cta}: must be between 1 and hidden={plan.hidden}")
    if not 1 <= cfg.k_groups <= MAX_K_GROUPS:
        raise ConfigError(f"k_groups={cfg.k_groups}: must be between 1 and {MAX_K_GROUPS} (warps sharing a row "
                          "tile's k)")
    check_layout(cfg, plan)
    if cfg.m_tiles_per_warp not in M_TILES_PER_WARP:
        raise ConfigError(f"m_tiles_per_warp={cfg.m_tiles_per_warp}: must be one of "
                          f"{', '.join(map(str, M_TILES_PER_WARP))} (row tiles of weights per warp)")
    if cfg.m_tiles_per_warp > 1:
        for reductions, _, _ in parts(cfg.layout, plan):
            tiles = product_tiles(reductions, cfg.units_per_cta)
            if any(n % cfg.m_tiles_per_warp for n in tiles):
                raise ConfigError(f"m_tiles_per_warp={cfg.m_tiles_per_warp}: a warp's row tiles multiply one operand, "
                                  f"so each product's row tiles must come in groups of {cfg.m_tiles_per_warp}; at "
                                  f"units_per_cta={cfg.units_per_cta} they are {tiles}")
    if cfg.k_chains not in K_CHAINS:
        raise ConfigError(f"k_chains={cfg.k_chains}: must be one of {', '.join(map(str, K_CHAINS))} (accumulator "
                          "sets per warp)")
    check_batch_groups(cfg, plan)
    check_operand_path(cfg, plan)
    if cfg.poll_sleep not in POLL_SLEEPS:
        raise ConfigError(f"poll_sleep={cfg.poll_sleep}: must be one of {', '.join(map(str, POLL_SLEEPS))} "
                          "(nanoseconds between polls)")
    if cfg.poll_sleep and not barrier(cfg.barrier).polls_values:
        raise ConfigError(f"poll_sleep={cfg.poll_sleep} paces the polls of a data-carried exchange (tags, sentinel); "
                          f"'{cfg.barrier}' does not poll values")
    if cfg.n_tiles not in (1, 2, 4, 8):
        raise ConfigError(f"n_tiles={cfg.n_tiles}: must be 1, 2, 4 or 8 (batch tiles of 8 rows per pass)")
    rows = group_rows(cfg, plan)
    if cfg.batch_tile > _round_up(rows, TILE_N):
        group = f" group of {rows} rows" if cfg.batch_groups > 1 else f" of {rows}"
        raise ConfigError(f"n_tiles={cfg.n_tiles} covers {cfg.batch_tile} batch rows per pass; the batch{group} "
                          f"needs at most {_round_up(rows, TILE_N) // TILE_N}")
    check_batch_warps(cfg)
    if cfg.xp not in XP_TYPES:
        raise ConfigError(f"xp='{cfg.xp}': the input projection's type, one of {', '.join(XP_TYPES)} (the layer's "
                          "half type)")
    check_atomic_sums(cfg, plan)
    if cfg.smem_k_tiles < 0:
        raise ConfigError(f"smem_k_tiles={cfg.smem_k_tiles}: the k tiles of a warp whose weights are in shared "
                          "memory, 0 or more")
    g = geometry(cfg, plan)
    if cfg.smem_k_tiles > g.k_tiles_per_warp:
        raise ConfigError(f"smem_k_tiles={cfg.smem_k_tiles}: a warp has {g.k_tiles_per_warp} k tiles (hidden "
                          f"{plan.hidden} over k_groups {cfg.k_groups}); at most that many can be in shared memory")
    check_streamed(cfg, g, plan)
    check_gate_layout(cfg, plan, g.batch_chunks)
    check_mma_heads(cfg, plan)
    K = OperandColumns.of(plan.reductions, plan.hidden, cfg.units_per_cta).k_extent
    k_tiles = math.ceil(K / TILE_K)
    if g.m_tiles and cfg.k_groups > k_tiles:
        of = f"hidden={plan.hidden}" if K == plan.hidden else f"a head of {K} units"
        raise ConfigError(f"k_groups={cfg.k_groups} exceeds the {k_tiles} k tiles of {of}")
    if cfg.k_chains > max(1, g.k_tiles_per_warp):
        raise ConfigError(f"k_chains={cfg.k_chains}: a warp has {g.k_tiles_per_warp} k tiles to share among its "
                          "accumulator sets; lower k_chains or k_groups")
    if g.tagged_per_thread > 32:  # one stale bit per load a poll waits on
        polls = (f"operand_path='direct' polls {g.tagged_per_thread} loads per lane ({cfg.n_tiles} batch tiles x "
                 f"{g.k_tiles_per_warp} k tiles of 16)" if cfg.direct else
                 f"the '{cfg.barrier}' exchange polls {g.tagged_per_thread} state loads per thread (batch tile "
                 f"{cfg.batch_tile} x hidden {plan.hidden} over {g.threads} threads, for each operand one poll waits "
                 "on)")
        raise ConfigError(f"{polls}; at most 32: lower n_tiles or raise k_groups")
    if g.threads > 1024:
        per_warp = f", {cfg.m_tiles_per_warp} per warp" if cfg.m_tiles_per_warp > 1 else ""
        raise ConfigError(f"{g.threads} threads per CTA ({g.m_tiles} row tiles{per_warp} x k_groups {cfg.k_groups}); "
                          "at most 1024: lower k_groups or units_per_cta")
    accumulators = 4 * cfg.warp_n_tiles * cfg.m_tiles_per_warp * cfg.k_chains
    fewer = ("lower n_tiles" + (" or m_tiles_per_warp" if cfg.m_tiles_per_warp > 1 else "")
             + (" or k_chains" if cfg.k_chains > 1 else ""))
    check_resources(g, plan, gpu, f"{g.weights_per_thread} of weight fragments, {accumulators} accumulators",
                    f"raise k_groups or units_per_cta, or {fewer}, or keep more fragments in shared memory (raise "
                    "smem_k_tiles) or in global memory (raise l2_k_tiles)",
                    "lower n_tiles or k_groups" + (f" or smem_k_tiles ({g.smem_ws} B of them weights)" if g.smem_ws
                                                   else ""),
                    "raise units_per_cta" + (" or lower batch_groups" if cfg.batch_groups > 1 else ""))
    return g


def check_mma_heads(cfg: MmaConfig, plan: CellPlan) -> None:
    """ConfigError where head-wise products do not fit the tensor-core layout: a warp's row tiles must lie in one
    head (they share the B fragments), a head's columns must start at a 16-byte boundary of the operand tile
    (``ldmatrix``: a head size a multiple of 8, unless every head starts the CTA's span), and the batch is one
    group unless no block reads another's values (``block``)."""
    if plan.heads == 1:
        return
    cols = OperandColumns.of(plan.reductions, plan.hidden, cfg.units_per_cta)
    # in_warp: a warp's rows are gates of 8 units, in one head where heads are whole warps (check_gate_layout)
    for reductions, _, _ in parts(cfg.layout, plan) if not cfg.in_warp else ():
        starts, lo = [], 0
        for tiles in product_tiles(reductions, cfg.units_per_cta):
            starts.append(lo)
            lo += TILE_M * tiles
        check_heads(cols, reductions, TILE_M * cfg.m_tiles_per_warp, f"units_per_cta={cfg.units_per_cta}, "
                    f"m_tiles_per_warp={cfg.m_tiles_per_warp}", "a warp's row tiles of 16 rows", starts)
    for r in plan.reductions:  # (where a block's span is its heads', a warp's row tiles in one head make D % 16 == 0)
        D = r.head_size(plan.hidden)
        if D != plan.hidden and D % 8 and cols.span(r.operand) == plan.hidden:
            raise ConfigError(f"the tensor cores read a head's columns of the operand tile from 16-byte boundaries, "
                              f"and heads of {D} units (not a multiple of 8) of '{r.operand}', which a dense product "
                              "reads whole too, start inside it; take heads of a multiple of 8 units, or float32")
    if cfg.batch_groups > 1 and barrier(cfg.barrier).grid_wide:
        raise ConfigError(f"batch_groups={cfg.batch_groups}: head-wise products exchange by span of heads, every "
                          f"batch row's values together, across blocks with '{cfg.barrier}'; take one batch group, or "
                          "barrier 'block' with blocks of whole heads (no block reads another's values)")


def check_batch_groups(cfg: MmaConfig, plan: CellPlan) -> None:
    """ConfigError where ``batch_groups`` cannot split this plan's batch, with the reason."""
    G = cfg.batch_groups
    if G not in BATCH_GROUPS:
        raise ConfigError(f"batch_groups={G}: must be one of {', '.join(map(str, BATCH_GROUPS))}")
    if G == 1:
        return
    if plan.batch % G:
        raise ConfigError(f"batch_groups={G}: the batch of {plan.batch} does not split into {G} equal groups of rows")
    kind = barrier(cfg.barrier)
    if not kind.polls_values and kind.grid_wide:
        raise ConfigError(f"batch_groups={G} runs each group of batch rows on CTAs of its own, which pays only where "
                          f"the groups never wait for each other: with tags or sentinel, or block (no block waits for "
                          f"another), not across the grid barrier of '{cfg.barrier}'")
    if cfg.layout != "shared":
        raise ConfigError(f"batch_groups={G} takes the shared layout, not '{cfg.layout}'")
    if plan.unit_sums:
        raise ConfigError(f"batch_groups={G}: cell '{plan.cell.name}' sums over units, whose partial sums the "
                          "workspace holds for the whole batch; take one batch group")


def check_operand_path(cfg: MmaConfig, plan: CellPlan) -> None:
    """ConfigError where ``operand_path`` cannot take this plan or config, with the reason."""
    if cfg.operand_path not in OPERAND_PATHS:
        raise ConfigError(f"operand_path '{cfg.operand_path}' unknown; available: {', '.join(OPERAND_PATHS)}")
    problem = direct_problem(plan, cfg.barrier) if cfg.direct else None
    if problem:
        raise ConfigError(f"operand_path='direct' {problem}")


def direct_problem(plan: CellPlan, kind: str) -> str | None:
    """Why direct fragments cannot carry ``plan``'s products with barrier ``kind`` (None where they can)."""
    problem = barrier(kind).fragments_problem()
    if problem:
        return problem
    if plan.lag or len(plan.operands) != 1:
        return (f"takes a step that multiplies one exchanged state; cell '{plan.cell.name}' multiplies "
                f"{', '.join(plan.operands)}: use operand_path='shared'")
    if plan.hidden % 8:
        return (f"loads 8 values of a state row at a time; hidden={plan.hidden} is not a multiple of 8: use "
                "operand_path='shared'")
    if plan.heads > 1:
        return (f"loads a warp's k range of the whole state; cell '{plan.cell.name}' has head-wise products: use "
                "operand_path='shared'")
    return None


def paths_for(plan: CellPlan, kind: str) -> tuple:
    """The operand paths the space offers: ``direct`` too where :func:`direct_problem` finds none."""
    return ("shared",) if direct_problem(plan, kind) else OPERAND_PATHS


def groups_for(plan: CellPlan, layout: str, kind: str) -> tuple:
    """The batch groups the space offers, in the shared layout: with ``block`` (no block waits for another) every
    count that splits the batch into equal groups, down to one row (a plan that sums over units: none); with a kind
    that polls values (groups never wait for each other) up to POLLED_GROUPS_MOST groups of at least GROUP_MIN_ROWS
    rows; else none."""
    found = barrier(kind)
    if layout != "shared" or plan.unit_sums or (found.grid_wide and not found.polls_values):
        return (1,)
    if not found.grid_wide:
        return batch_splits(plan, 1, BATCH_GROUPS[-1])
    return batch_splits(plan)


def batch_splits(plan: CellPlan, min_rows: int = GROUP_MIN_ROWS, most: int = POLLED_GROUPS_MOST) -> tuple:
    """The batch group counts, up to ``most``, that split ``plan``'s batch into equal groups of at least ``min_rows``
    rows."""
    return tuple(G for G in BATCH_GROUPS
                 if G == 1 or (G <= most and plan.batch % G == 0 and plan.batch // G >= min_rows))


def grid_filling_units(plan: CellPlan, gpu: GpuSpec, runs: int) -> set:
    """For each batch split, the least units per CTA that fill whole row tiles and keep the grid (``runs`` runs of
    CTAs per group) within one CTA per SM: what the tuning records at batch 16 chose at every hidden size
    (``ranking.carried_over``)."""
    found = set()
    for G in batch_splits(plan):
        per_run = gpu.sms // (G * runs)
        least = math.ceil(plan.hidden / per_run) if per_run else plan.hidden + 1
        found |= {next((u for u in range(least, least + TILE_M + 1) if row_aligned(plan, u)), least)}
    return found


def sleeps_for(plan: CellPlan, kind: str, groups: int) -> tuple:
    """The poll sleeps the space offers: more than none only with a kind that polls values, where its groups poll
    at least SLEEP_MIN_ROWS batch rows."""
    if not barrier(kind).polls_values or plan.batch // groups < SLEEP_MIN_ROWS:
        return (0,)
    return POLL_SLEEPS


def row_aligned(plan: CellPlan, units: int) -> bool:
    """Whether every product's rows fill whole row tiles at ``units`` per CTA (no zero-weight padding)."""
    return all(r.slices * units % TILE_M == 0 for r in plan.reductions)


def space(plan: CellPlan, gpu: GpuSpec, barriers: tuple = tuple(BARRIERS),
          tiles_per_warp: tuple = M_TILES_PER_WARP, chains: tuple = K_CHAINS) -> list[MmaConfig]:
    """Candidate configs for a plan on a GPU (unvalidated): the template's tuning space. The split layout
    (where the plan has parts) spreads every part's units over the SMs together. More than one accumulator
    chain only where a warp has at most CHAIN_MAX_SETS accumulator sets (row tiles x batch tiles per pass) and at
    least CHAIN_MIN_K_TILES k tiles: with more sets its mma steps are independent enough already, and two sets
    still wait on a chain of every k tile (16 in the tuned LSTM 1024 x 16 config: two row tiles, four k groups).
    Batch groups as :func:`groups_for` offers them, each with the batch tiles its own rows need, poll sleeps as
    :func:`sleeps_for` does and operand paths as :func:`paths_for` does."""
    k_tiles = math.ceil(plan.hidden / TILE_K)

    def chain_counts(kg: int, nt: int, mw: int) -> tuple:
        long = nt * mw <= CHAIN_MAX_SETS and math.ceil(k_tiles / kg) >= CHAIN_MIN_K_TILES
        return tuple(kc for kc in chains if kc == 1 or long)

    H = plan.hidden
    configs = []
    for layout, runs, layout_barriers in layouts(plan, barriers):
        min_units = math.ceil(runs * H / gpu.sms)
        aligned = next(u for u in range(min_units, min_units + TILE_M + 1) if row_aligned(plan, u))
        # and 16 units (whole row tiles of any product; what the batch-16 records chose at 512 and 1024, and what
        # cuDNN's persistent LSTM runs at every size), and the units that fill the grid in each batch split
        offered = {min_units, min_units + 1, aligned, 2 * min_units, 4 * min_units, 8 * min_units, TILE_M}
        units = sorted({u for u in offered | grid_filling_units(plan, gpu, runs) if u <= H}
                       | fitting_units(plan, min_units))
        configs += [MmaConfig(u, kg, nt, b, layout, mw, kc, bg, ps, path, atomic_sums=a) for u in units
                    for kg in K_GROUPS for nt in (1, 2, 4, 8) for b in layout_barriers
                    for bg in groups_for(plan, layout, b) if nt <= _round_up(plan.batch // bg, TILE_N) // TILE_N
                    for mw in tiles_per_warp for kc in chain_counts(kg, nt, mw) for ps in sleeps_for(plan, b, bg)
                    for path in paths_for(plan, b) for a in atomic_sums_offered(plan)]
    in_warp = [dataclasses.replace(cfg, gate_layout="in_warp") for cfg in configs if in_warp_offered(cfg, plan)]
    configs += in_warp + [dataclasses.replace(cfg, batch_warps=bw) for cfg in in_warp for bw in BATCH_WARPS
                          if 1 < bw and cfg.n_tiles % bw == 0]
    configs += [dataclasses.replace(cfg, xp=xp) for cfg in configs for xp in XP_TYPES[1:]]  # either projection
    tiered = configs
    if tiers_offered(plan, gpu, configs, validate):
        tiered = [dataclasses.replace(cfg, smem_k_tiles=sk) if sk else cfg for cfg in configs
                  for sk in weight_tiers(cfg, plan, gpu)]
    if not offers_streaming(plan, gpu):
        return tiered
    return tiered + [dataclasses.replace(cfg, smem_k_tiles=sk, l2_k_tiles=lk) for cfg in configs
                     for sk, lk in streamed_options(cfg, plan, gpu)]


def in_warp_offered(cfg: MmaConfig, plan: CellPlan) -> bool:
    """Whether the space offers ``cfg`` with ``gate_layout="in_warp"`` too: where that layout can place ``plan``
    with ``cfg``'s knobs (``gate_layout.in_warp_problem``, the batch in one pass; validate checks the rest)."""
    return in_warp_problem(cfg, plan, math.ceil(group_rows(cfg, plan) / cfg.batch_tile)) is None


def gates_in_warp(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaConfig:
    """``cfg`` with every gate of a unit in one warp (``gate_layout="in_warp"``: the row tiles per warp that takes,
    one k group, one batch pass), a head a CTA where the heads fit one an SM, and the fewest shared k tiles that
    validate (:func:`fewest_shared_tiles`), else ``cfg`` as it is. H100, lstm_h12 bf16 768 x 16 at units_per_cta=64:
    1.40-1.45 -> 0.737-0.740 us per step (bench/results/heads-in-warp-h100.md); H200, lstm_h6 (heads of 128, whose
    warps hold two k tiles' weights in shared memory): 2.435 -> 1.425 (bench/results/heads-batch-warps-h200.md).

    A head a CTA: blocks of a ``block`` barrier never wait for each other, so where the ranked config's CTAs hold
    several heads and one head a CTA still fits the SMs, each CTA does half the work on SMs that were idle (H200,
    lstm_h48, heads of 16: 0.668 -> 0.653 us per step, 0.605 -> 0.588 with ``batch_warps=2``)."""
    mw = in_warp_tiles(plan)
    passes = next((n for n in (1, 2, 4, 8) if TILE_N * n >= group_rows(cfg, plan)), None)
    if mw is None or passes is None:
        return cfg
    other = dataclasses.replace(cfg, gate_layout="in_warp", m_tiles_per_warp=mw, k_groups=1, n_tiles=passes,
                                k_chains=1, smem_k_tiles=0, l2_k_tiles=0, batch_warps=1)
    head = plan.reductions[0].head_size(plan.hidden)
    one_head = dataclasses.replace(other, units_per_cta=head)
    tries = (one_head, other) if head < cfg.units_per_cta and geometry(one_head, plan).ctas <= gpu.sms else (other,)
    return next((found for found in map(lambda c: fewest_shared_tiles(c, plan, gpu), tries) if found), cfg)


def fewest_shared_tiles(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaConfig | None:
    """``cfg`` with the fewest ``smem_k_tiles``, from its own up, with which it validates: the weights that its
    registers cannot hold, in shared memory (None where no count validates)."""
    try:
        k_tiles = geometry(cfg, plan).k_tiles_per_warp
    except ConfigError:  # validate says why
        return None
    for sk in range(cfg.smem_k_tiles, k_tiles + 1):
        other = dataclasses.replace(cfg, smem_k_tiles=sk)
        try:
            validate(other, plan, gpu)
        except ConfigError:
            continue
        return other
    return None


def split_batch_tiles(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaConfig:
    """An ``in_warp`` ``cfg`` with its pass's batch tiles split over more sets of warps (``batch_warps``, doubled
    while the CTA has fewer than BATCH_WARPS_BELOW warps and the split validates), else ``cfg`` as it is."""
    best = cfg
    while cfg.in_warp and cfg.n_tiles % (2 * best.batch_warps) == 0:
        other = dataclasses.replace(best, batch_warps=2 * best.batch_warps)
        try:
            if geometry(best, plan).threads // 32 >= BATCH_WARPS_BELOW:
                break
            validate(other, plan, gpu)
        except ConfigError:
            break
        best = other
    return best


def grouped(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec, most: int | None = None) -> MmaConfig:
    """``cfg``, a config of one batch group whose blocks never wait for each other (``block``), with the batch in the
    most groups, up to ``most`` (default :data:`BLOCK_GROUPS_MOST`), whose grid keeps within one CTA per SM: a group's
    rows in the batch tiles they need (one pass where ``cfg`` runs one), the fewest shared k tiles that validate and
    its pass split over sets of warps as :func:`split_batch_tiles` does; else ``cfg`` as it is. Each CTA then runs the
    products and pointwise math of its group's rows alone, on SMs the heads left idle (issue 49: lstm_h12 at batch
    16, 12 CTAs of 132 SMs)."""
    most = BLOCK_GROUPS_MOST if most is None else most
    if barrier(cfg.barrier).grid_wide or cfg.batch_groups != 1:
        return cfg
    for G in reversed(groups_for(plan, cfg.layout, cfg.barrier)):
        if G == 1 or G > most:
            continue
        tiles = min(cfg.n_tiles, math.ceil(plan.batch // G / TILE_N))
        n_tiles = next(n for n in (1, 2, 4, 8) if n >= tiles)
        found = fewest_shared_tiles(dataclasses.replace(cfg, batch_groups=G, n_tiles=n_tiles, batch_warps=1,
                                                        smem_k_tiles=0), plan, gpu)
        if found is not None and geometry(found, plan).ctas <= gpu.sms:
            return split_batch_tiles(found, plan, gpu)
    return cfg


def weight_tiers(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> list[int]:
    """The ``smem_k_tiles`` a space offers for ``cfg`` (``ranking.tier_counts``)."""
    try:
        g = geometry(cfg, plan)
    except ConfigError:  # validate says why
        return [0]
    excess = g.regs_estimate - max_regs_per_thread(g.threads, gpu)
    # each k tile frees four registers per row tile of the warp; the first adds the staged fragments
    return tier_counts(excess if g.m_tiles else 0, SHARED_FRAGMENT_REGS, 4 * cfg.m_tiles_per_warp,
                       g.k_tiles_per_warp)


def streamed_options(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> list[tuple[int, int]]:
    """The ``(smem_k_tiles, l2_k_tiles)`` a space offers ``cfg`` past the chip (``streamed_tier.streamed_tiers``)."""
    try:
        g = geometry(cfg, plan)
    except ConfigError:  # validate says why
        return []
    return streamed_tiers(cfg, g, plan, gpu, SHARED_FRAGMENT_REGS)


GEOMETRY_FEATURES = ("ctas", "threads", "m_tiles", "k_tiles_per_warp", "weights_per_thread", "batch_chunks",
                     "items_per_thread", "tagged_per_thread", "smem_bytes", "smem_ws", "l2_ws")


def features(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> dict:
    """The cost model's view of a valid config: knobs, barrier one-hot, geometry, occupancy, estimate."""
    g = geometry(cfg, plan)
    row = {k: getattr(cfg, k) for k in ("units_per_cta", "k_groups", "n_tiles", "m_tiles_per_warp", "k_chains",
                                        "batch_groups", "poll_sleep", "smem_k_tiles", "l2_k_tiles", "batch_warps",
                                        "atomic_sums")}
    row["half_xp"] = float(cfg.half_xp)
    row.update({f"barrier={b}": float(cfg.barrier == b) for b in BARRIERS})
    row["layout=split"] = float(cfg.layout == "split")
    row["operand_path=direct"] = float(cfg.direct)
    row["gate_layout=in_warp"] = float(cfg.in_warp)
    row.update({k: getattr(g, k) for k in GEOMETRY_FEATURES})
    row.update(regs_estimate=g.regs_estimate, ctas_per_sm=ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, gpu),
               log2_estimated_cycles=math.log2(estimated_cycles(cfg, g)), registers=g.regs_estimate)
    return row


def estimated_cycles(cfg: MmaConfig, g: MmaGeometry) -> float:
    """A rough per-step cost in SM cycles, used only to rank the untuned defaults.

    Per pass a warp runs ``k_tiles_per_warp`` dependent mma steps for each of its
    ``n_tiles`` independent accumulators, each shared-memory B fragment costs a quarter
    cycle to issue, and the pass pays an L2 round trip and two block barriers
    (``TILE_OVERHEAD``); every k group adds a partial sum per gate value to store and to
    add up, more with a larger batch. Fewer than 8 warps cannot hide the latencies (last
    factor, as in the float32 template's estimate). Fitted on an H100 (LSTM fp16, hidden 1024, T=256):
    at batch 16 k_groups 4/8/12 with n_tiles 2 ran 2.74/2.96/3.52 us/step and n_tiles 1
    (two passes) 3.41 at k_groups 4; at batch 1 k_groups 4 and 8 both 2.08.
    """
    chain = g.k_tiles_per_warp * max(MMA_CYCLES, 2 * cfg.n_tiles * cfg.m_tiles_per_warp)
    loads = g.threads / 32 * g.k_tiles_per_warp * cfg.n_tiles / 4
    # shared A fragments (the tiers), read every pass: 512 bytes a warp, four wavefronts (an uncalibrated guess)
    loads += g.threads / 32 * g.smem_k_tiles * cfg.m_tiles_per_warp * 4
    per_pass = (chain + loads + TILE_OVERHEAD) * max(1.0, 8 / (g.threads / 32))
    # streamed fragments (the third tier): bound by DRAM, the products hidden behind them
    per_pass = max(per_pass, streamed_cycles(g) + TILE_OVERHEAD)
    return g.batch_chunks * per_pass + cfg.k_groups * (20 + 4 * g.batch_chunks * cfg.batch_tile)


def carried(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaConfig | None:
    """A tuning record's config at another hidden size, for ``plan`` (``ranking.carried_over``): units other than
    the record's only where they fill whole row tiles, and the most row tiles per warp, up to the record's, that
    divide every product's tiles."""
    def fit(candidate: MmaConfig, same_units: bool) -> MmaConfig | None:
        if not same_units and not row_aligned(plan, candidate.units_per_cta):
            return None
        tiles = [n for reductions, _, _ in parts(candidate.layout, plan)
                 for n in product_tiles(reductions, candidate.units_per_cta)]
        mw = max(m for m in M_TILES_PER_WARP if m <= candidate.m_tiles_per_warp and all(n % m == 0 for n in tiles))
        return dataclasses.replace(candidate, m_tiles_per_warp=mw)

    return carried_over(cfg, plan, gpu, validate, fit)


def saving_config(cfg: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> MmaConfig:
    """The config of the training forward (``recurrent_save``) of a layer built with ``cfg``
    (``ranking.shared_layout``), its projection float32: what ``prnn_tvm.torch``'s training call projects
    (``autograd.CudaBackprop``) and the GPU backward reads. A ``block`` config keeps its batch groups, each group's CTAs
    saving their own rows (H100, slstm_h12 bf16 768 x 16, bench/saving_groups.py: 1.472 us a step in one group of 12
    CTAs, 0.799 in two); a kind that polls values trains in one group."""
    return dataclasses.replace(shared_layout(cfg, plan, gpu, validate, ranked_configs), xp="float32")


@per_plan
def ranked_configs(plan: CellPlan, gpu: GpuSpec, limit: int = 4) -> list[MmaConfig]:
    """The untuned choices, best first: units spread over every SM, then least estimated cost.
    Later entries hold fewer weight registers per thread (what a build falls back to if ptxas spills).

    A plan with parts (a stack's layers) takes the split layout first where it fits, then the shared one: a
    CTA of a split stack reads only its layer's operands (H100, four fp16 LSTM layers at hidden 512, batch 8,
    tuned: 2.46 us per step split against 3.49 shared)."""
    check_target(plan, gpu)

    def widen(pool: list, found: list, runs: int) -> list:
        if any(row_aligned(plan, cfg.units_per_cta) for cfg in found):
            return found
        # The last resort: padded row tiles cost registers the estimate does not see (A100, Cho's GRU at
        # hidden 1024: 10 units per CTA spill at 384 threads, 16 units compile in 128 registers).
        aligned = [cfg for cfg in pool if row_aligned(plan, cfg.units_per_cta)]
        try:
            return found + ranked_defaults(plan, gpu, aligned, validate, estimated_cycles, 1, "tensor-core", runs)
        except ConfigError:
            return found

    def one_tile_space(plan, gpu, barriers):  # one row tile per warp: what the estimate was fitted on
        return space(plan, gpu, barriers=barriers, tiles_per_warp=(1,), chains=(1,))

    # a block that holds whole heads may need several row tiles per warp to fit (a head of 128: 1024 threads else)
    # (ranked as one batch group: the estimate does not see what groups gain, :func:`grouped` adds them below)
    local = block_local(plan, gpu, lambda p, g, kinds: [c for c in space(p, g, barriers=kinds, chains=(1,))
                                                        if c.batch_groups == 1],
                        validate, estimated_cycles, limit, "tensor-core")
    # each with a unit's gates in one warp where that fits (no gate exchange through shared memory), its batch in
    # groups where BLOCK_GROUPS_MOST allows, then the layout as ranked after it (fallbacks where ptxas spills)
    local = list(dict.fromkeys(c for cfg in local for warp in (gates_in_warp(cfg, plan, gpu),)
                               for split in (split_batch_tiles(warp, plan, gpu),)
                               for c in (grouped(split, plan, gpu), split, warp, cfg)))
    ladder = layered_defaults(plan, gpu, one_tile_space(plan, gpu, (RANKED_WITH,)), validate, estimated_cycles, limit,
                              "tensor-core", widen)
    # ``tags`` where a pass holds at most TAGS_MAX_ROWS batch rows and it fits (1.25x faster per step at batch 1);
    # SUMS_BARRIER where the plan sums over units (``tags`` cannot carry them)
    def preferred(cfg: MmaConfig) -> MmaConfig:
        if plan.unit_sums:
            return dataclasses.replace(with_barrier(cfg, SUMS_BARRIER, plan, gpu, validate), atomic_sums=SUMS_ATOMICS)
        if min(cfg.batch_tile, plan.batch) <= TAGS_MAX_ROWS:
            return with_barrier(cfg, PREFERRED, plan, gpu, validate)
        return cfg

    return [dataclasses.replace(cfg, xp=XP_DEFAULT) for cfg in local + [preferred(cfg) for cfg in ladder]]


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m

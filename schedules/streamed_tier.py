"""The tensor-core template's third weight tier: A fragments read from global memory every step (``l2_k_tiles``).

Past registers and shared memory together (LSTM fp16 H=4096: 134 MB of recurrent weights against ~63 MB of chip),
the first ``l2_k_tiles`` of each warp's k tiles keep their A fragments in global memory. They are read in place from
the weight matrix, which the launch never writes, with non-coherent loads (``ld.global.nc``) of 16 bytes, served by
L2 (the runtime puts a persistence window on the matrix: ``prnn_tvm.runtime.l2``) or DRAM. In place is possible
because the k order inside the streamed range is the one :func:`direct_k` lays out (the B fragments take the same
columns): a lane's fragments of two k tiles are 8 consecutive columns of each of its two rows, one 16-byte load
each (8-byte loads over an odd number of k tiles). With ``operand_path="direct"`` the warp's whole k range is in
that order already; otherwise only the streamed range is, and its B fragments are read from the shared operand tile
with one 8-byte load per batch tile instead of ``ldmatrix``. ``persistent_fragments.StreamedFragments`` builds it.

The fp32 template's counterpart is ``l2_chunks`` (``persistent_config``); both are offered only past the chip
(``ranking.offers_streaming``) and rank after every config that keeps its weights on chip.
"""

from __future__ import annotations

from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import STATIC_SMEM_RESERVE, GpuSpec, max_regs_per_thread

from .ranking import TIER_STEPS, weights_offset

TILE_K = 16  # columns of a k tile (mma.m16n8k16)
STREAM_DEPTH = 4  # load groups (a row tile's two rows of one load each) a warp has in flight, at one row tile a warp
# Per SM, bytes per cycle of weights streamed past L2 (H100: 3.35 TB/s of HBM over 132 SMs at ~1.75 GHz): what the
# untuned ranking charges a streamed k tile (an estimate: unmeasured)
DRAM_BYTES_PER_CYCLE = 14


def direct_loads(k_tiles: int) -> tuple[int, int]:
    """``(bytes per load, loads per batch tile)`` of a lane's direct fragments over ``k_tiles`` k tiles
    (:func:`direct_k`): 16 bytes a load (two k tiles) where the k tiles come in pairs, else 8."""
    width = 16 if k_tiles % 2 == 0 else 8
    return width, 8 * k_tiles // width


def direct_k(quad: int, kt: int, j: int, k_tiles: int) -> int:
    """``operand_path="direct"`` (and the streamed k tiles): the column, within its warp's k range of ``k_tiles`` k
    tiles, that lane quad ``quad`` multiplies as element ``j`` (0..3) of its B fragment of k tile ``kt`` (its A
    fragment's elements ``2 * (j // 2) + j % 2`` and ``+ 2``, one in each of its two rows, take the same column).
    A lane's load ``p`` holds ``v`` consecutive columns (8 for 16-byte loads: two k tiles' fragments; 4 for 8-byte
    ones), and the four lanes of a batch row load theirs side by side: ``p * 4v + quad * v``, so each load
    instruction of a warp reads 4v contiguous values of each of its eight rows (cuDNN's persistent LSTM reads its
    operands the same way: ``LDG.E.128`` at +0, +64, +128, +192 bytes). Any bijection of the range is right as long
    as A and B agree."""
    per_load = direct_loads(k_tiles)[0] // 2
    tiles_per_load = per_load // 4
    return kt // tiles_per_load * 4 * per_load + quad * per_load + kt % tiles_per_load * 4 + j


def ordered_tiles(cfg, k_tiles_per_warp: int, l2_k_tiles: int) -> int:
    """The k tiles whose columns :func:`direct_k` orders: the warp's whole range with ``operand_path="direct"``,
    else the streamed ones."""
    return k_tiles_per_warp if cfg.operand_path == "direct" else l2_k_tiles


def streamed_loads(cfg, k_tiles_per_warp: int, l2_k_tiles: int) -> tuple[int, int]:
    """``(bytes, k tiles)`` of one load of a streamed row: 16 bytes over two k tiles, or 8 over one."""
    width = direct_loads(ordered_tiles(cfg, k_tiles_per_warp, l2_k_tiles))[0]
    return width, width // 8


def stream_depth(m_tiles_per_warp: int) -> int:
    """Load groups a warp keeps in flight: ``STREAM_DEPTH`` at one row tile a warp, fewer (at least two) with more."""
    return max(2, STREAM_DEPTH // m_tiles_per_warp)


def staging_regs(cfg, k_tiles_per_warp: int, l2_k_tiles: int) -> int:
    """32-bit registers the streamed tier takes: the loads in flight, one assembled A fragment per row tile and each
    row's offset into the weight matrix."""
    if not l2_k_tiles:
        return 0
    mw = cfg.m_tiles_per_warp
    width, _ = streamed_loads(cfg, k_tiles_per_warp, l2_k_tiles)
    return stream_depth(mw) * mw * 2 * width // 4 + 4 * mw + 2 * mw


def check_streamed(cfg, g, plan: CellPlan) -> None:
    """ConfigError where ``l2_k_tiles`` cannot be read in place from the weight matrix, with the reason."""
    lk = cfg.l2_k_tiles
    if lk < 0:
        raise ConfigError(f"l2_k_tiles={lk}: the k tiles of a warp whose A fragments are read from global memory, "
                          "0 or more")
    if not lk:
        return
    kt = g.k_tiles_per_warp
    if cfg.smem_k_tiles + lk > kt:
        raise ConfigError(f"smem_k_tiles={cfg.smem_k_tiles} and l2_k_tiles={lk}: a warp has {kt} k tiles (hidden "
                          f"{plan.hidden} over k_groups {cfg.k_groups}); together at most {kt}")
    if len(plan.reductions) != 1 or plan.heads > 1:
        raise ConfigError(f"l2_k_tiles={lk}: the streamed fragments are read in place from one dense recurrent weight "
                          f"matrix; cell '{plan.cell.name}' has {len(plan.reductions)} products"
                          f"{' over heads' if plan.heads > 1 else ''}: use l2_k_tiles=0")
    if plan.hidden % 8:
        raise ConfigError(f"l2_k_tiles={lk}: the streamed fragments are read in place, 8 weights (16 bytes) at a time; "
                          f"hidden={plan.hidden} is not a multiple of 8: use l2_k_tiles=0")
    last = TILE_K * ((cfg.k_groups - 1) * kt + lk)
    if last > plan.hidden:
        raise ConfigError(f"l2_k_tiles={lk}: the last k group's streamed columns end at {last}, past hidden="
                          f"{plan.hidden} (its k range is padded): lower l2_k_tiles to "
                          f"{max(0, plan.hidden // TILE_K - (cfg.k_groups - 1) * kt)} or k_groups")
    per_load = streamed_loads(cfg, kt, lk)[1]
    if lk % per_load:
        raise ConfigError(f"l2_k_tiles={lk}: with operand_path='direct' a lane's loads hold {per_load} k tiles each; "
                          f"stream a multiple of {per_load}")


def streamed_tiers(cfg, g, plan: CellPlan, gpu: GpuSpec, other_regs: int) -> list[tuple[int, int]]:
    """The ``(smem_k_tiles, l2_k_tiles)`` a space offers for ``cfg`` (geometry ``g``, without tiers) past registers and
    shared memory together: as many k tiles in shared memory as the block's limit takes, and the fewest streamed k
    tiles that bring the register estimate under the cap, with the next ``TIER_STEPS - 1`` (fallbacks where ptxas
    spills); none where the config cannot stream or needs not. ``other_regs``: what a shared tier adds (its staged
    fragments)."""
    if not g.m_tiles or len(plan.reductions) != 1 or plan.heads > 1 or plan.hidden % 8:
        return []
    mw, kt = cfg.m_tiles_per_warp, g.k_tiles_per_warp
    per_tile = 16 * g.threads * mw  # shared bytes of one k tile of every warp
    room = gpu.smem_per_block - STATIC_SMEM_RESERVE - weights_offset(g.smem_ops + g.smem_gs + g.smem_us)
    sk = max(0, min(kt, room // per_tile))
    excess = g.regs_estimate - max_regs_per_thread(g.threads, gpu)
    if excess <= 0 or 4 * mw * sk >= excess + other_regs:  # registers, or with shared memory, hold them
        return []
    most = max(0, min(kt - sk, plan.hidden // TILE_K - (cfg.k_groups - 1) * kt))
    out = []
    for lk in range(1, most + 1):
        staging = staging_regs(cfg, kt, lk) + (other_regs if sk else 0)
        if 4 * mw * (sk + lk) < excess + staging:  # not yet under the cap
            continue
        if lk % streamed_loads(cfg, kt, lk)[1] or (cfg.operand_path != "direct" and lk % 2 and lk < most):
            continue  # whole loads; 16-byte ones where the range allows
        out.append((sk, lk))
        if len(out) == TIER_STEPS:
            break
    return out


def streamed_cycles(g) -> float:
    """What the untuned ranking charges a pass for its streamed fragments: their bytes at ``DRAM_BYTES_PER_CYCLE``."""
    return g.l2_ws / DRAM_BYTES_PER_CYCLE


"""Batch groups in the float32 backward (``persistent_backward``): its config type and the knob's rules.

Batch rows never read each other, in the backward as in the forward. ``batch_groups`` G splits the batch into G
equal groups of rows, each on CTAs of its own that hold all the transposed weights and run every unit for their
group's rows only: the grid is G runs of ``ceil(hidden / units_per_cta)`` CTAs, and every per-row argument is seen
through the group's rows (``codegen.kernel.row_view``), so the kernel indexes rows from 0 as for a batch of B / G.
It is the forward's tensor-core knob of the same name (``persistent_mma_config``: ``batch_groups``), here where no
block waits for another: barrier ``block`` (head-wise products whose heads a CTA holds whole, or one CTA holding every
unit), so that a group never meets another at a barrier. Each CTA then takes 1/G of the (batch row, unit) items and
1/G of the products' batch rows, with no grid barrier: at slstm_h12 768 x 16, 12 heads x 8 groups of 2 rows is 96
CTAs of 256 threads, one item a thread, the fastest of 14 configs on the H100 (``persistent_backward``'s cost model).
Across a grid barrier (``counter``, ``grid_sync``) groups would wait for each other every step and only add CTAs to
it: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan

from .persistent_config import PersistentConfig
from .persistent_mma_config import BATCH_GROUPS, batch_splits

# The fewest batch rows a group of the space has: fewer than the forward's (``persistent_mma_config.GROUP_MIN_ROWS``,
# 4), since a backward item costs more than a forward one and more groups share it out. H100, slstm_h12 bf16
# 768 x 16, T=1024, a training step (bench/cell_backward_configs.py, k_split 16, 4 rows a thread): groups of 16 rows
# 6.895 ms, 8 rows 5.072, 4 rows 4.363, 2 rows 4.042; groups of one row would take 192 CTAs there (past one a SM)
# and were not measured.
GROUP_MIN_ROWS = 2


@dataclass(frozen=True)
class BackwardConfig(PersistentConfig):
    """The forward's knobs (``PersistentConfig``) over the transposed weights, and ``batch_groups`` (module doc);
    1 is what configs from before the knob mean (a ``PersistentConfig`` is taken as one)."""

    batch_groups: int = field(default=1, metadata={"short": "bg", "quiet": True})


def groups_of(cfg) -> int:
    """``cfg``'s batch groups: 1 for a config without the knob (a ``PersistentConfig``)."""
    return getattr(cfg, "batch_groups", 1)


def group_rows(cfg, plan: CellPlan) -> int:
    """The batch rows a CTA of ``cfg`` runs: its group's (:func:`check_batch_groups` makes the groups equal)."""
    return plan.batch // groups_of(cfg)


def check_batch_groups(cfg, plan: CellPlan) -> None:
    """ConfigError where ``batch_groups`` cannot split this plan's batch, or the config's barrier makes groups wait
    for each other, with the reason. Any divisor of the batch is valid; the space offers the forward's
    (:func:`groups_offered`)."""
    G = groups_of(cfg)
    if not isinstance(G, int) or isinstance(G, bool) or G < 1:
        raise ConfigError(f"batch_groups={G!r}: the number of groups of batch rows, a positive integer")
    if G == 1:
        return
    if plan.batch % G:
        raise ConfigError(f"batch_groups={G}: the batch of {plan.batch} does not split into {G} equal groups of rows; "
                          "take a divisor of the batch")
    if barrier(cfg.barrier).grid_wide:
        raise ConfigError(f"batch_groups={G} runs each group of batch rows on CTAs of its own, which pays only where "
                          f"no block waits for another: with barrier 'block' (whole heads a CTA), not across the "
                          f"grid barrier of '{cfg.barrier}'; take batch_groups=1")


def groups_offered(plan: CellPlan, kind: str) -> tuple:
    """The batch groups the space offers with barrier ``kind``: where no block waits for another, the forward's
    group counts (``persistent_mma_config.batch_splits``) that split the batch into equal groups of at least
    ``GROUP_MIN_ROWS`` rows; else one group."""
    return (1,) if barrier(kind).grid_wide else batch_splits(plan, GROUP_MIN_ROWS, BATCH_GROUPS[-1])

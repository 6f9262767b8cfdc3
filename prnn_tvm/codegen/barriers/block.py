"""``block``: each block synchronizes with itself alone, where no block reads another's values.

Where every recurrent product of a step reads only units of the block that computes it (head-wise products
whose heads the block holds whole, ``CellPlan.local_to``; or a single block holding every unit), a step needs
no grid barrier: a block barrier (``__syncthreads()``) makes its threads' new values visible to each other,
through the plain double-buffered exchange. The launch has no grid synchronization (no ``sync`` words, no
cooperative launch), like a cell without products; nothing can time out.
"""

from __future__ import annotations

from .base import Barrier, sync_threads


class Block(Barrier):
    """A block barrier between steps and phases; the plain exchange."""

    name = "block"
    state_words = None
    grid_wide = False

    def placement_problem(self, plan, units: int) -> str | None:
        if plan.reductions and not plan.local_to(units):
            sizes = sorted({r.head_size(plan.hidden) for r in plan.reductions})
            return (
                f"barrier '{self.name}' synchronizes each block with itself alone, so a block must hold every unit "
                f"its products read: units_per_cta={units} must be a multiple of the head size of every product "
                f"({', '.join(map(str, sizes))} units; the hidden size for a dense one); use counter, tags or "
                "grid_sync"
            )
        return None

    def probe_problem(self, all_to_all: bool) -> str | None:
        return "'block' synchronizes no block with another: there is nothing for the barrier probe to measure"

    def training_kind(self) -> str:
        """Itself: the training forward exchanges through the workspace, as this kind does."""
        return self.name

    def emit_wait(self, ordinal, base, args, stall) -> None:
        sync_threads()

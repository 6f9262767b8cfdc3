"""``block``: each block synchronizes with itself alone, where no block reads another's values.

Where every recurrent product of a step reads only units of the block that computes it (head-wise products
whose heads the block holds whole, ``CellPlan.local_to``; or a single block holding every unit), a step needs
no grid barrier: a block barrier (``__syncthreads()``) makes its threads' new values visible to each other.
The launch has no grid synchronization (no ``sync`` words, no cooperative launch), like a cell without products;
nothing can time out.

Where a step runs one batch pass (``ExchangeSite.exchange_in_tiles``), the values are exchanged in the shared
operand tiles themselves: a thread writes its unit's new value straight into the tile the next products read,
and nothing goes through the global workspace. One tile per operand is enough: a step's products read it before
the block barrier that ends them (``end_products``), its pointwise math writes it after that barrier, and the
barrier at the end of the step orders those writes before the next step's products. Against the workspace
exchange this takes a global store and an L2 round trip (the tile copy) and one block barrier off every step's
critical path. Elsewhere (several batch passes a step) the plain double-buffered workspace exchange.
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

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

    def load_operands(self, site, names: list, t, b0, phase: int) -> None:
        """In the tiles: the states' initial values at step 0 (then a block barrier); the tiles hold every later
        value already."""
        if not site.exchange_in_tiles:
            super().load_operands(site, names, t, b0, phase)
            return
        if phase > 0:  # a stage of this step, written into its tile before the barrier between the phases
            return
        with T.If(t == 0):
            with T.Then():
                for name in names:
                    site.copy_tile(name, t, b0, phase, initial=True)
                sync_threads()

    def publish(self, site, name: str, t, b, unit, value) -> None:
        if not site.exchange_in_tiles:
            super().publish(site, name, t, b, unit, value)
            return
        T.buffer_store(site.smem, value, [site.tile_at(name, b, unit)])

    def previous(self, site, name: str, t, b, unit):
        if not site.exchange_in_tiles:
            return super().previous(site, name, t, b, unit)
        return site.smem[site.tile_at(name, b, unit)]

"""``grid_sync``: cooperative groups' ``grid.sync()``. No state, no timeout (CUDA guarantees it under a cooperative
launch); the baseline the project's kinds are measured against."""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from .base import Barrier


class GridSyncBarrier(Barrier):
    """``cooperative_groups::this_grid().sync()`` between steps; the plain exchange."""

    name = "grid_sync"
    state_words = None

    def emit_wait(self, ordinal, base, args, stall) -> None:
        T.evaluate(T.cuda.grid_sync())

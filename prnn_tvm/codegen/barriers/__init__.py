"""Synchronization between timesteps: one class per kind, each in a module of its own with its device code in a
``.cuh`` file of this package (``base`` says what every kind provides and the protocol they share).

- ``tags`` (default where it fits): data-carried synchronization, tagged 64-bit words (``tags``);
- ``sentinel``: a slot per step, polled until no value is the sentinel, cuDNN's exchange (``sentinel``);
- ``counter``: one monotonic arrival counter, as fast as ``grid.sync()`` and bounded (``counter``);
- ``grid_sync``: cooperative groups; no state, no timeout; the baseline (``grid_sync``);
- ``block``: a block barrier alone, where no block reads another's values (head-wise products whose heads a
  block holds whole): no grid synchronization at all (``block``).

A new kind is a module here with its class, its ``.cuh`` file and an entry in :data:`BARRIERS`; templates,
the GPU backward, the runtime and the benchmark reach it through :func:`by_name` and the :class:`Barrier`
interface.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import SYNC_WORDS, Barrier, SyncArgs, block_or, declare_sync_args, row_lanes
from .block import Block
from .counter import Counter
from .grid_sync import GridSyncBarrier
from .sentinel import Sentinel
from .tags import Tags

BARRIERS = {kind.name: kind for kind in (Tags(), Sentinel(), Counter(), GridSyncBarrier(), Block())}

__all__ = [
    "BARRIERS",
    "SYNC_WORDS",
    "Barrier",
    "SyncArgs",
    "block_or",
    "by_name",
    "declare_sync_args",
    "of_launch",
    "row_lanes",
]


def by_name(name: str) -> Barrier:
    """The kind a config names; ConfigError listing the kinds otherwise."""
    try:
        return BARRIERS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"barrier '{name}' unknown; available: {', '.join(BARRIERS)}") from None


def of_launch(launch) -> Barrier:
    """The kind a launch (``prnn_tvm.signature.Launch``) synchronizes its steps with: its ``GridSync``'s, or
    ``grid_sync`` for a launch without one (its steps need no grid barrier)."""
    return by_name(launch.sync.kind if launch.sync is not None else GridSyncBarrier.name)

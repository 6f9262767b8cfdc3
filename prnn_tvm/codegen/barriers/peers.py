"""The ``tags`` exchange of a layer split over GPUs (``schedules/split.py``; device code: ``peers.cuh``).

Not a kind of its own (``BARRIERS`` does not list it: a config names ``tags``, and one GPU's kernels are unchanged):
the split kernel's builder runs this in its place. Two differences from :class:`~.tags.Tags`:

- a published value also goes, as the same tagged word, into every peer GPU's copy of the workspace (system-scope
  stores through the peers' addresses, the launch's ``peer_workspace_<k>`` scalars);
- a tile is polled ``chunk_rows`` batch rows at a time: a poll holds its loads in registers while it waits, and a
  whole tile of a wide layer (8 rows of 2048 values: 32 loads, 192 registers a thread) does not fit beside the
  weights that a layer too big for one GPU keeps in them.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ...signature import PEER_WORKSPACE
from ..pointwise import bind_value
from .base import ExchangeSite, abort_on, payload_type
from .source import cuda_source
from .tags import Tags


class PeerTags(Tags):
    """``tags`` over ``gpus`` GPUs, polling ``chunk_rows`` batch rows of a tile at a time. ``floor_parts`` (the split's
    ``floor`` hops, timing only; None: the real exchange): the peers replaced by this GPU's own copy, so that a step
    does its local work and no hop: a store meant for a peer goes to its own slot again, and the first
    ``floor_parts`` GPUs' columns (its own, then each next GPU's) are polled from its own (fresh as soon as its own
    blocks wrote them) into their place in the operand tile."""

    def __init__(self, gpus: int, chunk_rows: int, floor_parts: int | None = None):
        self.gpus, self.chunk_rows, self.floor_parts = gpus, chunk_rows, floor_parts

    def poll_tiles(self, site: ExchangeSite, names: list, t, b0, parity, step) -> None:
        """Each operand's rows b0.. (written at ``step - 1``), ``chunk_rows`` rows per poll, into shared memory: every
        column at once, or on a floor a GPU's columns at a time, each read from this GPU's own (as many polls and
        values as the whole row's where ``floor_parts`` is every GPU)."""
        for name in names:
            if self.floor_parts is None:
                self._poll_columns(site, name, b0, parity, step, site.cols.first_column(name, site.cta), None)
                continue
            source = bind_value(site.gpu_index * site.gpu_units, "own_column")
            for part in range(self.floor_parts):
                first = bind_value((site.gpu_index + part) % self.gpus * site.gpu_units, f"part{part}_column")
                self._poll_columns(site, name, b0, parity, step, first, site.gpu_units, source)

    def _poll_columns(self, site: ExchangeSite, name: str, b0, parity, step, first, width, source=None) -> None:
        """Operand ``name``'s rows b0.. from column ``first``: ``width`` columns of each row (None: the whole row),
        read from column ``source`` of the workspace (None: ``first``)."""
        _dst, _n, _most, sleep_ns, row = site.polled_tile(name, b0)
        width = width or row
        # a chunk holds as many values as one of whole rows (the registers its loads take: split.poll_chunk), at
        # most a tile's rows
        BT, B = site.c.batch_tile, site.B
        rows = min(self.chunk_rows * (row // width), BT)
        column = 0 if width == row else first  # of the operand tile: a part sits where it is in the row
        here = T.min(BT, B - b0)  # rows of this tile
        for r0 in range(0, min(BT, B), rows):
            count = tirx.max(T.min(here - r0, rows), 0) * width
            at = first if source is None else source
            src = T.address_of(site.a.ws[site.ws_at(name, parity, T.min(b0 + r0, B - 1), at)])
            dst = T.address_of(site.smem[(site.slot[name] * site.tile_rows + r0) * site.stride + column])
            abort = self.poll_copy(site.g.threads, src, dst, site.dt, count, min(rows, B - r0) * width, width,
                                   site.stride, site.barrier_base, step, site.sync, sleep_ns, src_row=row)
            abort_on(site, abort)

    def publish(self, site: ExchangeSite, name: str, t, b, unit, value) -> None:
        """The tagged store into this GPU's copy, and the same word into each peer's; CTA 0 of the whole grid skips
        them all at ``stall_step`` (the test knob: every GPU then times out)."""
        value = bind_value(value, "published")  # once, for every copy
        super().publish(site, name, t, b, unit, value)
        with T.If(tirx.Not(tirx.all(site.bx == 0, t == site.sync.stall_step))):
            with T.Then():
                slot = T.address_of(site.a.ws[site.ws_at(name, t % 2, b, unit)])
                first = T.address_of(site.a.ws[(0,) * len(site.a.ws.shape)])
                tag = T.Cast("uint32", site.barrier_base + t + 1)  # as Tags.store tags it
                for k in range(self.gpus - 1):
                    peer = site.a.named[PEER_WORKSPACE.format(k)] if self.floor_parts is None else first
                    T.evaluate(T.cuda.func_call(
                        f"prnn_tag_store_peer<{payload_type(site.dt, self.name)}>",
                        slot, first, peer, value, tag,
                        source_code=cuda_source("peers.cuh"), return_type="void"))

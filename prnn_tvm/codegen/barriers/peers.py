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
    """``tags`` over ``gpus`` GPUs, polling ``chunk_rows`` batch rows of a tile at a time; ``peers`` False (the split's
    ``floor`` hop, timing only): the peers replaced by this GPU's own copy, so that a step does all its local work
    and no hop: a store meant for a peer goes to its own slot again, and a peer's columns are polled from its own
    (fresh as soon as its own blocks wrote them) into the peer's place in the operand tile."""

    def __init__(self, gpus: int, chunk_rows: int, peers: bool = True):
        self.gpus, self.chunk_rows, self.peers = gpus, chunk_rows, peers

    def poll_tiles(self, site: ExchangeSite, names: list, t, b0, parity, step) -> None:
        """Each operand's rows b0.. (written at ``step - 1``), ``chunk_rows`` rows per poll, into shared memory: every
        column, or where the site multiplies a GPU's units at a time (``site.per_part``) its own GPU's alone (the
        peers' come before their k tiles: :meth:`poll_part`)."""
        if site.per_part:
            self.poll_part(site, names, b0, parity, step, 0)
            return
        for name in names:
            self._poll_columns(site, name, b0, parity, step, site.cols.first_column(name, site.cta), None)

    def poll_part(self, site: ExchangeSite, names: list, b0, parity, step, part: int) -> None:
        """Each operand's columns of the ``part``-th GPU after this one (0: its own), rows b0.., as
        :meth:`poll_tiles` polls."""
        for name in names:
            first = bind_value((site.gpu_index + part) % self.gpus * site.gpu_units, f"part{part}_column")
            source = first if self.peers else bind_value(site.gpu_index * site.gpu_units, f"part{part}_source")
            self._poll_columns(site, name, b0, parity, step, first, site.gpu_units, source)

    def _poll_columns(self, site: ExchangeSite, name: str, b0, parity, step, first, width, source=None) -> None:
        """Operand ``name``'s rows b0.. from column ``first``: ``width`` columns of each row (None: the whole row),
        read from column ``source`` of the workspace (None: ``first``)."""
        _dst, _n, _most, sleep_ns, row = site.polled_tile(name, b0)
        width = width or row
        # a chunk holds as many values as one of whole rows (the registers its loads take: split.poll_chunk)
        BT, B, rows = site.c.batch_tile, site.B, self.chunk_rows * (row // width)
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
                    peer = site.a.named[PEER_WORKSPACE.format(k)] if self.peers else first
                    T.evaluate(T.cuda.func_call(
                        f"prnn_tag_store_peer<{payload_type(site.dt, self.name)}>",
                        slot, first, peer, value, tag,
                        source_code=cuda_source("peers.cuh"), return_type="void"))

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
    """``tags`` over ``gpus`` GPUs, polling ``chunk_rows`` batch rows of a tile at a time."""

    def __init__(self, gpus: int, chunk_rows: int):
        self.gpus, self.chunk_rows = gpus, chunk_rows

    def poll_tiles(self, site: ExchangeSite, names: list, t, b0, parity, step) -> None:
        """Each operand's rows b0.. (written at ``step - 1``), ``chunk_rows`` rows per poll, into shared memory."""
        BT, B, rows = site.c.batch_tile, site.B, self.chunk_rows
        for name in names:
            _dst, _n, _most, sleep_ns, row = site.polled_tile(name, b0)
            first = site.cols.first_column(name, site.cta)
            here = T.min(BT, B - b0)  # rows of this tile
            for r0 in range(0, min(BT, B), rows):
                count = tirx.max(T.min(here - r0, rows), 0) * row
                src = T.address_of(site.a.ws[site.ws_at(name, parity, T.min(b0 + r0, B - 1), first)])
                dst = T.address_of(site.smem[(site.slot[name] * site.tile_rows + r0) * site.stride])
                abort = self.poll_copy(site.g.threads, src, dst, site.dt, count, min(rows, B - r0) * row, row,
                                       site.stride, site.barrier_base, step, site.sync, sleep_ns)
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
                    T.evaluate(T.cuda.func_call(
                        f"prnn_tag_store_peer<{payload_type(site.dt, self.name)}>",
                        slot, first, site.a.named[PEER_WORKSPACE.format(k)], value, tag,
                        source_code=cuda_source("peers.cuh"), return_type="void"))

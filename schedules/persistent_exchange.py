"""How the persistent template moves exchanged values between thread blocks.

An *operand* is anything a recurrent product multiplies: a state (exchanged between
steps) or a stage of this step (exchanged between the phases of a step). Each has a
double-buffered slot pair in the workspace, ``ws[e, parity, b, k]``:

- state ``h`` written at step ``t`` goes to parity ``t % 2`` and is read at step ``t + 1``;
- a stage written in phase ``p`` of step ``t`` goes to parity ``t % 2`` and is read in
  phase ``p + 1`` of the same step.

The config's kind of synchronization (``prnn_tvm.codegen.barriers``) decides how the values travel: plain
stores and loads after a barrier, tagged words polled until they carry their step, or a slot per step of
each state's sequence polled until it holds no sentinel. The builder is the kind's ``ExchangeSite``: this
mixin gives it the addresses and tile copies the kinds move values with.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import barriers
from prnn_tvm.codegen.barriers.base import sync_threads
from prnn_tvm.codegen.kernel import vec_index
from prnn_tvm.dtypes import itemsize

from .persistent_sums import sum_slots


class OperandExchange:
    """Mixin of the template's builder: loading operand tiles, publishing and re-reading values."""

    def operands_of_phase(self, phase: int) -> list[str]:
        return list(dict.fromkeys(r.operand for r in self.reductions if r.phase == phase))

    def load_operands(self, t, b0, phase: int):
        """Bring rows b0..b0+batch_tile of this phase's operands into shared memory (the kind's way).

        Ends with a block barrier, or leaves the batch-tile loop with an abort flag (``aborted``) that the kind's
        ``after_products`` turns into leaving the time loop.
        """
        if self.direct:  # each lane's own fragments, no shared tile (the tensor-core template's poll_fragments)
            self.poll_fragments(t, b0)
            return
        self.barrier.load_operands(self, self.operands_of_phase(phase), t, b0, phase)

    def polled_tile(self, name: str, b0) -> tuple:
        """A poll of operand ``name``'s rows b0..: ``(where they go in shared memory, values, at most that many,
        nanoseconds to sleep between polls, values of a row)`` (a row: the CTA's span of the operand, every unit
        of a dense one: ``head_columns``)."""
        BT, row = self.c.batch_tile, self.cols.span(name)
        dst = T.address_of(self.smem[self.slot[name] * self.tile_rows * self.stride])
        most = min(BT, self.B) * row  # the tensor-core template's tile may be taller than the batch
        return dst, T.min(BT, self.B - b0) * row, most, getattr(self.c, "poll_sleep", 0), row  # tensor-core knob

    def workspace_shape(self) -> tuple:
        """The exchange's shape: one double-buffered slot per operand, ``(batch, hidden)`` each, or with head-wise
        products ``batch x padded hidden`` values laid out by span (``head_columns``); then slots for the partial
        sums of the sums over units (``persistent_sums``)."""
        rows = (self.p.batch, self.H) if not self.cols.headed else (self.p.batch * self.cols.padded_hidden(),)
        operands = max(1, len(self.p.operands))  # then the partial sums of the sums over units
        return (operands + sum_slots(self.p, 2 * math.prod(rows), self.dt, self.g.ctas, self.replicas), 2, *rows)

    def ws_at(self, name: str, parity, b, unit) -> tuple:
        """The workspace indices of operand ``name``'s value for batch row ``b``, unit ``unit``, at ``parity``: by span
        (``[span][batch row][column]``) where products are head-wise, else ``[batch row][unit]``."""
        e = self.ops[name]
        if not self.cols.headed:
            return e, parity, b, unit
        span = self.cols.span(name)
        return e, parity, unit // span * (self.B * span) + b * span + unit % span

    def sequence_row(self, name: str) -> int:
        """Values between consecutive batch rows of state ``name``'s per-step sequence (``self.sequences``)."""
        kind, _ = self.sequences[name]
        return self.a.out.shape[2] if kind == "out" else self.H

    def sequence_slot(self, name: str, step, b, unit):
        """State ``name``'s value of its own step ``step`` for row ``b``, unit ``unit``, in its per-step sequence
        (``self.sequences``)."""
        kind, k = self.sequences[name]
        if kind == "out":
            return self.a.out[step, b, k * self.H + unit]
        return self.a.exchange[step, k, b, unit]

    def copy_tile(self, name: str, t, b0, phase: int, initial: bool = False):
        """Plain vector loads: the initial state at step 0 (``initial``: whatever the step), else the workspace
        slot written before. A CTA loads its span of the operand (``head_columns``: every unit, or its heads'
        units, a contiguous run per batch row in the workspace); columns past ``hidden`` (the last CTA's) are
        not loaded."""
        H, BT, threads, s = self.H, self.tile_rows, self.g.threads, self.slot[name]
        span, col0 = self.cols.span(name), self.cols.first_column(name, self.cta)
        lv = barriers.row_lanes(H if span == H else min(self.cols.sizes[name]), itemsize(self.dt))  # 16-byte loads
        n = BT * span // lv
        for i in range(ceil_div(n, threads)):
            idx = i * threads + self.tx
            bb, k = (idx * lv) // span, (idx * lv) % span
            b = b0 + bb
            column = k if span == H else col0 + k
            dst = [vec_index((s * BT + bb) * self.stride + k, lv)]

            def workspace(parity, b=b, column=column):
                *slot, at = self.ws_at(name, parity, b, column)
                return self.a.ws[(*slot, vec_index(at, lv))]

            inside = tirx.all(idx < n, b < self.B) if span == H else tirx.all(idx < n, b < self.B, column < H)
            with T.If(inside):
                with T.Then():
                    if initial:
                        T.buffer_store(self.smem, self.a.init[name][b, vec_index(column, lv)], dst)
                    elif phase > 0:  # a stage of this step
                        T.buffer_store(self.smem, workspace(t % 2), dst)
                    else:
                        with T.If(t == 0):
                            with T.Then():
                                T.buffer_store(self.smem, self.a.init[name][b, vec_index(column, lv)], dst)
                            with T.Else():
                                T.buffer_store(self.smem, workspace((t + 1) % 2), dst)

    @property
    def exchange_in_tiles(self) -> bool:
        """Whether the exchanged values can live in the shared operand tiles themselves: a step runs one batch pass
        (the tiles hold every batch row) from shared tiles. Only a kind that synchronizes each block with itself
        uses it (``block``), where no other block reads the values."""
        return self.g.batch_chunks == 1 and not self.direct

    def tile_at(self, name: str, b, unit):
        """Where, in shared memory, operand ``name``'s value for batch row ``b`` and unit ``unit`` sits in its tile
        (as :meth:`copy_tile` lays it out), where :attr:`exchange_in_tiles`."""
        column = unit - self.cols.first_column(name, self.cta)
        return (self.slot[name] * self.tile_rows + b) * self.stride + column

    def publish(self, name: str, t, b, unit, value):
        """Write this unit's new value of operand ``name`` for the other blocks (the kind's way)."""
        self.barrier.publish(self, name, t, b, unit, value)

    def previous_state(self, name: str, t, b, unit):
        """This unit's value of exchanged state ``name`` from the step before (this thread wrote it)."""
        return T.if_then_else(t == 0, self.a.init[name][b, unit], self.barrier.previous(self, name, t, b, unit))

    def end_products(self):
        """After a batch tile's products, a block barrier: the partial sums are in shared memory. With direct
        fragments it also makes the polls' abort flag the block's, and leaves the batch-tile loop on it."""
        if not self.direct:
            sync_threads()
            return
        T.buffer_store(self.aborted, barriers.block_or(self.aborted[0]), [0])
        with T.If(self.aborted[0] != 0):
            with T.Then():
                T.Break()

    def zero_operand_padding(self):
        """Columns hidden..k_pad of the shared operand tiles meet zero weights; keep them 0, not garbage (direct
        fragments have no shared tiles: their columns past hidden are never loaded)."""
        if self.direct:
            return
        if self.cols.headed:
            self.zero_head_padding()
            return
        pad = self.g.k_pad - self.H
        total = self.tile_sets * len(self.part.operands) * self.tile_rows * pad
        for i in range(ceil_div(total, self.g.threads)):
            idx = i * self.g.threads + self.tx
            with T.If(idx < total):
                with T.Then():
                    T.buffer_store(self.smem, tirx.const(0.0, self.dt),
                                   [(idx // pad) * self.stride + self.H + idx % pad])


    @property
    def tile_sets(self) -> int:
        """Sets of the part's operand tiles in shared memory, one after the other: one (the tensor-core template's
        ``gate_layout="in_warp"`` keeps two, the one a step reads and the one it writes)."""
        return 1

    def zero_head_padding(self):
        """:meth:`zero_operand_padding` where products are head-wise: the columns of each operand's tile that no
        copy loads (from its span to the tile's stride, where a row of the last head reads ``k_pad - D`` on, and
        in the last CTA those past ``hidden``)."""
        BT, stride = self.tile_rows, self.stride
        for name, first in self.slot.items():
            span, col0 = self.cols.span(name), self.cols.first_column(name, self.cta)
            total = BT * stride
            for slot in range(first, first + self.tile_sets * len(self.slot), len(self.slot)):  # each set's tile
                for i in range(ceil_div(total, self.g.threads)):
                    idx = i * self.g.threads + self.tx
                    k = idx % stride
                    with T.If(tirx.all(idx < total, tirx.any(k >= span, col0 + k >= self.H))):
                        with T.Then():
                            T.buffer_store(self.smem, tirx.const(0.0, self.dt), [slot * BT * stride + idx])


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


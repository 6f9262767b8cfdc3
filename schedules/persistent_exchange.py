"""How the persistent template moves exchanged values between thread blocks.

An *operand* is anything a recurrent product multiplies: a state (exchanged between
steps) or a stage of this step (exchanged between the phases of a step). Each has a
double-buffered slot pair in the workspace, ``ws[e, parity, b, k]``:

- state ``h`` written at step ``t`` goes to parity ``t % 2`` and is read at step ``t + 1``;
- a stage written in phase ``p`` of step ``t`` goes to parity ``t % 2`` and is read in
  phase ``p + 1`` of the same step.

With a barrier variant the reads are plain loads after the barrier; with ``tags`` the
values carry their step and the reads poll (``prnn_tvm.codegen.barrier.tag_copy``).

With ``sentinel`` every exchanged state has a slot per step of its own instead, written once
per launch: the output sequence where the state is an output, else the launch's ``exchange``
sequence (a stack's lower layers). A state of delay ``d`` (a stack's layer ``d``) writes kernel
step ``t``'s value at its own step ``t - d``, and kernel step ``t`` reads it at ``t - 1 - d``,
its value as the step found it (its initial state before its first step).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import barrier as grid_barrier
from prnn_tvm.codegen.kernel import vec_index
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.dtypes import itemsize


class OperandExchange:
    """Mixin of the template's builder: loading operand tiles, publishing and re-reading values."""

    def operands_of_phase(self, phase: int) -> list[str]:
        return list(dict.fromkeys(r.operand for r in self.reductions if r.phase == phase))

    def load_operands(self, t, b0, phase: int):
        """Bring rows b0..b0+batch_tile of this phase's operands into shared memory.

        Ends with a block barrier (or, for ``tags``, a block-uniform abort flag that breaks
        out of the batch-tile loop and, through ``aborted``, the time loop).
        """
        names = self.operands_of_phase(phase)
        if self.direct:  # each lane's own fragments, no shared tile (the tensor-core template's poll_fragments)
            self.poll_fragments(t, b0)
            return
        if self.barrier.sentinel:  # one phase
            self.poll_sequences(names, t, b0)
            return
        if not self.barrier.carries_data:
            for name in names:
                self.copy_tile(name, t, b0, phase)
            sync_threads()
            return
        if phase > 0:
            self.poll_tiles(names, t, b0, parity=t % 2, step=t + 1)
            return
        with T.If(t == 0):
            with T.Then():
                for name in names:
                    self.copy_tile(name, t, b0, phase)
                sync_threads()
            with T.Else():
                self.poll_tiles(names, t, b0, parity=(t + 1) % 2, step=t)

    def poll_sequences(self, names, t, b0):
        """``sentinel``: each operand's rows b0.. as step ``t`` found them, from its sequence (the module's doc):
        its initial state before its own first step, else polled from the slot of its step before. Past the end
        of the sequence nothing is loaded: the operand's layer is done, and what it would multiply is not used.
        The operands are polled ``SENTINEL_SOURCES`` at a time, each poll waiting on all of them at once (a stack's
        layer polls its own state and the one below's together: LSTM fp16 4x512x8 2.04 -> 1.92 us per
        wavefront step, H100); each group ends with a block barrier, also where it polls nothing."""
        slots = {name: bind_value(t - 1 - self.p.delays[name], f"slot_{name}") for name in names}
        polled = {name: tirx.all(slot >= 0, slot < self.a.seq_len) for name, slot in slots.items()}
        for name in names:  # the initial copies first: a poll's block barrier publishes them
            with T.If(slots[name] < 0):
                with T.Then():
                    self.copy_tile(name, t, b0, 0, initial=True)
        for first in range(0, len(names), grid_barrier.SENTINEL_SOURCES):
            group = names[first:first + grid_barrier.SENTINEL_SOURCES]
            # where the group polls all its operands (every step but a layer's first and those past the sequence),
            # the counts are the tile's, constants to the compiler: a count it must read at run time made a
            # single layer's step 1.24x slower (H100, LSTM fp16 512x8, 8 warps)
            with T.If(tirx.all(*(polled[name] for name in group))):
                with T.Then():
                    self.poll_group(group, slots, t, b0)
                with T.Else():
                    if len(group) == 1:  # nothing to poll: the block barrier alone publishes the initial copies
                        sync_threads()
                    else:
                        self.poll_group(group, slots, t, b0, polled)

    def poll_group(self, names, slots, t, b0, polled=None):
        """One ``sentinel`` poll of operands ``names`` at their ``slots``: the whole tile of each, or (``polled``)
        of those whose condition holds and nothing of the others; leaves the time loop if it timed out."""
        sources = []
        for name in names:
            dst, n, most, sleep_ns = self.polled_tile(name, b0)
            slot = slots[name]
            if polled is not None:  # an address even where the operand is not polled
                slot, n = tirx.max(tirx.min(slot, self.a.seq_len - 1), 0), T.if_then_else(polled[name], n, 0)
            sources.append((T.address_of(self.sequence_slot(name, slot, b0, 0)), dst, n))
        abort = grid_barrier.sentinel_copy(self.barrier, self.g.threads, sources, self.dt, most, self.H,
                                           self.stride, t, self.sync, sleep_ns)
        with T.If(abort != 0):
            with T.Then():
                T.buffer_store(self.aborted, 1, [0])
                T.Break()

    def polled_tile(self, name: str, b0) -> tuple:
        """A poll of operand ``name``'s rows b0..: ``(where they go in shared memory, values, at most that many,
        nanoseconds to sleep between polls)``."""
        BT = self.c.batch_tile
        dst = T.address_of(self.smem[self.slot[name] * BT * self.stride])
        most = min(BT, self.B) * self.H  # the tensor-core template's tile may be taller than the batch
        return dst, T.min(BT, self.B - b0) * self.H, most, getattr(self.c, "poll_sleep", 0)  # tensor-core knob

    def sequence_row(self, name: str) -> int:
        """``sentinel``: values between consecutive batch rows of state ``name``'s sequence."""
        kind, _ = self.sequences[name]
        return self.a.out.shape[2] if kind == "out" else self.H

    def sequence_slot(self, name: str, step, b, unit):
        """``sentinel``: state ``name``'s value of its own step ``step`` for row ``b``, unit ``unit``, in its
        sequence (``self.sequences``)."""
        kind, k = self.sequences[name]
        if kind == "out":
            return self.a.out[step, b, k * self.H + unit]
        return self.a.exchange[step, k, b, unit]

    def copy_tile(self, name: str, t, b0, phase: int, initial: bool = False):
        """Plain vector loads: the initial state at step 0 (``initial``: whatever the step), else the workspace
        slot written before."""
        H, BT, threads, e, s = self.H, self.c.batch_tile, self.g.threads, self.ops[name], self.slot[name]
        lv = grid_barrier.row_lanes(H, itemsize(self.dt))  # 16-byte loads where H allows
        n = BT * H // lv
        for i in range(ceil_div(n, threads)):
            idx = i * threads + self.tx
            bb, k = (idx * lv) // H, (idx * lv) % H
            b = b0 + bb
            dst = [vec_index((s * BT + bb) * self.stride + k, lv)]
            with T.If(tirx.all(idx < n, b < self.B)):
                with T.Then():
                    if initial:
                        T.buffer_store(self.smem, self.a.init[name][b, vec_index(k, lv)], dst)
                    elif phase > 0:  # a stage of this step
                        T.buffer_store(self.smem, self.a.ws[e, t % 2, b, vec_index(k, lv)], dst)
                    else:
                        with T.If(t == 0):
                            with T.Then():
                                T.buffer_store(self.smem, self.a.init[name][b, vec_index(k, lv)], dst)
                            with T.Else():
                                T.buffer_store(self.smem, self.a.ws[e, (t + 1) % 2, b, vec_index(k, lv)], dst)

    def poll_tiles(self, names, t, b0, parity, step):
        """``tags``: poll each operand's values (written at ``step - 1``) into shared memory."""
        for name in names:
            dst, n, most, sleep_ns = self.polled_tile(name, b0)
            abort = grid_barrier.tag_copy(
                self.barrier, self.g.threads, T.address_of(self.a.ws[self.ops[name], parity, b0, 0]), dst,
                self.dt, n, most, self.H, self.stride, self.barrier_base, step, self.sync, sleep_ns)
            with T.If(abort != 0):
                with T.Then():
                    T.buffer_store(self.aborted, 1, [0])
                    T.Break()

    def publish(self, name: str, t, b, unit, value):
        """Write this unit's new value of operand ``name`` for the other blocks."""
        e = self.ops[name]
        if not self.barrier.carries_data:
            T.buffer_store(self.a.ws, value, [e, t % 2, b, unit])
            return
        with T.If(tirx.Not(tirx.all(self.bx == 0, t == self.sync.stall_step))):  # test knob: block 0 stalls
            with T.Then():
                slot = T.address_of(self.a.ws[e, t % 2, b, unit])
                T.evaluate(grid_barrier.tag_store(self.barrier, slot, value, self.barrier_base, t))

    def publish_sequences(self, t, timing, stored: dict, b, unit):
        """``sentinel``: the sequences are the exchange (the outputs among them). Store each exchanged state of
        ``stored`` at its own step (zero past the row's length, as ever: rows are independent, so no other row
        reads it, and the row keeps its state in a register; nothing before its first step or past the sequence)
        with the sentinel's store; block 0 skips its stores at ``stall_step`` (the test knob)."""
        with T.If(tirx.Not(tirx.all(self.bx == 0, t == self.sync.stall_step))):
            with T.Then():
                for name, value in stored.items():
                    if name not in self.own:
                        continue
                    running, d = timing.running(name), self.p.delays[name]
                    if running is not None:
                        value = T.if_then_else(running, value, tirx.const(0, self.dt))
                    store = grid_barrier.sentinel_store(
                        self.barrier, T.address_of(self.sequence_slot(name, t - d, b, unit)), value, self.dt)
                    if not self.p.lag:  # every step is the state's own
                        T.evaluate(store)
                        continue
                    with T.If(tirx.all(t >= d, t - d < self.a.seq_len)):
                        with T.Then():
                            T.evaluate(store)

    def previous_state(self, name: str, t, b, unit):
        """This unit's value of exchanged state ``name`` from the step before (this thread wrote it)."""
        previous = self.a.ws[self.ops[name], (t + 1) % 2, b, unit]
        if self.barrier.carries_data:  # the thread's own store: no polling
            previous = grid_barrier.tag_value(self.barrier, T.address_of(previous), self.dt)
        return T.if_then_else(t == 0, self.a.init[name][b, unit], previous)

    def end_products(self):
        """After a batch tile's products, a block barrier: the partial sums are in shared memory. With direct
        fragments it also makes the polls' abort flag the block's, and leaves the batch-tile loop on it."""
        if not self.direct:
            sync_threads()
            return
        T.buffer_store(self.aborted, grid_barrier.block_or(self.aborted[0]), [0])
        with T.If(self.aborted[0] != 0):
            with T.Then():
                T.Break()

    def zero_operand_padding(self):
        """Columns hidden..k_pad of the shared operand tiles meet zero weights; keep them 0, not garbage (direct
        fragments have no shared tiles: their columns past hidden are never loaded)."""
        if self.direct:
            return
        pad = self.g.k_pad - self.H
        total = len(self.part.operands) * self.c.batch_tile * pad
        for i in range(ceil_div(total, self.g.threads)):
            idx = i * self.g.threads + self.tx
            with T.If(idx < total):
                with T.Then():
                    T.buffer_store(self.smem, tirx.const(0.0, self.dt),
                                   [(idx // pad) * self.stride + self.H + idx % pad])


def sync_threads():
    """``__syncthreads()``."""
    T.evaluate(T.tvm_storage_sync("shared"))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

"""How the persistent template moves exchanged values between thread blocks.

An *operand* is anything a recurrent product multiplies: a state (exchanged between
steps) or a stage of this step (exchanged between the phases of a step). Each has a
double-buffered slot pair in the workspace, ``ws[e, parity, b, k]``:

- state ``h`` written at step ``t`` goes to parity ``t % 2`` and is read at step ``t + 1``;
- a stage written in phase ``p`` of step ``t`` goes to parity ``t % 2`` and is read in
  phase ``p + 1`` of the same step.

With a barrier variant the reads are plain loads after the barrier; with ``tags`` the
values carry their step and the reads poll (``prnn_tvm.codegen.barrier.tag_copy``).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import barrier as grid_barrier
from prnn_tvm.codegen.kernel import vec_index
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

    def copy_tile(self, name: str, t, b0, phase: int):
        """Plain vector loads: the initial state at step 0, else the workspace slot written before."""
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
                    if phase > 0:  # a stage of this step
                        T.buffer_store(self.smem, self.a.ws[e, t % 2, b, vec_index(k, lv)], dst)
                    else:
                        with T.If(t == 0):
                            with T.Then():
                                T.buffer_store(self.smem, self.a.init[name][b, vec_index(k, lv)], dst)
                            with T.Else():
                                T.buffer_store(self.smem, self.a.ws[e, (t + 1) % 2, b, vec_index(k, lv)], dst)

    def poll_tiles(self, names, t, b0, parity, step):
        """``tags`` and ``sentinel``: poll each operand's values (written at ``step - 1``) into shared memory."""
        BT, H = self.c.batch_tile, self.H
        sleep_ns = getattr(self.c, "poll_sleep", 0)  # a knob of the tensor-core template's only
        rows = T.min(BT, self.B - b0)
        most = min(BT, self.B) * H  # the tensor-core template's tile may be taller than the batch
        for name in names:
            dst = T.address_of(self.smem[self.slot[name] * BT * self.stride])
            if self.barrier.sentinel:  # the output sequence, step - 1's rows (the operand is the only output)
                abort = grid_barrier.sentinel_copy(
                    self.barrier, self.g.threads, T.address_of(self.a.out[step - 1, b0, 0]), dst, self.dt,
                    rows * H, most, H, self.stride, step, self.sync, sleep_ns)
            else:
                abort = grid_barrier.tag_copy(
                    self.barrier, self.g.threads, T.address_of(self.a.ws[self.ops[name], parity, b0, 0]), dst,
                    self.dt, rows * H, most, H, self.stride, self.barrier_base, step, self.sync, sleep_ns)
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

    def publish_outputs(self, t, timing, stored: dict, b, unit):
        """``sentinel``: the output sequence is the exchange. Store each output (zero past the row's length, as
        ever: rows are independent, so no other row reads it, and the row keeps its state in a register) with
        the sentinel's store; block 0 skips its stores at ``stall_step`` (the test knob)."""
        with T.If(tirx.Not(tirx.all(self.bx == 0, t == self.sync.stall_step))):
            with T.Then():
                for k, name in enumerate(self.p.outputs):
                    value, running = stored[name], timing.running(name)
                    if running is not None:
                        value = T.if_then_else(running, value, tirx.const(0, self.dt))
                    slot = T.address_of(self.a.out[t, b, k * self.H + unit])
                    T.evaluate(grid_barrier.sentinel_store(self.barrier, slot, value, self.dt))

    def previous_state(self, name: str, t, b, unit):
        """This unit's value of exchanged state ``name`` from the step before (this thread wrote it)."""
        previous = self.a.ws[self.ops[name], (t + 1) % 2, b, unit]
        if self.barrier.carries_data:  # the thread's own store: no polling
            previous = grid_barrier.tag_value(self.barrier, T.address_of(previous), self.dt)
        return T.if_then_else(t == 0, self.a.init[name][b, unit], previous)

    def zero_operand_padding(self):
        """Columns hidden..k_pad of the shared operand tiles meet zero weights; keep them 0, not garbage."""
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

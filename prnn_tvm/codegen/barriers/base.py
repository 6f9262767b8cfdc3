"""What every kind of synchronization between timesteps provides, and the protocol they share on the device.

A kind is one class (:class:`Barrier`): its workspace (the layer-owned ``sync`` words, the type of the
exchange), how a block publishes a value for the others and waits for theirs, how far a launch advances its
base, what it costs the cost model, and whether it fits a plan and layout (with the reason). Templates,
the GPU backward, the signature's ``GridSync``, the runtime and the benchmark ask the kind, never its name.

The protocol of the stateful kinds (device code in ``common.cuh``, pasted with ``T.cuda.func_call``):

- **state** is a ``uint32`` buffer of ``SYNC_WORDS`` words owned by the layer: word 0 the error word (0, or
  1 + the step whose wait timed out), word 1 the arrival count, word 2 the base, word 3 the blocks that left
  the running launch;
- **no reset between launches**: the base is the number of barriers (or steps, for the kinds that count
  steps) all earlier launches passed, mod 2^32 (:meth:`Barrier.advance`). Every thread reads it once when the
  kernel starts (a volatile load, which the compiler cannot repeat later). The last block to leave advances
  the base: thread 0 of each block counts it out with an acquire-release atomic, after a block barrier of the
  time loop that every thread of the block passed after reading the base (a launch of no steps leaves the base
  as it was), and the next launch starts after this one ends. Not block 0: with a kind that waits on values
  and independent parts (a bidirectional layer's directions) block 0 never waits for the other part's blocks.
  Only a timeout leaves the state inconsistent: the host then zeroes it (and the workspace);
- **never hangs**: every poll loop looks at the error word and ``%globaltimer`` every ``PRNN_CHECK_EVERY``
  polls, gives up after ``timeout_us``, records the step in the error word (first one wins) and makes the
  whole block leave its time loop; a waiter that sees the error word set gives up at once;
- **reported without a host synchronization**: when its time loop ends, a block that finds the error word
  set fills its part of the outputs with NaN (a result read before anyone checks never looks valid) and
  copies the word to ``error_host``, the address of a word of page-locked host memory that the host reads
  whenever it likes (0: no such word). The error word stays set until the host resets the state, so every
  later launch on that state gives up at once and fills NaN too; the host raises ``BarrierTimeout``;
- ``stall_step`` (a test knob, -1 in normal use) makes block 0 skip its arrival (or its publishing) at that
  step, which forces the timeout path.

The exchange: a template's kernel builder is an :class:`ExchangeSite`; a kind's :meth:`Barrier.load_operands`,
:meth:`Barrier.publish`, :meth:`Barrier.previous` and :meth:`Barrier.write_outputs` move the exchanged values
through it. :class:`Barrier` itself is the plain exchange (a double-buffered workspace, written with plain
stores, read with plain loads after a block-wide wait); the kinds that wait on the values themselves override
those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ...dtypes import policy
from ...errors import ConfigError
from ...signature import SYNC_SCALARS, GridSync
from .source import cuda_source

SYNC_WORDS = 4  # error word, counter, base, blocks that left the running launch


@dataclass(frozen=True)
class SyncArgs:
    """The kernel arguments of a stateful barrier (``prnn_tvm.signature.recurrent_args`` orders them)."""

    sync: object
    timeout_us: object
    stall_step: object
    error_host: object


def declare_sync_args() -> SyncArgs:
    """Declare the barrier's kernel arguments inside a ``T.prim_func()`` frame (for kernels without a
    layer signature, like the barrier probe)."""
    sync = T.arg("sync", T.buffer((SYNC_WORDS,), "uint32", buffer_name="sync"))
    return SyncArgs(sync, *(T.arg(name, tirx.Var(name, dtype)) for name, dtype in SYNC_SCALARS.items()))


class ExchangeSite(Protocol):
    """What a kind's exchange methods use of the kernel being built (a template's builder).

    ``a``: the declared arguments (``codegen.kernel.declare_args``); ``p``: the plan; ``H``, ``B``: hidden units
    and the batch rows a CTA runs; ``dt``: the storage dtype; ``sync``: the barrier's arguments (None without);
    ``barrier_base``: the base read at the start (None without state); ``bx``: the block index; ``smem``: the
    shared operand tiles; ``ops``: each operand's workspace slot; ``own``: the states this thread keeps in
    registers as it published them (:meth:`Barrier.kept_states`); ``g.threads``, ``stride``, ``tile_rows``: threads
    per CTA, elements between rows of a shared operand tile and its rows; ``aborted``: the thread's abort flag (a
    one-element local buffer)."""

    def copy_tile(self, name: str, t, b0, phase: int, initial: bool = False):
        """Plain vector loads of operand ``name``'s rows ``b0..`` into its shared tile: the initial state at step
        0 (``initial``: whatever the step), else the workspace slot written before."""

    def polled_tile(self, name: str, b0) -> tuple:
        """A poll of operand ``name``'s rows ``b0..``: ``(shared address, values, at most that many, sleep ns, values
        of a row)``; consecutive rows are a row apart in the workspace too (:meth:`ws_at`)."""

    def ws_at(self, name: str, parity, b, unit) -> tuple:
        """The workspace indices of operand ``name``'s value for batch row ``b``, unit ``unit``, at ``parity``."""

    def sequence_slot(self, name: str, step, b, unit):
        """State ``name``'s value of its own step ``step`` in its per-step sequence (a buffer element)."""

    def own_slots(self):
        """``(b, unit, name)`` for each state of :attr:`own` this thread publishes, inside its item's guard."""

    @property
    def exchange_in_tiles(self) -> bool:
        """Whether the shared operand tiles hold every batch row of a step (one batch pass), so that a kind whose
        values no other block reads can exchange them there."""

    def tile_at(self, name: str, b, unit):
        """The index into ``smem`` (the shared operand tiles) of operand ``name``'s value for row ``b``, unit
        ``unit``."""


def sync_threads():
    """``__syncthreads()``."""
    T.evaluate(T.tvm_storage_sync("shared"))


def leave_on_abort(site: ExchangeSite):
    """Leave the enclosing loop when the thread's abort flag is set (block-uniform where this is called)."""
    with T.If(site.aborted[0] != 0):
        with T.Then():
            T.Break()


def abort_on(site: ExchangeSite, flag) -> None:
    """Where ``flag`` (a block-uniform wait's result) is set: mark the thread aborted and leave the enclosing
    loop."""
    with T.If(flag != 0):
        with T.Then():
            T.buffer_store(site.aborted, 1, [0])
            T.Break()


def payload_type(dtype: str, kind: str) -> str:
    """The C type a kind that polls values exchanges ``dtype`` values as (at most 32 bits, which its device code
    reads and writes as bits); ConfigError when it cannot."""
    p = policy(dtype)
    if p.itemsize > 4:
        raise ConfigError(f"the '{kind}' barrier carries values of at most 32 bits, not {dtype}")
    return p.c_type


def row_lanes(hidden: int, itemsize: int) -> int:
    """Values per load of a state tile's rows of ``hidden`` values (a plain tile load, a ``sentinel`` poll):
    16 bytes where the row allows, else 4, 2 or 1 values."""
    return next(n for n in (16 // itemsize, 4, 2, 1) if hidden % n == 0)


def block_or(flag):
    """A block barrier that returns whether ``flag`` is set in any thread of the block (an int32 expression)."""
    return T.cuda.func_call("prnn_block_or", flag, source_code=cuda_source("block_or.cuh"), return_type="int32")


class Barrier:
    """One kind of synchronization between timesteps (see the module's doc). ``name`` keys configs and records.

    Class attributes: ``state_words`` (the ``sync`` words a launch owns, None for a kind without state),
    ``counts`` (what the error word and the base count: ``"barriers"`` or ``"steps"``), ``polls_values``
    (a block waits by polling the values it reads, not at a barrier: it waits only for the blocks whose values
    it reads), ``plain_args`` (launch arguments other blocks write while this one reads them, declared without
    ``__restrict__``), ``grid_wide`` (False for a kind that synchronizes each block with itself: its launch has
    no grid synchronization, and is not cooperative)."""

    name = ""
    state_words: int | None = SYNC_WORDS
    counts = "barriers"
    polls_values = False
    plain_args: tuple = ()
    grid_wide = True  # synchronizes blocks with each other (False: each block with itself, ``block``)

    # ------------------------------------------------------------------ workspace
    def exchange_dtype(self, storage: str) -> str:
        """The element type of the double-buffered workspace the exchanged values go through."""
        return storage

    def kept_states(self, plan) -> tuple:
        """The states a thread keeps in registers as it published them, because the kind publishes them to a
        slot per step (none for the workspace exchange)."""
        return ()

    def grid_sync(self, phases: int) -> GridSync:
        """The launch's grid synchronization as the runtime and exported files see it."""
        return GridSync(self.name, self.state_words, self.counts, phases)

    def advance(self, steps, barriers):
        """How far a launch of ``steps`` steps that passed ``barriers`` barriers moves the base."""
        return barriers

    # ------------------------------------------------------------------ fits and costs
    def problem(self, plan, layout: str) -> str | None:
        """Why this kind cannot carry ``plan``'s steps in ``layout`` (``"shared"``, ``"split"``), or None."""
        return None

    def placement_problem(self, plan, units: int) -> str | None:
        """Why this kind cannot carry ``plan``'s steps with ``units`` hidden units per block, or None."""
        return None

    def polled_loads(self, values: int, threads: int, hidden: int, itemsize: int, operands: int = 1) -> tuple:
        """``(loads per thread, registers per load)`` a poll of ``values`` exchanged values (rows of ``hidden``)
        of each of ``operands`` operands holds while it waits: the cost model's and validation's count. ``(0, 0)``
        for a kind that does not poll values."""
        return 0, 0

    def fragments_problem(self) -> str | None:
        """Why a lane cannot poll its tensor-core fragments straight from this kind's exchange, or None."""
        return (
            "polls each lane's fragments from the output sequence, which only the 'sentinel' exchange writes a "
            f"slot per step of; not '{self.name}'"
        )

    def probe_problem(self, all_to_all: bool) -> str | None:
        """Why the barrier probe (``prnn_tvm.bench.barrier_probe``) cannot run this kind, or None."""
        return None

    def training_kind(self) -> str:
        """The kind a training forward (``recurrent_save``, which exchanges through the workspace) runs in place
        of this one."""
        return self.name

    # ------------------------------------------------------------------ device code: the launch
    def begin(self, args: SyncArgs | None):
        """At kernel start: bind and return the base (None for a kind without state, or a launch without
        ``sync``)."""
        if args is None or self.state_words is None:
            return None
        call = T.cuda.func_call(
            "prnn_barrier_begin", args.sync.data, source_code=cuda_source("common.cuh"), return_type="int32"
        )
        return T.bind(call, var=tirx.Var("barrier_base", "int32"))

    def end(self, args: SyncArgs | None, base, steps, barriers) -> None:
        """At kernel end: advance the base past this launch (:meth:`advance`)."""
        if args is None or self.state_words is None:
            return
        T.evaluate(
            T.cuda.func_call(
                "prnn_barrier_end",
                args.sync.data,
                base,
                self.advance(steps, barriers),
                source_code=cuda_source("common.cuh"),
                return_type="void",
            )
        )

    def report(self, args: SyncArgs | None):
        """At kernel end: the error word, copied to the host word when set (an int32 bound to a var), or None
        for a kind that cannot time out."""
        if args is None or self.state_words is None:
            return None
        call = T.cuda.func_call(
            "prnn_report",
            args.sync.data,
            T.Cast("uint64", args.error_host),
            source_code=cuda_source("common.cuh"),
            return_type="uint32",
        )
        return T.bind(T.Cast("int32", call), var=tirx.Var("barrier_error", "int32"))

    # ------------------------------------------------------------------ device code: between steps
    def wait(self, ordinal, base, args: SyncArgs | None, stall=None, when=None) -> None:
        """Wait for every block at barrier number ``ordinal`` of the launch (only where ``when`` holds, if given);
        leave the enclosing loop if the wait timed out. ``stall``: the ordinal the test knob stalls (default:
        the ``stall_step`` argument itself). Nothing for a kind that waits on the values it reads."""
        if when is None:
            self.emit_wait(ordinal, base, args, stall)
            return
        with T.If(when):
            with T.Then():
                self.emit_wait(ordinal, base, args, stall)

    def emit_wait(self, ordinal, base, args: SyncArgs | None, stall) -> None:
        """The device code of one :meth:`wait`."""
        raise NotImplementedError(self.name)

    # ------------------------------------------------------------------ the exchange
    def start(self, site: ExchangeSite) -> None:
        """Before the time loop (on a kernel with state)."""

    def load_operands(self, site: ExchangeSite, names: list, t, b0, phase: int) -> None:
        """Bring rows ``b0..`` of the operands ``names`` of ``phase`` into shared memory, as step ``t`` reads
        them; ends with a block barrier, or leaves the enclosing loop with the block when a wait timed out."""
        for name in names:
            site.copy_tile(name, t, b0, phase)
        sync_threads()

    def after_products(self, site: ExchangeSite) -> None:
        """After a phase's batch tiles: leave the time loop where a wait of theirs timed out."""

    def publish(self, site: ExchangeSite, name: str, t, b, unit, value) -> None:
        """Write this unit's value of operand ``name`` of step ``t`` for the other blocks."""
        T.buffer_store(site.a.ws, value, list(site.ws_at(name, t % 2, b, unit)))

    def previous(self, site: ExchangeSite, name: str, t, b, unit):
        """This unit's value of state ``name`` from the step before ``t`` (``t > 0``), which this thread wrote."""
        return site.a.ws[site.ws_at(name, (t + 1) % 2, b, unit)]

    def write_outputs(self, site: ExchangeSite, t, timing, stored: dict, b, unit) -> None:
        """End of step: the output sequence (``timing``: the step's ``codegen.kernel.StepTiming``) and, for a
        kind that publishes states to a slot per step, those."""
        timing.write_outputs(site.a.out, stored, b, unit)

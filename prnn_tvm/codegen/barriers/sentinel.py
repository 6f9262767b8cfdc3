"""``sentinel``: the exchange cuDNN's persistent LSTM uses (device code: ``sentinel.cuh``).

Each step's state goes into a slot of its own, the output sequence, which the kernel fills with a sentinel
(every bit set: a NaN in float32, float16 and bfloat16, which no store writes) before one ``counter`` barrier
at its start; a block then polls the values of step ``t - 1`` with 16-byte relaxed loads until none is the
sentinel. Each value is its own flag (2 bytes a half value, where ``tags`` moves 8), and no slot is written
twice in a launch, so no tag, no reset and no fence between steps. One-part, one-phase cells whose exchanged
state is their output; fastest on small grids.

Every exchanged state has a slot per step of its own: the output sequence where the state is an output, else
the launch's ``exchange`` sequence (a stack's lower layers). A state of delay ``d`` (a stack's layer ``d``)
writes kernel step ``t``'s value at its own step ``t - d``, and kernel step ``t`` reads it at ``t - 1 - d``, its
value as the step found it (its initial state before its first step). A thread keeps the states it publishes in
registers (:meth:`Sentinel.kept_states`), so it never reads its own back.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ...dtypes import itemsize
from ..pointwise import bind_value
from .base import Barrier, ExchangeSite, SyncArgs, abort_on, leave_on_abort, payload_type, row_lanes, sync_threads
from .source import cuda_source

SOURCES = 2  # operands one poll waits on together (``prnn_sentinel_copy``'s SOURCES)


def sentinel_problem(plan) -> str | None:
    """Why the sentinel exchange cannot carry ``plan``'s step (None where it can): it needs one phase, one
    output, and either the exchanged states to be the output sequence itself, or a stack (whose lower layers'
    states go through an exchange sequence of their own, the last layer's through the output); not both
    directions in one launch (the reverse one reads each row's steps from its own end)."""
    if plan.independent_parts:
        return "runs both directions in one launch, the reverse one reading each row from its own last step"
    if plan.heads > 1:  # a block's span of a state is strided in the sequence, which has every head's values
        return "has head-wise products, whose blocks poll their heads' part of the state (tags does)"
    if plan.phases != 1:
        what = "sums over units" if plan.unit_sums else "a stage"
        return f"exchanges {what} within each step ({plan.phases} phases)"
    if len(plan.outputs) != 1:
        return f"outputs {len(plan.outputs)} states side by side"
    if plan.lag:  # a stack
        if not set(plan.outputs) <= set(plan.operands):
            return f"outputs {', '.join(plan.outputs)}, which no layer multiplies"
        return None
    if tuple(plan.operands) != tuple(plan.outputs):
        return (
            f"multiplies {', '.join(plan.operands) or 'no state'} and outputs {', '.join(plan.outputs)}: its "
            "exchanged states are not its output"
        )
    return None


class Sentinel(Barrier):
    """A slot per step, filled with the sentinel before the launch's one barrier; readers poll until no value is
    the sentinel. The base counts the launch's one barrier."""

    name = "sentinel"
    counts = "steps"
    polls_values = True
    plain_args = ("out",)  # the output sequence, which other blocks write while this one polls it

    def kept_states(self, plan) -> tuple:
        return tuple(plan.operands)

    def advance(self, steps, barriers):
        return 1

    def problem(self, plan, layout: str) -> str | None:
        problem = sentinel_problem(plan)
        if problem:
            return (
                f"barrier '{self.name}' exchanges each step's state through the output sequence, and cell "
                f"'{plan.cell.name}' {problem}: use tags, counter or grid_sync"
            )
        return None

    def polled_loads(self, values: int, threads: int, hidden: int, itemsize: int, operands: int = 1) -> tuple:
        """A load holds up to 16 bytes, each its own 64-bit address; up to :data:`SOURCES` operands are polled
        at once."""
        lanes = row_lanes(hidden, itemsize)
        return min(operands, SOURCES) * -(-values // (threads * lanes)), max(1, lanes * itemsize // 4) + 2

    def fragments_problem(self) -> str | None:
        return None

    def probe_problem(self, all_to_all: bool) -> str | None:
        return (
            "'sentinel' exchanges through a layer's output sequence, which the probe does not have: "
            "bench/probes/sentinel_exchange.cu measures it"
        )

    def training_kind(self) -> str:
        return "counter"

    def wait(self, ordinal, base, args, stall=None, when=None) -> None:
        """Nothing between steps: a block waits on the values it polls (:meth:`load_operands`)."""

    # ------------------------------------------------------------------ device code
    def fill(self, ptr, dtype: str):
        """Mark the slot at ``ptr`` not written yet (before the launch's one barrier)."""
        return T.cuda.func_call(
            f"prnn_sentinel_fill<{payload_type(dtype, self.name)}>",
            ptr,
            source_code=cuda_source("sentinel.cuh"),
            return_type="void",
        )

    def store(self, ptr, value, dtype: str):
        """Publish ``value`` at ``ptr`` (an expression to evaluate)."""
        return T.cuda.func_call(
            f"prnn_sentinel_store<{payload_type(dtype, self.name)}>",
            ptr,
            value,
            source_code=cuda_source("sentinel.cuh"),
            return_type="void",
        )

    def poll_copy(
        self,
        threads: int,
        sources: list,
        dtype: str,
        max_n: int,
        row: int,
        row_pad: int,
        step,
        args: SyncArgs,
        sleep_ns: int = 0,
    ):
        """One poll-and-copy of up to :data:`SOURCES` sources ``(src, dst, n)``: ``n`` (at most ``max_n``; 0: none)
        ``dtype`` values written at ``step - 1``, rows of ``row``, from ``src`` into shared memory at ``dst``, rows
        of ``row_pad``, sleeping about ``sleep_ns`` between polls (0: none); returns the block-uniform abort
        flag."""
        assert 1 <= len(sources) <= SOURCES, len(sources)
        size = itemsize(dtype)
        per, _ = self.polled_loads(max_n, threads, row, size)  # per source, as the config's validate counts them
        width = row_lanes(row, size) * size
        src, dst, _ = sources[0]
        second = sources[1] if len(sources) > 1 else (src, dst, 0)  # SOURCES = 1 never reads it
        call = T.cuda.func_call(
            f"prnn_sentinel_copy<{payload_type(dtype, self.name)}, {per}, {width}, {row}, "
            f"{row_pad}, {sleep_ns}, {len(sources)}>",
            *sources[0],
            *second,
            step,
            args.sync.data,
            args.timeout_us,
            source_code=cuda_source("sentinel.cuh"),
            return_type="int32",
        )
        return T.bind(call, var=tirx.Var("exchange_abort", "int32"))

    def poll_fragments(
        self,
        src,
        row_step,
        rows,
        pieces,
        frag,
        dtype: str,
        tiles: int,
        loads: int,
        width: int,
        poll: bool,
        step,
        args: SyncArgs,
        sleep_ns: int = 0,
    ):
        """A lane's own tensor-core fragments: ``tiles`` batch rows ``row_step`` values apart from ``src``, ``loads``
        loads of ``width`` bytes each per row, ``4 * width`` bytes apart, into the registers at ``frag``; rows from
        ``rows`` on and loads from ``pieces`` on read as zero. ``poll``: values written at ``step - 1``, polled
        until none holds the sentinel (sleeping about ``sleep_ns`` between polls); else loaded once (an initial
        state). Returns this thread's abort flag (not block-uniform)."""
        call = T.cuda.func_call(
            f"prnn_sentinel_frags<{payload_type(dtype, self.name)}, {tiles}, {loads}, {width}, "
            f"{sleep_ns}, {int(poll)}>",
            src,
            T.Cast("int64", row_step),
            rows,
            pieces,
            frag,
            step,
            args.sync.data,
            args.timeout_us,
            source_code=cuda_source("sentinel.cuh"),
            return_type="int32",
        )
        return T.bind(call, var=tirx.Var("exchange_abort", "int32"))

    def start_barrier(self, base, args: SyncArgs):
        """The launch's one barrier, after every block filled its slots (barrier ordinal 0, never stalled by the
        test knob); returns the abort flag."""
        call = T.cuda.func_call(
            "prnn_barrier_counter",
            args.sync.data,
            base,
            0,
            args.timeout_us,
            -1,
            source_code=cuda_source("sentinel.cuh"),
            return_type="int32",
        )
        return T.bind(call, var=tirx.Var("start_abort", "int32"))

    # ------------------------------------------------------------------ the exchange
    def start(self, site: ExchangeSite) -> None:
        """Before the first step: mark every slot of the sequences this thread will write (its exchanged states'
        own steps) as not written yet, then the launch's one grid barrier, after which no block can read what
        an earlier launch left there. A timed-out barrier makes the time loop give up at its first poll."""
        for b, unit, name in site.own_slots():
            with T.serial(0, site.a.seq_len) as t:
                T.evaluate(self.fill(T.address_of(site.sequence_slot(name, t, b, unit)), site.dt))
        abort = self.start_barrier(site.barrier_base, site.sync)
        with T.If(abort != 0):
            with T.Then():
                T.buffer_store(site.aborted, 1, [0])

    def load_operands(self, site: ExchangeSite, names: list, t, b0, phase: int) -> None:
        """Each operand's rows b0.. as step ``t`` found them, from its sequence: its initial state before its own
        first step, else polled from the slot of its step before. Past the end of the sequence nothing is
        loaded: the operand's layer is done, and what it would multiply is not used. The operands are polled
        :data:`SOURCES` at a time, each poll waiting on all of them at once (a stack's layer polls its own state
        and the one below's together: LSTM fp16 4x512x8 2.04 -> 1.92 us per wavefront step, H100); each group
        ends with a block barrier, also where it polls nothing."""
        slots = {name: bind_value(t - 1 - site.p.delays[name], f"slot_{name}") for name in names}
        polled = {name: tirx.all(slot >= 0, slot < site.a.seq_len) for name, slot in slots.items()}
        for name in names:  # the initial copies first: a poll's block barrier publishes them
            with T.If(slots[name] < 0):
                with T.Then():
                    site.copy_tile(name, t, b0, 0, initial=True)
        for first in range(0, len(names), SOURCES):
            group = names[first : first + SOURCES]
            # where the group polls all its operands (every step but a layer's first and those past the sequence),
            # the counts are the tile's, constants to the compiler: a count it must read at run time made a
            # single layer's step 1.24x slower (H100, LSTM fp16 512x8, 8 warps)
            with T.If(tirx.all(*(polled[name] for name in group))):
                with T.Then():
                    self.poll_group(site, group, slots, t, b0)
                with T.Else():
                    if len(group) == 1:  # nothing to poll: the block barrier alone publishes the initial copies
                        sync_threads()
                    else:
                        self.poll_group(site, group, slots, t, b0, polled)

    def poll_group(self, site: ExchangeSite, names: list, slots: dict, t, b0, polled=None) -> None:
        """One poll of operands ``names`` at their ``slots``: the whole tile of each, or (``polled``) of those whose
        condition holds and nothing of the others; leaves the time loop if it timed out."""
        sources = []
        for name in names:
            dst, n, most, sleep_ns, _ = site.polled_tile(name, b0)
            slot = slots[name]
            if polled is not None:  # an address even where the operand is not polled
                slot, n = tirx.max(tirx.min(slot, site.a.seq_len - 1), 0), T.if_then_else(polled[name], n, 0)
            sources.append((T.address_of(site.sequence_slot(name, slot, b0, 0)), dst, n))
        abort = self.poll_copy(site.g.threads, sources, site.dt, most, site.H, site.stride, t, site.sync, sleep_ns)
        abort_on(site, abort)

    def after_products(self, site: ExchangeSite) -> None:
        leave_on_abort(site)

    def publish(self, site: ExchangeSite, name: str, t, b, unit, value) -> None:
        raise NotImplementedError(
            "the sentinel exchange publishes states through their sequences (write_outputs) "
            "and exchanges no stage (sentinel_problem refuses plans that would)"
        )

    def previous(self, site: ExchangeSite, name: str, t, b, unit):
        raise NotImplementedError(
            "a thread keeps the states it publishes through the sentinel exchange in registers (kept_states)"
        )

    def write_outputs(self, site: ExchangeSite, t, timing, stored: dict, b, unit) -> None:
        """The sequences are the exchange (the outputs among them). Store each exchanged state of ``stored`` at its
        own step (zero past the row's length, as ever: rows are independent, so no other row reads it, and the
        row keeps its state in a register; nothing before its first step or past the sequence) with the
        sentinel's store; block 0 skips its stores at ``stall_step`` (the test knob)."""
        with T.If(tirx.Not(tirx.all(site.bx == 0, t == site.sync.stall_step))):
            with T.Then():
                for name, value in stored.items():
                    if name not in site.own:
                        continue
                    running, d = timing.running(name), site.p.delays[name]
                    if running is not None:
                        value = T.if_then_else(running, value, tirx.const(0, site.dt))
                    store = self.store(T.address_of(site.sequence_slot(name, t - d, b, unit)), value, site.dt)
                    if not site.p.lag:  # every step is the state's own
                        T.evaluate(store)
                        continue
                    with T.If(tirx.all(t >= d, t - d < site.a.seq_len)):
                        with T.Then():
                            T.evaluate(store)

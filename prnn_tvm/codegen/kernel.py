"""What a schedule template returns, and the argument list of every recurrent kernel.

The arguments come from one place, :func:`recurrent_launch` (in turn
:func:`prnn_tvm.signature.recurrent_args`): templates declare exactly those
(:func:`declare_args`), and the runtime binds a call's arrays to the same list.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from dataclasses import dataclass
from types import SimpleNamespace

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ..frontend.plan import CellPlan
from ..signature import (
    SEQ,
    SYNC_SCALARS,
    ArgRole,
    Grid,
    GridSync,
    Launch,
    Signature,
    backward_args,
    projection_launch,
    recurrent_args,
)
from .barriers.base import SyncArgs

SEQ_LEN = "seq_len"  # the name of the sequence-length variable inside kernels
HAND_PLACED = "prnn.hand_placed"  # a kernel the tirx pipeline lowers as written (``codegen.build``)
PLAIN_ARGS = "prnn.plain_args"  # the kernel's arguments not to declare __restrict__ (``codegen.build``)


def vec_index(base, lanes: int):
    """``lanes`` consecutive elements from ``base`` (a vector access when lanes > 1)."""
    return T.ramp(base, 1, lanes) if lanes > 1 else base


@dataclass(frozen=True)
class Kernel:
    """A recurrent kernel made by a schedule template.

    ``launch`` says how to call it (function name, arguments, grid, grid synchronization);
    ``config`` is the template's knobs (None for a template without any).
    """

    func: tirx.PrimFunc
    template: str
    launch: Launch
    config: object | None = None


def recurrent_launch(
    plan: CellPlan,
    workspace: tuple | None = None,
    workspace_dtype: str | None = None,
    grid: Grid | None = None,
    sync: GridSync | None = None,
    exchanged: int = 0,
    xp_dtype: str | None = None,
) -> Launch:
    """The ``recurrent`` launch of ``plan``: the arguments every template's kernel takes, in order (and an
    ``exchange`` sequence of ``exchanged`` states where a kernel needs one). ``xp_dtype``: the input projection's type,
    by default the accumulation type (a half layer's float32); the layer's storage type where a template reads it
    so (the tensor-core template's ``half_xp``)."""
    H = plan.hidden
    args = recurrent_args(
        plan.batch,
        H,
        plan.input.slices * H,
        plan.weight_shapes(),
        {p.name: (p.slices * H,) for p in plan.params},
        tuple(s.name for s in plan.states),
        plan.dtype,
        workspace,
        workspace_dtype,
        sync.state_words if sync is not None else None,
        xp_dtype or plan.policy.accumulate,
        len(plan.outputs),
        exchanged,
    )
    return Launch("recurrent", args, grid, sync)


def backward_launch(plan: CellPlan) -> Launch:
    """The ``recurrent_backward`` launch of ``plan``: the recurrent kernel's gradients (every template's
    backward takes these arguments, in this order)."""
    H = plan.hidden
    args = backward_args(
        plan.batch,
        H,
        plan.input.slices * H,
        plan.weight_shapes(),
        {p.name: (p.slices * H,) for p in plan.params},
        tuple(s.name for s in plan.states),
        plan.dtype,
        plan.policy.compute,
        plan.policy.accumulate,
    )
    return Launch("recurrent_backward", args)


def layer_signature(plan: CellPlan, input_size: int, recurrent: Launch | None = None) -> Signature:
    """The layer a compile makes: the input projection, then the recurrent kernel (``recurrent``:
    the template's launch; by default the arguments alone, which every template shares). The projection writes ``xp``
    in the type the recurrent launch reads it in."""
    recurrent = recurrent or recurrent_launch(plan)
    projection = projection_launch(
        plan.batch, input_size, plan.input.slices * plan.hidden, plan.dtype, recurrent.arg("xp").dtype
    )
    return Signature(
        plan.cell.name,
        plan.batch,
        plan.hidden,
        input_size,
        plan.dtype,
        (projection, recurrent),
        bool(plan.reversed_states),
    )


def declare_args(launch: Launch) -> SimpleNamespace:
    """Declare a launch's arguments inside a ``T.prim_func()`` frame, in its order.

    Returns a namespace with ``seq_len`` (the symbolic length), ``xp`` and ``out`` (None in a
    launch without them), ``ws`` (None without a workspace), ``exchange`` (None without an exchange
    sequence), ``lengths`` (None in a launch without per-row lengths), ``sync`` (the barrier's
    :class:`~.barriers.base.SyncArgs`, or None), dicts ``weight``, ``param``, ``init``, ``final`` keyed by the
    cell's declared names, and ``named``: every argument by its name.
    """
    seq_len = tirx.Var(SEQ_LEN, "int32")
    declared = {}
    for a in launch.args:
        if a.role is ArgRole.SCALAR:
            declared[a.name] = T.arg(a.name, tirx.Var(a.name, a.dtype))
        else:
            shape = tuple(seq_len if d == SEQ else d for d in a.shape)
            declared[a.name] = T.arg(a.name, T.buffer(shape, a.dtype, buffer_name=a.name))

    def by_role(role, strip=""):
        return {
            a.name[: len(a.name) - len(strip)] if strip else a.name: declared[a.name]
            for a in launch.args
            if a.role is role and a.name.endswith(strip)
        }

    ns = SimpleNamespace(
        seq_len=seq_len,
        xp=declared.get("xp"),
        out=declared.get("out"),
        ws=declared.get("workspace"),
        lengths=declared.get("lengths"),
        exchange=declared.get("exchange"),
        named=declared,
    )
    ns.weight, ns.param = by_role(ArgRole.WEIGHT), by_role(ArgRole.PARAM)
    ns.init, ns.final = by_role(ArgRole.STATE, strip="0"), by_role(ArgRole.FINAL, strip="_n")
    ns.sync = (
        SyncArgs(declared["sync"], *(declared.get(name) for name in SYNC_SCALARS)) if "sync" in declared else None
    )  # a launch that only reads the barrier's words takes none of its scalars
    return ns


def row_view(buf, axis: int, first, row: int | None = None):
    """``buf`` seen from batch row ``first`` of its batch axis ``axis`` on: row ``b`` of the view is row ``first + b``
    (a batch group's rows: ``persistent_cuda.PersistentBuilder.batch_group_views``, the backward's
    ``persistent_backward``). The view keeps the whole argument's shape, offset by the first row: TVM 0.27 lowers a
    declared buffer by its shape and drops explicit strides (``LowerTIRx``), so a view shaped to the group's rows
    would index the later steps of a sequence wrongly. ``row``: the elements between batch rows, where they are not
    the product of the axes after ``axis`` (a workspace laid out by span of heads)."""
    if row is None:
        row = functools.reduce(operator.mul, buf.shape[axis + 1 :], 1)  # elements between batch rows
    return T.decl_buffer(buf.shape, buf.dtype, data=buf.data, elem_offset=first * row)


def input_step(plan: CellPlan, a, t):
    """The step of the input projection that kernel step ``t`` reads: ``t``, or for a stack (whose layer runs
    its lag beyond the sequence, when only later layers still change) the last one."""
    return T.min(t, a.seq_len - 1) if plan.lag else t


class StepTiming:
    """Which rows a kernel step changes each state of, which step of the input projection it reads and
    where it writes the output sequence: the rule the templates share (``prnn_tvm.reference`` has it in
    NumPy).

    A row stops changing after its length (``length``: the row's ``lengths`` entry, None when the launch
    has none) and writes zeros there. A state of delay ``d`` (a stack's layer, :mod:`prnn_tvm.frontend.stack`)
    keeps its initial value for the first ``d`` steps and changes until ``d`` steps after the row's length;
    the output is the output state's, written ``d`` steps late. A reversed state and input slice (a
    bidirectional layer's reverse direction, :mod:`prnn_tvm.frontend.directions`) take step ``t`` of a row
    of length ``n`` at step ``n - 1 - t``.
    """

    def __init__(self, plan: CellPlan, a, t, length=None):
        self.plan, self.a, self.t, self.length = plan, a, t, length

    def running(self, state: str):
        """Whether this step changes ``state`` of the row, or None where it always does."""
        t, d = self.t, self.plan.delays[state]
        if not self.plan.lag:
            return None if self.length is None else t < self.length
        end = self.row_steps() + d  # clamped before the delay is added
        return tirx.all(t >= d, t < end) if d else t < end

    def row_steps(self):
        """The steps the row runs: its length, at most the sequence's (lengths past the sequence mean all of it:
        a caller may pass 2^31 - 1)."""
        return self.a.seq_len if self.length is None else T.min(self.length, self.a.seq_len)

    def backwards(self):
        """The step a reversed state's step ``t`` reads and writes: ``n - 1 - t`` while the row runs (``n``,
        :meth:`row_steps`), then ``t`` (the padding, where zeros go)."""
        n = self.row_steps()
        return T.if_then_else(self.t < n, n - 1 - self.t, self.t)

    def input_step(self, input_slice: int):
        """The step of the input projection that this step reads at ``input_slice``."""
        if input_slice in self.plan.reversed_slices:
            return self.backwards()
        return input_step(self.plan, self.a, self.t)

    def write_outputs(self, out, values: dict, b, unit):
        """``out[step, b, k * hidden + unit] = value`` for each output state ``k`` in ``values`` (state name ->
        value), at the output step this kernel step makes (zeros past the row's length); nothing in a
        stack's first steps."""
        for k, name in enumerate(self.plan.outputs):
            if name not in values:
                continue
            value, column = values[name], k * self.plan.hidden + unit
            running = self.running(name)
            if running is not None:
                value = T.if_then_else(running, value, tirx.const(0, out.dtype))
            d = self.plan.delays[name]
            if name in self.plan.reversed_states:
                T.buffer_store(out, value, [self.backwards(), b, column])
            elif not d:
                T.buffer_store(out, value, [self.t, b, column])
            else:
                with T.If(self.t >= d):
                    with T.Then():
                        T.buffer_store(out, value, [self.t - d, b, column])


@contextlib.contextmanager
def persistent_frame(launch: Launch, plain: tuple = ()):
    """The frame of a hand-placed persistent kernel, inside an IRBuilder: the function named after
    ``launch``, cooperative when its grid is, its arguments declared (:func:`declare_args`), one block per
    CTA of the grid and one thread per thread, in thread-block clusters where the grid has them (the arguments'
    ``cluster_rank``: the CTA's rank in its cluster). Yields ``(arguments, blockIdx.x, threadIdx.x)``. ``plain``:
    more arguments to declare without ``__restrict__`` (what other blocks write while this one reads)."""
    grid = launch.grid
    attrs = {
        "tirx.noalias": True,
        HAND_PLACED: True,
        PLAIN_ARGS: [a.name for a in launch.args if not a.role.restrict or a.name in plain],
    }
    if grid.cooperative:
        attrs["tirx.kernel_launch_params"] = ["tirx.use_cooperative_launch"]
    with T.prim_func():
        T.func_name(launch.function)
        T.func_attr(attrs)
        args = declare_args(launch)
        # __launch_bounds__(threads, 1): one CTA per SM is all a persistent grid needs; without
        # the bound ptxas trades registers for occupancy the kernel does not want, and spills.
        with contextlib.ExitStack() as frames:
            bx = frames.enter_context(T.launch_thread("blockIdx.x", grid.ctas))
            if grid.cluster > 1:  # TVM's launcher makes it the launch's cluster dimension (cuLaunchKernelEx)
                args.cluster_rank = frames.enter_context(T.launch_thread("clusterCtaIdx.x", grid.cluster))
            tx = frames.enter_context(T.launch_thread("threadIdx.x", grid.threads))
            frames.enter_context(T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1}))
            yield args, bx, tx

"""A compiled layer's interface as plain data: its arguments, its launches and their grids.

Code generation declares each kernel's arguments from it, the runtime binds a caller's
arrays with it, and an exported library carries it as JSON; nothing else describes what a
kernel takes. It imports only the standard library, so it works under TVM's runtime-only
import.

A layer is a sequence of :class:`Launch`\\ es. Each names its kernel function and its
arguments in kernel order, each argument with a role, a shape and a dtype. Between
launches, values pass by name: the projection's ``xp`` output is the recurrent kernel's
``xp`` input. What the layer's caller passes (:attr:`Signature.inputs`) and gets back
(:attr:`Signature.outputs`) is derived from the launches: inputs are the data arguments
no earlier launch writes, outputs the written arguments no later launch reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from functools import cached_property

SEQ = "T"  # the sequence length in a shape: one kernel serves every length


class ArgRole(str, enum.Enum):
    """What an argument is to the caller and to the runtime."""

    INPUT = "input"  # a sequence read by the launch (x, the projection xp)
    WEIGHT = "weight"  # a matrix (W_ih, a recurrent weight)
    PARAM = "param"  # a per-unit vector (a bias, peephole weights)
    STATE = "state"  # an initial state: zeros when the caller omits it
    LENGTHS = "lengths"  # each batch row's number of steps (int32): every row runs all of them when omitted
    OUTPUT = "output"  # a sequence the launch writes (out, or xp for a later launch)
    FINAL = "final"  # a final state
    WORKSPACE = "workspace"  # scratch owned by the layer: zero at first use and after a barrier timeout
    SCRATCH = "scratch"  # a sequence a launch writes and reads itself (exchanged states): per call, not returned
    SYNC = "sync"  # the grid barrier's state, owned by the layer (uint32 words)
    SCALAR = "scalar"  # an integer the layer passes itself (a timeout, a test knob, the host error word)

    @property
    def written(self) -> bool:
        return self in (ArgRole.OUTPUT, ArgRole.FINAL)

    @property
    def restrict(self) -> bool:
        """Declared ``__restrict__`` in a kernel (``codegen.build.coherent_exchange``): the launch's other
        blocks do not write it while it runs (they write the owned exchange and barrier words), and the
        kernel does not read it where it reads such an argument (it reads initial states at step 0 where
        later steps read the exchange)."""
        return self not in (ArgRole.WORKSPACE, ArgRole.SYNC, ArgRole.STATE, ArgRole.SCRATCH)

    @property
    def data(self) -> bool:
        """Passed by the caller (or computed by an earlier launch), not by the layer."""
        return self in (ArgRole.INPUT, ArgRole.WEIGHT, ArgRole.PARAM, ArgRole.STATE, ArgRole.LENGTHS)

    @property
    def optional(self) -> bool:
        """The caller may omit it: initial states are zeros, every row runs the whole sequence."""
        return self in (ArgRole.STATE, ArgRole.LENGTHS)

    @property
    def owned(self) -> bool:
        """Allocated and kept by the layer across calls."""
        return self in (ArgRole.WORKSPACE, ArgRole.SYNC)


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a buffer of ``shape`` (ints and :data:`SEQ`) and ``dtype``, or a scalar."""

    name: str
    role: ArgRole
    shape: tuple = ()
    dtype: str = "float32"

    def concrete_shape(self, seq_len: int) -> tuple[int, ...]:
        return tuple(seq_len if d == SEQ else int(d) for d in self.shape)

    def as_dict(self) -> dict:
        return {"name": self.name, "role": self.role.value, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict) -> Arg:
        return cls(d["name"], ArgRole(d["role"]), tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class Grid:
    """A hand-placed kernel's grid, and what one CTA uses (for the co-residency check)."""

    ctas: int
    threads: int
    dynamic_smem_bytes: int
    cooperative: bool
    registers: int | None = None  # per thread: ptxas's figure once built, the template's estimate before
    static_smem_bytes: int = 0
    streamed: str = ""  # the weight argument part of which the kernel reads from global memory every step (L2 window)
    cluster: int = 1  # CTAs per thread-block cluster (sm_90+; ``clusterCtaIdx.x``): 1, none

    def as_dict(self) -> dict:
        """The fields, ``cluster`` only where the grid has clusters (a signature without them reads as before)."""
        return {k: v for k, v in vars(self).items() if k != "cluster" or v != 1}

    @property
    def smem_bytes(self) -> int:
        """Shared memory per CTA: dynamic and static."""
        return self.dynamic_smem_bytes + self.static_smem_bytes


@dataclass(frozen=True)
class GridSync:
    """How a kernel separates timesteps across its grid.

    ``kind`` is the barrier's name (``prnn_tvm.codegen.barriers``; its ``Barrier.grid_sync`` makes this);
    ``state_words`` the size of its ``sync`` argument (None for a barrier without state); ``counts`` what
    the error word records on a timeout, ``"steps"`` or ``"barriers"`` (``phases`` per step).
    """

    kind: str
    state_words: int | None = None
    counts: str = "barriers"
    phases: int = 1

    def where(self, recorded: int) -> str:
        """Where a timeout happened, from what the error word recorded."""
        if self.counts == "steps" or self.phases == 1:
            return f"after step {recorded}"
        step, phase = divmod(recorded, self.phases)
        return f"after phase {phase} of step {step}"


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the function's name in the module and its arguments in kernel order.

    ``grid`` is set for hand-placed kernels (TVM launches the others itself), ``sync`` for
    kernels with a grid synchronization between steps.
    """

    function: str
    args: tuple
    grid: Grid | None = None
    sync: GridSync | None = None

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def as_dict(self) -> dict:
        return {
            "function": self.function,
            "args": [a.as_dict() for a in self.args],
            "grid": None if self.grid is None else self.grid.as_dict(),
            "sync": None if self.sync is None else vars(self.sync).copy(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Launch:
        return cls(
            d["function"],
            tuple(Arg.from_dict(a) for a in d["args"]),
            Grid(**d["grid"]) if d.get("grid") else None,
            GridSync(**d["sync"]) if d.get("sync") else None,
        )


@dataclass(frozen=True)
class Signature:
    """A layer: its launches in order, and the inputs and outputs derived from them. ``whole_sequence``:
    its kernel reads the sequence from both ends (a bidirectional layer), so a sequence past
    ``MAX_ELEMENTS`` cannot run in consecutive chunks."""

    cell: str
    batch: int
    hidden: int
    input_size: int
    dtype: str
    launches: tuple
    whole_sequence: bool = False

    @cached_property  # a frozen instance: derived once (cached_property writes its __dict__ directly)
    def inputs(self) -> tuple:
        """What the caller passes, in call order: data arguments no earlier launch writes."""
        seen, written, found = set(), set(), []
        for launch in self.launches:
            for a in launch.args:
                if a.role.data and a.name not in written and a.name not in seen:
                    seen.add(a.name)
                    found.append(a)
            written |= {a.name for a in launch.args if a.role.written}
        return tuple(found)

    @cached_property
    def outputs(self) -> tuple:
        """What the caller gets back: written arguments no later launch reads."""
        found = []
        for i, launch in enumerate(self.launches):
            read_later = {a.name for later in self.launches[i + 1 :] for a in later.args if a.role.data}
            found += [a for a in launch.args if a.role.written and a.name not in read_later]
        return tuple(found)

    @cached_property
    def intermediates(self) -> tuple:
        """Written by one launch and read by a later one (the projection's ``xp``)."""
        outputs = {a.name for a in self.outputs}
        return tuple(a for launch in self.launches for a in launch.args if a.role.written and a.name not in outputs)

    @cached_property
    def scratch(self) -> tuple:
        """Sequences a launch writes and reads itself: allocated for each call, returned to nobody."""
        return tuple(a for launch in self.launches for a in launch.args if a.role is ArgRole.SCRATCH)

    @cached_property
    def arg_names(self) -> tuple:
        return tuple(a.name for a in self.inputs)

    def launch(self, function: str) -> Launch:
        return next(x for x in self.launches if x.function == function)

    def starting_at(self, function: str) -> Signature:
        """The same layer entered at launch ``function``: earlier launches' outputs become inputs."""
        i = next(i for i, x in enumerate(self.launches) if x.function == function)
        return replace(self, launches=self.launches[i:])

    def with_grid(self, function: str, **changes) -> Signature:
        """A copy whose launch ``function`` has its grid fields changed (e.g. ptxas's registers)."""
        launches = tuple(
            replace(x, grid=replace(x.grid, **changes)) if x.function == function else x for x in self.launches
        )
        return replace(self, launches=launches)

    def as_dict(self) -> dict:
        found = {
            "cell": self.cell,
            "batch": self.batch,
            "hidden": self.hidden,
            "input_size": self.input_size,
            "dtype": self.dtype,
            "launches": [x.as_dict() for x in self.launches],
        }
        return {**found, "whole_sequence": True} if self.whole_sequence else found

    @classmethod
    def from_dict(cls, d: dict) -> Signature:
        return cls(
            d["cell"],
            d["batch"],
            d["hidden"],
            d["input_size"],
            d["dtype"],
            tuple(Launch.from_dict(x) for x in d["launches"]),
            bool(d.get("whole_sequence")),
        )


# ------------------------------------------------------------------ the launches of a layer
# Built from sizes and names only (no cell plan), so that code generation and the reading of
# older exported files make the same argument lists.


def projection_launch(batch: int, input_size: int, width: int, dtype: str, xp_dtype: str | None = None) -> Launch:
    """``xp = x @ W_ih.T + b_ih`` for every step: ``projection(x, W_ih, b_ih, xp)``; ``xp`` is
    ``xp_dtype`` (the type the recurrent launch reads it in: float32, or a half layer's own type)."""
    return Launch(
        "projection",
        (
            Arg("x", ArgRole.INPUT, (SEQ, batch, input_size), dtype),
            Arg("W_ih", ArgRole.WEIGHT, (width, input_size), dtype),
            Arg("b_ih", ArgRole.PARAM, (width,), dtype),
            Arg("xp", ArgRole.OUTPUT, (SEQ, batch, width), xp_dtype or dtype),
        ),
    )


# The scalars a stateful barrier takes, with their types: the per-wait bound, the test knob that
# stalls block 0 (-1: none), and the address of the page-locked host word a timeout is copied to.
SYNC_SCALARS = {"timeout_us": "int32", "stall_step": "int32", "error_host": "int64"}
# A layer split over GPUs (schedules/split.py): a GPU's recurrent launch also takes the first CTA of the whole grid
# that it runs and the address of each other GPU's copy of the exchange (peers in device order, itself left out).
CTA_OFFSET = "cta_offset"
PEER_WORKSPACE = "peer_workspace_{}"


def split_args(gpus: int) -> tuple:
    """The scalars a GPU's recurrent launch of a layer split over ``gpus`` GPUs takes after the template's."""
    return (Arg(CTA_OFFSET, ArgRole.SCALAR, (), "int32"),
            *(Arg(PEER_WORKSPACE.format(k), ArgRole.SCALAR, (), "int64") for k in range(gpus - 1)))


def recurrent_args(
    batch: int,
    hidden: int,
    width: int,
    weights: dict,
    params: dict,
    states: tuple,
    dtype: str,
    workspace: tuple | None = None,
    workspace_dtype: str | None = None,
    sync_words: int | None = None,
    xp_dtype: str | None = None,
    outputs: int = 1,
    exchanged: int = 0,
) -> tuple:
    """The recurrent kernel's arguments, in kernel order.

    ``xp`` (T, B, width); each weight and param (``weights``/``params``: name -> shape, in
    declaration order); each initial state ``<s>0`` (B, H); ``lengths`` (B,) int32, the steps
    of each batch row (a row's states stop changing after its length and its outputs are zero
    there); ``out`` (T, B, outputs x H: the output states side by side); each final state
    ``<s>_n``; ``exchange`` (T, exchanged, B, H) where ``exchanged`` states travel between blocks
    through a sequence of their own (the ``sentinel`` exchange of a stack's lower layers); then
    ``workspace`` and the barrier's ``sync`` and scalars (:data:`SYNC_SCALARS`) when the kernel
    takes them. Everything is ``dtype`` but ``xp`` (``xp_dtype``, by default ``dtype``) and the
    workspace (``workspace_dtype``).
    """
    B, H = batch, hidden
    args = [Arg("xp", ArgRole.INPUT, (SEQ, B, width), xp_dtype or dtype)]
    args += [Arg(n, ArgRole.WEIGHT, tuple(s), dtype) for n, s in weights.items()]
    args += [Arg(n, ArgRole.PARAM, tuple(s), dtype) for n, s in params.items()]
    args += [Arg(f"{s}0", ArgRole.STATE, (B, H), dtype) for s in states]
    args += [Arg("lengths", ArgRole.LENGTHS, (B,), "int32")]
    args += [Arg("out", ArgRole.OUTPUT, (SEQ, B, outputs * H), dtype)]
    args += [Arg(f"{s}_n", ArgRole.FINAL, (B, H), dtype) for s in states]
    if exchanged:
        args.append(Arg("exchange", ArgRole.SCRATCH, (SEQ, exchanged, B, H), dtype))
    if workspace is not None:
        args.append(Arg("workspace", ArgRole.WORKSPACE, tuple(workspace), workspace_dtype or dtype))
    if sync_words is not None:
        args.append(Arg("sync", ArgRole.SYNC, (sync_words,), "uint32"))
        args += [Arg(name, ArgRole.SCALAR, (), dtype) for name, dtype in SYNC_SCALARS.items()]
    return tuple(args)


def backward_args(
    batch: int,
    hidden: int,
    width: int,
    weights: dict,
    params: dict,
    states: tuple,
    dtype: str,
    grad_dtype: str,
    xp_dtype: str | None = None,
) -> tuple:
    """The recurrent kernel's backward: the forward's inputs (``xp``, weights, params, initial states,
    ``lengths``), the gradients of its outputs (``d_out`` (T, B, H); each ``d_<s>_n``, zeros when
    omitted), and, written, the gradients of its inputs (``d_xp``, ``d_<weight>``, ``d_<param>``,
    ``d_<s>0``), in ``grad_dtype``."""
    B, H = batch, hidden
    forward = [a for a in recurrent_args(B, H, width, weights, params, states, dtype, xp_dtype=xp_dtype) if a.role.data]
    args = [*forward, Arg("d_out", ArgRole.INPUT, (SEQ, B, H), grad_dtype)]
    args += [Arg(f"d_{s}_n", ArgRole.STATE, (B, H), grad_dtype) for s in states]
    args += [Arg(f"d_{a.name}", ArgRole.OUTPUT, a.shape, grad_dtype) for a in forward if a.role is not ArgRole.LENGTHS]
    return tuple(args)


def with_saved(launch: Launch, columns: int, dtype: str) -> Launch:
    """``launch`` as a training forward, ``recurrent_save``: the same arguments and one more output after
    the final states, ``saved`` (T, B, ``columns``) in ``dtype`` (``CellPlan.saved_leaves`` says what
    they hold)."""
    args = list(launch.args)
    at = max(i for i, a in enumerate(args) if a.role.written) + 1
    batch = next(a.shape[1] for a in args if a.name == "out")
    args.insert(at, Arg("saved", ArgRole.OUTPUT, (SEQ, batch, columns), dtype))
    return replace(launch, function="recurrent_save", args=tuple(args))


def with_projected(launch: Launch, input_size: int, width: int) -> Launch:
    """``launch`` (a recurrent launch) projecting its own input, ``recurrent_projected``: in place of ``xp`` the raw
    input ``x`` (T, B, ``input_size``) and the projection's ``W_ih`` (``width``, ``input_size``) and ``b_ih``; the
    rest as it is (the same owned buffers: the layer's launch state serves both). One launch a layer where the
    projection would be a launch of its own (``schedules/projected.py``)."""
    args = []
    for a in launch.args:
        if a.name == "xp":
            dtype = next(f.dtype for f in launch.args if f.role is ArgRole.FINAL)
            args += [
                Arg("x", ArgRole.INPUT, (a.shape[0], a.shape[1], input_size), dtype),
                Arg("W_ih", ArgRole.WEIGHT, (width, input_size), dtype),
                Arg("b_ih", ArgRole.PARAM, (width,), dtype),
            ]
        else:
            args.append(a)
    return replace(launch, function="recurrent_projected", args=tuple(args))


# ------------------------------------------------------------------ a resident session's launches
# A session (prnn_tvm.runtime.session) launches a layer's recurrent kernel once and has it serve a step per
# request: a step's input x_t goes tagged into a mailbox the kernel polls (a launch on the caller's stream
# publishes it, or the host writes it into page-locked memory that the kernel relays), the kernel projects it
# itself, and a launch on the caller's stream collects the step's outputs (or the kernel stores them into
# page-locked host memory): prnn_tvm/codegen/barriers/session.cuh.

REQUESTS = "mailbox"  # (depth, request_words(B * input, dtype)) tagged words: each step's input x_t
RESPONSES = "resp"  # (depth, states, B, H) tagged words: each step's new states
# the resident kernel's addresses of the host transport's page-locked buffers (0: the device transport): the
# host's requests, shaped as the mailbox, and the responses, shaped as ``resp``
REQUESTS_HOST = "requests_host"
RESPONSES_HOST = "responses_host"
CONTROL_WORDS = 4  # control[0]: the steps requested of the running launch
# In a session's recorded timeout (the error word's 1 + step): the resident kernel's wait for a request, not for a
# block or a response, at that step (session.cuh's PRNN_SESSION_IDLE). It takes nothing, so loses no state.
SESSION_IDLE = 0x40000000
FREE_SMS = 4  # SMs a session leaves to other kernels by default (its own publish and collect among them)


def request_words(values: int, dtype: str) -> int:
    """The tagged words of a request of ``values`` input values of a ``dtype`` layer: a word carries 32 bits of
    payload, two 16-bit values (the first in the low half) or one float32 value (a float32 layer's, or a single
    value). A mailbox with fewer words than values carries pairs (libraries exported before pairs have as many)."""
    return (values + 1) // 2 if dtype in ("float16", "bfloat16") and values > 1 else values


def with_session(launch: Launch, input_size: int, width: int) -> Launch:
    """``launch`` (a recurrent launch) as a session's resident kernel, ``recurrent_session``: in place of ``xp`` the
    input projection's ``W_ih`` (``width``, ``input_size``) and ``b_ih`` (the kernel projects each step's input
    itself) and the request mailbox, in place of ``out`` the tagged responses (every state's new value, in the
    order of the final states: the outputs are among them), no ``lengths`` (every row runs every step), and four
    more scalars: ``idle_us`` (how long it waits for a request before it reports a timeout: a bound against a
    caller that went away, not the session's release), ``capacity`` (the most steps a launch serves), and
    :data:`REQUESTS_HOST` and :data:`RESPONSES_HOST` (the host transport's buffers, 0 for the device transport).
    The mailbox's and responses' first dimension (:data:`SEQ`) is the depth of their rings."""
    args = []
    for a in launch.args:
        if a.name == "xp":
            dtype = next(f.dtype for f in launch.args if f.role is ArgRole.FINAL)
            args += [
                Arg("W_ih", ArgRole.WEIGHT, (width, input_size), dtype),
                Arg("b_ih", ArgRole.PARAM, (width,), dtype),
                Arg(REQUESTS, ArgRole.WORKSPACE, (SEQ, request_words(a.shape[1] * input_size, dtype)), "uint64"),
            ]
        elif a.name == "out":
            finals = [f for f in launch.args if f.role is ArgRole.FINAL]
            args.append(Arg(RESPONSES, ArgRole.WORKSPACE, (SEQ, len(finals), *finals[0].shape), "uint64"))
        elif a.role is not ArgRole.LENGTHS:
            args.append(a)
    args += [
        Arg(name, ArgRole.SCALAR, (), dtype)
        for name, dtype in (("idle_us", "int32"), ("capacity", "int32"), (REQUESTS_HOST, "int64"),
                            (RESPONSES_HOST, "int64"))
    ]
    return replace(launch, function="recurrent_session", args=tuple(args))


def session_launches(resident: Launch, dtype: str, grids: dict) -> tuple:
    """The launches a session's caller makes around ``resident`` (:func:`with_session`) under the device transport,
    on ``grids`` (by function): ``session_publish`` (a step's input ``x`` (B, input) tagged into the mailbox),
    ``session_collect`` (the step's new ``states``, one (B, H) matrix per state in the order of the final states,
    from the responses) and ``session_close`` (the close mark in the mailbox). ``control`` (:data:`CONTROL_WORDS`
    uint32) counts the steps requested; ``sync`` and the scalars are the resident kernel's."""
    mailbox, resp = resident.arg(REQUESTS), resident.arg(RESPONSES)
    sync = (resident.arg("sync"),)
    control = Arg("control", ArgRole.WORKSPACE, (CONTROL_WORDS,), "uint32")
    x = Arg("x", ArgRole.INPUT, (resp.shape[2], resident.arg("W_ih").shape[1]), dtype)  # (B, input)
    publish = (x, mailbox, control, *sync)
    collect = (
        resp,
        Arg("states", ArgRole.OUTPUT, resp.shape[1:], dtype),
        control,
        *sync,
        resident.arg("timeout_us"),
        resident.arg("error_host"),
    )
    close = (mailbox, control, *sync)
    return tuple(
        Launch(name, args, grids[name])
        for name, args in (("session_publish", publish), ("session_collect", collect), ("session_close", close))
    )


@dataclass(frozen=True)
class SessionSignature:
    """A resident session's interface as plain data: what :class:`prnn_tvm.runtime.session.Session` runs, and what an
    exported library carries for one (``prnn_tvm.export(..., session=True)``). The layer's ``cell``, shapes and
    ``dtype``, ``output`` (the state a step returns as its output) and the four launches: ``resident``
    (:func:`with_session`), ``publish``, ``collect`` and ``close`` (:func:`session_launches`)."""

    cell: str
    batch: int
    hidden: int
    dtype: str
    output: str
    resident: Launch
    publish: Launch
    collect: Launch
    close: Launch

    ROLES = ("resident", "publish", "collect", "close")

    @property
    def launches(self) -> tuple:
        return tuple(getattr(self, role) for role in self.ROLES)

    @property
    def input_size(self) -> int:
        return int(self.publish.arg("x").shape[1])

    def as_dict(self) -> dict:
        found = {"cell": self.cell, "batch": self.batch, "hidden": self.hidden, "dtype": self.dtype}
        return {**found, "output": self.output, **{role: getattr(self, role).as_dict() for role in self.ROLES}}

    @classmethod
    def from_dict(cls, d: dict) -> SessionSignature:
        launches = (Launch.from_dict(d[role]) for role in cls.ROLES)
        return cls(d["cell"], int(d["batch"]), int(d["hidden"]), d["dtype"], d["output"], *launches)


def gpu_backward_args(
    batch: int,
    hidden: int,
    width: int,
    weights: dict,
    params: dict,
    states: tuple,
    saved: int,
    gates: int,
    dtype: str,
    storage: str,
    workspace: tuple,
    sync_words: int | None,
    gates_dtype: str | None = None,
    exchange_dtype: str | None = None,
) -> tuple:
    """The GPU backward kernel's arguments, in kernel order: ``xp``, the weights and params as the forward
    takes them, ``lengths``, ``saved`` (the training forward's, ``saved`` columns), ``d_out`` and each
    ``d_<s>_n`` in; ``d_xp``, ``d_gates`` (T, B, ``gates``: every product's gate gradients, for the weight
    gradients' GEMMs), each ``d_<param>_rows`` (B, width of the param: the param's gradient per batch
    row) and each ``d_<s>0`` out; then the workspace and the barrier's state and scalars. The weights and
    params are the layer's ``storage`` type, and so are ``d_out`` and each ``d_<s>_n`` (the gradients of what the
    layer returns come in its type, and the kernel widens them as it reads them: a half layer's taken in float32, a
    copy of ``d_out`` ran before the kernel, 55 us a step at slstm_h12 bf16 768 x 16, T=1024, H100) and ``d_xp`` (the
    projection's GEMMs take it in the layer's type: rounded where written, not by a copy of 95 us there). ``d_gates`` is
    ``gates_dtype`` (the half type where the weight gradients' GEMMs multiply them), the workspace (the gate gradients
    the blocks exchange) ``exchange_dtype`` (where not ``gates_dtype``: the float32 backward of a half layer exchanges
    them in float32), everything else ``dtype`` (float32)."""
    B, H = batch, hidden
    args = [Arg("xp", ArgRole.INPUT, (SEQ, B, width), dtype)]
    args += [Arg(n, ArgRole.WEIGHT, tuple(s), storage) for n, s in weights.items()]
    args += [Arg(n, ArgRole.PARAM, tuple(s), storage) for n, s in params.items()]
    args += [
        Arg("lengths", ArgRole.LENGTHS, (B,), "int32"),
        Arg("saved", ArgRole.INPUT, (SEQ, B, saved), dtype),
        Arg("d_out", ArgRole.INPUT, (SEQ, B, H), storage),
    ]
    args += [Arg(f"d_{s}_n", ArgRole.STATE, (B, H), storage) for s in states]
    args += [
        Arg("d_xp", ArgRole.OUTPUT, (SEQ, B, width), storage),
        Arg("d_gates", ArgRole.OUTPUT, (SEQ, B, gates), gates_dtype or dtype),
    ]
    args += [Arg(f"d_{n}_rows", ArgRole.OUTPUT, (B, *s), dtype) for n, s in params.items()]
    args += [Arg(f"d_{s}0", ArgRole.OUTPUT, (B, H), dtype) for s in states]
    args.append(Arg("workspace", ArgRole.WORKSPACE, tuple(workspace), exchange_dtype or gates_dtype or dtype))
    if sync_words is not None:
        args.append(Arg("sync", ArgRole.SYNC, (sync_words,), "uint32"))
        args += [Arg(name, ArgRole.SCALAR, (), t) for name, t in SYNC_SCALARS.items()]
    return tuple(args)

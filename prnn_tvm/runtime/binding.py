"""Binding a call's arrays to a layer's :class:`~prnn_tvm.signature.Signature`.

Positional and keyword arguments are matched to the signature's inputs like a Python
signature would; each is checked (shape with the call's sequence length, dtype,
contiguity, device) and placed on the layer's device: NumPy arrays are copied, anything
with ``__dlpack__`` is wrapped without a copy. Omitted initial states are zeros, omitted
per-row lengths the whole sequence (NumPy lengths and a CPU tensor's are checked to lie in [0, T];
a GPU tensor's are not read, and the kernels take them as clamped to that range); outputs are
allocated per call, intermediates and scratch sequences kept between calls (:mod:`~prnn_tvm.runtime.buffers`);
the layer's own buffers (workspace, barrier state) and scalars are supplied by the layer. A caller that launches
one launch again and again with arrays of its own (:class:`~prnn_tvm.runtime.base.Launcher`) binds by the
positions :class:`Slots` works out once.
Imports only TVM's runtime and NumPy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi

from ..dtypes import itemsize
from ..errors import InputError
from ..signature import SEQ, Arg, ArgRole, Launch, Signature
from . import limits
from .buffers import KeptOn
from .limits import ALIGNMENT, chunk_length

# A sequence past MAX_ELEMENTS runs in pieces (prnn_tvm.runtime.limits): they are copied into (inputs) and out of
# (outputs) buffers of one piece's length, which also bounds the intermediates' memory.
COPY = "copy"  # a step of a chunked call that is a copy, ``(COPY, (destination, source))``


@dataclass(frozen=True)
class BoundCall:
    """Every step of one call with its arguments in place, and what the call returns.

    ``launches`` holds ``(function name, argument values)`` in order: the signature's
    launches, once per chunk for a sequence past :data:`MAX_ELEMENTS`, with the copies
    that move each chunk as ``(COPY, (destination, source))``. ``outputs`` are the tensors
    the call returns (the output sequence, then the final states); ``from_numpy`` whether
    every input came as NumPy (then NumPy goes back to the caller).
    """

    seq_len: int
    launches: tuple
    outputs: tuple
    from_numpy: bool
    chunks: int = 1


def bind(
    signature: Signature, args: tuple, kwargs: dict, device, owned, scalars: dict, kept: KeptOn | None = None
) -> BoundCall:
    """Check and place a call's arguments; allocate its outputs.

    ``owned(arg)`` returns the layer's persistent buffer for a workspace or barrier-state
    argument; ``scalars`` maps scalar argument names to their values; ``kept``: where the call's own
    buffers (intermediates, scratch, a chunked call's pieces) are kept between calls (None: made for
    this call). Refuses, before anything is allocated, a call whose buffers do not fit in the device's
    free memory.
    """
    kept = KeptOn(device) if kept is None else kept
    inputs = signature.inputs
    names = [a.name for a in inputs]
    values = bind_names(names, args, kwargs, required=[a.name for a in inputs if not a.role.optional])
    first = next(a for a in inputs if a.shape and a.shape[0] == SEQ)
    seq_len = sequence_length(values[first.name], first.name)
    chunk = chunk_length(signature, seq_len)
    chunks = -(-seq_len // chunk)
    if chunks > 1 and signature.whole_sequence:
        raise InputError(
            f"{seq_len} steps of '{signature.cell}' need buffers past {limits.MAX_ELEMENTS} elements, "
            f"which runs in consecutive launches of {chunk} steps; its reverse direction reads each row "
            "from its last step, so it cannot: run the directions as layers of their own, or shorter "
            "sequences"
        )
    per_call = (*signature.intermediates, *signature.scratch)  # a piece's length when chunked
    sequences = [a for a in (*inputs, *per_call, *signature.outputs) if SEQ in a.shape]
    finals = [a for a in signature.outputs if a.role is ArgRole.FINAL]
    copied = [a for a in inputs if isinstance(values.get(a.name), np.ndarray)]  # NumPy goes to the device
    check_memory(
        [(a, seq_len) for a in (*copied, *signature.outputs)],
        device,
        [("call", a, chunk) for a in per_call]
        if chunks == 1
        else [("piece", a, chunk) for a in sequences] + [("spare", a, 1) for a in finals],
        kept,
    )
    tensors, from_numpy = {}, True
    for arg in inputs:
        given = values.get(arg.name)
        if given is None and arg.role.optional:  # an initial state's zeros, every row's whole sequence: kept
            tensors[arg.name] = kept.constant(arg, seq_len, seq_len if arg.role is ArgRole.LENGTHS else 0)
            continue
        if arg.role is ArgRole.LENGTHS:
            given = row_lengths(given, arg, seq_len)
        tensors[arg.name], numpy_given = place(arg, given, seq_len, device)
        from_numpy &= numpy_given
    for arg in signature.outputs:
        tensors[arg.name] = tvm.runtime.empty(arg.concrete_shape(seq_len), arg.dtype, device)
    if chunks == 1:
        tensors.update({a.name: kept.get("call", a, seq_len) for a in per_call})
        launches = [(x.function, _values(x, tensors, owned, scalars)) for x in signature.launches]
        return BoundCall(seq_len, tuple(launches), tuple(tensors[a.name] for a in signature.outputs), from_numpy)
    pieces = {a.name: kept.get("piece", a, chunk) for a in sequences}
    # chunk c's final states are chunk c + 1's initial states: two sets written in turn (a
    # kernel must not write what other blocks may still read), the last chunk's the outputs
    spare = {a.name: kept.get("spare", a, 1) for a in finals}
    lengths = [a for a in inputs if a.role is ArgRole.LENGTHS]
    full = {a.name: tensors[a.name].numpy() for a in lengths}  # read once: each chunk counts from its start
    steps, carried = [], {}
    for c in range(chunks):
        t0, t1 = c * chunk, min(seq_len, (c + 1) * chunk)
        piece = {a.name: _steps(pieces[a.name], a, 0, t1 - t0) for a in sequences}
        piece.update(
            {name: tvm.runtime.tensor(np.clip(n - t0, 0, t1 - t0).astype(np.int32), device) for name, n in full.items()}
        )
        steps += [(COPY, (piece[a.name], _steps(tensors[a.name], a, t0, t1))) for a in sequences if a in inputs]
        for launch in signature.launches:
            own = {
                a.name: (tensors if (chunks - 1 - c) % 2 == 0 else spare)[a.name]
                for a in launch.args
                if a.role is ArgRole.FINAL
            }
            states = [a.name for a in launch.args if a.role is ArgRole.STATE]
            here = {**tensors, **piece, **own, **(dict(zip(states, carried[launch.function])) if c else {})}
            steps.append((launch.function, _values(launch, here, owned, scalars)))
            carried[launch.function] = list(own.values())  # the k-th final state is the k-th next initial one
        steps += [
            (COPY, (_steps(tensors[a.name], a, t0, t1), piece[a.name])) for a in signature.outputs if SEQ in a.shape
        ]
    return BoundCall(seq_len, tuple(steps), tuple(tensors[a.name] for a in signature.outputs), from_numpy, chunks)


class Slots:
    """Where each argument of one launch goes, worked out once for a caller that binds it call after call (a call's
    host time is part of what a user waits for at small batch): the call's data (inputs in the launch's order,
    :attr:`data`), what the launch writes (allocated per call, returned: :attr:`written`), its scratch sequences
    (allocated per call: :attr:`scratch`), the layer's scalars (read at every call: :attr:`scalars`) and the
    layer's own buffers (the same while the caller's stream is: :attr:`owned`). Positions are kernel order."""

    def __init__(self, launch: Launch, dtype=str):
        args = launch.args
        self.function, self.arity = launch.function, len(args)
        self.data = [i for i, a in enumerate(args) if a.role.data]
        self.written = [(i, a) for i, a in enumerate(args) if a.role.written]
        self.scratch = [(i, a) for i, a in enumerate(args) if a.role is ArgRole.SCRATCH]
        self.scalars = [(i, a.name) for i, a in enumerate(args) if a.role is ArgRole.SCALAR]
        self.owned = [(i, a.name) for i, a in enumerate(args) if a.role.owned]
        self._dtype = dtype  # a dtype's name -> the caller's dtype object
        self._sized: dict = {}  # sequence length -> (written, scratch) buffers' (position, shape, dtype)

    def sized(self, seq_len: int) -> tuple:
        """``(written, scratch)`` for a call of ``seq_len`` steps: each buffer's ``(position, shape, dtype)``, the
        dtype as the caller's array library names it."""
        found = self._sized.get(seq_len)
        if found is None:
            found = self._sized[seq_len] = tuple(
                [(i, a.concrete_shape(seq_len), self._dtype(a.dtype)) for i, a in g]
                for g in (self.written, self.scratch)
            )
        return found

    def with_owned(self, owned: dict) -> list:
        """An argument list (kernel order) holding the layer's buffers ``owned`` (by argument name) in place."""
        args = [None] * self.arity
        for i, name in self.owned:
            args[i] = owned[name]
        return args


def _values(launch, tensors: dict, owned, scalars: dict) -> list:
    """A launch's argument values: the layer's own buffers and scalars, else the named tensors."""
    return [
        owned(a) if a.role.owned else scalars[a.name] if a.role is ArgRole.SCALAR else tensors[a.name]
        for a in launch.args
    ]


def check_memory(buffers: list, device, own: list = (), kept: KeptOn | None = None) -> None:
    """InputError, before anything is allocated, when ``buffers`` ((arg, steps) pairs) and the call's own buffers
    ``own`` ((use, arg, steps), of which ``kept`` may hold some already) exceed the device's free memory."""
    needed = sum(math.prod(a.concrete_shape(steps)) * itemsize(a.dtype) for a, steps in buffers)
    needed += sum(
        kept.new_bytes(use, a, steps) if kept else math.prod(a.concrete_shape(steps)) * itemsize(a.dtype)
        for use, a, steps in own
    )
    free = _free_memory(device)
    if free is not None and needed > free:
        everything = [*buffers, *((a, steps) for _, a, steps in own)]
        names = ", ".join(dict.fromkeys(a.name for a, _ in everything))
        longest = max(steps for _, steps in everything)
        raise InputError(
            f"a sequence of {longest} steps needs {needed / 2**30:.2f} GiB on {device} for its "
            f"inputs, outputs and intermediates ({names}), and {free / 2**30:.2f} GiB are free: run it in "
            "shorter pieces, each starting from the final states of the one before"
        )


def _free_memory(device) -> int | None:
    """Free bytes on a GPU; None on the CPU (the operating system has the say there)."""
    if device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
        return None
    try:
        return int(device.available_global_memory)
    except Exception:  # noqa: BLE001 - a device that cannot say: no check rather than a wrong one
        return None


def _steps(tensor, arg: Arg, t0: int, t1: int):
    """A view of steps t0..t1 of a (T, ...) tensor."""
    shape = arg.concrete_shape(t1 - t0)
    row = math.prod(shape[1:]) * itemsize(arg.dtype)
    return tensor._create_view(shape, relative_byte_offset=t0 * row)


def bind_names(names: list[str], args: tuple, kwargs: dict, required: list[str]) -> dict:
    """Map positional and keyword arguments onto ``names`` like a Python signature would."""
    if len(args) > len(names):
        raise InputError(f"takes at most {len(names)} arguments ({', '.join(names)}), got {len(args)}")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise InputError(f"unknown argument '{key}'; arguments are {', '.join(names)}")
        if key in values:
            raise InputError(f"argument '{key}' given twice")
        values[key] = value
    missing = [n for n in required if values.get(n) is None]
    if missing:
        raise InputError(f"missing argument(s): {', '.join(missing)}")
    return values


def sequence_length(value, name: str) -> int:
    """The T of a (T, batch, features) argument; InputError for anything else."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) != 3:
        raise InputError(
            f"{name} must be a 3-d array (T, batch, features), got {type(value).__name__} of shape {shape}"
        )
    T = int(shape[0])
    if T < 1:
        raise InputError(f"{name} has {T} timesteps; a sequence needs at least one")
    return T


def row_lengths(value, arg: Arg, seq_len: int):
    """The lengths argument as placed (given: an omitted one is the layer's kept constant): a NumPy one checked
    (integers in [0, T], as int32); a tensor as given, its values checked where they are in host memory (reading a
    GPU tensor's would wait for the GPU)."""
    if not isinstance(value, np.ndarray) and isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        if _on_host(value):
            _check_lengths(arg, np.from_dlpack(value), seq_len)
        return value
    if value.dtype.kind not in "iu":
        raise InputError(f"{arg.name} must hold integers (each batch row's number of steps), got {value.dtype}")
    check(arg.name, tuple(value.shape), arg.dtype, arg.concrete_shape(seq_len), arg.dtype)
    _check_lengths(arg, value, seq_len)
    return value.astype(arg.dtype)


def _on_host(value) -> bool:
    """Whether a DLPack tensor is in host memory (DLPack's device type 1), where NumPy reads it."""
    try:
        return value.__dlpack_device__()[0] == 1
    except Exception:  # not a DLPack tensor: place() says so
        return False


def _check_lengths(arg: Arg, value: np.ndarray, seq_len: int) -> None:
    if value.size and value.dtype.kind in "iu" and (value.min() < 0 or value.max() > seq_len):
        raise InputError(
            f"{arg.name} must lie in [0, {seq_len}] (the sequence's {seq_len} steps), got values from "
            f"{value.min()} to {value.max()}"
        )


def place(arg: Arg, value, seq_len: int, device) -> tuple:
    """(device tensor, came from NumPy) for one argument, after checking it."""
    shape = arg.concrete_shape(seq_len)
    if isinstance(value, np.ndarray):
        check(arg.name, tuple(value.shape), str(value.dtype), shape, arg.dtype)
        return tvm.runtime.tensor(np.ascontiguousarray(value), device), True
    if isinstance(value, tvm.runtime.Tensor):
        tensor = value
    elif hasattr(value, "__dlpack__"):
        try:  # any alignment: a misaligned tensor is copied below, not refused
            tensor = tvm_ffi.from_dlpack(value, require_alignment=0, require_contiguous=False)
        except Exception as err:
            raise InputError(f"{arg.name}: cannot be wrapped through DLPack ({err})") from err
    else:
        raise InputError(f"{arg.name} must be a NumPy array or a DLPack tensor, got {type(value).__name__}")
    check(arg.name, tuple(int(d) for d in tensor.shape), str(tensor.dtype), shape, arg.dtype)
    if not tensor.is_contiguous():
        raise InputError(f"{arg.name} is not contiguous; pass a compact (row-major) tensor")
    if (tensor.device.dlpack_device_type(), tensor.device.index) != (device.dlpack_device_type(), device.index):
        raise InputError(f"{arg.name} is on {tensor.device}, the layer runs on {device}")
    if tensor.data_ptr() % ALIGNMENT:  # kernels may load it with vector instructions: an aligned copy
        aligned = tvm.runtime.empty(shape, arg.dtype, device)
        aligned.copyfrom(tensor)
        return aligned, False
    return tensor, False


def check(name: str, got_shape: tuple, got_dtype: str, shape: tuple, dtype: str) -> None:
    if got_shape != tuple(shape):
        raise InputError(f"{name} has shape {got_shape}, expected {tuple(shape)}")
    if got_dtype != dtype:
        raise InputError(f"{name} has dtype {got_dtype}, expected {dtype}")

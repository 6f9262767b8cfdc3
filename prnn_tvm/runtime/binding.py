"""Binding a call's arrays to a layer's :class:`~prnn_tvm.signature.Signature`.

Positional and keyword arguments are matched to the signature's inputs like a Python
signature would; each is checked (shape with the call's sequence length, dtype,
contiguity, device) and placed on the layer's device: NumPy arrays are copied, anything
with ``__dlpack__`` is wrapped without a copy. Omitted initial states are zeros; outputs
and intermediates are allocated per call; the layer's own buffers (workspace, barrier
state) and scalars are supplied by the layer. Imports only TVM's runtime and NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm

from ..errors import InputError
from ..signature import SEQ, Arg, ArgRole, Signature


@dataclass(frozen=True)
class BoundCall:
    """Every launch of one call with its arguments in place, and what the call returns.

    ``launches`` holds ``(function name, argument values)`` in order; ``outputs`` the
    tensors the call returns (the output sequence, then the final states); ``from_numpy``
    whether every input came as NumPy (then NumPy goes back to the caller).
    """

    seq_len: int
    launches: tuple
    outputs: tuple
    from_numpy: bool


def bind(signature: Signature, args: tuple, kwargs: dict, device, owned, scalars: dict) -> BoundCall:
    """Check and place a call's arguments; allocate its outputs.

    ``owned(arg)`` returns the layer's persistent buffer for a workspace or barrier-state
    argument; ``scalars`` maps scalar argument names to their values.
    """
    inputs = signature.inputs
    names = [a.name for a in inputs]
    values = bind_names(names, args, kwargs, required=[a.name for a in inputs if a.role is not ArgRole.STATE])
    first = next(a for a in inputs if a.shape and a.shape[0] == SEQ)
    seq_len = sequence_length(values[first.name], first.name)
    tensors, from_numpy = {}, True
    for arg in inputs:
        given = values.get(arg.name)
        if given is None:  # an omitted initial state
            given = np.zeros(arg.concrete_shape(seq_len), arg.dtype)
        tensors[arg.name], numpy_given = place(arg, given, seq_len, device)
        from_numpy &= numpy_given
    for arg in (*signature.intermediates, *signature.outputs):
        tensors[arg.name] = tvm.runtime.empty(arg.concrete_shape(seq_len), arg.dtype, device)
    launches = []
    for launch in signature.launches:
        values_of = []
        for arg in launch.args:
            if arg.role.owned:
                values_of.append(owned(arg))
            elif arg.role is ArgRole.SCALAR:
                values_of.append(scalars[arg.name])
            else:
                values_of.append(tensors[arg.name])
        launches.append((launch.function, values_of))
    return BoundCall(seq_len, tuple(launches), tuple(tensors[a.name] for a in signature.outputs), from_numpy)


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
        raise InputError(f"{name} must be a 3-d array (T, batch, features), got {type(value).__name__} "
                         f"of shape {shape}")
    T = int(shape[0])
    if T < 1:
        raise InputError(f"{name} has {T} timesteps; a sequence needs at least one")
    return T


def place(arg: Arg, value, seq_len: int, device) -> tuple:
    """(device tensor, came from NumPy) for one argument, after checking it."""
    shape = arg.concrete_shape(seq_len)
    if isinstance(value, np.ndarray):
        check(arg.name, tuple(value.shape), str(value.dtype), shape, arg.dtype)
        return tvm.runtime.tensor(np.ascontiguousarray(value), device), True
    if isinstance(value, tvm.runtime.Tensor):
        tensor = value
    elif hasattr(value, "__dlpack__"):
        try:
            tensor = tvm.runtime.from_dlpack(value)
        except Exception as err:
            raise InputError(f"{arg.name}: cannot be wrapped through DLPack ({err}); pass a contiguous, "
                             "64-byte aligned tensor") from err
    else:
        raise InputError(f"{arg.name} must be a NumPy array or a DLPack tensor, got {type(value).__name__}")
    check(arg.name, tuple(int(d) for d in tensor.shape), str(tensor.dtype), shape, arg.dtype)
    if not tensor.is_contiguous():
        raise InputError(f"{arg.name} is not contiguous; pass a compact (row-major) tensor")
    if (tensor.device.dlpack_device_type(), tensor.device.index) != (device.dlpack_device_type(), device.index):
        raise InputError(f"{arg.name} is on {tensor.device}, the layer runs on {device}")
    return tensor, False


def check(name: str, got_shape: tuple, got_dtype: str, shape: tuple, dtype: str) -> None:
    if got_shape != tuple(shape):
        raise InputError(f"{name} has shape {got_shape}, expected {tuple(shape)}")
    if got_dtype != dtype:
        raise InputError(f"{name} has dtype {got_dtype}, expected {dtype}")

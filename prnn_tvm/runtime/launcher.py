"""Launching one launch of a layer again and again with the caller's own arrays: what ``prnn_tvm.torch`` runs
every CUDA kernel through.

:meth:`RuntimeLayer.__call__ <prnn_tvm.runtime.base.RuntimeLayer>` binds a call by name, checks every array and
runs every launch; a :class:`Launcher` serves a caller that has checked its arrays itself and calls one launch
at small batch, where host time is part of what a user waits for: the binding's positions are worked out once
(:class:`~prnn_tvm.runtime.binding.Slots`), what the launch writes is made by the caller's array library
(:class:`Arrays`), and the rest is the layer's as for any call: the workspace and barrier state of the caller's
stream, the scalars and the host error word, the co-residency check, the chunked call past 2^31 elements.
Imports only TVM's runtime and NumPy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi

from ..errors import InputError
from . import l2, limits
from .base import RuntimeLayer
from .binding import Slots

_NOTHING = contextlib.nullcontext()  # reusable


@dataclass(frozen=True)
class Arrays:
    """How a :class:`Launcher` makes buffers in its caller's array library: ``empty(*shape, dtype=...)`` an
    uninitialized one (the shape unpacked: torch parses a tuple half a microsecond slower), ``dtype(name)`` the
    library's dtype for a signature's dtype name, ``zeros(arg)`` a zeroed buffer for a workspace or barrier-state
    :class:`~prnn_tvm.signature.Arg`, ``adopt(tensor)`` one of the library's arrays for a TVM tensor (through
    DLPack, without a copy). :func:`tvm_arrays` is TVM's own."""

    empty: Callable
    dtype: Callable
    zeros: Callable
    adopt: Callable


def tvm_arrays(device: tvm.runtime.Device) -> Arrays:
    """TVM tensors on ``device``."""
    return Arrays(
        empty=lambda *shape, dtype: tvm.runtime.empty(shape, dtype, device),
        dtype=str,
        zeros=lambda a: tvm.runtime.tensor(np.zeros(a.shape, a.dtype), device),
        adopt=lambda tensor: tensor,
    )


class Launcher:
    """One launch of a layer (``function``: its ``recurrent`` kernel, or a training kernel), called again and again
    with arrays the caller's library makes (:class:`Arrays`): what :meth:`RuntimeLayer.bind` does once per call,
    but by positions worked out once (:class:`~prnn_tvm.runtime.binding.Slots`), for callers whose host time
    matters (``prnn_tvm.torch`` launches every CUDA kernel through one).

    A call passes the launch's data arguments (kernel order: anything with ``__dlpack__`` on the layer's device,
    checked by the caller) and the raw handle of the stream to run on; the launcher raises an earlier launch's
    barrier timeout first, supplies the layer's scalars (the host error word among them) and its workspace and
    barrier state for that stream (:meth:`RuntimeLayer.launch_state`, or ``state``, one the caller keeps:
    :meth:`new_state`), makes what the launch writes with ``arrays.empty`` (or takes the caller's: ``into``),
    launches on that stream and returns the written arrays in kernel order. Nothing waits for the device. A
    sequence whose buffers would reach 2^31 elements runs as the layer's chunked call
    (:meth:`RuntimeLayer.recurrent`; its arrays adopted, ``into`` not written).
    """

    def __init__(
        self,
        layer: RuntimeLayer,
        function: str = "recurrent",
        arrays: Arrays | None = None,
        device: tvm.runtime.Device | None = None,
    ):
        device = layer.device if device is None else device
        arrays = tvm_arrays(device) if arrays is None else arrays
        self.layer, self.name, self.arrays = layer, function, arrays
        self.slots = Slots(layer.signature.launch(function), arrays.dtype)
        self.function = layer.function(function)  # co-residency checked here, once
        self.max_steps = limits.chunk_length(layer.signature, limits.MAX_ELEMENTS)  # more: launches over pieces
        self._device = device
        self._stream = tvm_ffi.use_raw_stream if layer.is_cuda else None  # TVM's current stream while launching
        self._placed: dict = {}  # stream -> (its launch state, an argument list with that state in place)
        self._streamed = streamed_weight(layer.signature.launch(function)) if layer.is_cuda else None

    def new_state(self) -> dict:
        """A fresh workspace and barrier state that belongs to the caller (one captured in a CUDA graph, which
        must outlive the graph and is zeroed at the start of every replay)."""
        return self.layer.new_launch_state(self.arrays.zeros)

    def __call__(self, data: list, stream: int = 0, state: dict | None = None, into: list | None = None) -> list:
        """``into``: where the launch writes, the caller's arrays (kernel order; None where ``arrays.empty`` makes
        it), each of its argument's shape and dtype and compact on a 64-byte boundary (views of one allocation
        that the caller returns whole: a stack's final states). Unchecked, as ``data``."""
        self.layer.check(wait=False)  # an earlier launch's timeout is raised before this one starts
        T = int(data[0].shape[0])
        if T > self.max_steps:
            return self._in_pieces(data, stream, T)
        args = self._with_owned(state) if state is not None else self._placed_for(stream)[2].copy()
        for i, value in zip(self.slots.data, data):
            args[i] = value
        return self._launch(args, stream, T, into)

    def bound(self, data: list, steps: int) -> Bound | None:
        """This launch of ``steps`` steps with the data arguments that stay the same from call to call in place
        (``data`` in kernel order, None at each that a call passes): :class:`Bound`. None where ``steps`` runs in
        pieces (a call of :meth:`__call__` then)."""
        return Bound(self, data, steps) if steps <= self.max_steps else None

    def _placed_for(self, stream: int) -> tuple:
        """``(launch state, scalars, argument list)`` of ``stream``: the list holds the stream's own workspace and
        barrier state (kept by the layer, made anew after a timeout) and the layer's scalars, made again only when
        the state is another object or a scalar another value (a split layer's part makes its scalars anew each call:
        :class:`~prnn_tvm.runtime.split.DevicePart`)."""
        layer = self.layer
        state, scalars = layer.launch_state(stream, self.arrays.zeros), layer.scalars()
        placed = self._placed.get(stream)
        if placed is None or placed[0] is not state or (placed[1] is not scalars and placed[1] != scalars):
            placed = self._placed[stream] = (state, scalars, self._with_owned(state))
        return placed

    def _with_owned(self, state: dict) -> list:
        """A new argument list holding the launch state ``state`` (each buffer converted to a TVM tensor once
        here, rather than by every launch) and the layer's scalars."""
        args = self.slots.with_owned({name: _tvm(buffer) for name, buffer in state.items()})
        scalars = self.layer.scalars()
        for i, name in self.slots.scalars:
            args[i] = scalars[name]
        return args

    def _launch(self, args: list, stream: int, T: int, into: list | None) -> list:
        """Launch ``function`` on ``args`` (every input in place) with what it writes made here (or the caller's,
        ``into``); returns what it writes."""
        written, scratch = self.slots.sized(T)
        empty, outputs = self.arrays.empty, []
        for k, (i, shape, dtype) in enumerate(written):
            value = None if into is None else into[k]
            args[i] = value = empty(*shape, dtype=dtype) if value is None else value
            outputs.append(value)
        for i, shape, dtype in scratch:  # the exchange sequence of a call: written and read by the kernel alone
            args[i] = empty(*shape, dtype=dtype)
        window = _NOTHING
        if self._streamed is not None:  # weights read from global memory every step: an L2 window over them
            index, nbytes = self._streamed
            window = l2.Window(stream, args[index].data_ptr(), nbytes, self._device.index)
        try:
            # TVM's current stream set for the launch where it is not that one already (the default stream, called
            # from the default stream): a stream context costs three times the look-up
            with window:
                if self._stream is None or tvm_ffi.get_raw_stream(self._device) == stream:
                    self.function(*args)
                else:
                    with self._stream(self._device, stream):
                        self.function(*args)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise self.layer.launch_error(self.name, err) from err
        return outputs

    def _in_pieces(self, data: list, stream: int, T: int) -> list:
        """The recurrent launch over a sequence past 2^31 elements: the layer's chunked call (not capturable)."""
        if self.name != "recurrent":
            raise InputError(
                f"{T} steps of {self.name} of '{self.layer.signature.cell}' need buffers past "
                f"{limits.MAX_ELEMENTS} elements, and kernels index with 32-bit integers; only the "
                "recurrent launch runs in pieces: run shorter pieces of the sequence (to train, truncated "
                "backpropagation through time)"
            )
        with self._stream(self._device, stream) if self._stream else _NOTHING:
            out, finals = self.layer.recurrent(*data)
        adopt = self.arrays.adopt
        return [adopt(out), *(adopt(f) for f in finals)]


class Bound:
    """A :class:`Launcher`'s launch of ``steps`` steps with the data arguments that stay the same from call to call
    in place, each converted to a TVM tensor once (a repeated call's weights, params, row lengths, zeros): a call
    passes the others (``varying``, in kernel order) and the stream, and is otherwise the launcher's call (an earlier
    launch's timeout raised first, the stream's launch state and the layer's scalars, ``into``). Made by
    :meth:`Launcher.bound`; unchecked, as the launcher's data: each varying array of its argument's shape for
    ``steps`` steps (its ``steps`` is not read from them)."""

    def __init__(self, launcher: Launcher, data: list, steps: int):
        positions = launcher.slots.data
        self.launcher, self.steps = launcher, steps
        self.fixed = [(i, _tvm(value)) for i, value in zip(positions, data) if value is not None]
        self.varying = [i for i, value in zip(positions, data) if value is None]
        self._placed: dict = {}  # stream -> (the launcher's placed tuple it was made from, an argument list)

    def __call__(self, varying: list, stream: int = 0, into: list | None = None) -> list:
        launcher = self.launcher
        launcher.layer.check(wait=False)  # an earlier launch's timeout is raised before this one starts
        base = launcher._placed_for(stream)
        placed = self._placed.get(stream)
        if placed is None or placed[0] is not base:  # a new stream, launch state or scalars
            args = base[2].copy()
            for i, value in self.fixed:
                args[i] = value
            placed = self._placed[stream] = (base, args)
        args = placed[1].copy()  # each call its own: calls from several threads
        for i, value in zip(self.varying, varying):
            args[i] = value
        return launcher._launch(args, stream, self.steps, into)


def _tvm(value):
    """``value`` as a TVM tensor (through DLPack, without a copy): what the FFI would convert at every launch."""
    return value if isinstance(value, tvm_ffi.Tensor) else tvm_ffi.from_dlpack(value)


def streamed_weight(launch) -> tuple[int, int] | None:
    """``(position, bytes)`` of the weight argument part of which ``launch`` reads from global memory every step
    (``Grid.streamed``), or None."""
    if launch.grid is None or not launch.grid.streamed:
        return None
    index = [a.name for a in launch.args].index(launch.grid.streamed)
    arg = launch.args[index]
    return index, int(np.prod(arg.concrete_shape(1))) * np.dtype(arg.dtype).itemsize

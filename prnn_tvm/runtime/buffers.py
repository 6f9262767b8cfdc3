"""The buffers a layer's call makes for itself and does not return, kept between calls.

A call of a compiled layer writes buffers that only its own launches read: the input projection ``xp``, the
scratch sequences a kernel exchanges its states through, and, for a sequence run in pieces, each piece's buffers.
Allocating them per call costs what the device's allocator costs (TVM's CUDA allocator: a ``cudaMalloc`` and a
``cudaFree``; 1.5 ms for a 201 MB float32 ``xp`` on an H200), so a layer keeps one of each, per host thread and
stream, and a call of the same length reuses it. Launches on one stream run in order, so a call's launches see
only their own values there; a host thread of its own keeps two threads that call the layer on one stream (or on
the CPU, where every call is on "stream" 0) from writing into each other's. A call of another length replaces the
buffer: what is kept is the last call's size. The constants a call reads where the caller omits an argument (an
initial state's zeros, every row's length) are kept too, rather than copied to the device at every call. Imports
only TVM's runtime and NumPy.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import tvm

from ..dtypes import itemsize
from ..signature import Arg


class KeptBuffers:
    """Per host thread and stream, a layer's per-call buffers by ``(use, argument name)``: :meth:`get` gives the one
    of a call's shape, made at the first call of that shape (and after a call of another shape) and then reused."""

    def __init__(self):
        self._local = threading.local()  # .by_stream: stream -> {(use, name): buffer}

    def on(self, stream: int, device) -> KeptOn:
        """The buffers of this host thread's calls on ``stream`` of ``device``."""
        by_stream = self._local.__dict__.setdefault("by_stream", {})
        kept = by_stream.get(stream)
        if kept is None:
            kept = by_stream[stream] = KeptOn(device)
        return kept


class KeptOn:
    """One host thread's buffers on one stream (:class:`KeptBuffers`)."""

    def __init__(self, device):
        self.device = device
        self._held: dict = {}  # (use, argument name) -> ((shape, dtype), buffer)

    def get(self, use: str, arg: Arg, steps: int):
        """The buffer ``use`` (``"call"``, ``"piece"``, ...) of ``arg`` for ``steps`` steps: the kept one where its
        shape and dtype are those, else a new one, kept in its place."""
        shape = arg.concrete_shape(steps)
        held = self._held.get((use, arg.name))
        if held is None or held[0] != (shape, arg.dtype):
            held = self._held[(use, arg.name)] = ((shape, arg.dtype), tvm.runtime.empty(shape, arg.dtype, self.device))
        return held[1]

    def constant(self, arg: Arg, steps: int, value):
        """A buffer of ``arg`` for ``steps`` steps that holds ``value`` everywhere and that kernels only read (an
        omitted initial state's zeros, an omitted ``lengths``' whole sequence): made once, then kept."""
        shape = arg.concrete_shape(steps)
        held = self._held.get(("constant", arg.name))
        if held is None or held[0] != (shape, arg.dtype, value):
            made = tvm.runtime.tensor(np.full(shape, value, arg.dtype), self.device)
            held = self._held[("constant", arg.name)] = ((shape, arg.dtype, value), made)
        return held[1]

    def new_bytes(self, use: str, arg: Arg, steps: int) -> int:
        """The bytes :meth:`get` would allocate for these: none where the buffer is kept already."""
        shape = arg.concrete_shape(steps)
        held = self._held.get((use, arg.name))
        return 0 if held is not None and held[0] == (shape, arg.dtype) else math.prod(shape) * itemsize(arg.dtype)

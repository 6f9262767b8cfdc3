"""The host's half of a session's host transport: a step's request into the request ring, and the spin until its
responses are in the response ring (``prnn_tvm.runtime.session``'s :meth:`~.session.Session.step`).

It runs once per host step. Where the native step (:mod:`.session_native`) is built, a step is one call into it:
pack the request, spin, unpack the states into the caller's array (about a microsecond, against 10-15 for the same
in Python). Elsewhere, and with ``native=False``, the same words in Python: the rings' slots, the packer and one
probe word per slot are made once; the spin polls one word through ctypes (about 0.1 us a poll, against
microseconds for a NumPy pass over every word) until it carries the step's tag, then checks every word once (two
reductions in place) and polls on only while some are stale. Both look at the kernel's error word and the clock
every :data:`CHECK_EVERY` polls. The rings are plain NumPy arrays here: page-locked memory under a session, any
memory under a test's double of the kernel.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from . import session_native
from . import session_words as words

CHECK_EVERY = 64  # polls between two looks at the error word and the clock (session_native.c's too)
READY, FAILED, TIMED_OUT = 0, 1, 2  # how a wait ended (session_native.c's too)


class HostRings:
    """The request ring ``requests`` (slots x words of a request) and the response ring ``responses`` (slots x
    states x batch x hidden words, uint64, contiguous) of a session's host transport, for inputs of ``values``
    values of ``dtype`` (the layer's: two a word where a request has fewer words) and states of ``state_dtype``.
    ``error`` is the address of the resident kernel's error word (a uint32, non-zero once it left with an error).
    ``native``: step through the native step where it is built (else, and with False, in Python)."""

    def __init__(self, requests: np.ndarray, responses: np.ndarray, values: int, dtype, state_dtype, error: int,
                 native: bool = True):
        for name, ring in (("requests", requests), ("responses", responses)):
            if ring.dtype != np.uint64 or not ring.flags.c_contiguous:
                raise ValueError(f"{name} must be a contiguous uint64 ring, got {ring.dtype}")
        self.requests = requests.reshape(len(requests), -1)
        self.responses = responses
        self.depth = len(requests)
        self._packer = words.RequestPacker(values, dtype, self.requests.shape[1])
        self._values = words.values(responses, state_dtype)
        # the last word of each response slot: polled alone until it carries the step's tag
        last = responses.reshape(self.depth, -1)[:, -1]
        self._probes = [ctypes.c_uint64.from_address(last[i : i + 1].ctypes.data) for i in range(self.depth)]
        self._flat = responses.reshape(self.depth, -1)
        self._error = ctypes.c_uint32.from_address(error)
        self._native = session_native.native() if native else None
        if self._native is not None:
            self._ring = self._described(values, state_dtype, error)
            self._address = ctypes.addressof(self._ring)

    @property
    def native(self) -> bool:
        """Whether a step runs natively (else in Python)."""
        return self._native is not None

    def step(self, x, out, step: int, tag: int, timeout_ns: int) -> int:
        """:meth:`post` then :meth:`collect`: step ``step``'s input ``x`` in, its states into ``out``; how the wait
        ended. Natively, ``x`` and ``out`` may also be addresses (a tensor's ``data_ptr()``) of that many values."""
        if self._native is None:
            self.post(x, step, tag)
            return self.collect(out, step, tag, timeout_ns)
        try:
            return self._native.step(self._address, x, out, step, tag, timeout_ns)
        except BufferError:  # a view whose values are not in order in memory: copied once
            return self._native.step(self._address, np.ascontiguousarray(x), out, step, tag, timeout_ns)

    def post(self, x: np.ndarray, step: int, tag: int) -> None:
        """Step ``step``'s input ``x`` (the packer's count and dtype, C-contiguous), tagged ``tag``, into its
        request slot."""
        if self._native is not None:
            self._native.post(self._address, x, step, tag)
        else:
            self._packer.pack(x, tag, self.requests[step % self.depth])

    def collect(self, out, step: int, tag: int, timeout_ns: int) -> int:
        """Wait for step ``step``'s states (:meth:`wait`) and copy them into ``out`` (states x batch x hidden of the
        state dtype, C-contiguous; its values are the step's only where the wait ended :data:`READY`); how the wait
        ended."""
        if self._native is not None:
            return self._native.collect(self._address, out, step, tag, timeout_ns)
        ended = self.wait(step, tag, timeout_ns)
        if ended == READY:
            out[...] = self._values[step % self.depth]
        return ended

    def close(self, step: int, tag: int) -> None:
        """The close mark, tagged ``tag``, in step ``step``'s request slot (the resident kernel relays it and
        leaves)."""
        slot = self.requests[step % self.depth]
        slot[...] = words.close_words(slot.size, tag)

    def wait(self, step: int, tag: int, timeout_ns: int) -> int:
        """In Python: spin until every response word of step ``step`` carries ``tag``: :data:`READY`; or until the
        kernel's error word is set (:data:`FAILED`) or ``timeout_ns`` passed (:data:`TIMED_OUT`)."""
        slot = step % self.depth
        probe, flat, want = self._probes[slot], self._flat[slot], tag
        deadline = time.monotonic_ns() + timeout_ns
        polls = 0
        while True:
            if probe.value >> 32 == want and words.tagged(flat, want):
                return READY
            polls += 1
            if polls % CHECK_EVERY == 0:
                if self._error.value:
                    return FAILED
                if time.monotonic_ns() > deadline:
                    return TIMED_OUT

    def _described(self, values: int, state_dtype, error: int) -> session_native.Ring:
        """The rings as the native step reads them (the table a widening packer reads kept alive here)."""
        packer = self._packer
        if packer.pairs:
            mode, self._table = session_native.PACK_PAIRS, None
        elif packer.dtype.itemsize == 2:
            mode, self._table = session_native.PACK_WIDEN, words.widened(packer.dtype)
        else:
            mode, self._table = session_native.PACK_FLOAT32, None
        return session_native.Ring(
            requests=self.requests.ctypes.data,
            responses=self.responses.ctypes.data,
            error=error,
            widen=None if self._table is None else self._table.ctypes.data,
            depth=self.depth,
            request_words=self.requests.shape[1],
            response_words=self._flat.shape[1],
            values=values,
            mode=mode,
            input_bytes=packer.dtype.itemsize,
            state_bytes=np.dtype(state_dtype).itemsize,
        )

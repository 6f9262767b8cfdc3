"""The host's half of a session's host transport: a step's request into the request ring, and the spin until its
responses are in the response ring (``prnn_tvm.runtime.session``'s :meth:`~.session.Session.step`).

It runs once per host step, so it is cut to what a step needs: the rings' slots, the packer and one probe word
per slot are made once, and a step allocates nothing but the copy of its states it returns. The spin polls one
word through ctypes (about 0.1 us a poll, against microseconds for a NumPy pass over every word) until it carries
the step's tag, then checks every word once (two reductions in place) and polls on only while some are stale. It
looks at the kernel's error word and the clock every :data:`CHECK_EVERY` polls. The rings are plain NumPy arrays
here: page-locked memory under a session, any memory under a test's double of the kernel.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from . import session_words as words

CHECK_EVERY = 64  # polls between two looks at the error word and the clock
READY, FAILED, TIMED_OUT = 0, 1, 2  # how a wait ended


class HostRings:
    """The request ring ``requests`` (slots x words of a request) and the response ring ``responses`` (slots x
    states x batch x hidden words, uint64, contiguous) of a session's host transport, for inputs of ``values``
    values of ``dtype`` (the layer's: two a word where a request has fewer words) and states of ``state_dtype``.
    ``error`` reads the resident kernel's error word (non-zero: it left with an error)."""

    def __init__(self, requests: np.ndarray, responses: np.ndarray, values: int, dtype, state_dtype, error):
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
        self._error = error

    def post(self, x: np.ndarray, step: int, tag: int) -> None:
        """Step ``step``'s input ``x`` (the packer's count and dtype), tagged ``tag``, into its request slot."""
        self._packer.pack(x, tag, self.requests[step % self.depth])

    def close(self, step: int, tag: int) -> None:
        """The close mark, tagged ``tag``, in step ``step``'s request slot (the resident kernel relays it and
        leaves)."""
        slot = self.requests[step % self.depth]
        slot[...] = words.close_words(slot.size, tag)

    def wait(self, step: int, tag: int, timeout_ns: int) -> int:
        """Spin until every response word of step ``step`` carries ``tag``: :data:`READY`; or until the kernel's
        error word is set (:data:`FAILED`) or ``timeout_ns`` passed (:data:`TIMED_OUT`)."""
        slot = step % self.depth
        probe, flat, want = self._probes[slot], self._flat[slot], tag
        deadline = time.monotonic_ns() + timeout_ns
        polls = 0
        while True:
            if probe.value >> 32 == want and words.tagged(flat, want):
                return READY
            polls += 1
            if polls % CHECK_EVERY == 0:
                if self._error():
                    return FAILED
                if time.monotonic_ns() > deadline:
                    return TIMED_OUT

    def states(self, step: int) -> np.ndarray:
        """A copy of step ``step``'s states (states x batch x hidden, the state dtype): the caller's to keep (the
        slot is written again two steps later)."""
        return self._values[step % self.depth].copy()

"""What a launch may see of a buffer: its size (32-bit indices) and its start's alignment.

Kernels index their buffers with 32-bit integers (TVM's default) and take buffers that start at their
allocation, so no launch may see a sequence buffer of 2^31 elements or more: a longer sequence runs as several
launches over consecutive pieces of it (:func:`chunk_length` steps each), each starting from the states the one
before ended with. Imports only the standard library: ``prnn_tvm.torch`` sizes its calls with it without TVM.
"""

from __future__ import annotations

import math

from ..signature import SEQ, Signature

MAX_ELEMENTS = 2**31 - 1
ALIGNMENT = 64  # bytes: what TVM allocates with and its kernels may assume of a buffer's start


def chunk_length(signature: Signature, seq_len: int) -> int:
    """Steps per launch: all of them, unless a sequence buffer would reach :data:`MAX_ELEMENTS`."""
    per_step = max(
        (math.prod(int(d) for d in a.shape if d != SEQ) for x in signature.launches for a in x.args if SEQ in a.shape),
        default=1,
    )
    return min(seq_len, max(1, MAX_ELEMENTS // per_step))

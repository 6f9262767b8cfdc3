"""The tagged 64-bit words a session's host transport exchanges with its resident kernel, in NumPy.

A word is ``(tag << 32) | value bits`` (``prnn_tvm/codegen/barriers/session.cuh``): a request carries a step's
input value as float32 bits, a response a new state's value as the layer dtype's bits. A whole word is one aligned
8-byte store, so a reader that sees a word's tag sees its value: no fence between them.
"""

from __future__ import annotations

import numpy as np

CLOSE = 0xFFFFFFFF  # a request value with every bit set closes the kernel (PRNN_SESSION_CLOSE)
CANONICAL_NAN = 0x7FFFFFFF  # what an input value with those bits is sent as


def request_words(x: np.ndarray, tag: int) -> np.ndarray:
    """``x`` (any float dtype) as request words tagged ``tag``, flat (uint64)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).ravel().astype(np.uint64)
    bits[bits == CLOSE] = CANONICAL_NAN
    return bits | np.uint64(tag << 32)


def close_words(count: int, tag: int) -> np.ndarray:
    """``count`` words of the close mark, tagged ``tag``."""
    return np.full(count, (tag << 32) | CLOSE, np.uint64)


def tagged(words: np.ndarray, tag: int) -> bool:
    """Whether every one of ``words`` carries ``tag``."""
    return bool(((words >> np.uint64(32)) == np.uint64(tag)).all())


def values(words: np.ndarray, dtype: str) -> np.ndarray:
    """The values of response ``words`` in ``dtype`` (its bits are the words' low ones), same shape."""
    dtype = np.dtype(dtype)
    bits = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32 if dtype.itemsize == 4 else np.uint16)
    return bits.view(dtype)

"""The tagged 64-bit words a session's host transport exchanges with its resident kernel, in NumPy.

A word is ``(tag << 32) | value bits`` (``prnn_tvm/codegen/barriers/session.cuh``): a request carries a step's
input value as float32 bits, a response a new state's value as the layer dtype's bits (the low ones). A whole word
is one aligned 8-byte store, so a reader that sees a word's tag sees its value: no fence between them. The views
below read a word's halves in place (a little-endian host: the value first, the tag second); once a response word
carries a step's tag, the kernel writes it again only for the request after next, so the host reads it in place.
"""

from __future__ import annotations

import sys

import numpy as np

CLOSE = 0xFFFFFFFF  # a request value with every bit set closes the kernel (PRNN_SESSION_CLOSE)
CANONICAL_NAN = 0x7FFFFFFF  # what an input value with those bits is sent as

if sys.byteorder != "little":  # the kernel's word layout is the GPU's (little-endian) one
    raise ImportError("a session's host transport needs a little-endian host")


def request_words(x: np.ndarray, tag: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` (any float dtype) as request words tagged ``tag``, flat (uint64), into ``out`` (B x input words,
    staging memory, not the ring the kernel polls: copy it there in one piece) or a new array."""
    out = np.empty(x.size, np.uint64) if out is None else out
    halves = out.view(np.uint32)
    out.view(np.float32)[0::2] = x.ravel()
    bits = halves[0::2]
    closing = bits == CLOSE
    if closing.any():
        bits[closing] = CANONICAL_NAN
    halves[1::2] = tag
    return out


def close_words(count: int, tag: int) -> np.ndarray:
    """``count`` words of the close mark, tagged ``tag``."""
    return np.full(count, (tag << 32) | CLOSE, np.uint64)


def tags(words: np.ndarray) -> np.ndarray:
    """The tags of ``words`` (uint64, last axis contiguous), a uint32 view."""
    return words.view(np.uint32)[..., 1::2]


def tagged(words: np.ndarray, tag: int) -> bool:
    """Whether every one of ``words`` carries ``tag``."""
    return bool((tags(words) == tag).all())


def values(words: np.ndarray, dtype: str) -> np.ndarray:
    """The values of response ``words`` in ``dtype`` (of 2 or 4 bytes: the words' low bits), a view, same shape."""
    dtype = np.dtype(dtype)
    return words.view(dtype)[..., :: 8 // dtype.itemsize]

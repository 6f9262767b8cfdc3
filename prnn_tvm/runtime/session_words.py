"""The tagged 64-bit words a session's host transport exchanges with its resident kernel, in NumPy.

A word is ``(tag << 32) | value bits`` (``prnn_tvm/codegen/barriers/session.cuh``): a request carries two of a
step's 16-bit input values (the first in the low half) where its mailbox has fewer words than values
(``prnn_tvm.signature.request_words``), else one input value as float32 bits; a response carries a new state's
value as the layer dtype's bits (the low ones). A whole word
is one aligned 8-byte store, so a reader that sees a word's tag sees its value: no fence between them. The views
below read a word's halves in place (a little-endian host: the value first, the tag second); once a response word
carries a step's tag, the kernel writes it again only for the request after next, so the host reads it in place.

Everything here runs once per host step, so nothing allocates: :class:`RequestPacker` packs into memory it owns
and the ring, :func:`tagged` reduces the words in place.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

CLOSE = 0xFFFFFFFF  # a request value with every bit set closes the kernel (PRNN_SESSION_CLOSE)
CLOSE_SENT_AS = 0xFFFFFFFE  # what a float32 input with those bits is sent as: still a NaN
VALUE_BITS = 0xFFFFFFFF
_CLOSE_SENT_AS = np.uint32(CLOSE_SENT_AS)  # a NumPy scalar: no conversion per step
_lowest, _highest = np.minimum.reduce, np.maximum.reduce

if sys.byteorder != "little":  # the kernel's word layout is the GPU's (little-endian) one
    raise ImportError("a session's host transport needs a little-endian host")


class RequestPacker:
    """Packs a step's input of ``count`` values of ``dtype`` (a float dtype of 2 or 4 bytes) into ``words`` tagged
    request words, allocating nothing per step. Two 16-bit values a word where ``words`` < ``count`` (their bits as
    they are, a pair whose bits are the close mark's sent as :data:`CLOSE_SENT_AS`: two NaNs still); else one value
    a word as float32 bits: float32 values as they are (the close mark's bits as :data:`CLOSE_SENT_AS`), 16-bit
    ones widened through a table of all 65536 (exact; none widens to the close mark's bits)."""

    def __init__(self, count: int, dtype, words: int | None = None):
        self.count, self.dtype = count, np.dtype(dtype)
        self.words = count if words is None else words
        if self.dtype.itemsize not in (2, 4):
            raise ValueError(f"a request packs float values of 2 or 4 bytes, not {self.dtype}")
        self.pairs = self.words < count
        if self.words != (-(-count // 2) if self.pairs and self.dtype.itemsize == 2 else count):
            raise ValueError(f"{count} values of {self.dtype} do not go into {self.words} request words")
        self._bits = np.empty(self.words, np.uint32)
        self._halves = np.zeros(2 * self.words if self.pairs else 0, np.uint16)  # an odd count of pairs, padded
        self._table = widened(self.dtype) if self.dtype.itemsize == 2 and not self.pairs else None

    def pack(self, x: np.ndarray, tag: int, out: np.ndarray) -> np.ndarray:
        """``x`` (``count`` values of the packer's dtype, any shape) as words tagged ``tag`` into ``out`` (uint64,
        ``words`` words, the ring's slot itself: each word is written whole, its tag with its value)."""
        flat = x.reshape(-1)  # a view when x is contiguous
        if self.pairs:
            if self.count % 2:  # padded to whole words
                self._halves[: self.count] = flat.view(np.uint16)
                flat = self._halves
            np.minimum(flat.view(np.uint32), _CLOSE_SENT_AS, out=self._bits)
        elif self._table is None:
            np.minimum(flat.view(np.uint32), _CLOSE_SENT_AS, out=self._bits)
        else:
            np.take(self._table, flat.view(np.uint16), out=self._bits)
        np.bitwise_or(self._bits, np.uint64(tag << 32), out=out.reshape(-1))
        return out


@functools.lru_cache(maxsize=None)
def widened(dtype: np.dtype) -> np.ndarray:
    """The float32 bits of every value of the 16-bit float ``dtype``, by its bits."""
    return np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float32).view(np.uint32)


def request_words(x: np.ndarray, tag: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` (any float dtype of 2 or 4 bytes) as request words tagged ``tag``, flat (uint64), into ``out`` (as many
    words as the mailbox's slot: fewer than values carries pairs) or a new array of a word per value
    (:class:`RequestPacker` once, for a caller that packs once)."""
    out = np.empty(x.size, np.uint64) if out is None else out
    return RequestPacker(x.size, x.dtype, out.size).pack(x, tag, out)


def close_words(count: int, tag: int) -> np.ndarray:
    """``count`` words of the close mark, tagged ``tag``."""
    return np.full(count, (tag << 32) | CLOSE, np.uint64)


def tags(words: np.ndarray) -> np.ndarray:
    """The tags of ``words`` (uint64, last axis contiguous), a uint32 view."""
    return words.view(np.uint32)[..., 1::2]


def tagged(words: np.ndarray, tag: int) -> bool:
    """Whether every one of ``words`` (uint64, any shape) carries ``tag``: all of them lie in the tag's range of
    words (two reductions over the words in place, no temporary)."""
    low = tag << 32
    return bool(_lowest(words, None) >= low and _highest(words, None) <= low | VALUE_BITS)


def values(words: np.ndarray, dtype: str) -> np.ndarray:
    """The values of response ``words`` in ``dtype`` (of 2 or 4 bytes: the words' low bits), a view, same shape."""
    dtype = np.dtype(dtype)
    return words.view(dtype)[..., :: 8 // dtype.itemsize]

"""The dtype policy: which type each part of a layer computes in, and how exact it must be.

A layer's ``dtype`` is its *storage* type: what its inputs, weights, outputs and exchanged
states are. The recurrent products *accumulate* in their own type, and the pointwise math
(and private states such as LSTM's ``c``) *computes* in another, so a half-precision
layer can keep fp32 where rounding would compound over the sequence. A cell is traced in
the compute type (its file never names a dtype); templates load storage values into it
and round results back to storage.

Tolerances: a layer's max abs error against the cell's float64 NumPy reference, on the
same storage-rounded inputs, grows with the number of steps a rounding error can travel
through; :func:`tolerance` is the one bound that tests, the CLI, the tuner and the
benchmark use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers NumPy's 'bfloat16', which arrays of bfloat16 layers use)

from .errors import ConfigError


@dataclass(frozen=True)
class DtypePolicy:
    """Storage, accumulation and compute types of one layer dtype, and its error per step."""

    storage: str
    accumulate: str
    compute: str
    error_per_step: float  # the tolerance at T=1; it grows like sqrt(T)
    error_floor: float = 0.0  # at any T: rounding an output of magnitude up to 4 to storage
    fast_math: bool = False  # GPU kernels: exp, sigmoid, tanh on the hardware's approximate units

    @property
    def itemsize(self) -> int:
        """Bytes of one stored element."""
        return itemsize(self.storage)

    def tolerance(self, seq_len: int) -> float:
        """Max abs error against the float64 reference allowed after ``seq_len`` steps."""
        return max(self.error_floor, self.error_per_step * math.sqrt(max(1, seq_len)))


# float32: the CPU build and the GPU kernels measured 1e-6..2e-6 against float64 at T up to 256
# (hidden up to 1024): rounding of H-long dot products, growing like sqrt(T).
# float16 / bfloat16: inputs, weights and exchanged states are stored in the half type (the reference
# gets the same rounded values), products accumulate and pointwise math runs in float32, and private
# states (LSTM's c) stay float32 between steps. What remains is rounding each step's new state to the
# half type (2^-11 relative for float16, 2^-8 for bfloat16) and carrying it on: the bounds allow
# 1e-2 (float16) and 4e-2 (bfloat16) at T=256, and never less than half a unit in the last place
# of an output of magnitude 4 (2^-9, 2^-6: ReLU cells' outputs exceed 1); beyond magnitude 4
# (``BOUND_MAGNITUDE``: a ReLU cell's output, an IndRNN of input size 62 reached 8-16) a value's
# error counts relative to its magnitude, as its rounding does (``checks.max_abs_error``).
# The GPU kernels of half layers compute exp and sigmoid with the hardware's approximate exp2 and reciprocal
# (relative error about 2^-21) and tanh with its tanh unit (2^-16.6; ``codegen.pointwise.fast_transcendentals``),
# far below the 2^-11 rounding of each stored value, and a fraction of the instructions of the exact forms.
# float64: the CPU build only (gradient checks want it); it matches the float64 NumPy reference to
# rounding, measured at 2e-16..5e-16 at T=64 on every built-in cell.
POLICIES = {
    "float32": DtypePolicy(storage="float32", accumulate="float32", compute="float32", error_per_step=1e-5),
    "float16": DtypePolicy(storage="float16", accumulate="float32", compute="float32", error_per_step=1e-2 / 16,
                            error_floor=2.0**-9, fast_math=True),
    "bfloat16": DtypePolicy(storage="bfloat16", accumulate="float32", compute="float32", error_per_step=4e-2 / 16,
                             error_floor=2.0**-6, fast_math=True),
    "float64": DtypePolicy(storage="float64", accumulate="float64", compute="float64", error_per_step=1e-12),
}
HALF_DTYPES = ("float16", "bfloat16")
GPU_DTYPES = ("float32", *HALF_DTYPES)  # what the GPU templates place; float64 is for the CPU build


def policy(dtype: str) -> DtypePolicy:
    """The policy of a layer dtype; ConfigError naming the supported ones otherwise."""
    try:
        return POLICIES[dtype]
    except (KeyError, TypeError):
        raise ConfigError(f"dtype {dtype} is not supported yet; supported: {', '.join(POLICIES)}") from None


BOUND_MAGNITUDE = 4.0  # the bounds are absolute up to this magnitude of a value, relative beyond it


def tolerance(dtype: str, seq_len: int) -> float:
    """The max abs error a ``dtype`` layer may have against the float64 reference after ``seq_len`` steps."""
    return policy(dtype).tolerance(seq_len)


def itemsize(dtype: str) -> int:
    """Bytes per element of a TVM dtype name (``float32`` -> 4, ``uint64`` -> 8, ``bfloat16`` -> 2)."""
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 0)
    if bits % 8 or not bits:
        raise ValueError(f"no byte size for dtype {dtype!r}")
    return bits // 8

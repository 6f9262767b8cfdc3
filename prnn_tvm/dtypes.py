"""The dtype policy: which type each part of a layer computes in, and how exact it must be.

A layer's ``dtype`` is its *storage* type: what its inputs, weights, outputs and exchanged
states are. The recurrent products *accumulate* in their own type, and the pointwise math
(and private states such as LSTM's ``c``) *computes* in another, so a half-precision
layer can keep fp32 where rounding would compound over the sequence. A cell is traced in
the compute type (its file never names a dtype); templates load storage values into it
and round results back to storage.

Every fact about a dtype lives in its :class:`DtypePolicy` (``POLICIES``): the three types, their names in
CUDA C and torch, the tensor-core operand (its PTX type and ``mma`` shape), the tuning-record family and the
error bound. Code asks the policy rather than naming dtypes: a new dtype is an entry here, and a template that
places it.

Tolerances: a layer's max abs error against the cell's float64 NumPy reference, on the
same storage-rounded inputs, grows with the number of steps a rounding error can travel
through; :func:`tolerance` is the one bound that tests, the CLI, the tuner and the
benchmark use.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers NumPy's 'bfloat16', which arrays of bfloat16 layers use)

from .errors import ConfigError


@dataclass(frozen=True)
class MmaOperand:
    """How a storage type enters the tensor cores: ``mma.sync.<shape>`` (:func:`mma_dims`) with operands of PTX
    type ``ptx`` (A and B) and accumulators of PTX type ``accumulator``, on ``sm_<min_arch>`` or newer."""

    ptx: str
    shape: str
    accumulator: str
    min_arch: int


def mma_dims(shape: str) -> tuple[int, int, int]:
    """``(m, n, k)`` of an ``mma.sync`` shape (``"m16n8k16"`` -> (16, 8, 16)): rows of A, columns of B, the
    reduction."""
    m, rest = shape[1:].split("n")
    n, k = rest.split("k")
    return int(m), int(n), int(k)


@dataclass(frozen=True)
class DtypePolicy:
    """Everything the compiler knows about one layer dtype: its storage, accumulation and compute types, their
    names in CUDA C and in torch, how it enters the tensor cores, which tuning records it shares, its error
    per step, and how its math runs.

    ``record_family``: layers of dtypes in one family build the same kernels but for their storage type, so a
    config measured for one ranks the same for another (``prnn_tvm.choice``). ``gpu``: the GPU templates place
    it (float64 is for the CPU build). ``cast_through_bits``: TVM 0.27's LLVM code generator mis-legalizes casts
    of it (``schedules/cpu_reference.py`` widens and rounds it on its bits)."""

    storage: str
    accumulate: str
    compute: str
    error_per_step: float  # the tolerance at T=1; it grows like sqrt(T)
    c_type: str  # a storage value's type in CUDA C
    torch_type: str  # the torch dtype's name (``torch.<torch_type>``)
    record_family: str
    error_floor: float = 0.0  # at any T: rounding an output of magnitude up to 4 to storage
    fast_math: bool = False  # GPU kernels: exp, sigmoid, tanh, log, division on the hardware's approximate units
    mma: MmaOperand | None = None  # tensor-core products (None: CUDA cores)
    gpu: bool = True
    cast_through_bits: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes of one stored element."""
        return itemsize(self.storage)

    @property
    def widens(self) -> bool:
        """Whether products accumulate in a wider type than the layer stores (a half layer)."""
        return self.accumulate != self.storage

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
# Their products are mma.sync m16n8k16 with float32 accumulators (sm_80+). float16 and bfloat16 share tuning
# records: the H100 ran the same config's bfloat16 kernels in 0.98-1.08x the time of float16 ones over the
# benchmark's 36 LSTM and GRU shapes.
# Every GPU kernel, float32 layers' too, computes a / sqrt(v) as a * rsqrtf(v) (2 ulp, ~2^-22 relative:
# ``codegen.pointwise.reciprocal_roots``), far below float32's 1e-5 a step.
# float64: the CPU build only (gradient checks want it); it matches the float64 NumPy reference to
# rounding, measured at 2e-16..5e-16 at T=64 on every built-in cell.
M16N8K16 = "m16n8k16"
POLICIES = {
    "float32": DtypePolicy(
        storage="float32",
        accumulate="float32",
        compute="float32",
        error_per_step=1e-5,
        c_type="float",
        torch_type="float32",
        record_family="float32",
    ),
    "float16": DtypePolicy(
        storage="float16",
        accumulate="float32",
        compute="float32",
        error_per_step=1e-2 / 16,
        c_type="half",
        torch_type="float16",
        record_family="half",
        error_floor=2.0**-9,
        fast_math=True,
        mma=MmaOperand("fp16", M16N8K16, "fp32", 80),
    ),
    "bfloat16": DtypePolicy(
        storage="bfloat16",
        accumulate="float32",
        compute="float32",
        error_per_step=4e-2 / 16,
        c_type="nv_bfloat16",
        torch_type="bfloat16",
        record_family="half",
        error_floor=2.0**-6,
        fast_math=True,
        mma=MmaOperand("bf16", M16N8K16, "fp32", 80),
        cast_through_bits=True,
    ),
    "float64": DtypePolicy(
        storage="float64",
        accumulate="float64",
        compute="float64",
        error_per_step=1e-12,
        c_type="double",
        torch_type="float64",
        record_family="float64",
        gpu=False,
    ),
}
GPU_DTYPES = tuple(d for d, p in POLICIES.items() if p.gpu)  # what the GPU templates place
TENSOR_CORE_DTYPES = tuple(d for d, p in POLICIES.items() if p.mma is not None)


def policy(dtype: str) -> DtypePolicy:
    """The policy of a layer dtype; ConfigError naming the supported ones otherwise."""
    try:
        return POLICIES[dtype]
    except (KeyError, TypeError):
        raise ConfigError(f"dtype {dtype} is not supported yet; supported: {', '.join(POLICIES)}") from None


def sharing_records(dtype: str) -> tuple:
    """The other dtypes whose tuning records a ``dtype`` layer without its own takes (its record family's)."""
    family = policy(dtype).record_family
    return tuple(d for d, p in POLICIES.items() if d != dtype and p.record_family == family)


BOUND_MAGNITUDE = 4.0  # the bounds are absolute up to this magnitude of a value, relative beyond it


def tolerance(dtype: str, seq_len: int) -> float:
    """The max abs error a ``dtype`` layer may have against the float64 reference after ``seq_len`` steps."""
    return policy(dtype).tolerance(seq_len)


@functools.lru_cache(maxsize=64)  # a handful of names, asked millions of times while configs are ranked
def itemsize(dtype: str) -> int:
    """Bytes per element of a TVM dtype name (``float32`` -> 4, ``uint64`` -> 8, ``bfloat16`` -> 2)."""
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 0)
    if bits % 8 or not bits:
        raise ValueError(f"no byte size for dtype {dtype!r}")
    return bits // 8

"""Shared fixtures: GPU detection, and the per-dtype tolerances every numerics test states."""

import math

import pytest

from prnn_tvm.target import local_gpu

HAS_GPU = local_gpu() is not None


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def cpu_tolerance(seq_len: int) -> float:
    """fp32 CPU kernel vs float64 NumPy: rounding of H-long dot products, growing like sqrt(T)."""
    return 1e-5 * math.sqrt(seq_len)


GPU_TOLERANCE = 1e-4  # fp32 GPU kernel vs float64 NumPy, any T up to 256

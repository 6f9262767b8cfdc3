"""Shared fixtures: GPU detection (numerics tests take their bounds from ``prnn_tvm.dtypes.tolerance``), TF32 off."""

import os

# One BLAS thread per test process, set before NumPy loads (pytest-xdist's workers inherit it): every worker
# computes float64 references at once, and a pool of a thread per core in each oversubscribes the machine
# (H100 host, 16 cores, `-n 15`: the half-precision GPU grid did not finish in two 10-minute runs; 92 s with
# one thread each).
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

import pytest  # noqa: E402

from prnn_tvm.target import local_gpu  # noqa: E402

HAS_GPU = local_gpu() is not None


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    if config.getoption("markexpr") == "gpu":  # `make gpu-test` without a GPU: nothing would run
        raise pytest.UsageError("the GPU tests (-m gpu) need a CUDA GPU and there is none here: nothing ran")
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_tf32():
    """float32 on both sides of a comparison with torch.nn: TF32 off in cuDNN and in torch's GEMMs
    (cuDNN's RNNs default to TF32), restored afterwards."""
    torch = pytest.importorskip("torch")
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags

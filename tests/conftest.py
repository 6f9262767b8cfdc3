"""Shared fixtures: GPU detection (numerics tests take their bounds from ``prnn_tvm.dtypes.tolerance``), TF32 off,
and one layer cache for the whole run."""

import os
import resource
import shutil
import time
from pathlib import Path

# One BLAS thread per test process, set before NumPy loads (pytest-xdist's workers inherit it): every worker
# computes float64 references at once, and a pool of a thread per core in each oversubscribes the machine
# (H100 host, 16 cores, `-n 15`: the half-precision GPU grid did not finish in two 10-minute runs; 92 s with
# one thread each).
for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_pool, "1")

# One layer cache for the session, shared by pytest-xdist's workers and the processes tests start (they inherit the
# environment): a layer the suite compiles in many tests is built once per run. The controller (or the only process)
# names a folder of its own, so that two sessions never share or clear each other's, and removes it at the end. No
# user tuning records: a compile reads the shipped logs alone, wherever the suite runs.
BUILD = Path(__file__).resolve().parents[1] / "build"
LAYER_CACHES = BUILD / "test-layer-cache"
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["PRNN_TVM_CACHE_DIR"] = str(LAYER_CACHES / f"session-{os.getpid()}")
os.environ["XDG_DATA_HOME"] = str(BUILD / "test-data")
# ptxas's reports of the kernel sources the suite compiles, known ahead (prnn_tvm.cache.ptxas_table): a build without a
# GPU reads its report there instead of running nvcc, unless its source is new; `make ptxas-table` rewrites the table.
os.environ.setdefault("PRNN_TVM_PTXAS_TABLE", str(Path(__file__).resolve().parent / "data" / "ptxas-reports.jsonl"))
# The CPU layers the suite builds (hundreds) at LLVM's optimization level 0: its code generation, the most of a CPU
# build, takes about a quarter of the CPU time of level 3, the one a user's build takes, and half of level 1's
# (prnn_tvm.target.cpu_target); tests/test_cpu_opt_level.py builds and checks every built-in cell at that level.
os.environ.setdefault("PRNN_TVM_CPU_OPT_LEVEL", "0")
STALE_S = 86400  # a session's folder this old was left by one that did not end

import pytest  # noqa: E402

from prnn_tvm.target import local_gpu  # noqa: E402

HAS_GPU = local_gpu() is not None


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or the only process), before any worker starts
        for folder in LAYER_CACHES.glob("session-*"):
            if time.time() - folder.stat().st_mtime > STALE_S:
                shutil.rmtree(folder, ignore_errors=True)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["PRNN_TVM_CACHE_DIR"], ignore_errors=True)


# PRNN_TVM_TEST_CPU=FILE: every test appends a line "<CPU seconds>\t<test id>" to FILE, its process's and its
# subprocesses' user+sys time (what `make test`'s budget counts; pytest's --durations gives wall time, which a busy
# machine inflates). `sort -rn FILE | head` names the costliest tests.
CPU_LOG = os.environ.get("PRNN_TVM_TEST_CPU")


def _cpu_s() -> float:
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    start = _cpu_s()
    yield
    with open(CPU_LOG, "a") as log:  # one short line per write: the workers' lines do not interleave
        log.write(f"{_cpu_s() - start:.2f}\t{item.nodeid}\n")


def gpu_count() -> int:
    """The CUDA devices this process sees (0 without a GPU)."""
    import tvm

    count = 0
    while HAS_GPU and tvm.cuda(count).exist:
        count += 1
    return count


def pytest_collection_modifyitems(config, items):
    for item in items:  # @pytest.mark.gpus(n): n GPUs of one host (a layer split over them)
        wanted = item.get_closest_marker("gpus")
        if wanted is not None and gpu_count() < wanted.args[0]:
            item.add_marker(pytest.mark.skip(reason=f"needs {wanted.args[0]} CUDA GPUs ({gpu_count()} found)"))
    if HAS_GPU:
        return
    if config.getoption("markexpr") == "gpu":  # `make gpu-test` without a GPU: nothing would run
        raise pytest.UsageError("the GPU tests (-m gpu) need a CUDA GPU and there is none here: nothing ran")
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class _ForgettingPatch(pytest.MonkeyPatch):
    """pytest's ``monkeypatch`` that forgets the untuned rankings a process keeps per plan
    (``schedules.ranking.per_plan``) after every attribute or item it patches, and when it is undone: what it patched
    may be what a ranking read, and a test may rank, patch a template's constant and rank again. A test that only sets
    environment variables keeps them (no ranking reads one)."""

    def setattr(self, *args, **kwargs):
        super().setattr(*args, **kwargs)
        _forget_rankings()

    def delattr(self, *args, **kwargs):
        super().delattr(*args, **kwargs)
        _forget_rankings()

    def setitem(self, *args, **kwargs):
        super().setitem(*args, **kwargs)
        _forget_rankings()

    def delitem(self, *args, **kwargs):
        super().delitem(*args, **kwargs)
        _forget_rankings()

    def undo(self):
        super().undo()
        _forget_rankings()


def _forget_rankings():
    from prnn_tvm.schedules.ranking import forget_rankings

    forget_rankings()


@pytest.fixture
def monkeypatch():
    """pytest's own, forgetting the rankings as it patches (:class:`_ForgettingPatch`)."""
    patch = _ForgettingPatch()
    yield patch
    patch.undo()


@pytest.fixture
def no_tf32():
    """float32 on both sides of a comparison with torch.nn: TF32 off in cuDNN and in torch's GEMMs
    (cuDNN's RNNs default to TF32), restored afterwards."""
    torch = pytest.importorskip("torch")
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags

"""Data-parallel training: ``prnn_tvm.torch`` modules under ``torch.nn.parallel.DistributedDataParallel``.

One SGD step on two processes (gloo on the CPU; NCCL on two GPUs with ``-m gpu``), each on its half of a global
batch, against one process's step on the whole batch, against ``torch.nn.LSTM`` under the same DDP, and against
float64 autograd of ``torch.nn.LSTM`` on the whole batch. The ranks load the layer their parent compiled from the
on-disk layer cache (``prnn_tvm.cache``), which every process of the machine shares. ``examples/ddp_train.py``
runs under ``torchrun``, shortened.
"""

import copy
import importlib.util
import logging
import os
import pathlib
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm.cache.store import Store  # noqa: E402
from prnn_tvm.checks import relative_error, worst  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402

T, B, N_IN, H = 8, 3, 5, 16  # B sequences per rank
WORLD = 2
EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"
TIMEOUT_S = 300  # two process starts (torch, TVM) on a shared 2-core machine take ~10 s


def _example():
    """examples/ddp_train.py as a module (its ``main`` runs only as a script)."""
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Regressor = _example().Regressor  # the example's model: an LSTM and a linear head over every step


def _models(device) -> dict:
    """The same initialization three ways: prnn-tvm's LSTM (sharing nothing with the others), torch.nn's, and
    torch.nn's in float64 (the reference)."""
    torch.manual_seed(0)
    reference = Regressor(torch.nn.LSTM(N_IN, H))
    ours, exact = copy.deepcopy(reference), copy.deepcopy(reference).double()
    ours.lstm = pt.from_torch(ours.lstm)
    return {"prnn": ours.to(device), "torch.nn": reference.to(device), "float64": exact}


def _global_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, WORLD * B, N_IN, generator=g)
    return x, torch.randn(T, WORLD * B, generator=g)


def _step(model, module, x, y) -> dict:
    """One SGD step of ``model`` (``module`` itself, or DDP around it) on ``(x, y)``: the gradients it took and the
    parameters it left, by name, on the CPU."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters()}
    optimizer.step()
    return {"grads": grads, "params": {n: p.detach().cpu().clone() for n, p in module.named_parameters()}}


class _CacheHits(logging.Handler):
    """Counts the layer cache's hits (``prnn_tvm.cache.layers`` logs each at INFO)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.hits = 0

    def emit(self, record):
        self.hits += "from the layer cache" in record.getMessage()


def _rank(rank: int, backend: str, device_type: str, folder: str) -> None:
    """One rank: the prnn-tvm and torch.nn models under DDP, one step each on this rank's half of the batch."""
    hits = _CacheHits()
    logger = logging.getLogger("prnn_tvm.cache")
    logger.addHandler(hits)
    logger.setLevel(logging.INFO)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group: NCCL's communicators live on the current device
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD)
    try:
        x, y = (t[:, rank * B : (rank + 1) * B].to(device) for t in _global_batch())
        models, result = _models(device), {}
        for name in ("prnn", "torch.nn"):
            module = models[name]
            ddp = torch.nn.parallel.DistributedDataParallel(
                module, device_ids=[rank] if device.type == "cuda" else None
            )
            started = time.process_time()
            result[name] = _step(ddp, module, x, y)
            result[name]["cpu_s"] = time.process_time() - started
        result["cache_hits"] = hits.hits
        torch.save(result, pathlib.Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown (as examples/ddp_train.py does, and why): gloo's threads may still be
    # letting go of the last collectives' tensors, and one that takes the GIL while the interpreter exits aborts.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(backend: str, device_type: str, folder: pathlib.Path) -> list[dict]:
    """Run ``_rank`` in WORLD spawned processes, bounded by TIMEOUT_S; their results in rank order."""
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _rank, args=(backend, device_type, str(folder)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):  # raises ProcessRaisedException with a rank's traceback
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {WORLD} DDP ranks did not finish in {TIMEOUT_S} s")
    return [torch.load(folder / f"rank{r}.pt") for r in range(WORLD)]


def _largest(got: dict, want: dict) -> float:
    """The largest error of ``got``'s tensors against ``want``'s, relative where one passes 1."""
    assert got.keys() == want.keys()
    return worst(relative_error(got[n], want[n]) for n in want)


def _check(ranks: list[dict], device) -> None:
    x, y = _global_batch()
    models = _models(device)
    one = _step(models["prnn"], models["prnn"], x.to(device), y.to(device))  # one process, the whole batch
    exact = _step(models["float64"], models["float64"], x.double(), y.double())
    bound = tolerance("float32", T)
    for what in ("grads", "params"):
        for name in ("prnn", "torch.nn"):  # every rank holds the same all-reduced gradients, hence parameters
            for other in ranks[1:]:
                assert all(torch.equal(other[name][what][n], t) for n, t in ranks[0][name][what].items()), name
        ours, theirs = ranks[0]["prnn"][what], ranks[0]["torch.nn"][what]
        errors = {
            "DDP against one process on the global batch": _largest(ours, one[what]),
            "prnn-tvm against torch.nn under DDP": _largest(ours, theirs),
            "DDP against float64 autograd": _largest(ours, exact[what]),
            "torch.nn under DDP against float64 autograd": _largest(theirs, exact[what]),
        }
        print(f"{what} ({device}): " + "; ".join(f"{k} {v:.1e}" for k, v in errors.items()) + f" (bound {bound:.1e})")
        assert all(err <= bound for err in errors.values()), errors
    assert any(g.abs().max() > 0 for g in ranks[0]["prnn"]["grads"].values())  # a step that moved something


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty layer cache of this test's own; the spawned ranks inherit the environment, hence the folder."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("PRNN_TVM_CACHE_DIR", str(folder))
    return folder


def test_one_ddp_step_on_two_cpu_processes_equals_one_process_on_the_global_batch(tmp_path, cache_dir):
    """gloo, two ranks. The parent compiles the ranks' layer (forward and backward, batch B) before they start;
    both ranks then load it from the layer cache and build nothing."""
    models = _models("cpu")
    x, y = (t[:, :B] for t in _global_batch())
    started = time.process_time()
    _step(models["prnn"], models["prnn"], x, y)
    cold_s = time.process_time() - started
    stored = {e.digest for e in Store(cache_dir, 1 << 30).entries()}
    assert {e.info["kind"] for e in Store(cache_dir, 1 << 30).entries()} == {"layer", "backward"}

    ranks = _spawn("gloo", "cpu", tmp_path)

    assert {e.digest for e in Store(cache_dir, 1 << 30).entries()} == stored  # nothing built by the ranks
    assert [r["cache_hits"] for r in ranks] == [1] * WORLD
    print(
        f"first step, batch {B}: compiled in the parent {cold_s:.2f} s of CPU; from the cache in the ranks "
        + ", ".join(f"{r['prnn']['cpu_s']:.2f} s" for r in ranks)
    )
    _check(ranks, "cpu")


@pytest.mark.gpu
def test_one_ddp_step_on_two_gpus_equals_one_gpu_on_the_global_batch(tmp_path, no_tf32):
    """NCCL, two GPUs: the training kernels under DDP against one GPU's step on the whole batch."""
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} CUDA GPUs, found {torch.cuda.device_count()}")
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    _check(_spawn("nccl", "cuda", tmp_path), "cuda:0")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu)])
def test_ddp_example_runs_under_torchrun(device):
    """examples/ddp_train.py, shortened, on two processes: each rank's throughput and the final check (it exits 1
    when a rank's parameters differ from rank 0's). On the CPU (gloo) docs/pytorch.md runs the same command and
    shows these lines (tests/test_docs.py compares them): a second run here would only start three processes more."""
    if device == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} CUDA GPUs, found {torch.cuda.device_count()}")
    backend = "nccl" if device == "cuda" else "gloo"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    sizes = ["--hidden", "32", "--seq", "16", "--batch", "4", "--steps", "5", "--warmup", "2"]
    run = subprocess.run(
        [*launch, str(EXAMPLE), "--backend", backend, *sizes], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 1:" in run.stdout and "all ranks:" in run.stdout
    assert f"final check passed: parameters identical on {WORLD} rank(s)" in run.stdout


@pytest.mark.slow
def test_ddp_benchmark_writes_its_table(tmp_path):
    """bench/ddp.py on CPU processes (gloo), shortened: four runs of the example, one row per module, each with its
    scaling and a final check that passed."""
    script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "ddp.py"
    out = tmp_path / "ddp.md"
    sizes = ["--hidden", "32", "--seq", "16", "--batch", "4", "--steps", "3", "--warmup", "1"]
    run = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", *sizes, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "LSTM" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| prnn_tvm.torch.LSTM", "| torch.nn.LSTM (cuDNN on the GPU)"]
    assert all(row.endswith("x | passed |") for row in rows), rows

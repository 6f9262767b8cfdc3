"""A TVM tensor freed while torch captures a CUDA graph aborts the process; collecting the garbage first keeps the
capture safe (``prnn_tvm.bench.baselines.free_before_capture``, docs/export-and-runtime.md). Each case runs in a
process of its own, since one of them is meant to die (``pytest -m gpu``)."""

import gc
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch

import prnn_tvm.torch

pytestmark = pytest.mark.gpu

CAPTURE = textwrap.dedent("""
    import gc, sys
    import torch, tvm
    from prnn_tvm.bench.baselines import free_before_capture

    gc.disable()  # no collection but the ones written here

    class Holder:
        pass

    holder = Holder()
    holder.me = holder  # an unreachable cycle once dropped: only a collection frees its tensor
    holder.tensor = tvm.runtime.empty((1 << 20,), "float32", tvm.cuda(0))
    del holder
    if sys.argv[1] == "collect":
        print("freed before the capture:", free_before_capture())
    x = torch.zeros(16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x + 1
        gc.collect()  # a collection inside the capture, as torch's own allocations of Python objects trigger
    graph.replay()
    torch.cuda.synchronize()
    print("captured and replayed:", float(y.sum()))
""")


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CAPTURE, mode], capture_output=True, text=True, timeout=300)


def test_a_tvm_tensor_freed_during_a_capture_aborts_the_process():
    """The failure documented: TVM's cudaFree inside the capture, raised from a destructor."""
    r = run("as-is")
    assert r.returncode != 0, r.stdout[-2000:]
    assert "cudaErrorStreamCaptureUnsupported" in r.stderr, r.stderr[-3000:]


def test_collecting_before_the_capture_frees_the_tensor_outside_it():
    r = run("collect")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "freed before the capture: {'tvm.runtime._tensor.Tensor': 1}" in r.stdout, r.stdout
    assert "captured and replayed: 16.0" in r.stdout, r.stdout


@pytest.mark.parametrize("input_size, batch", [(32, 8), (200, 64)], ids=["projected kernel", "refused"])
def test_a_dropped_torch_module_is_freed_at_once_not_by_a_later_collection(input_size, batch):
    """A module and its layers go when their last reference does: a reference cycle would leave them to a collection,
    which may come inside a CUDA graph capture. Repeated one-step calls compile the layer's projected kernel; at input
    200 and batch 64 it is refused (the step's input past shared memory), and the refusal is kept."""
    x = torch.randn(1, batch, input_size, device="cuda")
    gc.collect()
    gc.disable()
    try:
        module = prnn_tvm.torch.LSTM(input_size, 16, device="cuda")
        with torch.no_grad():
            for _ in range(3):  # a plan is made at the second call of a key, run from the third
                module(x)
        torch.cuda.synchronize()
        ref = weakref.ref(module)
        del module
        assert ref() is None
    finally:
        gc.enable()

"""The benchmark's PyTorch side on the CPU: the graph loop's math and prnn-tvm on torch.nn's weights.

Skipped where PyTorch is not installed (CI); the GPU test runs the same path on cuDNN.
"""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.bench.matrix import DEFAULT_CELLS

torch = pytest.importorskip("torch", reason="the benchmark's baselines need PyTorch")
baselines = pytest.importorskip("prnn_tvm.bench.baselines")

T, B, H, N_IN = 5, 3, 16, 12


def module_and_inputs(cell):
    torch.manual_seed(0)
    base = baselines.BASELINES[cell]
    module = base.module(N_IN, H).double().eval()
    x = torch.randn(T, B, N_IN, dtype=torch.float64)
    states = [0.5 * torch.randn(B, H, dtype=torch.float64) for _ in base.states]
    return base, module, x, states


@pytest.mark.parametrize("cell", sorted(set(DEFAULT_CELLS) | {"rnn_relu"}))
def test_gemm_loop_matches_torch_nn(cell):
    base, module, x, states = module_and_inputs(cell)
    w = baselines.weights(module)
    xp = torch.empty(T, B, w["W_ih"].shape[0], dtype=torch.float64)
    out = torch.empty(T, B, H, dtype=torch.float64)
    with torch.no_grad():
        baselines.project(w, x, xp)
        baselines.recur(base, w, xp, states, out)
        ref, _ = baselines.run_cudnn(module, x, states)
    assert torch.allclose(out, ref, atol=1e-12)


@pytest.mark.parametrize("cell", DEFAULT_CELLS)
def test_prnn_tvm_takes_torch_nn_weights_in_the_benchmarks_order(cell):
    """The argument order the benchmark passes (x, W_ih, b_ih, W_hh, b_hh, states) gives torch.nn's answer."""
    base, module, x, states = module_and_inputs(cell)
    module = module.float()
    w = baselines.weights(module)
    x, states = x.float(), [s.float() for s in states]
    layer = prnn_tvm.compile_cell(cell, H, B, input_size=N_IN, target="llvm")
    args = [x, w["W_ih"], w["b_ih"], w["W_hh"], w["b_hh"], *states]
    out, finals = layer(*[a.numpy() for a in args])
    with torch.no_grad():
        ref, ref_finals = baselines.run_cudnn(module, x, states)
    assert np.abs(out - ref.numpy()).max() < 1e-5
    for got, want in zip(finals, ref_finals, strict=True):
        assert np.abs(got - want.numpy()).max() < 1e-5


ORIGIN = "tuned: 1.00 us/step measured on test GPU"


def test_run_turns_failures_into_error_rows_and_goes_on(monkeypatch):
    """The run loop alone (compile and measurement faked): a failed compile or measurement is a row."""
    import gc
    import weakref
    from types import SimpleNamespace

    from prnn_tvm.bench import measure, runner
    from prnn_tvm.errors import ConfigError, LaunchError
    from prnn_tvm.target import gpu_spec

    def fake_compile(cell, hidden, batch, **kwargs):
        if hidden == 512:
            raise ConfigError("no persistent config fits")
        config = {"units_per_cta": 2, "barrier": "tags"}
        return SimpleNamespace(
            report=SimpleNamespace(
                config=config, config_detail=ORIGIN, ctas=128, threads=256, registers=200, spill_bytes=0
            )
        )

    def fake_measure(case, layer, gpu, repeats, number, probes):
        if case.batch == 64:
            raise LaunchError("launching 'recurrent' failed: too many resources requested")
        return {"prnn_layer_ms": 1.0, "prnn_kernel_ms": 0.5, "cudnn_ms": 3.0, "floor_step_us": 1.0}

    monkeypatch.setattr(runner, "missing_requirements", lambda: None)
    monkeypatch.setattr(runner, "gpu_spec", lambda: gpu_spec("sm_90"))
    monkeypatch.setattr(runner, "environment", lambda gpu: {"gpu": "test GPU", "sms": 132})
    monkeypatch.setattr(runner, "compile_cell", fake_compile)
    monkeypatch.setattr(measure, "measure", fake_measure)
    made = []  # the run's cache of compiled layers, weakly

    class Layers(runner._Layers):
        def __init__(self):
            super().__init__()
            made.append(weakref.ref(self))

    monkeypatch.setattr(runner, "_Layers", Layers)
    monkeypatch.setattr(runner, "recover", lambda torch: None)  # no GPU to recover here (its log would hold frames)
    gc.disable()  # no collection: what a reference cycle holds stays
    try:
        rows = runner.run(["lstm"], [256, 512], [4, 64], seq_len=8, dtypes=["float32"], progress=False)
        # no compile error's traceback holds a frame of the run: its layers are freed when it returns, not by the
        # next collection (which may come during a CUDA graph capture, where freeing a TVM tensor is fatal)
        assert len(made) == 1 and made[0]() is None
    finally:
        gc.enable()
    assert [(r["hidden"], r["batch"], r["status"]) for r in rows] == [
        (256, 4, "ok"),
        (256, 64, "error"),
        (512, 4, "error"),
        (512, 64, "error"),
    ]
    assert rows[0]["config_origin"] == ORIGIN and rows[0]["cudnn_ms"] == 3.0 and rows[0]["gpu"] == "test GPU"
    assert rows[1]["error"].startswith("LaunchError: launching 'recurrent' failed")
    assert rows[2]["error"] == "ConfigError: no persistent config fits"


def test_free_before_capture_frees_and_names_what_unreachable_cycles_held():
    """A TVM tensor held by an unreachable cycle would be freed by the next collection, inside a CUDA graph's capture
    (a refused cudaFree that aborts the process): the benchmarks' captures collect first and say what was held."""
    import gc

    import tvm

    class Holder:
        pass

    baselines.free_before_capture()  # what earlier tests left unreachable
    freed = []
    holder = Holder()
    holder.me, holder.tensor = holder, tvm.runtime.tensor(np.zeros(4, "float32"))
    holder.canary = Canary(freed)
    del holder
    gc.disable()  # no collection but the function's own
    try:
        found = baselines.free_before_capture()
    finally:
        gc.enable()
    assert found == {"tvm.runtime._tensor.Tensor": 1}
    assert freed == [True]  # the cycle is gone, not merely counted
    assert baselines.free_before_capture() == {}  # nothing left


class Canary:
    def __init__(self, freed: list):
        self.freed = freed

    def __del__(self):
        self.freed.append(True)

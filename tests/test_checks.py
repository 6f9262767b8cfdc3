"""The project's one error fold (``prnn_tvm.checks``): NaN anywhere, and an infinity where the reference is finite,
is the worst error, in every check that folds with it: a layer's outputs and final states, the gradient check,
the tuner's wrong-answer gate and the tests' own folds. Each plants one bad value at a time, in every array and
at positions past the first (Python's ``max(a, nan)`` keeps ``a``: that is how a NaN state past the first passed)."""

from types import SimpleNamespace

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import checks
from prnn_tvm.checks import abs_error, check_against_reference, max_abs_error, max_error, relative_error, worst
from prnn_tvm.dtypes import BOUND_MAGNITUDE, tolerance
from prnn_tvm.records import ErrorKind
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune import measure

BAD = [np.nan, np.inf, -np.inf]
T, B, H = 4, 3, 5


def positions(shape) -> list[tuple]:
    """The first, a middle and the last element of an array of ``shape``."""
    size = int(np.prod(shape))
    return [np.unravel_index(i, shape) for i in sorted({0, size // 2, size - 1})]


def planted(arrays: list, which: int, where: tuple, value: float) -> list:
    """``arrays`` with ``value`` at ``where`` of array ``which`` (copies)."""
    out = [np.array(a, copy=True) for a in arrays]
    out[which][where] = value
    return out


@pytest.fixture(scope="module")
def lstm():
    """A CPU LSTM (two final states), its inputs, its result and the float64 reference."""
    layer = prnn_tvm.compile_cell("lstm", H, B, input_size=2, target="llvm")
    inputs = random_inputs(layer.plan, T, 2, seed=1)
    out, finals = layer(**inputs)
    return layer, inputs, [out, *finals], reference_layer(layer.plan, inputs)


def test_a_bad_value_is_an_infinite_error_and_never_dropped_by_the_fold():
    want = np.arange(6.0).reshape(2, 3)
    for bad in BAD:
        for where in positions(want.shape):
            got = want.copy()
            got[where] = bad
            assert abs_error(got, want) == np.inf
            assert abs_error(want, got) == np.inf  # NaN in the reference: nothing was checked
    assert abs_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.0])) == 0.0  # the same infinity is no error
    assert abs_error(np.array([-np.inf]), np.array([np.inf])) == np.inf
    assert max(0.5, np.nan) == 0.5 and worst([0.5, np.nan, 0.25]) == np.inf  # what the fold is for
    assert worst([]) == 0.0 and worst([1e-3, 2e-3]) == 2e-3
    with pytest.raises(ValueError, match=r"differ in shape: \(2, 3\) against \(3, 2\)"):
        abs_error(want, want.T)


@pytest.mark.parametrize("which", range(3), ids=["out", "h_n", "c_n"])
def test_a_bad_output_or_final_state_fails_the_layer_check(lstm, which):
    layer, inputs, result, expected = lstm
    assert max_abs_error(layer.plan, (result[0], result[1:]), expected) < 1e-5
    for bad in BAD:
        for where in positions(result[which].shape):
            got = planted(result, which, where, bad)
            for bound in (None, BOUND_MAGNITUDE):
                assert max_abs_error(layer.plan, (got[0], got[1:]), expected, bound) == np.inf, (bad, where)


class Planted:
    """A layer as a check sees it: ``plan``, ``input_size`` and a call, whose result gets ``value`` at ``where`` of
    its ``which``-th array (the output, then the final states)."""

    def __init__(self, layer, which: int, where: tuple, value: float):
        self.layer, self.which, self.where, self.value = layer, which, where, value
        self.plan, self.input_size = layer.plan, layer.input_size

    def __call__(self, *args, **kwargs):
        out, finals = self.layer(*args, **kwargs)
        got = planted([out, *finals], self.which, self.where, self.value)
        return got[0], got[1:]


def test_check_against_reference_fails_for_a_bad_value_anywhere(lstm):
    layer, _, result, _ = lstm
    assert check_against_reference(layer, T, tolerance("float32", T), seed=1).ok
    for which in range(3):
        for where in positions(result[which].shape):
            res = check_against_reference(Planted(layer, which, where, np.nan), T, tolerance("float32", T), seed=1)
            assert not res.ok and res.max_abs_error == np.inf, (which, where)


class Loaded:
    """What the tuner's runner loads from a library, here returning ``arrays`` as TVM tensors (no GPU)."""

    def __init__(self, arrays: list):
        self.tensors = [tvm.runtime.tensor(np.asarray(a, np.float32)) for a in arrays]

    def __call__(self, **inputs):
        return self.tensors[0], self.tensors[1:]

    def check(self):
        pass

    def time(self, **kwargs):
        return {"recurrent": 1e-3}


def test_the_tuners_gate_calls_a_bad_value_anywhere_wrong(monkeypatch):
    """``GpuRunner.run``, with the GPU's load and launch replaced by a CPU build's result, planted."""
    task = measure.TuneTask("lstm", H, B, T, "float32", gpu_spec("sm_90"), "persistent_cuda")
    runner = measure.GpuRunner(tolerance=tolerance("float32", T))
    inputs = random_inputs(task.plan, T, H, seed=0)
    runner._task, runner._inputs, runner._expected = task, {}, reference_layer(task.plan, inputs)
    out, finals = prnn_tvm.compile_cell("lstm", H, B, target="llvm")(**inputs)
    arrays = [out, *finals]
    monkeypatch.setattr(measure, "load", lambda _: Loaded(arrays))
    assert runner.run(SimpleNamespace(library="x.so")).error is None
    for which in range(3):
        for where in positions(arrays[which].shape):
            monkeypatch.setattr(measure, "load", lambda _, w=which, p=where: Loaded(planted(arrays, w, p, np.nan)))
            got = runner.run(SimpleNamespace(library="x.so"))
            assert got.error is ErrorKind.WRONG and got.max_abs_error == np.inf, (which, where)


@pytest.fixture(scope="module")
def gradients():
    """A float64 CPU GRU's gradients (every argument's), and the plan's own."""
    layer = prnn_tvm.compile_cell("gru", 4, 2, input_size=3, dtype="float64", target="llvm")
    inputs = random_inputs(layer.plan, 3, 3, seed=2)
    rng = np.random.default_rng(3)
    d_out = rng.standard_normal((3, 2, 4))
    d_finals = {s.name: rng.standard_normal((2, 4)) for s in layer.plan.states}
    from prnn_tvm.reference import plan_gradients

    return checks.layer_gradients(layer, inputs, d_out, d_finals), plan_gradients(layer.plan, inputs, d_out, d_finals)


def test_a_bad_gradient_anywhere_fails_the_tests_fold(gradients):
    got, want = gradients
    assert max_error((got[n], want[n]) for n in want) < 1e-12
    for name in want:
        for where in positions(np.shape(want[name])):
            bad = {**got, name: planted([got[name]], 0, where, np.nan)[0]}
            assert max_error((bad[n], want[n]) for n in want) == np.inf, (name, where)
            assert worst(relative_error(bad[n], want[n]) for n in want) == np.inf, (name, where)


def test_a_bad_gradient_anywhere_fails_the_gradient_check(monkeypatch):
    """``check_gradients`` (what ``prnn-tvm compile`` reports) with the derived backward's result planted."""
    made = checks.layer_gradients
    seen = {}
    monkeypatch.setattr(checks, "layer_gradients", lambda *a: seen.update(made(*a)) or seen)
    assert checks.check_gradients("gru").ok and {"x", "W_ih", "b_ih", "W_hh", "b_hh", "h0"} <= set(seen)
    for name, value in dict(seen).items():
        for where in positions(np.shape(value))[1:]:  # past the first
            monkeypatch.setattr(
                checks,
                "layer_gradients",
                lambda *a, n=name, w=where: {**(g := made(*a)), n: planted([g[n]], 0, w, np.nan)[0]},
            )
            res = checks.check_gradients("gru")
            assert not res.ok and res.max_abs_error == np.inf, (name, where)


def test_torch_tensors_fold_the_same_way():
    torch = pytest.importorskip("torch")
    want = torch.arange(6.0).reshape(2, 3)
    for where in positions((2, 3)):
        got = want.clone()
        got[where] = float("nan")
        assert max_error([(want, want), (got, want)]) == np.inf
        assert relative_error(got, want) == np.inf
    assert relative_error(want * 1.001, want) == pytest.approx(1e-3, rel=1e-4)  # 5e-3 off at 5, relative to 5

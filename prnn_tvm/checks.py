"""Numerical checks and timings of a compiled layer: what ``prnn-tvm compile`` reports."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .compiler import compile_backward, compile_cell
from .dtypes import BOUND_MAGNITUDE, tolerance
from .reference import random_inputs, reference_layer
from .runtime.layer import Layer

# the size the gradient check runs at: what it checks is the cell's derivation, not its sizes
GRADIENT_CHECK = {"hidden": 5, "batch": 2, "input_size": 3, "seq_len": 4}


@dataclass(frozen=True)
class CheckResult:
    """Max abs error of a layer's output and final states against the float64 reference."""

    max_abs_error: float
    tolerance: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.tolerance


@dataclass(frozen=True)
class Timing:
    """Seconds per sequence of each launch (by function name), and of the whole layer."""

    seq_len: int
    launches: dict

    @property
    def total_s(self) -> float:
        return sum(self.launches.values())

    @property
    def recurrent_s(self) -> float:
        return self.launches["recurrent"]

    @property
    def per_step_s(self) -> float:
        """The recurrent kernel's time per step."""
        return self.recurrent_s / self.seq_len


def plan_tolerance(plan, seq_len: int) -> float:
    """The max abs error a layer of ``plan`` may have against the float64 reference after ``seq_len`` steps: its
    dtype's bound (:func:`prnn_tvm.dtypes.tolerance`) times its cell's ``error_gain``."""
    return tolerance(plan.dtype, seq_len) * plan.cell.error_gain


def check_against_reference(
    layer: Layer, seq_len: int, tolerance: float, seed: int = 0, lengths: np.ndarray | None = None
) -> CheckResult:
    """Run ``layer`` on random inputs (and the per-row ``lengths``, if given) and compare with the cell's
    NumPy reference in float64."""
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    start = time.perf_counter()
    out, finals = layer(**inputs)
    seconds = time.perf_counter() - start
    err = max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs), BOUND_MAGNITUDE)
    return CheckResult(err, tolerance, seconds)


def layer_gradients(layer: Layer, inputs: dict, d_out: np.ndarray, d_finals: dict) -> dict:
    """Gradients of ``sum(out * d_out) + sum_s sum(final_s * d_finals[s])`` with respect to every argument of a
    CPU ``layer`` (``inputs`` by name, NumPy), by its compiled backward; ``x``'s, ``W_ih``'s and ``b_ih``'s are
    the GEMMs over ``d_xp`` a caller makes."""
    backward = compile_backward(layer)
    x, W_ih, b_ih = inputs["x"], inputs["W_ih"], inputs["b_ih"]
    xp = (x @ W_ih.T + b_ih).astype(layer.signature.launch("recurrent").arg("xp").dtype)
    recurrent = {k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")}
    d_xp, rest = backward(xp, **recurrent, d_out=d_out, **{f"d_{s}_n": d for s, d in d_finals.items()})
    grads = dict(zip((a.name[2:] for a in backward.signature.outputs[1:]), rest))
    grads.update(
        x=d_xp @ W_ih, W_ih=d_xp.reshape(-1, d_xp.shape[-1]).T @ x.reshape(-1, x.shape[-1]), b_ih=d_xp.sum((0, 1))
    )
    return grads


def gradient_check_hidden(plan) -> int:
    """The hidden size :func:`check_gradients` takes for ``plan``'s cell: :data:`GRADIENT_CHECK`'s, rounded up to a
    whole number of heads of every head-wise weight."""
    heads = math.lcm(*(w.heads for w in plan.weights))
    return -(-GRADIENT_CHECK["hidden"] // heads) * heads


def check_gradients(
    cell, directions: int = 3, step: float = 1e-6, tolerance: float = 1e-6, seed: int = 0, hidden: int | None = None
) -> CheckResult:
    """The backward the compiler derives for ``cell`` against central differences of its forward, both the
    float64 CPU build at :data:`GRADIENT_CHECK`'s size (``hidden`` in place of its hidden size: a cell of
    heads takes :func:`gradient_check_hidden`): the derivative of ``L = sum(out * w) + sum_s
    sum(final_s * w_s)`` along random directions over every argument. The error is relative to the
    derivative's size where that passes 1."""
    size = GRADIENT_CHECK if hidden is None else {**GRADIENT_CHECK, "hidden": hidden}
    layer = compile_cell(
        cell, size["hidden"], size["batch"], input_size=size["input_size"], dtype="float64", target="llvm"
    )
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    inputs = random_inputs(layer.plan, size["seq_len"], size["input_size"], seed=seed)
    d_out = rng.standard_normal((size["seq_len"], size["batch"], size["hidden"]))
    d_finals = {s.name: rng.standard_normal((size["batch"], size["hidden"])) for s in layer.plan.states}

    def loss(args: dict) -> float:
        out, finals = layer(**args)
        return float((out * d_out).sum() + sum((f * d_finals[s.name]).sum() for s, f in zip(layer.plan.states, finals)))

    grads = layer_gradients(layer, inputs, d_out, d_finals)
    errors = []
    for _ in range(directions):
        v = {name: rng.standard_normal(value.shape) for name, value in inputs.items()}
        derivative = sum(float((grads[name] * v[name]).sum()) for name in inputs)
        plus = loss({name: value + step * v[name] for name, value in inputs.items()})
        minus = loss({name: value - step * v[name] for name, value in inputs.items()})
        errors.append(abs((plus - minus) / (2 * step) - derivative) / max(1.0, abs(derivative)))
    return CheckResult(worst(errors), tolerance, time.perf_counter() - start)


def max_abs_error(plan, result: tuple, expected: tuple, relative_beyond: float | None = None) -> float:
    """Largest abs difference of a layer's ``(out, finals)`` to the reference's ``(out, {state: final})``, folded
    by :func:`worst` (NaN or a stray infinity anywhere: ``inf``). With ``relative_beyond`` (``dtypes.BOUND_MAGNITUDE``
    for the dtype bounds), the difference at a reference value of larger magnitude counts scaled down by
    ``|value| / relative_beyond``: rounding to the storage type is relative, and a ReLU cell's outputs grow past
    the magnitude the bounds are absolute for."""
    (out, finals), (ref, ref_finals) = result, expected
    finals = list(finals)
    if len(finals) != len(plan.states):
        raise ValueError(f"{len(finals)} final states to check, the cell has {len(plan.states)}")
    pairs = [(out, ref), *((got, ref_finals[state.name]) for state, got in zip(plan.states, finals))]
    return max_error(pairs, relative_beyond)


def abs_error(got, want, relative_beyond: float | None = None) -> float:
    """Largest ``|got - want|`` of two arrays of one shape (NumPy, TVM or torch tensors), in float64: the project's
    one measure of a wrong answer. NaN anywhere (in ``got``, or in ``want``: then nothing was checked), or an
    infinity where ``want`` holds anything else, is an infinite error, so that a ``<=`` bound fails and no fold
    drops it. ``relative_beyond``: see :func:`max_abs_error`."""
    g, w = _float64(got), _float64(want)
    if g.shape != w.shape:
        raise ValueError(f"compared arrays differ in shape: {g.shape} against {w.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - w)
        if relative_beyond is not None:
            diff = diff / np.maximum(1.0, np.abs(w) / relative_beyond)
        diff[g == w] = 0.0  # an infinity where the reference has the same one
    diff[np.isnan(diff)] = np.inf
    return float(diff.max()) if diff.size else 0.0


def relative_error(got, want) -> float:
    """:func:`abs_error` relative to ``want``'s largest magnitude where that passes 1 (a gradient summed over many
    steps grows; its rounding with it)."""
    scale = float(np.abs(_float64(want)).max(initial=1.0))
    return worst([abs_error(got, want) / scale if np.isfinite(scale) else np.inf])


def max_error(pairs, relative_beyond: float | None = None) -> float:
    """The worst :func:`abs_error` over ``(got, want)`` pairs (outputs, states, gradients)."""
    return worst(abs_error(got, want, relative_beyond) for got, want in pairs)


def worst(errors) -> float:
    """The largest of ``errors``, with NaN the largest of all (``inf``): Python's ``max(a, b)`` keeps ``a`` when
    ``b`` is NaN, which is how a NaN state past the first used to pass. Every check folds its errors here."""
    out = 0.0
    for err in errors:
        err = float(err)
        if np.isnan(err):
            return np.inf
        out = max(out, err)
    return out


def _float64(x) -> np.ndarray:
    """An array as float64 NumPy: torch tensors (any device) through the host, TVM tensors through ``numpy()``."""
    if hasattr(x, "detach"):  # torch, without importing it
        x = x.detach().cpu().double().numpy()
    elif not isinstance(x, np.ndarray) and hasattr(x, "numpy"):
        x = x.numpy()
    return np.asarray(x, dtype=np.float64)


def time_layer(layer: Layer, seq_len: int, number: int = 10, repeat: int = 5, seed: int = 0) -> Timing:
    """Time every kernel of ``layer`` on random inputs (minimum over repeats)."""
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    return Timing(seq_len, layer.time(number=number, repeat=repeat, **inputs))

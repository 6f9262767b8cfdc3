"""Numerical checks and timings of a compiled layer: what ``prnn-tvm compile`` reports."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .reference import random_inputs, reference_layer
from .runtime.layer import Layer


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


def check_against_reference(layer: Layer, seq_len: int, tolerance: float, seed: int = 0,
                            lengths: np.ndarray | None = None) -> CheckResult:
    """Run ``layer`` on random inputs (and the per-row ``lengths``, if given) and compare with the cell's
    NumPy reference in float64."""
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    start = time.perf_counter()
    out, finals = layer(**inputs)
    seconds = time.perf_counter() - start
    err = max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs))
    return CheckResult(err, tolerance, seconds)


def max_abs_error(plan, result: tuple, expected: tuple) -> float:
    """Largest abs difference of a layer's ``(out, finals)`` to the reference's ``(out, {state: final})``."""
    (out, finals), (ref, ref_finals) = result, expected
    err = float(np.abs(np.asarray(out, dtype=np.float64) - ref).max())
    for state, got in zip(plan.states, finals):
        err = max(err, float(np.abs(np.asarray(got, dtype=np.float64) - ref_finals[state.name]).max()))
    return err


def time_layer(layer: Layer, seq_len: int, number: int = 10, repeat: int = 5, seed: int = 0) -> Timing:
    """Time every kernel of ``layer`` on random inputs (minimum over repeats)."""
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    return Timing(seq_len, layer.time(number=number, repeat=repeat, **inputs))

"""The params that carry the input projection's bias (``CellPlan.input_bias``): derived from a cell's math, and
true of it: moving ``b_ih`` into them leaves the layer's outputs as they were."""

import numpy as np
import pytest
from tvm import te

from prnn_tvm import Cell
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.bias import BiasCarrier
from prnn_tvm.frontend.directions import bidirectional
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.frontend.stack import stacked
from prnn_tvm.reference import random_inputs, reference_layer

H = 4
CARRIED = {"lstm": 4, "rnn_tanh": 1, "rnn_relu": 1, "lstm_peephole": 4}  # cell -> slices of its b_hh
NONE = ("gru", "gru_cho", "mgu", "indrnn", "stacked_rnn")


def _plan(name, shape="layer"):
    cell = resolve(name)
    made = {"layer": lambda: cell, "bidirectional": lambda: bidirectional(cell), "stack": lambda: stacked(cell, 2)}
    return analyze(made[shape](), 2, H)


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_lstm_and_rnn_carry_the_input_bias_in_b_hh(name):
    k = CARRIED[name]
    assert _plan(name).input_bias == (BiasCarrier("b_hh", 0, k),)
    assert _plan(name, "bidirectional").input_bias == (BiasCarrier("fwd_b_hh", 0, k), BiasCarrier("rev_b_hh", k, k))
    assert _plan(name, "stack").input_bias == (BiasCarrier("l0_b_hh", 0, k),)  # layer 1 projects in the kernel


@pytest.mark.parametrize("name", NONE)
@pytest.mark.parametrize("shape", ["layer", "bidirectional", "stack"])
def test_other_cells_carry_none(name, shape):
    """GRU multiplies b_hn by r; the others add no param beside their input (their b_ih is their only bias)."""
    assert _plan(name, shape).input_bias == ()


def _folded(plan, inputs):
    """``inputs`` (in float64: the sums exact to its rounding) with ``b_ih`` moved into the params that carry it."""
    inputs = {name: value.astype(np.float64) for name, value in inputs.items()}
    moved = dict(inputs, b_ih=np.zeros_like(inputs["b_ih"]))
    for c in plan.input_bias:
        moved[c.param] = inputs[c.param] + inputs["b_ih"][c.first * H : (c.first + c.slices) * H]
    return moved


@pytest.mark.parametrize("name", [*sorted(CARRIED), "gru"])
@pytest.mark.parametrize("shape", ["layer", "bidirectional"])
def test_moving_b_ih_into_the_carriers_changes_nothing(name, shape):
    """What the fact promises, on the float64 reference: the same outputs and final states, where the plan finds
    carriers; GRU, whose b_hh would carry it only in two of three gates, gives other outputs (the fact is not
    vacuous)."""
    plan = _plan(name, shape)
    inputs = random_inputs(plan, 5, 3)
    want, want_states = reference_layer(plan, inputs)
    if not plan.input_bias:  # what folding GRU's b_hh as LSTM's would do
        fake = dict(inputs, b_ih=np.zeros_like(inputs["b_ih"]))
        for p in (s for s in plan.params if s.name.endswith("b_hh")):
            direction = 1 if p.name.startswith("rev") else 0
            rows = slice(direction * p.slices * H, (direction + 1) * p.slices * H)
            fake[p.name] = inputs[p.name] + inputs["b_ih"][rows]
        assert np.abs(reference_layer(plan, fake)[0] - want).max() > 1e-3
        return
    got, got_states = reference_layer(plan, _folded(plan, inputs))
    assert np.abs(got - want).max() < 1e-12
    assert all(np.abs(got_states[s] - want_states[s]).max() < 1e-12 for s in want_states)


def _cell(gates):
    """A one-state cell with ``c.input(2)`` and ``c.param("b", 2)``: ``gates(x, hw, b, h, n, j)`` is h's new value."""

    def step(c):
        x, h = c.input(2), c.state("h")
        W, b = c.weight("W_hh", 1), c.param("b", 2)
        hw = c.matvec(h, W, name="hw")
        return {"h": c.pointwise(lambda n, j: gates(x, hw, b, h, n, j, c.hidden), name="h_new")}

    return Cell("bias_probe", step, lambda x, state, p: state)


@pytest.mark.parametrize(
    "what, gates, carried",
    [
        (
            "each input slice plus its own param slice",
            lambda x, hw, b, h, n, j, H: te.tanh(x[n, j] + b[j] + hw[n, j]) * te.sigmoid(b[H + j] + x[n, H + j]),
            (BiasCarrier("b", 0, 2),),
        ),
        (
            "the slices crossed",
            lambda x, hw, b, h, n, j, H: te.tanh(x[n, j] + b[H + j] + hw[n, j]) * te.sigmoid(x[n, H + j] + b[j]),
            (),
        ),
        (
            "the param twice in a sum",
            lambda x, hw, b, h, n, j, H: te.tanh(x[n, j] + b[j] + b[j] + hw[n, j]) * te.sigmoid(x[n, H + j] + b[H + j]),
            (),
        ),
        (
            "the input read outside a sum too",
            lambda x, hw, b, h, n, j, H: (
                te.tanh(x[n, j] + b[j] + hw[n, j]) * te.sigmoid(x[n, H + j] + b[H + j]) * x[n, j]
            ),
            (),
        ),
        (
            "the param read outside a sum too",
            lambda x, hw, b, h, n, j, H: (
                te.tanh(x[n, j] + b[j] + hw[n, j]) * te.sigmoid(x[n, H + j] + b[H + j] + b[j] * h[n, j])
            ),
            (),
        ),
        (
            "a difference, not a sum",
            lambda x, hw, b, h, n, j, H: te.tanh(x[n, j] - b[j] + hw[n, j]) * te.sigmoid(x[n, H + j] + b[H + j]),
            (),
        ),
        (
            "two input slices in one sum",
            lambda x, hw, b, h, n, j, H: (
                te.tanh(x[n, j] + x[n, H + j] + b[j] + hw[n, j]) * te.sigmoid(b[H + j] + hw[n, j])
            ),
            (),
        ),
    ],
)
def test_a_carrier_is_only_ever_added_to_its_input_slice(what, gates, carried):
    assert analyze(_cell(gates), 2, H).input_bias == carried, what


def test_an_input_copied_into_a_state_has_no_carrier():
    """The input reaches a state's new value through a stage that only copies it: that state would miss b_ih."""

    def step(c):
        x, h, m = c.input(1), c.state("h"), c.state("m")
        W, b = c.weight("W_hh", 1), c.param("b", 1)
        hw = c.matvec(h, W, name="hw")
        g = c.pointwise(lambda n, j: te.tanh(x[n, j] + b[j] + hw[n, j] + m[n, j]), name="g")
        return {"h": g, "m": c.pointwise(lambda n, j: x[n, j], name="copy")}

    assert analyze(Cell("copy_probe", step, lambda x, s, p: s), 2, H).input_bias == ()

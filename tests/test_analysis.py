"""Cell analysis: built-in cells are mapped right; malformed cells get their specific error."""

import numpy as np
import pytest
from tvm import te, tirx

import prnn_tvm
from prnn_tvm import Cell, CellError, analyze
from prnn_tvm.frontend.plan import Leaf

from .two_state_cell import TWO_STATE


def stage_leaves(plan, stage_name):
    stage = next(s for s in plan.stages if s.name == stage_name)
    inverse = {var: leaf for leaf, var in plan.leaf_vars.items()}
    from prnn_tvm.frontend.texpr import free_vars

    return [{inverse[v] for v in free_vars(e)} for e in stage.exprs]


def test_lstm_plan():
    plan = analyze(prnn_tvm.resolve("lstm"), batch=3, hidden=5)
    assert [(r.name, r.operand, r.weight, r.slices) for r in plan.reductions] == [("hw", "h", "W_hh", 4)]
    assert plan.exchanged == ("h",) and plan.private_states == ("c",)
    assert plan.input.slices == 4 and plan.needs_grid_barrier
    # the forget gate of unit u reads gate slice 1 of the projection, the product and the bias
    assert stage_leaves(plan, "f") == [{Leaf("input", "x", 1), Leaf("reduction", "hw", 1), Leaf("param", "b_hh", 1)}]
    assert stage_leaves(plan, "c_new") == [
        {Leaf("stage", "f", 0), Leaf("state", "c", 0), Leaf("stage", "i", 0), Leaf("stage", "g", 0)}
    ]
    assert plan.updates == {"h": Leaf("stage", "h_new", 0), "c": Leaf("stage", "c_new", 0)}


def test_gru_reset_gate_multiplies_product_slice_2():
    plan = analyze(prnn_tvm.resolve("gru"), batch=2, hidden=4)
    assert [(r.operand, r.slices) for r in plan.reductions] == [("h", 3)]
    assert plan.exchanged == ("h",) and plan.private_states == ()
    assert stage_leaves(plan, "n") == [
        {Leaf("input", "x", 2), Leaf("stage", "r", 0), Leaf("reduction", "hw", 2), Leaf("param", "b_hh", 2)}
    ]
    assert Leaf("state", "h", 0) in stage_leaves(plan, "h_new")[0]


@pytest.mark.parametrize("name", ["rnn_tanh", "rnn_relu"])
def test_rnn_plans(name):
    plan = analyze(prnn_tvm.resolve(name), batch=1, hidden=1)
    assert [(r.operand, r.weight, r.slices) for r in plan.reductions] == [("h", "W_hh", 1)]
    assert len(plan.stages) == 1


def test_two_products_over_two_states():
    plan = analyze(TWO_STATE, 2, 6)
    assert [(r.name, r.operand, r.weight) for r in plan.reductions] == [("hu", "h", "U"), ("mv", "m", "V")]
    assert plan.exchanged == ("h", "m") and plan.private_states == ()
    assert Leaf("stage", "m_new", 0) in stage_leaves(plan, "h_new")[0]


def test_fingerprint_depends_on_math_not_name_or_size():
    lstm = prnn_tvm.resolve("lstm")
    renamed = Cell("other", lstm.step, lstm.reference)
    assert analyze(lstm, 2, 8).fingerprint() == analyze(renamed, 4, 16).fingerprint()
    assert analyze(lstm, 2, 8).fingerprint() != analyze(prnn_tvm.resolve("gru"), 2, 8).fingerprint()


def test_a_stage_spanning_all_gates_maps_slice_by_slice():
    """A (batch, 4*hidden) pointwise stage is computed per gate slice and read back per slice."""

    def step(c):
        H = c.hidden
        x, h = c.input(2), c.state("h")
        W = c.weight("W", 2)
        hw = c.matvec(h, W, "hw")
        pre = c.pointwise(lambda n, j: x[n, j] + hw[n, j], "pre", slices=2)
        return {"h": c.pointwise(lambda n, j: te.tanh(pre[n, j]) * te.sigmoid(pre[n, H + j]), "h_new")}

    plan = analyze(Cell("two", step, None), 2, 3)
    assert stage_leaves(plan, "pre") == [
        {Leaf("input", "x", 0), Leaf("reduction", "hw", 0)},
        {Leaf("input", "x", 1), Leaf("reduction", "hw", 1)},
    ]
    assert stage_leaves(plan, "h_new") == [{Leaf("stage", "pre", 0), Leaf("stage", "pre", 1)}]


# ---------------------------------------------------------------- malformed cells


def _cell(body):
    """A one-state cell whose new h is ``body(c, x, h, W, b)``."""

    def step(c):
        x, h, W, b = c.input(1), c.state("h"), c.weight("W", 1), c.param("b", 1)
        return {"h": body(c, x, h, W, b)}

    return Cell("bad", step, None)


def _matvec(c, state, W, name="hw"):
    k = te.reduce_axis((0, c.hidden), "k")
    return te.compute((c.batch, c.hidden), lambda n, j: te.sum(state[n, k] * W[j, k], axis=k), name=name)


def _ok_tail(c, x, hw, b, name="h_new"):
    return c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + b[j]), name)


def bad_reduction_over_input(c, x, h, W, b):
    k = te.reduce_axis((0, c.hidden), "k")
    xw = te.compute((c.batch, c.hidden), lambda n, j: te.sum(x[n, k] * W[j, k], axis=k), name="xw")
    return _ok_tail(c, x, xw, b)


def bad_mixes_units(c, x, h, W, b):
    hw = _matvec(c, h, W)
    return c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + h[n, j + 1] + b[j]), "shift")


def bad_shape(c, x, h, W, b):
    hw = _matvec(c, h, W)
    wide = te.compute((c.batch, c.hidden + 1), lambda n, j: x[n, 0] + b[0], name="wide")
    return c.pointwise(lambda n, j: hw[n, j] + wide[n, j], "h_new")


def bad_max_reduction(c, x, h, W, b):
    k = te.reduce_axis((0, c.hidden), "k")
    m = te.compute((c.batch, c.hidden), lambda n, j: te.max(h[n, k] * W[j, k], axis=k), name="hmax")
    return _ok_tail(c, x, m, b)


def bad_transposed_weight(c, x, h, W, b):
    k = te.reduce_axis((0, c.hidden), "k")
    hw = te.compute((c.batch, c.hidden), lambda n, j: te.sum(h[n, k] * W[k, j], axis=k), name="hwT")
    return _ok_tail(c, x, hw, b)


def bad_product_of_a_product(c, x, h, W, b):
    hw = _matvec(c, h, W)
    k = te.reduce_axis((0, c.hidden), "k")
    hww = te.compute((c.batch, c.hidden), lambda n, j: te.sum(hw[n, k] * W[j, k], axis=k), name="hww")
    return _ok_tail(c, x, hww, b)


def bad_operand_with_gate_slices(c, x, h, W, b):
    wide = c.pointwise(lambda n, j: te.sigmoid(h[n, tirx.floormod(j, c.hidden)]), "wide", slices=2)
    k = te.reduce_axis((0, c.hidden), "k")
    hw = te.compute((c.batch, c.hidden), lambda n, j: te.sum(wide[n, k] * W[j, k], axis=k), name="u_wide")
    return _ok_tail(c, x, hw, b)


def bad_undeclared_placeholder(c, x, h, W, b):
    extra = te.placeholder((c.batch, c.hidden), "float32", name="extra")
    hw = _matvec(c, h, W)
    return c.pointwise(lambda n, j: hw[n, j] + x[n, j] + b[j] + extra[n, j], "h_new")


def bad_weight_in_pointwise(c, x, h, W, b):
    hw = _matvec(c, h, W)
    return c.pointwise(lambda n, j: hw[n, j] + x[n, j] + b[j] * W[j, j], "h_new")


def bad_other_batch_row(c, x, h, W, b):
    hw = _matvec(c, h, W)
    return c.pointwise(lambda n, j: hw[n, j] + x[0, j] + b[j], "h_new")


def bad_index_as_value(c, x, h, W, b):
    hw = _matvec(c, h, W)
    return c.pointwise(lambda n, j: hw[n, j] + x[n, j] + b[j] * tirx.Cast("float32", j), "h_new")


def bad_partial_range(c, x, h, W, b):
    k = te.reduce_axis((0, max(1, c.hidden // 2)), "k")
    hw = te.compute((c.batch, c.hidden), lambda n, j: te.sum(h[n, k] * W[j, k], axis=k), name="half")
    return _ok_tail(c, x, hw, b)


MALFORMED = [
    (bad_reduction_over_input, "xw", "must multiply a state"),
    (bad_mixes_units, "shift", "does not belong to the hidden unit"),
    (bad_shape, "wide", r"shape \(2, 9\)"),
    (bad_max_reduction, "hmax", "only sums"),
    (bad_transposed_weight, "hwT", r"indexed \[k, j\]"),
    (bad_product_of_a_product, "hww", "another product"),
    (bad_operand_with_gate_slices, "u_wide", "2 gate slices"),
    (bad_undeclared_placeholder, "extra", "did not declare"),
    (bad_weight_in_pointwise, "h_new", "reads weight 'W' directly"),
    (bad_other_batch_row, "h_new", "batch index 0"),
    (bad_index_as_value, "h_new", "as a value"),
    (bad_partial_range, "half", "whole state"),
]


@pytest.mark.parametrize("body, stage, message", MALFORMED, ids=[m[0].__name__ for m in MALFORMED])
def test_malformed_cell_is_refused_with_its_reason(body, stage, message):
    with pytest.raises(CellError, match=message) as info:
        analyze(_cell(body), batch=2, hidden=8)
    assert info.value.stage == stage


def test_missing_state_update():
    def step(c):
        c.input(1), c.state("h"), c.state("c")
        x = c.slots[0].tensor
        return {"h": c.pointwise(lambda n, j: x[n, j], "h_new")}

    with pytest.raises(CellError, match="no new value for state.*c"):
        analyze(Cell("bad", step, None), 2, 4)


def test_unused_weight():
    def step(c):
        x, h = c.input(1), c.state("h")
        c.weight("W_unused", 1)
        return {"h": c.pointwise(lambda n, j: x[n, j] + h[n, j], "h_new")}

    with pytest.raises(CellError, match="'W_unused' is declared but never used"):
        analyze(Cell("bad", step, None), 2, 4)


def test_declaration_errors():
    def twice(c):
        c.state("h"), c.state("h")

    with pytest.raises(CellError, match="two states are named 'h'"):
        analyze(Cell("bad", twice, None), 1, 2)

    def no_dict(c):
        return c.input(1)

    with pytest.raises(CellError, match="must return a dict"):
        analyze(Cell("bad", no_dict, None), 1, 2)


def test_cell_without_recurrent_product_needs_no_barrier():
    """An element-wise recurrence (IndRNN-like) has no cross-unit dependency."""

    def step(c):
        x, h, w = c.input(1), c.state("h"), c.param("w", 1)
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + w[j] * h[n, j]), "h_new")}

    plan = analyze(Cell("ind", step, lambda x, s, p: {"h": np.tanh(x + p["w"] * s["h"])}), 2, 4)
    assert not plan.needs_grid_barrier and plan.exchanged == ()


def _reset_before_product(c):
    """Cho et al.'s GRU shape: the reset gate multiplies h before the second product."""
    H = c.hidden
    x, h = c.input(3), c.state("h")
    U, Un = c.weight("U_rz", 2), c.weight("U_n", 1)
    rz = c.matvec(h, U, "rz_h")
    r = c.pointwise(lambda n, j: te.sigmoid(x[n, j] + rz[n, j]), "r")
    z = c.pointwise(lambda n, j: te.sigmoid(x[n, H + j] + rz[n, H + j]), "z")
    rh = c.pointwise(lambda n, j: r[n, j] * h[n, j], "rh")
    n_h = c.matvec(rh, Un, "n_rh")
    cand = c.pointwise(lambda n, j: te.tanh(x[n, 2 * H + j] + n_h[n, j]), "cand")
    return {"h": c.pointwise(lambda n, j: z[n, j] * h[n, j] + (1.0 - z[n, j]) * cand[n, j], "h_new")}


def test_a_product_over_this_steps_stage_gets_its_own_phase():
    plan = analyze(Cell("cho", _reset_before_product, None), 2, 6)
    assert [(r.name, r.operand, r.phase) for r in plan.reductions] == [("rz_h", "h", 0), ("n_rh", "rh", 1)]
    assert plan.phases == 2 and plan.exchanged == ("h",) and plan.exchanged_stages == ("rh",)
    assert plan.operands == ("h", "rh")
    phases = {st.name: st.phase for st in plan.stages}
    assert phases == {"r": 0, "z": 0, "rh": 0, "cand": 1, "h_new": 1}
    # rh crosses to phase 1 as the operand; z is read by h_new in phase 1: both stay live
    assert set(plan.live_outs(0)) == {Leaf("stage", "rh", 0), Leaf("stage", "z", 0)}
    assert plan.live_outs(1) == (Leaf("stage", "h_new", 0),)


@pytest.mark.parametrize(
    "name, phases, operands",
    [
        ("gru_cho", 2, ("h", "r_times_h")),
        ("mgu", 2, ("h", "f_times_h")),
        ("stacked_rnn", 2, ("h1", "h2", "h1_new")),
        ("lstm_peephole", 1, ("h",)),
    ],
)
def test_new_cells_get_their_phases_from_the_graph(name, phases, operands):
    plan = analyze(prnn_tvm.resolve(name), 2, 8)
    assert plan.phases == phases and plan.operands == operands


def test_indrnn_has_no_product_and_needs_no_barrier():
    plan = analyze(prnn_tvm.resolve("indrnn"), 2, 8)
    assert plan.reductions == () and not plan.needs_grid_barrier
    assert plan.exchanged == () and plan.private_states == ("h",)


def test_peepholes_are_per_unit_params():
    plan = analyze(prnn_tvm.resolve("lstm_peephole"), 2, 8)
    assert [(p.name, p.slices) for p in plan.params] == [("b_hh", 4), ("w_peep", 3)]
    assert Leaf("param", "w_peep", 2) in stage_leaves(plan, "o")[0]  # the output gate peeps at c'

"""Derivatives derived from a cell's plan, checked in float64 against central finite differences, and
backpropagation through time with them against finite differences and torch's autograd.

Expressions are evaluated with ``texpr.evaluate``, which the plan's forward uses too; that forward
is checked against each cell's own NumPy reference below."""

import numpy as np
import pytest
from tvm import tirx
from tvm.ir.prim import expr as P

import prnn_tvm
from prnn_tvm.errors import CellError
from prnn_tvm.frontend.derivative import partial, step_adjoints
from prnn_tvm.frontend.plan import Leaf
from prnn_tvm.frontend.texpr import evaluate, free_vars, rebuild
from prnn_tvm.reference import plan_gradients, plan_layer, random_inputs, reference_layer

CELLS = sorted(prnn_tvm.builtin_cells())
STEP = 1e-6  # finite-difference step; float64 evaluation keeps its error near 1e-9
BOUND = 1e-6


def _forward(plan, leaves: dict) -> dict:
    """Every stage leaf's value from the non-stage leaves' (``leaves`` keyed by Leaf)."""
    env = {plan.leaf_vars[leaf]: value for leaf, value in leaves.items()}
    values = dict(leaves)
    for stage in plan.stages:
        for s, expr in enumerate(stage.exprs):
            leaf = Leaf("stage", stage.name, s)
            values[leaf] = evaluate(expr, env)
            if leaf in plan.leaf_vars:
                env[plan.leaf_vars[leaf]] = values[leaf]
    return values


def _loss(plan, leaves: dict, weights: dict) -> float:
    """sum of weight * value over the new states, the stages later products multiply and the unit's shares of
    the sums over units: its gradient is the backward with these incoming adjoints."""
    values = _forward(plan, leaves)
    env = {plan.leaf_vars[leaf]: v for leaf, v in values.items() if leaf in plan.leaf_vars}
    shares = {us.name: sum(evaluate(e, env) for e in us.exprs) for us in plan.unit_sums}
    outputs = {**plan.updates, **{name: Leaf("stage", name, 0) for name in plan.exchanged_stages}}
    return sum(w * (shares[name] if name in shares else values[outputs[name]]) for name, w in weights.items())


@pytest.mark.parametrize("cell", CELLS)
def test_step_adjoints_match_finite_differences(cell):
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 2, 8)
    adjoints = step_adjoints(plan)
    rng = np.random.default_rng(CELLS.index(cell))
    read = [leaf for leaf in plan.leaf_vars if leaf.kind != "stage"]
    for trial in range(5):
        for _ in range(1000):  # leaves where the step is defined (a layer norm's mean square above its mean's square)
            leaves = {leaf: float(rng.uniform(-1.5, 1.5)) for leaf in read}
            with np.errstate(invalid="ignore", divide="ignore"):
                if all(np.isfinite(v) for v in _forward(plan, leaves).values()):
                    break
        weights = {name: float(rng.normal()) for name in (*adjoints.incoming, *adjoints.operands, *adjoints.unit_sums)}
        env = {plan.leaf_vars[leaf]: v for leaf, v in _forward(plan, leaves).items() if leaf in plan.leaf_vars}
        env.update(
            {
                var: weights[name]
                for name, var in (*adjoints.incoming.items(), *adjoints.operands.items(), *adjoints.unit_sums.items())
            }
        )
        for leaf in read:
            up, down = dict(leaves), dict(leaves)
            up[leaf] += STEP
            down[leaf] -= STEP
            numeric = (_loss(plan, up, weights) - _loss(plan, down, weights)) / (2 * STEP)
            derived = adjoints.evaluate(adjoints.leaves[leaf], env) if leaf in adjoints.leaves else 0.0
            assert abs(derived - numeric) <= BOUND * max(1.0, abs(numeric)), (cell, trial, leaf, derived, numeric)


def test_a_product_over_a_stage_sends_its_adjoint_back_into_the_stage():
    """Cho's GRU multiplies r * h in phase 1: the adjoint of that stage (arriving through U_n's transpose)
    reaches r's pre-activation and h."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("gru_cho"), 2, 8)
    adjoints = step_adjoints(plan)
    assert list(adjoints.operands) == ["r_times_h"]
    d_operand = adjoints.operands["r_times_h"]
    r_pre = adjoints.leaves[Leaf("reduction", "rz_h", 0)]
    assert any(v.same_as(d_operand) for v in _reads(adjoints, r_pre))
    assert not any(v.same_as(d_operand) for v in _reads(adjoints, adjoints.leaves[Leaf("reduction", "n_rh", 0)]))


def _reads(adjoints, expr) -> list:
    """The variables ``expr`` reads, through the stage adjoints it reads."""
    found = []
    for var in free_vars(expr):
        found += _reads(adjoints, adjoints.stages[var]) if var in adjoints.stages else [var]
    return found


def _nodes(expr) -> int:
    """The size of ``expr`` written out as a tree (what code generation emits where nothing is bound)."""
    count = [0]

    def visit(_node):
        count[0] += 1

    rebuild(expr, visit)
    return count[0]


@pytest.mark.parametrize("cell", ["slstm", "lstm_layernorm", "gru_cho"])
def test_each_stage_adjoint_is_one_variable_that_the_leaves_read(cell):
    """Every stage's adjoint is a variable (its expression in ``stages``, reading only earlier ones), not copied into
    each expression that reads it: sLSTM's gate gradients were about 200 nodes each written out, now 40 at most
    (a LayerNorm-LSTM's stage differentiates to more by itself). Evaluated through ``StepAdjoints.evaluate``, the
    leaves' adjoints are the same (the finite-difference tests above)."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 2, 8)
    adjoints = step_adjoints(plan)
    assert adjoints.stages and all(v.name.startswith("d_") for v in adjoints.stages)
    defined = {
        *plan.leaf_vars.values(),
        *adjoints.incoming.values(),
        *adjoints.operands.values(),
        *adjoints.unit_sums.values(),
    }
    for var, expr in adjoints.stages.items():
        assert all(any(u.same_as(d) for d in defined) for u in free_vars(expr)), var
        defined.add(var)
    assert all(all(any(u.same_as(d) for d in defined) for u in free_vars(e)) for e in adjoints.leaves.values())
    largest = max(_nodes(e) for e in (*adjoints.stages.values(), *adjoints.leaves.values()))
    assert cell == "lstm_layernorm" or largest <= 40, largest


def test_every_leaf_a_step_reads_gets_an_adjoint():
    """LSTM: the four gate slices of the projection and the product, the bias slices and the cell state c
    (read directly); h reaches the step only through the product."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 2, 8)
    got = step_adjoints(plan).leaves
    assert {(lf.kind, lf.name) for lf in got} == {
        ("input", "x"),
        ("reduction", "hw"),
        ("param", "b_hh"),
        ("state", "c"),
    }
    assert sorted(lf.slice for lf in got if lf.name == "hw") == [0, 1, 2, 3]


X, Y = tirx.Var("x", "float32"), tirx.Var("y", "float32")
ONE = tirx.const(1.0, "float32")


@pytest.mark.parametrize(
    "expr",
    [
        X * Y + X,
        X - Y * Y,
        X / (Y + tirx.const(3.0, "float32")),
        tirx.sigmoid(X * Y),
        tirx.tanh(X - Y),
        tirx.exp(X) * Y,
        tirx.log(X * X + ONE),
        tirx.sqrt(Y * Y + ONE),
        tirx.max(X + Y, tirx.const(0.0, "float32")),
        tirx.min(X, Y),
        P.Select(P.GT(X, Y), X * X, Y),
        tirx.if_then_else(X < Y, X * Y, Y),
        P.Cast("float32", X * Y),
        tirx.abs(X - Y) * Y,
    ],
    ids=str,
)
def test_partial_matches_finite_differences(expr):
    rng = np.random.default_rng(1)
    for _ in range(20):
        env = {X: float(rng.uniform(-2, 2)), Y: float(rng.uniform(-2, 2))}
        if abs(env[X] - env[Y]) < 1e-3 or abs(env[X] + env[Y]) < 1e-3:  # away from the kinks
            continue
        for var in (X, Y):
            up, down = dict(env), dict(env)
            up[var] += STEP
            down[var] -= STEP
            numeric = (evaluate(expr, up) - evaluate(expr, down)) / (2 * STEP)
            assert abs(evaluate(partial(expr, var), env) - numeric) <= BOUND * max(1.0, abs(numeric))


def test_relu_at_zero_has_torchs_zero_gradient_and_constants_fold():
    relu = tirx.max(X, tirx.const(0.0, "float32"))
    assert evaluate(partial(relu, X), {X: 0.0}) == 0.0 and evaluate(partial(relu, X), {X: 0.5}) == 1.0
    assert isinstance(partial(X * tirx.const(2.0, "float32") + Y, Y), P.FloatImm)  # d/dy = 1, folded


def test_an_operation_without_a_rule_is_named():
    with pytest.raises(CellError, match=r"cannot differentiate .*floor.*training supports"):
        partial(tirx.floor(X) * Y, X)


# ---------------------------------------------------------------- backpropagation through time
@pytest.mark.parametrize("cell", CELLS)
def test_the_plan_runs_the_cells_own_reference(cell):
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 3, 5)
    inputs = random_inputs(plan, 6, 4, seed=2)
    out, finals, _ = plan_layer(plan, inputs)
    want_out, want_finals = reference_layer(plan, inputs)
    assert np.abs(out - want_out).max() < 1e-12
    assert all(np.abs(finals[k] - want_finals[k]).max() < 1e-12 for k in want_finals)


def _weighted_loss(plan, inputs, d_out, d_finals):
    out, finals, _ = plan_layer(plan, inputs)
    return float((out * d_out).sum() + sum((finals[k] * v).sum() for k, v in d_finals.items()))


@pytest.mark.parametrize("cell", CELLS)
def test_gradients_through_time_match_finite_differences(cell):
    """Every argument's gradient (sampled coordinates) against central differences of the float64 layer."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 2, 5)
    inputs = {k: v.astype(np.float64) for k, v in random_inputs(plan, 4, 3, seed=3).items()}
    rng = np.random.default_rng(4)
    d_out = rng.standard_normal((4, 2, 5))
    d_finals = {s.name: rng.standard_normal((2, 5)) for s in plan.states}
    grads = plan_gradients(plan, inputs, d_out, d_finals)
    assert set(grads) == set(inputs)
    for name, value in inputs.items():
        for index in {tuple(int(rng.integers(n)) for n in value.shape) for _ in range(4)}:
            up, down = {**inputs, name: value.copy()}, {**inputs, name: value.copy()}
            up[name][index] += 1e-6
            down[name][index] -= 1e-6
            numeric = (_weighted_loss(plan, up, d_out, d_finals) - _weighted_loss(plan, down, d_out, d_finals)) / 2e-6
            assert abs(grads[name][index] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (cell, name, index)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_gradients_through_time_match_torch_autograd(cell):
    torch = pytest.importorskip("torch")
    T, B, H, n_in = 7, 3, 6, 4
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), B, H)
    inputs = {k: v.astype(np.float64) for k, v in random_inputs(plan, T, n_in, seed=5).items()}
    kind = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell, torch.nn.RNN)
    extra = {"nonlinearity": cell[4:]} if cell.startswith("rnn") else {}
    module = kind(n_in, H, **extra).double()
    names = {"weight_ih_l0": "W_ih", "weight_hh_l0": "W_hh", "bias_ih_l0": "b_ih", "bias_hh_l0": "b_hh"}
    with torch.no_grad():
        for torch_name, ours in names.items():
            getattr(module, torch_name).copy_(torch.from_numpy(inputs[ours]))
    x = torch.from_numpy(inputs["x"]).requires_grad_()
    states = [torch.from_numpy(inputs[f"{s.name}0"])[None].requires_grad_() for s in plan.states]
    out, finals = module(x, tuple(states) if cell == "lstm" else states[0])
    finals = finals if cell == "lstm" else (finals,)
    rng = np.random.default_rng(6)
    d_out = rng.standard_normal((T, B, H))
    d_finals = {s.name: rng.standard_normal((B, H)) for s in plan.states}
    loss = (out * torch.from_numpy(d_out)).sum() + sum(
        (f[0] * torch.from_numpy(d_finals[s.name])).sum() for f, s in zip(finals, plan.states)
    )
    loss.backward()
    grads = plan_gradients(plan, inputs, d_out, d_finals)
    want = {
        "x": x.grad,
        **{ours: getattr(module, t).grad for t, ours in names.items()},
        **{f"{s.name}0": st.grad[0] for s, st in zip(plan.states, states)},
    }
    for name, value in want.items():
        assert np.abs(grads[name] - value.numpy()).max() < 1e-12, name

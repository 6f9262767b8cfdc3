"""Derivatives of a cell's step, derived from its plan: the first piece of training any cell.

A plan's pointwise math is a list of stages, each an expression per gate slice in *leaf*
variables (one hidden unit's value of an input slice, a product, a state, a param, an
earlier stage). Backpropagation through one step of one unit is therefore reverse-mode
differentiation of a small expression DAG:

- :func:`partial` differentiates one expression by one variable symbolically (sums,
  products, quotients, min/max, selects, casts, sigmoid, tanh, exp, log, sqrt, abs); the
  result is again an expression in the leaf variables, which a template can place like
  the forward's;
- :func:`step_adjoints` walks the stages backwards from the adjoints of the step's new
  states (``dL/dh_t``, ``dL/dc_t``, incoming variables) and returns the adjoint of every
  leaf the step reads: the input projection's slices (``dL/dxp``, whose sums over steps
  give ``dW_ih`` and ``db_ih`` as one GEMM each), the products' outputs (``dL/d(W h)``, the
  gate gradients that the transposed recurrent product turns into ``dL/dh_{t-1}``), the
  params and the states read directly (LSTM's ``c``).

Nothing here knows a cell's name; a cell using an operation without a rule is refused
with the operation named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx
from tvm.ir import expr as E
from tvm.ir.prim import expr as P

from ..errors import CellError
from .plan import CellPlan, Leaf
from .texpr import evaluate, free_vars

_UNARY = ("tirx.sigmoid", "tirx.tanh", "tirx.exp", "tirx.log", "tirx.sqrt", "tirx.fabs")


def partial(e, var, value=None):
    """``d e / d var`` as an expression (constants folded where they are obvious). ``value``: a variable that holds
    ``e``'s value where the caller has one (a stage's): the derivative of a sigmoid, tanh, exp or sqrt at the top of
    ``e`` reads it instead of computing the function again."""
    if isinstance(e, E.Var):
        return _one(e) if e.same_as(var) else _zero(e)
    if isinstance(e, (P.FloatImm, P.IntImm)):
        return _zero(e)
    if not _depends_on(e, var):
        return _zero(e)
    if isinstance(e, P.Add):
        return _add(partial(e.a, var), partial(e.b, var))
    if isinstance(e, P.Sub):
        return _sub(partial(e.a, var), partial(e.b, var))
    if isinstance(e, P.Mul):
        return _add(_mul(partial(e.a, var), e.b), _mul(e.a, partial(e.b, var)))
    if isinstance(e, P.Div):
        # (a / b)' = a' / b - a b' / b^2
        return _sub(_div(partial(e.a, var), e.b), _div(_mul(e.a, partial(e.b, var)), _mul(e.b, e.b)))
    if isinstance(e, (P.Max, P.Min)):
        # the derivative follows the operand that wins; a tie goes to the second (relu'(0) = 0, as torch)
        first_wins = P.GT(e.a, e.b) if isinstance(e, P.Max) else P.LT(e.a, e.b)
        return _select(first_wins, partial(e.a, var), partial(e.b, var))
    if isinstance(e, P.Select):
        return _select(e.condition, partial(e.true_value, var), partial(e.false_value, var))
    if isinstance(e, P.Cast):
        return P.Cast(e.ty, partial(e.value, var))
    if isinstance(e, E.Call):
        name = getattr(e.op, "name", None)
        if name == "prim.if_then_else":
            return _select(e.args[0], partial(e.args[1], var), partial(e.args[2], var))
        if name in _UNARY:
            (u,) = e.args
            return _mul(_outer(name, e if value is None else value, u), partial(u, var))
        raise CellError(
            f"cannot differentiate {name or e.op} (in {e}): training supports +, -, *, /, min, max, "
            "select, casts, sigmoid, tanh, exp, log, sqrt and abs"
        )
    raise CellError(f"cannot differentiate a {type(e).__name__} expression ({e})")


def _outer(name: str, e, u):
    """d f(u) / d u for the unary function ``name``, with ``e`` = f(u) (an expression or a variable holding it)."""
    one = _one(e)
    if name == "tirx.sigmoid":
        return e * (one - e)
    if name == "tirx.tanh":
        return one - e * e
    if name == "tirx.exp":
        return e
    if name == "tirx.log":
        return one / u
    if name == "tirx.fabs":  # sign(u): 0 at 0, as torch's
        zero = _zero(e)
        return P.Select(P.GT(u, zero), one, P.Select(P.LT(u, zero), tirx.const(-1.0, _dtype(e)), zero))
    return tirx.const(0.5, _dtype(e)) / e  # sqrt


@dataclass(frozen=True)
class StepAdjoints:
    """The backward of one step, for one hidden unit.

    ``incoming`` maps each state to the variable standing for the adjoint of its new value
    (``dL/d state_t``: for the output state, the loss's gradient at step t plus what the
    next step sends back). ``operands`` maps each stage that a later phase's product
    multiplies (Cho's GRU's ``r * h``) to the variable standing for its adjoint, which
    arrives across units through that product's transpose: a backward step runs its phases
    in reverse, the products' adjoints of the last phase first. ``leaves`` maps each leaf
    the step reads (inputs, products, params, states; never stages) to its adjoint, an
    expression in the forward's leaf variables and the ``incoming`` and ``operands``
    variables; leaves the step's result does not depend on are absent.

    ``stages`` maps a variable standing for the adjoint of each stage slice that the step's result depends on to
    its expression, in the order of the backwards walk: each reads only the forward's leaf variables, the
    ``incoming``, ``operands`` and ``unit_sums`` variables and the stage adjoints before it. The leaves' adjoints
    read these variables, as reverse-mode differentiation keeps one adjoint per intermediate value: written out in
    every expression that reads it, an adjoint is copied into each reader, and the readers' copies into theirs
    (sLSTM's stages read each other so often that its step's expressions were hundreds of times their size).
    :meth:`evaluate` computes them where a caller evaluates a leaf's adjoint; a template binds each once.

    ``unit_sums`` maps each sum over units (``c.sum``) to the variable standing for the adjoint of its row's
    total: the sum over every unit of the row of that sum's leaf adjoint (``leaves[Leaf("unit_sum", name, 0)]``,
    a unit's share), which reaches each unit's summed values through the sum's own derivative. A backward
    step adds it up across units where the forward added the values, a phase of its own.
    """

    incoming: dict
    operands: dict
    leaves: dict
    unit_sums: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)

    def evaluate(self, expr, env: dict):
        """``expr`` (a leaf's adjoint) in float64 NumPy (``texpr.evaluate``), ``env`` holding the forward's leaf
        values and the incoming, operand and sum adjoints it reads; each stage adjoint it reads is evaluated into
        ``env`` first (once per ``env``)."""
        for var in free_vars(expr):
            if var in self.stages and var not in env:
                env[var] = self.evaluate(self.stages[var], env)
        return evaluate(expr, env)


def step_adjoints(plan: CellPlan) -> StepAdjoints:
    """Reverse-mode differentiation of ``plan``'s pointwise math for one unit and step."""
    dtype = plan.policy.compute
    incoming = {s.name: tirx.Var(f"d_{s.name}", dtype) for s in plan.states}
    operands = {name: tirx.Var(f"d_{name}", dtype) for name in plan.exchanged_stages}
    sums = {us.name: tirx.Var(f"d_{us.name}", dtype) for us in plan.unit_sums}
    adjoint: dict = {}
    for state, leaf in plan.updates.items():
        _accumulate(adjoint, leaf, incoming[state])
    for name, var in operands.items():  # a product's operand stage is one slice wide
        _accumulate(adjoint, Leaf("stage", name, 0), var)
    var_leaf = {var: leaf for leaf, var in plan.leaf_vars.items()}
    stage_adjoints: dict = {}
    for us in plan.unit_sums:  # each unit's summed values, by the row total's adjoint
        for expr in us.exprs:
            for var in free_vars(expr):
                _accumulate(adjoint, var_leaf[var], _mul(sums[us.name], partial(expr, var)))
    for stage in reversed(plan.stages):
        for slice_, expr in enumerate(stage.exprs):
            seed = adjoint.pop(Leaf("stage", stage.name, slice_), None)
            if seed is None:  # nothing downstream reads this slice
                continue
            if not isinstance(seed, E.Var):
                named = tirx.Var(f"d_{stage.name}_{slice_}", dtype)
                stage_adjoints[named], seed = seed, named
            held = plan.leaf_vars.get(Leaf("stage", stage.name, slice_))  # the stage's value, where a variable has it
            for var in free_vars(expr):
                _accumulate(adjoint, var_leaf[var], _mul(seed, partial(expr, var, held)))
    return StepAdjoints(
        incoming,
        operands,
        {leaf: value for leaf, value in adjoint.items() if leaf.kind != "stage"},
        sums,
        stage_adjoints,
    )


def _accumulate(adjoint: dict, leaf: Leaf, value) -> None:
    adjoint[leaf] = _add(adjoint[leaf], value) if leaf in adjoint else value


def _depends_on(e, var) -> bool:
    return any(v.same_as(var) for v in free_vars(e))


# ------------------------------------------------------------------ folding the obvious constants
def _const(e):
    return float(e.value) if isinstance(e, (P.FloatImm, P.IntImm)) else None


def _dtype(e) -> str:
    return str(e.ty.dtype)


def _zero(e):
    return tirx.const(0.0, _dtype(e))


def _one(e):
    return tirx.const(1.0, _dtype(e))


def _add(a, b):
    if _const(a) == 0.0:
        return b
    if _const(b) == 0.0:
        return a
    return a + b


def _sub(a, b):
    if _const(b) == 0.0:
        return a
    if _const(a) == 0.0:
        return tirx.const(-1.0, _dtype(b)) * b
    return a - b


def _mul(a, b):
    if _const(a) == 0.0 or _const(b) == 0.0:
        return _zero(a)
    if _const(a) == 1.0:
        return b
    if _const(b) == 1.0:
        return a
    return a * b


def _div(a, b):
    return _zero(a) if _const(a) == 0.0 else a / b


def _select(condition, a, b):
    if _const(a) is not None and _const(a) == _const(b):
        return a
    return P.Select(condition, a, b)


__all__ = ["partial", "step_adjoints", "StepAdjoints"]

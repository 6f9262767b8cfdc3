"""Small helpers over TVM primitive expressions (TVM 0.27 has no Python substitute/mutator).

`rebuild` walks an expression bottom-up and lets a callback replace any node; the cell
analysis uses it to turn TE tensor loads into per-unit leaves, and the schedule templates
use it to turn those leaves back into concrete loads. `evaluate` computes a pointwise
expression in float64 NumPy (the references of the plan's forward and backward).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tvm import te
from tvm.ir import expr as E
from tvm.ir.prim import expr as P

_BINARY = (
    P.Add,
    P.Sub,
    P.Mul,
    P.Div,
    P.Mod,
    P.FloorDiv,
    P.FloorMod,
    P.Min,
    P.Max,
    P.EQ,
    P.NE,
    P.LT,
    P.LE,
    P.GT,
    P.GE,
    P.And,
    P.Or,
)
_LEAVES = (P.IntImm, P.FloatImm, E.StringImm, E.Var)


class UnsupportedExpr(Exception):
    """An expression node the cell compiler does not lower (message names it)."""


def is_tensor_load(e) -> bool:
    """True for a TE tensor access ``A[i, j]`` inside a compute body."""
    return isinstance(e, E.Call) and getattr(e.op, "name", None) == "te.tensor_load"


def tensor_load_parts(e) -> tuple[te.Tensor, list]:
    """The tensor and the index expressions of a TE tensor load."""
    return e.args[0], list(e.args[1:])


def rebuild(e, replace: Callable[[object], object | None]):
    """Rebuild ``e`` bottom-up; ``replace(node)`` returns a substitute or None to keep going.

    The callback sees each node before its children; returning a value stops the descent
    there. Raises UnsupportedExpr on node kinds a recurrent cell has no use for (vectors,
    shuffles, nested reductions).
    """
    r = replace(e)
    if r is not None:
        return r
    if isinstance(e, _LEAVES):
        return e
    if isinstance(e, _BINARY):
        return type(e)(rebuild(e.a, replace), rebuild(e.b, replace))
    if isinstance(e, P.Not):
        return P.Not(rebuild(e.a, replace))
    if isinstance(e, P.Cast):
        return P.Cast(e.ty, rebuild(e.value, replace))
    if isinstance(e, P.Select):
        return P.Select(rebuild(e.condition, replace), rebuild(e.true_value, replace), rebuild(e.false_value, replace))
    if isinstance(e, P.Let):
        return P.Let(e.var, rebuild(e.value, replace), rebuild(e.body, replace))
    if isinstance(e, E.Call) and not is_tensor_load(e):
        return E.Call(e.op, [rebuild(a, replace) for a in e.args], ret_ty=e.ty)
    raise UnsupportedExpr(f"{type(e).__name__} expressions are not supported in a cell ({e})")


def free_vars(e) -> list:
    """Variables an expression mentions (in first-seen order)."""
    seen: dict = {}

    def visit(node):
        if isinstance(node, E.Var):
            seen.setdefault(node, None)
            return node
        return None

    rebuild(e, visit)
    return list(seen)


def substitute(e, mapping: dict):
    """Replace variables by expressions."""
    return rebuild(e, lambda node: mapping.get(node) if isinstance(node, E.Var) else None)


_NUMPY_BINARY = {
    P.Add: "add",
    P.Sub: "subtract",
    P.Mul: "multiply",
    P.Div: "divide",
    P.Max: "maximum",
    P.Min: "minimum",
    P.GT: "greater",
    P.GE: "greater_equal",
    P.LT: "less",
    P.LE: "less_equal",
    P.EQ: "equal",
    P.NE: "not_equal",
    P.And: "logical_and",
    P.Or: "logical_or",
}
_NUMPY_CALLS = {
    "tirx.sigmoid": lambda u: 1.0 / (1.0 + np.exp(-u)),
    "tirx.tanh": np.tanh,
    "tirx.exp": np.exp,
    "tirx.log": np.log,
    "tirx.sqrt": np.sqrt,
    "tirx.fabs": np.abs,
}
# CUDA's approximate intrinsics that GPU kernels compute with (``codegen.pointwise.gpu_math``), as the exact functions
# they approximate
_NUMPY_EXTERNS = {"__expf": np.exp, "__logf": np.log, "__fdividef": np.divide, "rsqrtf": lambda u: 1.0 / np.sqrt(u)}


def evaluate(e, env: dict):
    """The value of a pointwise expression in float64 NumPy, its variables taken from ``env``
    (variable -> array or number; arrays broadcast). Casts are ignored: the reference of any
    dtype computes in float64. Raises UnsupportedExpr on anything else."""
    if isinstance(e, E.Var):
        return env[e]
    if isinstance(e, (P.FloatImm, P.IntImm)):
        return float(e.value)
    if type(e) in _NUMPY_BINARY:
        return getattr(np, _NUMPY_BINARY[type(e)])(evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, P.Not):
        return np.logical_not(evaluate(e.a, env))
    if isinstance(e, P.Cast):
        return evaluate(e.value, env)
    if isinstance(e, P.Select):
        return np.where(evaluate(e.condition, env), evaluate(e.true_value, env), evaluate(e.false_value, env))
    name = getattr(getattr(e, "op", None), "name", None)
    if name == "prim.if_then_else":
        return np.where(*(evaluate(a, env) for a in e.args))
    if name in _NUMPY_CALLS:
        return _NUMPY_CALLS[name](evaluate(e.args[0], env))
    if name == "tirx.call_pure_extern" and e.args[0].value in _NUMPY_EXTERNS:
        return _NUMPY_EXTERNS[e.args[0].value](*(evaluate(a, env) for a in e.args[1:]))
    raise UnsupportedExpr(f"cannot evaluate {name or type(e).__name__} in NumPy ({e})")


def const_int(e) -> int | None:
    """The value of an integer constant, or None when ``e`` is not one."""
    return int(e.value) if isinstance(e, P.IntImm) else None


__all__ = [
    "rebuild",
    "free_vars",
    "substitute",
    "evaluate",
    "const_int",
    "is_tensor_load",
    "tensor_load_parts",
    "UnsupportedExpr",
]

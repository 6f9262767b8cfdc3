"""Emit a cell's pointwise math for one (batch row, hidden unit), shared by every template.

A template supplies where each leaf value lives (a register, shared memory, a global
load) and how to bind a value to a name; this module walks the plan's stages in
dependency order and returns the new value of every state.
"""

from __future__ import annotations

from collections.abc import Callable

from .analysis import CellPlan, Leaf
from .texpr import free_vars, substitute


def emit_unit_math(plan: CellPlan, load: Callable[[Leaf], object],
                   bind: Callable[[object, str], object]) -> dict[str, object]:
    """Bind every stage value one unit needs; return ``{state: new value}``.

    ``load(leaf)`` gives the value of an input, state, param or reduction leaf;
    ``bind(expr, name)`` emits a binding and returns the variable that holds it.
    Each leaf is loaded and each stage computed at most once.
    """
    stages = {st.name: st for st in plan.stages}
    leaf_of_var = {var: leaf for leaf, var in plan.leaf_vars.items()}
    values: dict[Leaf, object] = {}

    def value(leaf: Leaf):
        if leaf not in values:
            if leaf.kind == "stage":
                expr = stages[leaf.name].exprs[leaf.slice]
                expr = substitute(expr, {v: value(leaf_of_var[v]) for v in free_vars(expr)})
            else:
                expr = load(leaf)
            values[leaf] = bind(expr, f"{leaf.name}_{leaf.slice}")
        return values[leaf]

    return {s.name: value(plan.updates[s.name]) for s in plan.states}

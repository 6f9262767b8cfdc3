"""Which params carry the input projection's bias: a fact about a cell, derived from its plan.

A layer adds a bias to its input projection (``xp = x W_ih^T + b_ih``). Where a cell reads every slice of
``xp`` only in sums that also add one slice of a param (torch.nn's LSTM and RNN: ``xp + W_hh h + b_hh``),
and reads that param nowhere else, the two biases are one: ``b_ih`` may move into the param
(``b_hh + b_ih``) and the projection run without a bias, the cell computing the same values. Not GRU:
its ``n`` gate multiplies ``b_hn`` by ``r``; not a cell whose input has no param beside it (MGU, IndRNN).
A caller that makes the projection itself asks :attr:`CellPlan.input_bias
<prnn_tvm.frontend.plan.CellPlan.input_bias>` (``prnn_tvm.torch``'s half layers on the GPU, whose GEMM
into float32 has no bias epilogue in torch).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tvm.ir import expr as E
from tvm.ir.prim import expr as P

from .texpr import rebuild

_CARRIED = ("input", "param")  # the leaf kinds the fact is about


@dataclass(frozen=True)
class BiasCarrier:
    """Param ``param`` carries the bias of the input slices ``first`` to ``first + slices - 1``: its slice ``i``
    is added wherever input slice ``first + i`` is read, and read nowhere else (``slices`` is the param's)."""

    param: str
    first: int
    slices: int


def bias_carriers(plan) -> tuple:
    """The :class:`BiasCarrier` s of ``plan`` (a :class:`~prnn_tvm.frontend.plan.CellPlan`), covering every input
    slice once, in slice order; () where the cell reads an input slice other than in a sum with one param slice,
    or a param so paired anywhere else (a product's operand, a state's new value, another expression)."""
    inverse = {var: leaf for leaf, var in plan.leaf_vars.items()}
    # a stage slice that is a bare leaf (a bidirectional layer's reverse half of the input) is read as that leaf
    copies = {(st.name, s): inverse[e] for st in plan.stages for s, e in enumerate(st.exprs) if isinstance(e, E.Var)}

    def root(leaf):
        while leaf.kind == "stage" and (leaf.name, leaf.slice) in copies:
            leaf = copies[leaf.name, leaf.slice]
        return leaf

    # read other than by a stage's math: a state's new value, a product's operand
    direct = [*plan.updates.values(), *(copies[r.operand, 0] for r in plan.reductions if (r.operand, 0) in copies)]
    if any(root(leaf).kind in _CARRIED for leaf in direct):
        return ()
    sums = _sums(plan, inverse, copies, root)
    pairs = {}  # input slice -> the param leaf added wherever it is read
    for x in sorted((leaf for leaf in plan.leaf_vars if leaf.kind == "input"), key=lambda leaf: leaf.slice):
        holding = [terms for terms in sums if x in terms]
        if any(sum(n for leaf, n in terms.items() if leaf.kind == "input") != 1 for terms in holding):
            return ()  # read twice in a sum, with another input slice, or outside any sum
        param = next(
            (
                p
                for p, n in holding[0].items()
                if p.kind == "param"
                and n == 1
                and all(terms.get(p) == 1 for terms in holding)
                and all(x in terms for terms in sums if p in terms)
            ),
            None,
        )
        if param is None:
            return ()
        pairs[x.slice] = param
    carriers = []
    for name in dict.fromkeys(p.name for p in pairs.values()):
        firsts = {s - p.slice for s, p in pairs.items() if p.name == name}
        slices = plan.slot(name).slices
        if len(firsts) != 1 or sum(p.name == name for p in pairs.values()) != slices:
            return ()  # its slices pair with input slices out of order, or some slice has none
        carriers.append(BiasCarrier(name, firsts.pop(), slices))
    return tuple(sorted(carriers, key=lambda c: c.first)) if len(pairs) == plan.input.slices else ()


def _sums(plan, inverse: dict, copies: dict, root) -> list:
    """Each sum of the plan's stage expressions (a tree of ``+``, taken whole) as a Counter of the input and
    param leaves among its terms; such a leaf read outside any sum counts as a sum of its own."""
    found = []

    def visit(node):
        if isinstance(node, P.Add):
            terms, stack = Counter(), [node]
            while stack:
                term = stack.pop()
                if isinstance(term, P.Add):
                    stack += [term.a, term.b]
                elif isinstance(term, E.Var) and root(inverse[term]).kind in _CARRIED:
                    terms[root(inverse[term])] += 1
                else:
                    rebuild(term, visit)
            found.append(terms)
            return node
        if isinstance(node, E.Var) and root(inverse[node]).kind in _CARRIED:
            found.append(Counter([root(inverse[node])]))
            return node
        return None

    for st in plan.stages:
        for s, e in enumerate(st.exprs):
            if (st.name, s) not in copies:
                rebuild(e, visit)
    return found

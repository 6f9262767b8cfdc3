"""Emit a cell's pointwise math for one (batch row, hidden unit), shared by every template.

A step runs in phases (``CellPlan.phases``): phase ``p`` computes the stages that depend on
the products of phase ``p``. A template supplies where each leaf value lives (a register,
shared memory, a global load) and how to bind a value to a name; this module walks the
stages of one phase in dependency order and returns the values the rest of the step needs.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.ir.prim import expr as P
from tvm.script.ir_builder import tirx as T

from ..frontend.plan import CellPlan, Leaf
from ..frontend.texpr import free_vars, rebuild, substitute


def emit_phase(
    plan: CellPlan,
    phase: int,
    load: Callable[[Leaf], object],
    bind: Callable[[object, str], object],
    live_outs: tuple | None = None,
    sums: tuple = (),
) -> dict[Leaf, object]:
    """Bind the stages of ``phase`` that the step needs; return ``{leaf: variable}`` for its live-outs.

    ``load(leaf)`` gives the value of an input, state, param, product or sum-over-units leaf, and of a
    stage leaf of an earlier phase; ``bind(expr, name)`` emits a binding and returns the
    variable that holds it. Each leaf is loaded and each stage computed at most once.
    ``live_outs``: only these of the phase's live-outs, and what they need (one
    ``PointwiseGroup``'s); default all. ``sums``: sums over units (``UnitSum``, of :meth:`CellPlan.sums_of` this
    phase) whose share of this unit to add: returned too, as ``Leaf("share", name, 0)``.
    """
    stages = {st.name: st for st in plan.stages}
    leaf_of_var = {var: leaf for leaf, var in plan.leaf_vars.items()}
    values: dict[Leaf, object] = {}

    def value(leaf: Leaf):
        if leaf not in values:
            if leaf.kind == "stage" and plan.phase_of(leaf) == phase:
                expr = stages[leaf.name].exprs[leaf.slice]
                expr = substitute(expr, {v: value(leaf_of_var[v]) for v in free_vars(expr)})
            else:
                expr = load(leaf)
            values[leaf] = bind(expr, f"{leaf.name}_{leaf.slice}")
        return values[leaf]

    found = {leaf: value(leaf) for leaf in (plan.live_outs(phase) if live_outs is None else live_outs)}
    for us in sums:  # this unit's share of each sum: its terms over every gate slice
        terms = [substitute(expr, {v: value(leaf_of_var[v]) for v in free_vars(expr)}) for expr in us.exprs]
        found[Leaf("share", us.name, 0)] = bind(functools.reduce(operator.add, terms), f"{us.name}_share")
    return found


def adjoint_values(
    plan: CellPlan,
    adjoints,
    forward: Callable[[Leaf], object],
    incoming: Callable[[str], object],
    operand: Callable[[str], object],
    bind: Callable[[object, str], object],
    unit_sum: Callable[[str], object] | None = None,
) -> Callable[[Leaf], object]:
    """``value(leaf)``: the adjoint of a leaf of one (step, row, unit) as an expression, zero where the step
    does not depend on it, from the derived ``adjoints`` (``frontend.derivative.step_adjoints``).

    A template says where the forward's values live (``forward(leaf)`` for inputs, params,
    states at the step's start, products and sums over units; stages are recomputed from them), what each
    state's incoming adjoint is (``incoming(state)``), what the transposed products sent
    back to an operand stage (``operand(stage)``) and, for a plan with sums over units, the adjoint of a sum's
    row total (``unit_sum(name)``). Each variable, and each leaf's adjoint, is bound once (``bind``).
    """
    stages = {st.name: st for st in plan.stages}
    leaf_of_var = {var: leaf for leaf, var in plan.leaf_vars.items()}
    roles = {v: (incoming, n) for n, v in adjoints.incoming.items()}
    roles.update({v: (operand, n) for n, v in adjoints.operands.items()})
    roles.update({v: (unit_sum, n) for n, v in adjoints.unit_sums.items()})
    bound: dict = {}

    def var(v):
        if v not in bound:
            source, name = roles.get(v, (None, None))
            if source is not None:
                expr = source(name)
            elif v in adjoints.stages:  # a stage's adjoint, from the variables it reads
                expr = substitute(adjoints.stages[v], {u: var(u) for u in free_vars(adjoints.stages[v])})
            else:
                expr = leaf_value(leaf_of_var[v])
            bound[v] = bind(expr, v.name)
        return bound[v]

    def leaf_value(leaf: Leaf):
        if leaf.kind != "stage":
            return forward(leaf)
        expr = stages[leaf.name].exprs[leaf.slice]
        return substitute(expr, {v: var(v) for v in free_vars(expr)})

    def value(leaf: Leaf):
        expr = adjoints.leaves.get(leaf)
        if expr is None:
            return tirx.const(0.0, plan.policy.compute)
        if leaf not in bound:
            bound[leaf] = bind(substitute(expr, {v: var(v) for v in free_vars(expr)}), f"d_{leaf.name}_{leaf.slice}")
        return bound[leaf]

    return value


def live_index(plan: CellPlan) -> dict[Leaf, int]:
    """A slot for every live-out of every phase: where templates keep them until they are read."""
    leaves = [leaf for p in range(plan.phases) for leaf in plan.live_outs(p)]
    return {leaf: i for i, leaf in enumerate(leaves)}


def new_state_values(plan: CellPlan, value_of: Callable[[Leaf], object], states=None) -> dict[str, object]:
    """``{state: new value}`` at the end of a step (of ``states`` only, when given; in the plan's order);
    ``value_of`` resolves the update leaves."""
    return {s.name: value_of(plan.updates[s.name]) for s in plan.states if states is None or s.name in states}


def as_type(expr, dtype: str):
    """``expr`` converted to ``dtype`` (itself when it already is): between a layer's storage type and
    the types it accumulates and computes in (``prnn_tvm.dtypes``)."""
    return expr if str(expr.ty.dtype) == dtype else tirx.Cast(dtype, expr)


def bind_value(expr, name: str):
    """Bind ``expr`` to a new variable called ``name`` inside the current IRBuilder frame; returns the variable
    (how templates name the values of a step)."""
    return T.bind(expr, var=tirx.Var(name, expr.ty))


# TVM's StmtSimplify substitutes a let-bound value that reads no buffer into every use of its variable, and its
# CommonSubexprElim leaves expressions with calls alone: a value bound once is emitted again in every expression that
# reads it, and what reads those again. A backward step's adjoints are a DAG over the recomputed forward stages
# (sLSTM's: each stage read by several others): inlined, its CUDA grew to 850 KB (4 items a thread) with ~300
# exp2 and 64 IEEE divisions an item after nvcc's own CSE, the branches of its selects in between. An identity
# function is opaque to the simplifier (a call of unknown effect) and free to nvcc (inlined).
_KEEP_SOURCE = r"""
#ifndef PRNN_KEEP
#define PRNN_KEEP
__device__ __forceinline__ float prnn_keep(float x) { return x; }
#endif
"""


def bind_kept(expr, name: str):
    """:func:`bind_value` of a float32 value that TVM's simplifier must not copy into its uses (see above): for the
    values of a DAG of expressions that read each other many times (a backward step's adjoints)."""
    if str(expr.ty.dtype) != "float32":
        return bind_value(expr, name)
    return bind_value(T.cuda.func_call("prnn_keep", expr, source_code=_KEEP_SOURCE, return_type="float32"), name)


def bind_kept_llvm(expr, name: str):
    """:func:`bind_kept` for LLVM (the CPU backward's adjoints): the value through ``llvm.arithmetic.fence``, an
    identity to LLVM (it orders fast-math rewrites, which no build here asks for) that TVM's simplifier sees as a call
    of unknown effect. Inlined, lstm_layernorm's float64 backward was 153,000 lines of LLVM IR (its step's stages
    recomputed in every adjoint that reads them, tanh's lowering reading its argument five times): 5.1 s of TVM and
    LLVM to build; kept, 11,000 lines, 2.0 s, and the same bits out."""
    return bind_value(tirx.call_llvm_intrin(str(expr.ty.dtype), "llvm.arithmetic.fence", expr), name)


def _expf(x):
    return T.call_pure_extern("float32", "__expf", x)  # ex2.approx of x * log2(e)


def _fdividef(a, b):
    """``a / b`` (``a`` a float32 expression or a Python number) on the approximate reciprocal unit."""
    a = tirx.const(a, "float32") if isinstance(a, float) else a
    return T.call_pure_extern("float32", "__fdividef", a, b)  # rcp.approx, then a multiply


def _logf(x):
    return T.call_pure_extern("float32", "__logf", x)  # lg2.approx of x, times ln 2


# The hardware tanh unit (MUFU.TANH, sm_75 and newer; PTX tanh.approx.f32), as cuDNN's persistent LSTM uses it:
# one instruction where 1 - 2 / (1 + e^2x) on the exp2 and reciprocal units takes five, twice on an LSTM step's
# critical path. Measured on the H100 over 2^24 points of [-12, 12]: relative error at most 9.9e-6 (2^-16.6),
# absolute 8e-6; -1 and 1 beyond.
_TANH_SOURCE = r"""
#ifndef PRNN_TANH_APPROX
#define PRNN_TANH_APPROX
__device__ __forceinline__ float prnn_tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif
"""


def _tanh_approx(x):
    return T.cuda.func_call("prnn_tanh_approx", x, source_code=_TANH_SOURCE, return_type="float32")


# float32 exp and sigmoid on the approximate exp2 and reciprocal units, tanh on the hardware tanh unit, log on the
# approximate log2 unit: a few instructions each against ~20 for expf / an IEEE division / tanhf / logf, on the
# critical path of every step. Limits hold: __expf overflows to inf and __fdividef(a, inf) is 0, so sigmoid goes to 0
# and 1; __logf(0) is -inf. Errors (CUDA C++ Programming Guide, "Intrinsic Functions"): __logf 2^-21.41 absolute for
# x in [0.5, 2], 3 ulp elsewhere, an absolute error being what a log's value carries on (it enters sums in log space,
# a stabilizer or an exponent, where exp turns it into a relative one: sLSTM's log f + m); __fdividef (every float32
# division, :data:`_FAST_DIVISION`) 2 ulp for 2^-126 <= |b| <= 2^126, and 0 for 2^126 < |b| < 2^128 (a divisor past
# float16's range by 2^110, which a bfloat16 layer reaches only once its values have overflowed). Each is below 2^-20
# relative, against the 2^-11 (float16) or 2^-8 (bfloat16) to which every stored value is rounded.
_FAST = {
    "tirx.exp": _expf,
    "tirx.sigmoid": lambda x: _fdividef(1.0, 1.0 + _expf(-x)),
    "tirx.tanh": _tanh_approx,
    "tirx.log": _logf,
}
_FAST_DIVISION = _fdividef  # a float32 division (``a / b``), on the reciprocal unit


def _sigmoid_through_tanh(x):
    """sigmoid(x) = 1/2 + tanh(x/2) / 2 on the tanh unit: one MUFU.TANH where 1 / (1 + e^-x) takes MUFU.EX2 and
    MUFU.RCP. Its absolute error is half tanh.approx's: about 2^-12 by the PTX ISA's bound of 2^-10.99 (4e-6 by the
    H100's measured 8e-6), half a float16 ulp at 0.5 (2^-11) and a sixteenth of a bfloat16 one (2^-8)."""
    half = tirx.const(0.5, "float32")
    return half + half * _tanh_approx(x * half)


def fast_transcendentals(expr, sigmoid_through_tanh: bool = False):
    """``expr`` with its float32 exp, sigmoid, tanh, log and divisions on the GPU's approximate units (exp, sigmoid
    and a division: relative error about 2^-21; tanh: 2^-16.6; log: 2^-21.4 absolute near 1; see ``_FAST``): the
    pointwise math of layers whose dtype policy says ``fast_math`` (half precision, where every stored value is rounded
    to 2^-11 or coarser), forward and backward alike. With ``sigmoid_through_tanh``, sigmoid on the tanh unit
    (:func:`_sigmoid_through_tanh`: fewer MUFU instructions where their throughput bounds the step, absolute error up
    to 2^-12)."""
    fast_ops = {**_FAST, "tirx.sigmoid": _sigmoid_through_tanh} if sigmoid_through_tanh else _FAST

    def replace(node):
        if isinstance(node, TensorLoad):  # a register or shared-memory value: nothing below it
            return node
        if isinstance(node, P.Div) and str(node.ty.dtype) == "float32":
            return _FAST_DIVISION(rebuild(node.a, replace), rebuild(node.b, replace))
        fast = fast_ops.get(getattr(getattr(node, "op", None), "name", None))
        if fast is None or str(node.ty.dtype) != "float32":
            return None
        return fast(rebuild(node.args[0], replace))

    return rebuild(expr, replace)


def _rsqrtf(x):
    return T.call_pure_extern("float32", "rsqrtf", x)  # MUFU.RSQ: 2 ulp (CUDA's guide), one instruction


def reciprocal_roots(expr):
    """``expr`` with each float32 ``a / sqrt(v)`` as ``a * rsqrtf(v)`` (``rsqrtf(v)`` where a is 1): the reciprocal
    square root unit where an IEEE sqrtf and an IEEE division take ~20 instructions between them, on the critical
    path of a normalizing step (a LayerNorm's 1 / sqrt(var + eps), three a step in ``lstm_layernorm``: 0.968x its
    step on the H200, bench/results/exchange-probes-h100.md). rsqrtf's 2 ulp, and the multiply's rounding, are
    ~2^-22 relative: a fraction of float32's tolerance per step (``prnn_tvm.dtypes``). The pointwise math of every
    GPU kernel, forward and backward alike (a backward recomputes the forward's stages: the same values); float64
    layers build for the CPU alone and keep the IEEE form."""

    def replace(node):
        if isinstance(node, TensorLoad):
            return node
        if not (isinstance(node, P.Div) and getattr(getattr(node.b, "op", None), "name", None) == "tirx.sqrt"):
            return None
        if str(node.ty.dtype) != "float32":
            return None
        root = _rsqrtf(rebuild(node.b.args[0], replace))
        if isinstance(node.a, P.FloatImm) and node.a.value == 1.0:
            return root
        return rebuild(node.a, replace) * root

    return rebuild(expr, replace)


def gpu_math(expr, fast_math: bool, sigmoid_through_tanh: bool = False):
    """``expr`` as a GPU kernel computes it: reciprocal square roots on their unit (:func:`reciprocal_roots`),
    and where the dtype policy says ``fast_math`` exp, sigmoid and tanh on theirs (:func:`fast_transcendentals`)."""
    expr = reciprocal_roots(expr)
    return fast_transcendentals(expr, sigmoid_through_tanh) if fast_math else expr

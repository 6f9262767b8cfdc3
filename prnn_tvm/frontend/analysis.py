"""Analysis of a cell's TE graph: what the schedule templates place, and what they refuse.

The analysis turns a traced cell into a :class:`CellPlan`:

- the *recurrent reductions*: stages ``out[n, j] = sum_k S[n, k] * W[j, k]`` with ``S`` a
  state and ``W`` a recurrent weight. They are the only stages that mix hidden units, so
  they are what the persistent kernel distributes across thread blocks;
- the *pointwise stages*, rewritten per hidden unit: for every gate slice ``s`` of a
  stage, an expression in *leaves*, the values of one unit (``x`` at slice 2, the
  reduction ``hw`` at slice 0, the state ``c``, ...). This is where the analysis works
  out which gate slices belong to one hidden unit: each tensor access's column index
  must be ``s' * hidden + u`` for the unit ``u`` being computed;
- which states are *exchanged* (read by a reduction, so every block needs all of them
  after each step: they go through global memory and a grid barrier) and which stay
  private to the unit that owns them (LSTM's ``c``: registers for the whole sequence).

Anything that does not fit is refused with a :class:`~prnn_tvm.errors.CellError` naming
the stage and saying what would be accepted: a kernel is never built on a guess.
"""

from __future__ import annotations

import functools
import numbers

from tvm import te, tirx
from tvm.ir import Range
from tvm.ir import expr as E
from tvm.ir.prim import expr as P
from tvm.sym import Analyzer

from ..dtypes import policy
from ..errors import CellError
from .cell import Cell, Role, TracedCell
from .plan import CellPlan, Leaf, Reduction, Stage, UnitSum
from .texpr import UnsupportedExpr, const_int, free_vars, is_tensor_load, rebuild, substitute, tensor_load_parts

MAX_SIZE = 2**31 - 1


def analyze(cell: Cell, batch: int, hidden: int, dtype: str = "float32") -> CellPlan:
    """Trace ``cell`` at the given sizes and map its TE graph, or raise CellError.

    ``dtype`` is the layer's storage dtype; the cell is traced in its policy's compute
    type (:mod:`prnn_tvm.dtypes`), so a cell file never names a dtype.
    """
    for name, value in (("batch", batch), ("hidden", hidden)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
            raise CellError(
                f"{name} must be a positive integer up to {MAX_SIZE} (kernels count in 32-bit integers), got {value!r}"
            )
    key = (cell, int(batch), int(hidden), dtype)
    try:
        hash(key)
    except TypeError:  # a cell made with lists where it takes tuples: traced every time
        return _analyzed(*key)
    return _memo(*key)


def _analyzed(cell: Cell, batch: int, hidden: int, dtype: str) -> CellPlan:
    return _Analysis(cell.trace(batch, hidden, policy(dtype).compute), dtype).run()


# A plan is frozen and a cell's trace depends only on the cell's fields (its step function among them) and the sizes:
# a process that compiles a layer again (a cache hit, another input size or config) reuses its plan.
_memo = functools.lru_cache(maxsize=512)(_analyzed)


class _Analysis:
    def __init__(self, traced: TracedCell, dtype: str):
        self.t = traced
        self.dtype = dtype
        self.H = traced.hidden
        self.B = traced.batch
        self.slots = {s.tensor: s for s in traced.slots}
        self.leaf_vars: dict[Leaf, E.Var] = {}
        self.reductions: dict[te.Tensor, Reduction] = {}
        self.unit_sums: dict[te.Tensor, UnitSum] = {}
        self.stages: dict[te.Tensor, Stage] = {}
        self.order: list[te.Tensor] = []
        self.used: set[str] = set()

    # ---- entry
    def run(self) -> CellPlan:
        t = self.t
        by_role = {r: tuple(s for s in t.slots if s.role is r) for r in Role}
        if not by_role[Role.INPUT]:
            raise CellError(f"cell '{t.cell.name}' declares no input: call c.input(slices) once")
        if not by_role[Role.STATE]:
            raise CellError(f"cell '{t.cell.name}' declares no state: a recurrent cell needs c.state(name)")
        state_names = [s.name for s in by_role[Role.STATE]]
        delayed = [name for name, _ in t.cell.delays]
        for name in (*t.cell.outputs, *t.cell.reversed_states, *delayed):
            if name not in state_names:
                what = (
                    "output"
                    if name in t.cell.outputs
                    else "reversed state"
                    if name in t.cell.reversed_states
                    else "delayed state"
                )
                raise CellError(
                    f"cell '{t.cell.name}': {what} '{name}' is not a declared state (states: {', '.join(state_names)})"
                )
        slices = by_role[Role.INPUT][0].slices
        if any(not 0 <= s < slices for s in t.cell.reversed_slices):
            raise CellError(
                f"cell '{t.cell.name}': reversed input slices {list(t.cell.reversed_slices)} must lie "
                f"in 0..{slices - 1}"
            )
        if t.cell.delays and t.cell.reversed_states:
            raise CellError(
                f"cell '{t.cell.name}' has delayed and reversed states: a wavefront stack's layers run one time order"
            )
        missing = [n for n in state_names if n not in t.updates]
        extra = [n for n in t.updates if n not in state_names]
        if missing:
            raise CellError(
                f"cell '{t.cell.name}': the step returns no new value for state(s) "
                f"{', '.join(missing)}; return {{name: tensor}} for every c.state()"
            )
        if extra:
            raise CellError(
                f"cell '{t.cell.name}': the step returns {', '.join(extra)}, which "
                f"{'is' if len(extra) == 1 else 'are'} not a declared state"
            )

        updates = {}
        for name in state_names:
            tensor = t.updates[name]
            if not isinstance(tensor, te.Tensor):
                raise CellError(f"the new value of state '{name}' must be a te.Tensor, got {type(tensor).__name__}")
            self._visit(tensor)
            if self._slices(tensor, f"new value of state '{name}'") != 1:
                raise CellError(
                    f"the new value of state '{name}' has shape {self._shape(tensor)}; "
                    f"a state is (batch, hidden) = ({self.B}, {self.H})",
                    tensor.op.name,
                )
            updates[name] = self._leaf_of(tensor, 0)

        for s in t.slots:
            if s.role in (Role.WEIGHT, Role.PARAM) and s.name not in self.used:
                raise CellError(f"{s.role.value} '{s.name}' is declared but never used; remove it or use it")
        x = by_role[Role.INPUT][0]
        read = {leaf.slice for leaf in self.leaf_vars if leaf.kind == Role.INPUT.value}
        unread = [s for s in range(x.slices) if s not in read]
        if unread:  # the projection would compute it for nothing, and the reference would get a wider x
            raise CellError(
                f"cell '{t.cell.name}': input slice(s) {', '.join(map(str, unread))} of '{x.name}' "
                f"(c.input({x.slices}): columns s*hidden + j for s < {x.slices}) are never read; declare "
                f"c.input({len(read)}) and read its slices 0 to {len(read) - 1}, or read every slice"
            )
        exchanged = tuple(n for n in state_names if any(r.operand == n for r in self.reductions.values()))
        exchanged_stages = tuple(dict.fromkeys(r.operand for r in self.reductions.values() if r.phase > 0))
        return CellPlan(
            cell=t.cell,
            batch=self.B,
            hidden=self.H,
            dtype=self.dtype,
            input=by_role[Role.INPUT][0],
            states=by_role[Role.STATE],
            weights=by_role[Role.WEIGHT],
            params=by_role[Role.PARAM],
            exchanged=exchanged,
            exchanged_stages=exchanged_stages,
            reductions=tuple(self.reductions[x] for x in self.order if x in self.reductions),
            stages=tuple(self.stages[x] for x in self.order if x in self.stages),
            updates=updates,
            leaf_vars=dict(self.leaf_vars),
            unit_sums=tuple(self.unit_sums[x] for x in self.order if x in self.unit_sums),
        )

    # ---- graph walk (post-order = dependency order)
    def _visit(self, tensor: te.Tensor) -> None:
        if tensor in self.slots or tensor in self.reductions or tensor in self.stages or tensor in self.unit_sums:
            return
        op = tensor.op
        if isinstance(op, te.PlaceholderOp):
            raise CellError(
                f"'{op.name}' is a te.placeholder the cell did not declare; create inputs "
                f"with c.input(), c.state(), c.weight() or c.param()",
                op.name,
            )
        if not isinstance(op, te.ComputeOp):
            raise CellError(f"{type(op).__name__} is not supported; a cell is made of te.compute stages", op.name)
        if len(op.body) != 1:
            raise CellError("multi-output compute stages are not supported; write one te.compute per value", op.name)
        if tensor.dtype != self.t.dtype:
            raise CellError(
                f"computes {tensor.dtype}; every stage of a cell computes in {self.t.dtype}, the "
                f"compute type of a {self.dtype} layer (cast inside the expression instead)",
                op.name,
            )
        for inp in op.input_tensors:
            self._visit(inp)
        if isinstance(op.body[0], tirx.Reduce) and not self._reads_weight(op.body[0].source[0]):
            self.unit_sums[tensor] = self._unit_sum(tensor)
        elif isinstance(op.body[0], tirx.Reduce):
            self.reductions[tensor] = self._reduction(tensor)
        else:
            self.stages[tensor] = self._stage(tensor)
        self.order.append(tensor)

    # ---- shapes
    @staticmethod
    def _shape(tensor: te.Tensor) -> tuple:
        return tuple(int(d) for d in tensor.shape)

    def _slices(self, tensor: te.Tensor, what: str) -> int:
        shape = self._shape(tensor)
        if len(shape) != 2 or shape[0] != self.B or shape[1] % self.H != 0:
            raise CellError(
                f"{what} has shape {shape}; cell stages must be (batch, slices*hidden) with "
                f"batch={self.B}, hidden={self.H}",
                tensor.op.name,
            )
        return shape[1] // self.H

    def _leaf_of(self, tensor: te.Tensor, s: int) -> Leaf:
        if tensor in self.reductions:
            return Leaf("reduction", tensor.op.name, s)
        if tensor in self.unit_sums:
            return Leaf("unit_sum", tensor.op.name, s)
        if tensor in self.stages:
            return Leaf("stage", tensor.op.name, s)
        slot = self.slots[tensor]
        return Leaf(slot.role.value, slot.name, s)

    def _leaf_var(self, leaf: Leaf) -> E.Var:
        if leaf not in self.leaf_vars:
            self.leaf_vars[leaf] = tirx.Var(f"{leaf.name}_{leaf.slice}", self.t.dtype)
        return self.leaf_vars[leaf]

    # ---- recurrent reductions
    def _reduction(self, tensor: te.Tensor) -> Reduction:
        op = tensor.op
        name = op.name
        red = op.body[0]
        slices = self._slices(tensor, "the reduction")
        comb = red.combiner
        identity = comb.identity_element[0]
        if not (
            len(comb.result) == 1
            and isinstance(comb.result[0], P.Add)
            and isinstance(identity, (P.FloatImm, P.IntImm))
            and float(identity.value) == 0.0
        ):
            raise CellError(
                "only sums (te.sum) of state x weight products are supported as reductions, "
                f"this stage reduces with {comb.result[0]}",
                name,
            )
        if len(op.reduce_axis) != 1:
            raise CellError(
                f"reduces over {len(op.reduce_axis)} axes; a recurrent product reduces over one "
                "axis k in range(hidden)",
                name,
            )
        k = op.reduce_axis[0]
        if not (isinstance(red.condition, P.IntImm) and int(red.condition.value) == 1):
            raise CellError("a reduction with a where= condition is not supported", name)
        src = red.source[0]
        if not (isinstance(src, P.Mul) and is_tensor_load(src.a) and is_tensor_load(src.b)):
            raise CellError(
                f"sums {src}; a recurrent product sums state[n, k] * weight[j, k], the product "
                "of exactly two tensor accesses",
                name,
            )
        n, j = (iv.var for iv in op.axis)
        loads = [tensor_load_parts(src.a), tensor_load_parts(src.b)]
        roles = [self.slots[t].role if t in self.slots else None for t, _ in loads]
        if Role.WEIGHT not in roles:
            raise CellError(
                "a recurrent product multiplies a state by a recurrent weight (c.weight); this "
                f"one reads {', '.join(self._describe(t) for t, _ in loads)}",
                name,
            )
        (w_t, w_idx), (s_t, s_idx) = loads if roles[0] is Role.WEIGHT else loads[::-1]
        if s_t in self.reductions or s_t in self.unit_sums:
            what = "another product" if s_t in self.reductions else "a sum over units"
            raise CellError(
                f"the recurrent product multiplies the weight by '{s_t.op.name}', {what}; "
                "apply a pointwise stage in between (a product's operand is a state or a "
                "pointwise stage of shape (batch, hidden))",
                name,
            )
        if s_t in self.stages:
            if self._slices(s_t, "the product's operand") != 1:
                raise CellError(
                    f"the recurrent product reads '{s_t.op.name}', which has "
                    f"{self._shape(s_t)[1] // self.H} gate slices; a product's operand is "
                    "(batch, hidden)",
                    name,
                )
            operand, phase = s_t.op.name, self.stages[s_t].phase + 1
        elif s_t in self.slots and self.slots[s_t].role is Role.STATE:
            operand, phase = self.slots[s_t].name, 0
        else:
            raise CellError(
                f"the recurrent product multiplies the weight by {self._describe(s_t)}; it must "
                "multiply a state (c.state) or a pointwise stage of this step",
                name,
            )
        w_slot = self.slots[w_t]
        D = self.H // w_slot.heads
        if int(k.dom.min) != 0 or int(k.dom.extent) != D:
            where = (
                f"the whole state, range(0, {self.H})"
                if w_slot.heads == 1
                else f"one head of weight '{w_slot.name}' ({w_slot.heads} heads), range(0, {D})"
            )
            raise CellError(
                f"reduces over range({k.dom.min}, {int(k.dom.min) + int(k.dom.extent)}); a "
                f"recurrent product reduces over {where}",
                name,
            )
        if not (self._is(w_idx[0], j) and self._is(w_idx[1], k.var)):
            raise CellError(
                f"weight '{w_slot.name}' is indexed [{w_idx[0]}, {w_idx[1]}]; recurrent weights "
                f"have PyTorch's (slices*hidden, hidden) layout and are indexed [j, k]",
                name,
            )
        if not (self._is(s_idx[0], n) and self._reads_head(s_idx[1], j, k.var, slices, D)):
            at = "[n, k]" if w_slot.heads == 1 else "[n, (j % hidden) // D * D + k], the head of row j"
            raise CellError(
                f"'{operand}' is indexed [{s_idx[0]}, {s_idx[1]}]; the recurrent product reads its operand as {at}",
                name,
            )
        if w_slot.slices != slices:
            raise CellError(
                f"has {slices} gate slice(s) but weight '{w_slot.name}' has {w_slot.slices}; "
                "the product's shape is (batch, rows of the weight)",
                name,
            )
        self.used.add(w_slot.name)
        return Reduction(name, operand, w_slot.name, slices, phase, w_slot.heads)

    def _reads_head(self, column, j, k, slices: int, D: int) -> bool:
        """Whether operand column ``column`` (of product row ``j`` and reduction variable ``k``) is ``k`` itself
        (a dense product, ``D`` = hidden) or, for head size ``D``, unit ``head * D + k`` of row ``j``'s head:
        proven for every gate slice's rows ``j = s * hidden + u``, ``u`` in ``[0, hidden)``."""
        if D == self.H:
            return self._is(column, k)
        u = tirx.Var("u", "int32")
        an = Analyzer()
        an.bind(u, Range(0, self.H))
        return all(an.can_prove_equal(substitute(column, {j: s * self.H + u}) - k, (u // D) * D) for s in range(slices))

    # ---- sums over units
    def _reads_weight(self, source) -> bool:
        """Whether a reduction's source reads a recurrent weight (a product; else a sum over units)."""
        found = []

        def visit(e):
            if is_tensor_load(e):
                slot = self.slots.get(tensor_load_parts(e)[0])
                found.append(slot is not None and slot.role is Role.WEIGHT)
                return e
            return None

        try:
            rebuild(source, visit)
        except UnsupportedExpr:
            return True  # let the product's analysis say what is wrong
        return any(found)

    def _unit_sum(self, tensor: te.Tensor) -> UnitSum:
        """A sum over every hidden unit of a row (``c.sum``): ``te.sum`` over ``k`` in ``range(S * hidden)`` of a
        pointwise expression in values at column ``k`` (``s' * hidden + u`` for slice ``s``'s units ``u``)."""
        op = tensor.op
        name, red = op.name, op.body[0]
        if self._slices(tensor, "the sum over units") != 1:
            raise CellError(
                f"has shape {self._shape(tensor)}; a sum over units is (batch, hidden) = ({self.B}, "
                f"{self.H}), every unit holding its row's total",
                name,
            )
        comb = red.combiner
        identity = comb.identity_element[0]
        if not (
            len(comb.result) == 1
            and isinstance(comb.result[0], P.Add)
            and isinstance(identity, (P.FloatImm, P.IntImm))
            and float(identity.value) == 0.0
        ):
            raise CellError(f"reduces with {comb.result[0]}; a sum over units is a te.sum", name)
        if len(op.reduce_axis) != 1:
            raise CellError(f"reduces over {len(op.reduce_axis)} axes; a sum over units reduces over one axis k", name)
        k = op.reduce_axis[0]
        extent = int(k.dom.extent)
        if int(k.dom.min) != 0 or extent % self.H:
            raise CellError(
                f"reduces over range({k.dom.min}, {int(k.dom.min) + extent}); a sum over units runs over "
                f"range(0, S * hidden): every unit of S gate slices, hidden={self.H}",
                name,
            )
        if not (isinstance(red.condition, P.IntImm) and int(red.condition.value) == 1):
            raise CellError("a reduction with a where= condition is not supported", name)
        n, j = (iv.var for iv in op.axis)
        exprs = self._per_unit(red.source[0], name, n, k.var, extent // self.H, j)
        return UnitSum(name, exprs, 1 + self._phase_of_exprs(exprs))

    # ---- pointwise stages
    def _stage(self, tensor: te.Tensor) -> Stage:
        op = tensor.op
        name = op.name
        slices = self._slices(tensor, "the stage")
        n, j = (iv.var for iv in op.axis)
        exprs = self._per_unit(op.body[0], name, n, j, slices)
        return Stage(name, exprs, self._phase_of_exprs(exprs))

    def _per_unit(self, body, name: str, n, index, slices: int, unused=None) -> tuple:
        """``body`` for each gate slice ``s``, with ``index`` at column ``s * hidden + u``, in leaf variables of
        unit ``u``. ``unused``: an index variable the body must not read (a sum's own unit)."""
        u = tirx.Var("u", "int32")
        an = Analyzer()
        an.bind(u, Range(0, self.H))
        exprs = []
        for s in range(slices):
            col = s * self.H + u

            def replace(e, col=col):
                if is_tensor_load(e):
                    return self._pointwise_access(e, name, n, index, col, u, an)
                if isinstance(e, tirx.Reduce):
                    raise CellError(
                        "a reduction inside a larger expression is not supported; give it its own te.compute stage",
                        name,
                    )
                return None

            try:
                expr = rebuild(body, replace)
            except UnsupportedExpr as err:
                raise CellError(str(err), name) from None
            bad = [
                v
                for v in free_vars(expr)
                if v.same_as(n) or v.same_as(index) or (unused is not None and v.same_as(unused))
            ]
            if bad:
                raise CellError(
                    f"uses its index '{bad[0]}' as a value; a cell's math must be the same for "
                    "every batch row and hidden unit",
                    name,
                )
            exprs.append(expr)
        return tuple(exprs)

    def _phase_of_exprs(self, exprs) -> int:
        """The latest phase of the products, sums and stages that pointwise ``exprs`` read (0 without any)."""
        inverse = {var: leaf for leaf, var in self.leaf_vars.items()}
        producers = {"reduction": self.reductions, "stage": self.stages, "unit_sum": self.unit_sums}
        phase = 0
        for leaf in (inverse[v] for e in exprs for v in free_vars(e)):
            if leaf.kind in producers:
                phase = max(phase, next(x.phase for x in producers[leaf.kind].values() if x.name == leaf.name))
        return phase

    def _pointwise_access(self, e, stage: str, n, j, col, u, an: Analyzer):
        tensor, idx = tensor_load_parts(e)
        what = self._describe(tensor)
        slot = self.slots.get(tensor)
        if slot is not None and slot.role is Role.WEIGHT:
            raise CellError(
                f"reads weight '{slot.name}' directly; recurrent weights may only appear in a "
                "recurrent product te.sum(state[n, k] * weight[j, k])",
                stage,
            )
        if slot is not None and slot.role is Role.PARAM:
            if len(idx) != 1:
                raise CellError(
                    f"indexes param '{slot.name}' with {len(idx)} indices; params are vectors indexed [s*hidden + j]",
                    stage,
                )
            column, slices = idx[0], slot.slices
        else:
            slices = slot.slices if slot is not None else self._slices(tensor, what)
            if len(idx) != 2:
                raise CellError(f"indexes {what} with {len(idx)} indices, expected [n, column]", stage)
            if not self._is(idx[0], n):
                raise CellError(
                    f"reads {what} at batch index {idx[0]}; every stage may only read its own batch row [n, ...]", stage
                )
            column = idx[1]
        offset = an.simplify(substitute(column, {j: col}) - u)
        c = const_int(offset)
        if c is None or c < 0 or c >= slices * self.H or c % self.H != 0:
            raise CellError(
                f"reads {what} at column {column}, which does not belong to the hidden unit being computed; "
                f"pointwise stages may only combine values of the same hidden unit, at columns "
                f"s*hidden + j for a constant gate slice s < {slices}",
                stage,
            )
        if slot is not None:
            self.used.add(slot.name)
        return self._leaf_var(self._leaf_of(tensor, c // self.H))

    # ---- helpers
    def _describe(self, tensor: te.Tensor) -> str:
        slot = self.slots.get(tensor)
        if slot is not None:
            return f"'{slot.name}' ({slot.role.value})"
        if tensor in self.reductions:
            return f"'{tensor.op.name}' (recurrent product)"
        if tensor in self.unit_sums:
            return f"'{tensor.op.name}' (sum over units)"
        return f"'{tensor.op.name}' (stage)"

    @staticmethod
    def _is(e, var) -> bool:
        return isinstance(e, E.Var) and e.same_as(var)

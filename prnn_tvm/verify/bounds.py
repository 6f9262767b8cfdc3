"""Shared memory a kernel touches, from its own TIR: every load and store of a shared buffer, evaluated for every
thread of every block and every iteration of the loops around it (a small ``seq_len``), under the conditions that
guard it. What this checks is the chain *accesses <= declared buffer <= what the launch allocates*, with no
figure from the template's geometry in between (a geometry that undersizes a buffer undersizes both the
allocation and the grid's bytes alike, and a comparison of the two passes).

A condition that reads data (a row's length, an abort flag, a test knob) is taken as possibly true: the access
counts. An index that reads data cannot be bounded: :func:`shared_uses` raises, naming it. Accesses inside pasted
device code (``T.cuda.func_call``: the tags and sentinel exchanges) are seen only at the address passed in; the
emulator (``emulator.py``) runs that code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import tirx
from tvm.ir import expr as ir_expr

from prnn_tvm.dtypes import itemsize
from prnn_tvm.errors import PrnnError

SHARED = ("shared", "shared.dyn")


@dataclass
class SharedUse:
    """One shared allocation (in bytes) and the bytes its accesses reach: ``[lowest, end)``; ``worst`` the access
    that reaches furthest."""

    name: str
    scope: str
    declared: int
    lowest: int | None = None
    end: int | None = None
    worst: str = ""

    @property
    def problem(self) -> str | None:
        """Why the accesses do not fit the allocation, or None."""
        if self.end is None:
            return None
        if self.lowest < 0:
            return f"{self.name} ({self.scope}) is accessed at byte {self.lowest}, before its start"
        if self.end > self.declared:
            return (
                f"{self.name} ({self.scope}) is {self.declared} bytes and accessed up to byte {self.end}: {self.worst}"
            )
        return None


def shared_uses(func: tirx.PrimFunc, seq_len: int = 3) -> list[SharedUse]:
    """Every shared allocation of ``func`` with the bytes its accesses reach, for sequences of ``seq_len``."""
    return _Walker(func, seq_len).run()


def launch_problems(func: tirx.PrimFunc, grid, seq_len: int = 3) -> list[str]:
    """What in ``func``'s shared memory does not fit: an access past its buffer, or buffers of dynamic shared
    memory past the ``grid``'s ``dynamic_smem_bytes`` (what the launch allocates; nothing where the kernel
    never touches them, as a template without products declares a word it does not use)."""
    uses = shared_uses(func, seq_len)
    problems = [use.problem for use in uses if use.problem]
    dynamic = [use for use in uses if use.scope == "shared.dyn"]
    needed = sum(use.declared for use in dynamic) if any(use.end is not None for use in dynamic) else 0
    if needed > grid.dynamic_smem_bytes:
        problems.append(
            f"the kernel declares {needed} bytes of dynamic shared memory, the launch allocates "
            f"{grid.dynamic_smem_bytes}"
        )
    return problems


def bound_values(bindings, seq_len: int) -> dict:
    """``{name: int}`` of ``(var, value)`` bindings evaluated in order (a value may use the ones before it and
    ``seq_len``); a value that reads data is left out."""
    walker, out = _Walker(None, seq_len), {}
    for var, value in bindings:
        result = walker.expr(value, np.ones(1, bool))
        if result is not None:
            walker.env[var] = result
            out[var.name] = int(np.asarray(result).reshape(-1)[0])
    return out


class _Walker:
    """Evaluates ``func``'s integer expressions as arrays over its threads (every block's), statement by statement."""

    def __init__(self, func: tirx.PrimFunc | None, seq_len: int):
        self.func, self.seq_len = func, seq_len
        self.env: dict = {}
        self.uses: dict = {}  # allocation -> SharedUse
        self.views: dict = {}  # buffer -> (its allocation, byte offset): an allocation is its own view
        self.lanes = 1

    def run(self) -> list[SharedUse]:
        self.stmt(self.func.body, np.ones(1, bool))
        return list(self.uses.values())

    # ------------------------------------------------------------------ statements
    def stmt(self, s, mask):
        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.stmt(x, mask)
        elif isinstance(s, tirx.AttrStmt):
            if s.attr_key == "thread_extent":  # outside any condition: every thread so far runs it
                self.thread(s.node.var, int(s.value))
                mask = np.ones(self.lanes, bool)
            self.stmt(s.body, mask)
        elif isinstance(s, tirx.AllocBuffer):
            self.declare(s.buffer, s.buffer)
        elif isinstance(s, tirx.DeclBuffer):  # a view: of an allocation's data, from its elem_offset
            data = s.data
            source = data.args[0] if isinstance(data, ir_expr.Call) and data.op.name.endswith(".buffer_data") else None
            self.declare(s.buffer, source)
        elif isinstance(s, tirx.Bind):
            self.env[s.var] = self.expr(s.value, mask)
        elif isinstance(s, tirx.LetStmt):
            self.env[s.var] = self.expr(s.value, mask)
            self.stmt(s.body, mask)
        elif isinstance(s, tirx.BufferStore):
            self.expr(s.value, mask)
            self.access(s.buffer, s.indices, mask, s)
        elif isinstance(s, tirx.Evaluate):
            self.expr(s.value, mask)
        elif isinstance(s, tirx.IfThenElse):
            self.stmt(s.then_case, mask & self.may(s.condition, mask, True))
            if s.else_case is not None:
                self.stmt(s.else_case, mask & self.may(s.condition, mask, False))
        elif isinstance(s, tirx.For):
            self.loop(s, mask)
        elif isinstance(s, (tirx.Break, tirx.Continue)):
            pass  # every later iteration still counts: a bound, not a trace
        else:
            raise PrnnError(f"shared-memory bounds: no rule for a {type(s).__name__} statement")

    def thread(self, var, extent: int):
        """A new thread axis: every value so far repeats across it."""
        before = self.lanes
        self.lanes *= extent
        for key, value in self.env.items():
            if isinstance(value, np.ndarray) and value.size == before and before > 1:
                self.env[key] = np.repeat(value, extent)
        self.env[var] = np.tile(np.arange(extent, dtype=np.int64), before)

    def loop(self, s, mask):
        start, extent = self.expr(s.min, mask), self.expr(s.extent, mask)
        if start is None or extent is None:
            raise PrnnError(f"shared-memory bounds: the loop over {s.loop_var} has a bound that reads data")
        start, extent = np.broadcast_to(start, (self.lanes,)), np.broadcast_to(extent, (self.lanes,))
        steps = int(extent[mask].max()) if mask.any() else 0
        for i in range(steps):
            self.env[s.loop_var] = start + i
            self.stmt(s.body, mask & (i < extent))
        self.env.pop(s.loop_var, None)

    def declare(self, buffer, allocation):
        """A shared buffer: ``allocation`` itself (its bytes), or a view of it at its ``elem_offset``."""
        if buffer.scope() not in SHARED:
            return
        own = allocation is not None and allocation.same_as(buffer)
        if allocation is None or not (own or allocation in self.views):
            raise PrnnError(f"shared-memory bounds: the view {buffer.script()} is of no allocation seen before it")
        if own:
            size = int(np.prod([int(d) for d in buffer.shape])) * itemsize(buffer.dtype)
            self.uses[buffer] = SharedUse(buffer.name or f"shared buffer {len(self.uses)}", buffer.scope(), size)
            self.views[buffer] = (buffer, 0)
            return
        base, offset = self.views[allocation]
        self.views[buffer] = (base, offset + int(buffer.elem_offset) * itemsize(buffer.dtype))

    def access(self, buffer, indices, mask, node):
        if buffer.scope() not in SHARED or not mask.any():
            return
        if buffer not in self.views:
            raise PrnnError(f"shared-memory bounds: a {buffer.scope()} buffer is used before its allocation")
        data, offset = self.views[buffer]
        size, strides = itemsize(buffer.dtype), [1]
        for d in reversed([int(x) for x in buffer.shape][1:]):
            strides.insert(0, strides[0] * d)
        low = high = 0
        for index, stride in zip(indices, strides):
            lo, hi = self.index(index, mask, node)
            low, high = low + lo * stride, high + hi * stride
        flat = offset + size * low
        end = offset + size * (high + 1)
        use = self.uses[data]
        lowest = int(np.min(np.broadcast_to(flat, mask.shape)[mask]))
        furthest = int(np.max(np.broadcast_to(end, mask.shape)[mask]))
        use.lowest = lowest if use.lowest is None else min(use.lowest, lowest)
        if use.end is None or furthest > use.end:
            use.end, use.worst = furthest, f"{list(indices)} of a {buffer.dtype} view from byte {offset}"

    def index(self, index, mask, node):
        """The lowest and highest element an index reaches (a vector index: its lanes)."""
        if isinstance(index, tirx.Ramp):
            base, stride = self.expr(index.base, mask), self.expr(index.stride, mask)
            if base is None or stride is None:
                raise PrnnError(f"shared-memory bounds: the index {index} reads data")
            last = base + stride * (int(index.lanes) - 1)
            return np.minimum(base, last), np.maximum(base, last)
        value = self.expr(index, mask)
        if value is None:
            raise PrnnError(f"shared-memory bounds: the index {index} in {node} reads data")
        return value, value

    # ------------------------------------------------------------------ expressions
    def expr(self, e, mask):
        """An integer (or bool) expression's value over the threads, or None where it reads data. Shared
        buffers read on the way are recorded (only where the expression's own conditions may hold)."""
        binary = _BINARY.get(type(e))  # the most common node first (none of the kinds below is one)
        if binary is not None:
            a, b = self.expr(e.a, mask), self.expr(e.b, mask)
            return None if a is None or b is None else binary(a, b)
        if isinstance(e, tirx.IntImm):
            return np.int64(e.value)
        if isinstance(e, tirx.FloatImm):
            return None
        if isinstance(e, tirx.Var):  # the sequence length: a shape variable of the kernel's buffers
            return self.env.get(e, np.int64(self.seq_len) if e.name == "seq_len" else None)
        if isinstance(e, ir_expr.TensorLoad):
            for index in e.indices:
                self.expr(index.base if isinstance(index, tirx.Ramp) else index, mask)
            self.access(e.source, e.indices, mask, e)
            return None
        if isinstance(e, tirx.Cast):
            value = self.expr(e.value, mask)
            return value if str(e.ty).startswith(("int", "uint", "bool")) else None
        if isinstance(e, tirx.Not):
            value = self.expr(e.a, mask)
            return None if value is None else ~np.asarray(value, bool)
        if isinstance(e, (tirx.And, tirx.Or)):
            a, b = self.expr(e.a, mask), self.expr(e.b, mask)
            if a is None or b is None:
                return None
            return np.logical_and(a, b) if isinstance(e, tirx.And) else np.logical_or(a, b)
        if isinstance(e, tirx.Select):
            return self.choose(e.condition, e.true_value, e.false_value, mask)
        if isinstance(e, ir_expr.Call):
            name = getattr(e.op, "name", "").rsplit(".", 1)[-1]  # "prim.if_then_else" in TVM 0.27
            if name == "if_then_else":
                return self.choose(*e.args, mask)
            values = [self.expr(a, mask) for a in e.args]
            if name == "likely":
                return values[0]
            if name in _CALLS and None not in values:
                return _CALLS[name](*values)
            return None
        if isinstance(e, tirx.Let):
            self.env[e.var] = self.expr(e.value, mask)
            return self.expr(e.body, mask)
        if isinstance(e, (tirx.Ramp, tirx.Broadcast)):
            self.expr(e.base if isinstance(e, tirx.Ramp) else e.value, mask)
            return None
        return None

    def choose(self, cond, yes, no, mask):
        """``cond ? yes : no`` (CUDA evaluates one side: each records its reads where it may be the one)."""
        c = self.expr(cond, mask)
        a = self.expr(yes, mask & self.may(cond, mask, True))
        b = self.expr(no, mask & self.may(cond, mask, False))
        if c is None or a is None or b is None:
            return None
        return np.where(c, a, b)

    def may(self, cond, mask, value: bool):
        """Where ``cond`` may evaluate to ``value``: a part that reads data may be either."""
        if isinstance(cond, tirx.Not):
            return self.may(cond.a, mask, not value)
        if isinstance(cond, (tirx.And, tirx.Or)):
            a, b = self.may(cond.a, mask, value), self.may(cond.b, mask, value)
            both = isinstance(cond, tirx.And) == value  # And may be true where both may; false where either may
            return a & b if both else a | b
        known = self.expr(cond, mask)
        if known is None:
            return np.ones(self.lanes, bool)
        known = np.broadcast_to(np.asarray(known, bool), (self.lanes,))
        return known if value else ~known


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


_BINARY = {
    tirx.Add: np.add,
    tirx.Sub: np.subtract,
    tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
    tirx.Div: _trunc_div,
    tirx.Mod: lambda a, b: a - _trunc_div(a, b) * b,
    tirx.Min: np.minimum,
    tirx.Max: np.maximum,
    tirx.EQ: np.equal,
    tirx.NE: np.not_equal,
    tirx.LT: np.less,
    tirx.LE: np.less_equal,
    tirx.GT: np.greater,
    tirx.GE: np.greater_equal,
    tirx.BitwiseAnd: np.bitwise_and,
    tirx.BitwiseOr: np.bitwise_or,
    tirx.BitwiseXor: np.bitwise_xor,
    tirx.LShift: np.left_shift,
    tirx.RShift: np.right_shift,
}
_CALLS = {
    "shift_left": np.left_shift,
    "shift_right": np.right_shift,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}

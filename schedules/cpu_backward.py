"""CPU backward: the recurrent kernel's gradients by backpropagation through time, compiled.

One kernel, ``recurrent_backward`` (arguments: :func:`prnn_tvm.codegen.kernel.backward_launch`):

    forward    the CPU build's own time loop (``cpu_reference.time_loop``) once more, keeping
               each step's starting states, products and product operands (the leaves the
               backward reads; the stages are recomputed from them pointwise)
    backward   for t = T-1 .. 0, with the adjoints the compiler derived from the cell's plan
               (``frontend.derivative.step_adjoints``): per phase, last first, the products'
               adjoints (the gate gradients) and what they send back through the transposed
               weights; then per (row, unit) the states' adjoints carried to step t-1, the input
               projection's and the params' adjoints; the weights' gradients accumulate
               ``sum_t dgates_t^T operand_t`` step by step. A row past its length passes its
               state adjoints through unchanged.

No derivative is written per cell. The input projection's weight gradients are GEMMs over
``d_xp`` that the caller makes (one each).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import Kernel, backward_launch, declare_args
from prnn_tvm.codegen.pointwise import adjoint_values, bind_kept_llvm, bind_value
from prnn_tvm.frontend.derivative import step_adjoints
from prnn_tvm.frontend.plan import CellPlan, Leaf

from .cpu_reference import rounded, time_loop, widen


def backward_kernel(plan: CellPlan) -> Kernel:
    """The backward of ``plan``'s recurrent kernel for the CPU (``llvm``)."""
    launch = backward_launch(plan)
    return Kernel(_build(plan, launch), "cpu_backward", launch)


def _build(plan: CellPlan, launch) -> tirx.PrimFunc:
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("recurrent_backward")
            T.func_attr({"tirx.noalias": True})
            _Backward(plan, declare_args(launch)).emit()
    return ib.get()


class _Backward:
    def __init__(self, plan: CellPlan, a):
        self.p, self.a = plan, a
        self.B, self.H, self.dt = plan.batch, plan.hidden, plan.policy.compute
        self.si = {s.name: i for i, s in enumerate(plan.states)}
        self.adj = step_adjoints(plan)
        self.stage_operands = sorted({r.operand for r in plan.reductions if r.phase > 0})
        n = a.named
        self.d_out, self.d_xp = n["d_out"], n["d_xp"]
        self.d_final = {s.name: n[f"d_{s.name}_n"] for s in plan.states}
        self.d_init = {s.name: n[f"d_{s.name}0"] for s in plan.states}
        self.d_weight = {w.name: n[f"d_{w.name}"] for w in plan.weights}
        self.d_param = {p.name: n[f"d_{p.name}"] for p in plan.params}

    def emit(self):
        p, a, B, H, dt = self.p, self.a, self.B, self.H, self.dt
        S, steps = len(p.states), a.seq_len
        # what the forward leaves for the backward: starting states, products, product operands of every step
        self.hist = T.alloc_buffer((steps, S, B, H), dt)
        self.prods = {r.name: T.alloc_buffer((steps, B, r.slices * H), dt) for r in p.reductions}
        self.opnds = {name: T.alloc_buffer((steps, B, H), dt) for name in self.stage_operands}
        self.sums = T.alloc_buffer((steps, max(1, len(p.unit_sums)), B), dt)  # each row's sums over units
        self.recompute_forward()
        self.carry = T.alloc_buffer((S, B, H), dt)      # d L / d state at the end of the step being undone
        self.next_carry = T.alloc_buffer((S, B, H), dt)
        self.d_red = {r.name: T.alloc_buffer((B, r.slices * H), dt) for r in p.reductions}
        self.d_sums = T.alloc_buffer((max(1, len(p.unit_sums)), B), dt)  # the adjoints of the rows' totals
        self.sum_index = {us.name: i for i, us in enumerate(p.unit_sums)}
        self.sent = {name: T.alloc_buffer((B, H), dt) for name in (*self.si, *self.stage_operands)}
        with T.grid(B, H) as (b, u):
            for name, i in self.si.items():
                T.buffer_store(self.carry, self.d_final[name][b, u], [i, b, u])
        self.zero(list(self.d_weight.values()) + list(self.d_param.values()))
        with T.serial(0, steps) as back:
            t = bind_value(steps - 1 - back, "t")
            for phase in reversed(range(p.phases)):
                self.sum_adjoints(t, phase)
                self.product_adjoints(t, phase)
                for name in self.stage_operands:  # adjoints of this phase's operand stages, across units
                    self.send_back(name, phase)
            for name in self.si:
                self.send_back(name, 0)
            self.pointwise_adjoints(t)
            self.weight_gradients(t)
            with T.grid(S, B, H) as (s, b, u):
                T.buffer_store(self.carry, self.next_carry[s, b, u], [s, b, u])
        with T.grid(B, H) as (b, u):
            for name, i in self.si.items():
                T.buffer_store(self.d_init[name], self.carry[i, b, u], [b, u])

    def recompute_forward(self):
        p, a = self.p, self.a

        def save(t, cur, acc, kept, live, sums):
            if p.unit_sums:
                with T.grid(len(p.unit_sums), self.B) as (i, b):
                    T.buffer_store(self.sums, sums[i, b], [t, i, b])
            with T.grid(self.B, self.H) as (b, u):
                for i in range(len(p.states)):
                    T.buffer_store(self.hist, cur[i, b, u], [t, i, b, u])
                for name in self.stage_operands:  # the value the product multiplied: rounded to storage
                    value = rounded(kept[live[Leaf("stage", name, 0)], b, u], p.dtype)
                    T.buffer_store(self.opnds[name], value, [t, b, u])
            for r in p.reductions:
                with T.grid(self.B, r.slices * self.H) as (b, j):
                    T.buffer_store(self.prods[r.name], acc[r.name][b, j], [t, b, j])

        time_loop(p, a, save)

    def zero(self, buffers):
        for buf in buffers:
            with T.grid(*buf.shape) as idx:
                T.buffer_store(buf, tirx.const(0.0, buf.dtype), list(idx) if len(buf.shape) > 1 else [idx])

    # ------------------------------------------------------------------ one step backwards
    def sum_adjoints(self, t, phase: int):
        """The adjoint of each row total of this phase's sums over units: every unit's share, added up."""
        sums = [us for us in self.p.unit_sums if us.phase == phase]
        if not sums:
            return
        with T.parallel(0, self.B) as b:
            for us in sums:
                T.buffer_store(self.d_sums, tirx.const(0.0, self.dt), [self.sum_index[us.name], b])
            with T.serial(0, self.H) as u:
                value = self.evaluator(t, b, u)
                for us in sums:
                    i = self.sum_index[us.name]
                    T.buffer_store(self.d_sums, self.d_sums[i, b] + value(Leaf("unit_sum", us.name, 0)), [i, b])

    def product_adjoints(self, t, phase: int):
        """The adjoints of this phase's products (the gate gradients), per row and unit."""
        reds = [r for r in self.p.reductions if r.phase == phase]
        if not reds:
            return
        with T.parallel(0, self.B) as b, T.serial(0, self.H) as u:
            value = self.evaluator(t, b, u)
            for r in reds:
                for s in range(r.slices):
                    T.buffer_store(self.d_red[r.name], value(Leaf("reduction", r.name, s)), [b, s * self.H + u])

    def send_back(self, operand: str, phase: int):
        """``sent[operand] = sum over the products of ``operand`` in ``phase`` of d_red @ W``: what the
        transposed weights carry back to the operand (a state from phase 0, a stage from later ones)."""
        reds = [r for r in self.p.reductions if r.operand == operand and r.phase == phase]
        if not reds:
            return
        sent, dt, H = self.sent[operand], self.dt, self.H
        with T.parallel(0, self.B) as b, T.serial(0, H) as k:
            T.buffer_store(sent, tirx.const(0.0, dt), [b, k])
            for r in reds:
                w, D = self.a.weight[r.weight], r.head_size(H)
                if D == H:
                    with T.serial(0, r.slices * H) as j:
                        T.buffer_store(sent, sent[b, k] + self.d_red[r.name][b, j] * widen(w[j, k], dt), [b, k])
                    continue
                with T.serial(0, r.slices * D) as i:  # a head-wise product: the rows of k's head
                    j = i // D * H + k // D * D + i % D
                    T.buffer_store(sent, sent[b, k] + self.d_red[r.name][b, j] * widen(w[j, k % D], dt), [b, k])

    def pointwise_adjoints(self, t):
        """Per (unit, row): the states' adjoints for step t-1, the projection's and the params' adjoints
        (units in parallel: each owns its params' entries)."""
        p, H = self.p, self.H
        fed = {r.operand for r in p.reductions if r.phase == 0}
        with T.parallel(0, H) as u, T.serial(0, self.B) as b:
            value = self.evaluator(t, b, u)
            running = self.running(t, b)
            for name, i in self.si.items():
                d = value(Leaf("state", name, 0))
                if name in fed:
                    d = d + self.sent[name][b, u]
                passed = self.carry[i, b, u]  # a row that did not run this step passes its adjoint through
                T.buffer_store(self.next_carry, d if running is None else T.if_then_else(running, d, passed),
                               [i, b, u])
            for s in range(p.input.slices):
                T.buffer_store(self.d_xp, value(Leaf("input", p.input.name, s)), [t, b, s * H + u])
            for param in p.params:
                grad = self.d_param[param.name]
                for s in range(param.slices):
                    col = s * H + u
                    T.buffer_store(grad, grad[col] + value(Leaf("param", param.name, s)), [col])

    def weight_gradients(self, t):
        """``dW[j, k] += sum_b d_red[b, j] * operand[b, k]`` for every product."""
        for r in self.p.reductions:
            grad, d_red = self.d_weight[r.weight], self.d_red[r.name]
            operand = ((lambda b, k, r=r: self.hist[t, self.si[r.operand], b, k]) if r.phase == 0 else
                       (lambda b, k, r=r: self.opnds[r.operand][t, b, k]))
            D = r.head_size(self.H)
            with T.parallel(0, r.slices * self.H) as j, T.serial(0, D) as k:
                column = k if D == self.H else (j % self.H) // D * D + k  # a head-wise product's: j's head
                with T.serial(0, self.B) as b:
                    T.buffer_store(grad, grad[j, k] + d_red[b, j] * operand(b, column), [j, k])

    # ------------------------------------------------------------------ leaf values of one (step, row, unit)
    def running(self, t, b):
        return None if self.a.lengths is None else t < self.a.lengths[b]

    def evaluator(self, t, b, u):
        """``value(leaf)``: the adjoint of ``leaf`` at (t, b, u) (``codegen.pointwise.adjoint_values``). Forward
        leaves load what the recompute kept; incoming adjoints are the carried ones plus the output's
        gradient, zero for a row past its length; operand adjoints are what the later phase sent back."""
        p, a, H, dt = self.p, self.a, self.H, self.dt
        running = self.running(t, b)

        def forward(leaf: Leaf):
            if leaf.kind == "input":
                return widen(a.xp[t, b, leaf.slice * H + u], dt)
            if leaf.kind == "param":
                return widen(a.param[leaf.name][leaf.slice * H + u], dt)
            if leaf.kind == "state":
                return self.hist[t, self.si[leaf.name], b, u]
            if leaf.kind == "unit_sum":
                return self.sums[t, self.sum_index[leaf.name], b]
            return self.prods[leaf.name][t, b, leaf.slice * H + u]

        def incoming(name: str):
            d = self.carry[self.si[name], b, u]
            if name == p.output:
                d = d + widen(self.d_out[t, b, u], dt)
            return d if running is None else T.if_then_else(running, d, tirx.const(0.0, dt))

        # each value kept as one (bind_kept_llvm): TVM's simplifier would copy a stage into every adjoint reading it
        return adjoint_values(p, self.adj, forward, incoming, lambda name: self.sent[name][b, u], bind_kept_llvm,
                              lambda name: self.d_sums[self.sum_index[name], b])

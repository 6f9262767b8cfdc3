"""CPU reference template: the same cell plan, time loop outermost, no barriers.

It runs anywhere LLVM does and is what CI checks the compiler's numerics with: the
analysis, the per-unit pointwise lowering and the kernel argument layout are the ones
the GPU template uses; only the placement differs (plain loops, products parallel over
rows).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from prnn_tvm.analysis import CellPlan, Leaf
from prnn_tvm.kernel import Kernel, declare_args
from prnn_tvm.pointwise import emit_unit_math

NAME = "cpu_reference"


def apply(plan: CellPlan, target, gpu=None, config=None) -> Kernel | None:
    """Build the CPU kernel for an ``llvm`` target; None for any other target."""
    if target.kind.name != "llvm":
        return None
    if config is not None:
        raise ValueError("the CPU reference template has no config")
    return Kernel(_build(plan), NAME)


def _build(plan: CellPlan) -> tirx.PrimFunc:
    B, H, dt = plan.batch, plan.hidden, plan.dtype
    states = [s.name for s in plan.states]
    si = {name: i for i, name in enumerate(states)}
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("recurrent")
            T.func_attr({"tirx.noalias": True})
            a = declare_args(plan, workspace=None)
            cur = T.alloc_buffer((len(states), B, H), dt)
            nxt = T.alloc_buffer((len(states), B, H), dt)
            acc = {r.name: T.alloc_buffer((B, r.slices * H), dt) for r in plan.reductions}
            with T.grid(B, H) as (b, u):
                for name in states:
                    T.buffer_store(cur, a.init[name][b, u], [si[name], b, u])
            with T.serial(0, a.seq_len) as t:
                for r in plan.reductions:
                    rows = r.slices * H
                    w = a.weight[r.weight]
                    with T.parallel(0, B * rows) as i:
                        b, j = i // rows, i % rows
                        T.buffer_store(acc[r.name], tirx.const(0.0, dt), [b, j])
                        with T.serial(0, H) as k:
                            T.buffer_store(acc[r.name], acc[r.name][b, j] + cur[si[r.state], b, k] * w[j, k],
                                           [b, j])
                with T.parallel(0, B) as b, T.serial(0, H) as u:
                    def load(leaf: Leaf, b=b, u=u):
                        col = leaf.slice * H + u
                        if leaf.kind == "input":
                            return a.xp[t, b, col]
                        if leaf.kind == "state":
                            return cur[si[leaf.name], b, u]
                        if leaf.kind == "param":
                            return a.param[leaf.name][col]
                        return acc[leaf.name][b, col]

                    new = emit_unit_math(plan, load, _bind)
                    for name in states:
                        T.buffer_store(nxt, new[name], [si[name], b, u])
                    T.buffer_store(a.out, new[plan.output], [t, b, u])
                with T.grid(len(states), B, H) as (s, b, u):
                    T.buffer_store(cur, nxt[s, b, u], [s, b, u])
            with T.grid(B, H) as (b, u):
                for name in states:
                    T.buffer_store(a.final[name], cur[si[name], b, u], [b, u])
    return ib.get()


def _bind(expr, name: str):
    return T.bind(expr, var=tirx.Var(name, expr.ty))

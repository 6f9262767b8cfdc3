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

from prnn_tvm.codegen.kernel import Kernel, declare_args, recurrent_launch
from prnn_tvm.codegen.pointwise import emit_phase, live_index, new_state_values
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan, Leaf

NO_KNOBS = "the CPU reference template has no config; pass config only for target 'cuda'"


class CpuReference:
    """The template's contract (``schedules.template.Template``) for ``llvm`` targets; it has no knobs."""

    name = "cpu_reference"
    config_type = None

    def accepts(self, plan: CellPlan, target) -> bool:
        return target.kind.name == "llvm"

    def apply(self, plan: CellPlan, target, gpu=None, config=None) -> Kernel:
        if config is not None:
            raise ConfigError(NO_KNOBS)
        launch = recurrent_launch(plan)
        return Kernel(_build(plan, launch), self.name, launch)

    def default_configs(self, plan: CellPlan, target, gpu=None) -> list:
        return []

    def space(self, plan: CellPlan, gpu) -> list:
        return []

    def validate(self, config, plan: CellPlan, gpu) -> None:
        raise ConfigError(NO_KNOBS)

    def features(self, config, plan: CellPlan, gpu) -> dict:
        raise ConfigError(NO_KNOBS)

    def config_from_dict(self, knobs: dict):
        raise ConfigError(NO_KNOBS)


TEMPLATE = CpuReference()


def _build(plan: CellPlan, launch) -> tirx.PrimFunc:
    B, H = plan.batch, plan.hidden
    dt = plan.policy.compute  # the loop nest keeps every intermediate in the compute type
    states = [s.name for s in plan.states]
    si = {name: i for i, name in enumerate(states)}
    live = live_index(plan)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("recurrent")
            T.func_attr({"tirx.noalias": True})
            a = declare_args(launch)
            cur = T.alloc_buffer((len(states), B, H), dt)
            nxt = T.alloc_buffer((len(states), B, H), dt)
            kept = T.alloc_buffer((max(1, len(live)), B, H), dt)  # live-outs of every phase
            acc = {r.name: T.alloc_buffer((B, r.slices * H), dt) for r in plan.reductions}
            with T.grid(B, H) as (b, u):
                for name in states:
                    T.buffer_store(cur, a.init[name][b, u], [si[name], b, u])
            with T.serial(0, a.seq_len) as t:
                for phase in range(plan.phases):
                    for r in (r for r in plan.reductions if r.phase == phase):
                        _product(r, a, acc[r.name], cur, si, kept, live, H)
                    with T.parallel(0, B) as b, T.serial(0, H) as u:
                        for leaf, value in emit_phase(plan, phase, _loader(a, t, b, u, cur, si, acc, kept, live, H),
                                                      _bind).items():
                            T.buffer_store(kept, value, [live[leaf], b, u])
                with T.parallel(0, B) as b, T.serial(0, H) as u:
                    load = _loader(a, t, b, u, cur, si, acc, kept, live, H)
                    new = new_state_values(plan, load)
                    for name in states:
                        T.buffer_store(nxt, new[name], [si[name], b, u])
                    T.buffer_store(a.out, new[plan.output], [t, b, u])
                with T.grid(len(states), B, H) as (s, b, u):
                    T.buffer_store(cur, nxt[s, b, u], [s, b, u])
            with T.grid(B, H) as (b, u):
                for name in states:
                    T.buffer_store(a.final[name], cur[si[name], b, u], [b, u])
    return ib.get()


def _product(r, a, acc, cur, si, kept, live, H):
    """acc[b, j] = sum_k operand[b, k] * W[j, k], the operand a state or a live-out stage of this step."""
    rows, w = r.slices * H, a.weight[r.weight]
    operand = (lambda b, k: cur[si[r.operand], b, k]) if r.phase == 0 else \
        (lambda b, k: kept[live[Leaf("stage", r.operand, 0)], b, k])
    with T.parallel(0, acc.shape[0] * rows) as i:
        b, j = i // rows, i % rows
        T.buffer_store(acc, tirx.const(0.0, acc.dtype), [b, j])
        with T.serial(0, H) as k:
            T.buffer_store(acc, acc[b, j] + operand(b, k) * w[j, k], [b, j])


def _loader(a, t, b, u, cur, si, acc, kept, live, H):
    def load(leaf: Leaf):
        col = leaf.slice * H + u
        if leaf.kind == "input":
            return a.xp[t, b, col]
        if leaf.kind == "state":
            return cur[si[leaf.name], b, u]
        if leaf.kind == "param":
            return a.param[leaf.name][col]
        if leaf.kind == "stage":  # computed in an earlier phase
            return kept[live[leaf], b, u]
        return acc[leaf.name][b, col]
    return load


def _bind(expr, name: str):
    return T.bind(expr, var=tirx.Var(name, expr.ty))

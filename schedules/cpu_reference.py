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

from prnn_tvm.codegen.kernel import Kernel, StepTiming, declare_args, recurrent_launch
from prnn_tvm.codegen.pointwise import as_type, bind_value, emit_phase, live_index, new_state_values
from prnn_tvm.dtypes import POLICIES
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan, Leaf

from .template import ACCEPTED, Acceptance, refused

NO_KNOBS = "the CPU reference template has no config; pass config only for target 'cuda'"


class CpuReference:
    """The template's contract (``schedules.template.Template``) for ``llvm`` targets; it has no knobs."""

    name = "cpu_reference"
    config_type = None

    def accepts(self, plan: CellPlan, target) -> Acceptance:
        if target.kind.name != "llvm":
            return refused(f"places CPU (llvm) kernels, not {target.kind.name}")
        return ACCEPTED

    def apply(self, plan: CellPlan, target, gpu=None, config=None) -> Kernel:
        if config is not None:
            raise ConfigError(NO_KNOBS)
        launch = recurrent_launch(plan)
        return Kernel(_build(plan, launch), self.name, launch)

    def default_configs(self, plan: CellPlan, target, gpu=None) -> list:
        return []

    def space(self, plan: CellPlan, gpu) -> list:
        return []

    def carried_over(self, config, plan: CellPlan, gpu):
        return None

    def validate(self, config, plan: CellPlan, gpu) -> None:
        raise ConfigError(NO_KNOBS)

    def geometry(self, config, plan: CellPlan):
        return None

    def features(self, config, plan: CellPlan, gpu) -> dict:
        raise ConfigError(NO_KNOBS)

    def config_from_dict(self, knobs: dict):
        raise ConfigError(NO_KNOBS)


TEMPLATE = CpuReference()


def _build(plan: CellPlan, launch) -> tirx.PrimFunc:
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("recurrent")
            T.func_attr({"tirx.noalias": True})
            time_loop(plan, declare_args(launch))
    return ib.get()


def time_loop(plan: CellPlan, a, save=None) -> None:
    """The layer's time loop over the declared arguments ``a`` (:func:`~prnn_tvm.codegen.kernel.declare_args`),
    inside a ``T.prim_func()`` frame. ``save(t, cur, acc, kept, live, sums)``, when given, is called at the end
    of every step, before the new states replace ``cur`` (the states the step started from): what a
    backward kernel recomputes the step's leaves from (``sums``: each row's sums over units, by
    :class:`UnitSums`' index). ``a.out`` None: no output sequence is written."""
    if save is not None and plan.untrainable:
        raise ConfigError(plan.untrainable)
    B, H = plan.batch, plan.hidden
    dt = plan.policy.compute  # the loop nest keeps every intermediate in the compute type
    storage = plan.dtype
    states = [s.name for s in plan.states]
    si = {name: i for i, name in enumerate(states)}
    live = live_index(plan)
    cur = T.alloc_buffer((len(states), B, H), dt)
    nxt = T.alloc_buffer((len(states), B, H), dt)
    kept = T.alloc_buffer((max(1, len(live)), B, H), dt)  # live-outs of every phase
    acc = {r.name: T.alloc_buffer((B, r.slices * H), dt) for r in plan.reductions}
    sums = UnitSums(plan, T.alloc_buffer((max(1, len(plan.unit_sums)), B), dt))  # each row's sums over units
    with T.grid(B, H) as (b, u):
        for name in states:
            T.buffer_store(cur, widen(a.init[name][b, u], dt), [si[name], b, u])
    with T.serial(0, a.seq_len + plan.lag) as t:
        def timing(b):
            return StepTiming(plan, a, t, a.lengths[b] if a.lengths is not None else None)
        for phase in range(plan.phases):
            for r in (r for r in plan.reductions if r.phase == phase):
                _product(r, a, acc[r.name], cur, si, kept, live, H)
            with T.parallel(0, B) as b:
                sums.clear(phase, b)
                with T.serial(0, H) as u:
                    load = _loader(a, timing(b), b, u, cur, si, acc, kept, live, H, sums)
                    for leaf, value in emit_phase(plan, phase, load, bind_value, sums=plan.sums_of(phase)).items():
                        if leaf.kind == "share":
                            sums.add(leaf.name, b, value)
                        else:
                            T.buffer_store(kept, value, [live[leaf], b, u])
        with T.parallel(0, B) as b, T.serial(0, H) as u:
            row = timing(b)
            load = _loader(a, row, b, u, cur, si, acc, kept, live, H, sums)
            new = new_state_values(plan, load)
            for name in states:  # exchanged states round to storage each step, as on the GPU
                value = new[name] if name in plan.private_states else rounded(new[name], storage)
                running = row.running(name)  # a row past its length (or a stack's layer not yet started) keeps still
                if running is not None:
                    value = T.if_then_else(running, value, cur[si[name], b, u])
                T.buffer_store(nxt, value, [si[name], b, u])
            if a.out is not None:
                row.write_outputs(a.out, {name: as_type(new[name], storage) for name in plan.outputs}, b, u)
        if save is not None:
            save(t, cur, acc, kept, live, sums.buffer)
        with T.grid(len(states), B, H) as (s, b, u):
            T.buffer_store(cur, nxt[s, b, u], [s, b, u])
    if a.final:
        with T.grid(B, H) as (b, u):
            for name in states:
                T.buffer_store(a.final[name], as_type(cur[si[name], b, u], storage), [b, u])


def _product(r, a, acc, cur, si, kept, live, H):
    """acc[b, j] = sum_k operand[b, k] * W[j, k], the operand a state or a live-out stage of this step; for a
    head-wise product, over the ``D`` units of row ``j``'s head (``k`` from ``(j % H) // D * D``)."""
    rows, w = r.slices * H, a.weight[r.weight]
    dt = acc.dtype
    storage = w.dtype  # a stage of this step is exchanged in the storage type, as states are
    operand = (lambda b, k: cur[si[r.operand], b, k]) if r.phase == 0 else \
        (lambda b, k: rounded(kept[live[Leaf("stage", r.operand, 0)], b, k], storage))
    D = r.head_size(H)
    with T.parallel(0, acc.shape[0] * rows) as i:
        b, j = i // rows, i % rows
        T.buffer_store(acc, tirx.const(0.0, acc.dtype), [b, j])
        with T.serial(0, D) as k:
            column = k if D == H else (j % H) // D * D + k
            T.buffer_store(acc, acc[b, j] + operand(b, column) * widen(w[j, k], dt), [b, j])


class UnitSums:
    """Each batch row's sums over units (``CellPlan.unit_sums``) in ``buffer`` (sums x batch): a phase adds every
    unit's share of the sums the next phase reads (``CellPlan.sums_of``)."""

    def __init__(self, plan: CellPlan, buffer):
        self.plan, self.buffer = plan, buffer
        self.index = {us.name: i for i, us in enumerate(plan.unit_sums)}

    def clear(self, phase: int, b):
        for us in self.plan.sums_of(phase):
            T.buffer_store(self.buffer, tirx.const(0.0, self.buffer.dtype), [self.index[us.name], b])

    def add(self, name: str, b, share):
        T.buffer_store(self.buffer, self.buffer[self.index[name], b] + share, [self.index[name], b])

    def value(self, name: str, b):
        return self.buffer[self.index[name], b]


def _loader(a, timing, b, u, cur, si, acc, kept, live, H, sums: UnitSums):
    """Where each leaf of unit ``u`` of row ``b`` lives; ``timing`` (the row's :class:`StepTiming`) says
    which step of the input projection it reads."""
    def load(leaf: Leaf):
        col = leaf.slice * H + u
        if leaf.kind == "unit_sum":
            return sums.value(leaf.name, b)
        if leaf.kind == "input":
            return as_type(a.xp[timing.input_step(leaf.slice), b, col], cur.dtype)
        if leaf.kind == "state":
            return cur[si[leaf.name], b, u]
        if leaf.kind == "param":
            return widen(a.param[leaf.name][col], cur.dtype)
        if leaf.kind == "stage":  # computed in an earlier phase
            return kept[live[leaf], b, u]
        return acc[leaf.name][b, col]
    return load


def _through_bits(dtype: str) -> bool:
    """Whether TVM 0.27's LLVM code generator needs ``dtype`` cast on its bits (the dtype policy says)."""
    return dtype in POLICIES and POLICIES[dtype].cast_through_bits


def widen(expr, dt: str):
    """A storage value in the compute type ``dt``. bfloat16 (``cast_through_bits`` in its dtype policy) widens
    through its bits: TVM 0.27's LLVM bfloat16 legalization turns a let-bound ``Cast(float32, bf16 value)``
    into a cast of the raw bits."""
    if _through_bits(str(expr.ty.dtype)):
        return T.reinterpret(dt, T.shift_left(T.Cast("uint32", T.reinterpret("uint16", expr)), T.uint32(16)))
    return as_type(expr, dt)


def rounded(value, storage: str):
    """A compute-type value rounded to ``storage`` and back: what another block reads of it on the GPU.
    bfloat16 rounds (to nearest even) on the bits, for the reason of :func:`widen`."""
    dt = str(value.ty.dtype)
    if not _through_bits(storage):
        return as_type(as_type(value, storage), dt)
    bits = T.reinterpret("uint32", value)
    bits = bits + T.uint32(0x7FFF) + (T.shift_right(bits, T.uint32(16)) & T.uint32(1))
    return T.reinterpret(dt, bits & T.uint32(0xFFFF0000))


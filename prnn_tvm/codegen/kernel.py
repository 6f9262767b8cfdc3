"""What a schedule template returns, and the argument list every recurrent kernel shares.

The recurrent kernel's arguments, in order (shapes for batch B, hidden H, T steps):

    xp          (T, B, slices*H)   the input projection of every step
    <weight>    (slices*H, H)      each recurrent weight, in declaration order
    <param>     (slices*H,)        each per-unit parameter, in declaration order
    <state>0    (B, H)             each initial state
    out         (T, B, H)          the output state at every step
    <state>_n   (B, H)             each final state
    workspace   (E, 2, B, H)       only for templates that ask for one (float32, or uint64
                                   tagged values with the ``tags`` barrier)
    sync, timeout_us, stall_step   only with a stateful grid barrier (prnn_tvm.barrier)

T is symbolic: one kernel serves every sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ..frontend.plan import CellPlan

SEQ_LEN = "seq_len"


@dataclass(frozen=True)
class Kernel:
    """A recurrent kernel made by a schedule template.

    ``workspace`` is the shape of the scratch argument (of ``workspace_dtype``), or None;
    ``sync_words`` the size of the barrier state the kernel takes after it, or None;
    ``launch`` describes the grid for reports and pre-launch checks (empty on CPU).
    """

    func: tirx.PrimFunc
    template: str
    config: object | None = None
    launch: dict = field(default_factory=dict)
    workspace: tuple | None = None
    sync_words: int | None = None
    workspace_dtype: str = "float32"


def declare_args(plan: CellPlan, workspace: tuple | None, workspace_dtype: str = "float32") -> SimpleNamespace:
    """Declare the kernel's buffer arguments inside a ``T.prim_func()`` frame.

    Returns a namespace with ``seq_len``, ``xp``, ``out``, ``ws`` and dicts ``weight``,
    ``param``, ``init``, ``final`` keyed by declared name.
    """
    B, H, dt = plan.batch, plan.hidden, plan.dtype
    seq_len = tirx.Var(SEQ_LEN, "int32")

    def arg(name, shape, dtype=dt):
        return T.arg(name, T.buffer(shape, dtype, buffer_name=name))

    a = SimpleNamespace(seq_len=seq_len)
    a.xp = arg("xp", (seq_len, B, plan.input.slices * H))
    a.weight = {w.name: arg(w.name, (w.slices * H, H)) for w in plan.weights}
    a.param = {p.name: arg(p.name, (p.slices * H,)) for p in plan.params}
    a.init = {s.name: arg(f"{s.name}0", (B, H)) for s in plan.states}
    a.out = arg("out", (seq_len, B, H))
    a.final = {s.name: arg(f"{s.name}_n", (B, H)) for s in plan.states}
    a.ws = arg("workspace", workspace, workspace_dtype) if workspace else None
    return a

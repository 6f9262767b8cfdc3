"""A launch that starts before its input projection is complete: the projection arrives in chunks of steps during it.

Where a layer's grid leaves most SMs free (head-wise layers, a CTA per head), its caller may run the projection in
chunks on another stream, beside the recurrence, and launch the recurrent kernel after the first chunk
(``prnn_tvm.torch.overlap``). The kernel then takes :data:`~prnn_tvm.signature.XP_READY_SCALARS`: before its first
load of a chunk's first step, each thread waits for the chunk's flag (``prnn_tvm/codegen/barriers/xp_ready.cuh``: an
epoch per call, so flags are never reset), once per chunk, bounded by the layer's barrier timeout. A wait that gives
up writes the host word the caller raises from, and fills the projection's registers of that step and every later
one with NaN, so that every later output and the final states are NaN: never a hang, never a result that looks
valid. With ``xp_flags`` 0 (the runtime's own call, an exported layer) the kernel waits for nothing.

The projection ``xp`` is then declared without ``__restrict__``: another kernel writes it while this one runs.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.source import cuda_source
from prnn_tvm.codegen.pointwise import as_type
from prnn_tvm.signature import XP_READY_SCALARS, Arg, ArgRole


class XpReady:
    """Mixin of the tensor-core builder (before ``WarpGates``): the flag wait beside the loads of the projection, where
    :attr:`waits_for_projection`."""

    @property
    def waits_for_projection(self) -> bool:
        """Whether the kernel takes the chunk flags: ``gate_layout="in_warp"`` loading each step's projection during
        the step before (``block``), one direction reading the projection step by step in order (no stack's lag, no
        reversed slices), not a training forward, nor a kernel that projects its input itself (the session and projected
        modes, ``schedules/session.py``: their ``input_size``)."""
        p, own_projection = self.p, getattr(self, "input_size", None) is not None
        elsewhere = self.save or p.lag or p.reversed_slices or own_projection
        return bool(self.c.in_warp and self.inputs_early and not elsewhere)

    def _launch(self):
        launch = super()._launch()
        if not self.waits_for_projection:
            return launch
        added = tuple(Arg(name, ArgRole.SCALAR, (), dtype) for name, dtype in XP_READY_SCALARS.items())
        return dataclasses.replace(launch, args=launch.args + added)

    @property
    def plain_args(self) -> tuple:
        return (*super().plain_args, "xp") if self.waits_for_projection else super().plain_args

    def alloc_loop_state(self):
        super().alloc_loop_state()
        if self.waits_for_projection:  # whether a wait of this thread gave up (then every later step is NaN)
            self.xp_gave_up = T.alloc_buffer((1,), "int32", scope="local")
            T.buffer_store(self.xp_gave_up, 0, [0])

    def load_inputs(self, t, regs=None):
        if not self.waits_for_projection:
            super().load_inputs(t, regs)
            return
        named = self.a.named
        wait = T.cuda.func_call(
            "prnn_xp_wait",
            named["xp_flags"],
            named["xp_chunk"],
            t,
            named["xp_timeout_us"],
            named["xp_error_host"],
            self.xp_gave_up[0],
            source_code=cuda_source("xp_ready.cuh"),
            return_type="int32",
        )
        T.buffer_store(self.xp_gave_up, wait, [0])
        super().load_inputs(t, regs)
        regs = self.xreg if regs is None else regs
        nan = as_type(T.reinterpret("float32", tirx.const(0x7FC00000, "uint32")), str(regs.dtype))
        with T.If(self.xp_gave_up[0] != 0):
            with T.Then():
                for i in range(int(regs.shape[0])):
                    T.buffer_store(regs, nan, [i])

"""A launch that starts before its input projection is complete: the projection arrives in chunks of steps during it.

Where a layer's grid leaves most SMs free (head-wise layers, a CTA per head), its caller may run the projection in
chunks on another stream, beside the recurrence, and launch the recurrent kernel after the first chunk
(``prnn_tvm.torch.overlap``). That call launches a variant of the layer's recurrent kernel, built with the layer's
config only where it is used (``prnn_tvm.xp_ready_build``; the layer's own kernel stays as it was: the wait and the
projection without ``__restrict__`` cost its step registers and time). The variant takes
:data:`~prnn_tvm.signature.XP_READY_SCALARS`: before its first load of a chunk's first step, each thread waits for the
chunk's flag (``prnn_tvm/codegen/barriers/xp_ready.cuh``: an epoch per call, so flags are never reset), once per
chunk, bounded by the layer's barrier timeout. A wait that gives up writes the host word the caller raises from, and
makes the projection of that step and every later one NaN where the step reads it, so that every later output and the
final states are NaN: never a hang, never a result that looks valid. With ``xp_flags`` 0 it waits for nothing.

The projection ``xp`` is declared without ``__restrict__`` there: another kernel writes it while this one runs (nor may
its loads take the non-coherent path, ``ld.global.nc``, which ``__restrict__`` on a read-only argument allows).
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.source import cuda_source
from prnn_tvm.codegen.pointwise import as_type
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import XP_READY_SCALARS, Arg, ArgRole


def xp_ready_builder(builder: type) -> type:
    """The template's kernel builder whose kernel waits for its projection's chunks (see the module's doc)."""
    return type(f"XpReady{builder.__name__}", (XpReadyMode, builder), {})


class XpReadyMode:
    """Mixin over the tensor-core template's builder: the flag wait beside the loads of the projection. ConfigError
    where the kernel does not load each step's projection during the step before, in order, from a projection of
    another launch: ``gate_layout="in_warp"`` with a ``block`` barrier, one direction, no stack's lag, not a training
    forward, nor a kernel that projects its input itself (``schedules/session.py``, ``schedules/projected.py``)."""

    def _launch(self):
        launch = super()._launch()
        p = self.p
        early = getattr(self.c, "in_warp", False) and self.inputs_early
        if not early or self.save or p.lag or p.reversed_slices or getattr(self, "input_size", None) is not None:
            raise ConfigError(
                f"{self.c} does not load each step's input projection a step ahead, in order, from another launch "
                "(gate_layout='in_warp' with a block barrier, one direction, no stack): its projection runs before "
                "its launch"
            )
        added = tuple(Arg(name, ArgRole.SCALAR, (), dtype) for name, dtype in XP_READY_SCALARS.items())
        return dataclasses.replace(launch, args=launch.args + added)

    @property
    def plain_args(self) -> tuple:
        return (*super().plain_args, "xp")

    def alloc_loop_state(self):
        super().alloc_loop_state()
        # 1 + the step whose wait gave up in this thread, 0: none (then that step and every later one is NaN)
        self.xp_gave_up = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(self.xp_gave_up, 0, [0])

    def load_inputs(self, t, regs=None):
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

    def loader(self, t, it, group, b, unit, ul):
        """The template's, an input of a step whose wait (or an earlier one) gave up NaN: chosen where the step reads
        it, not written over the registers its load fills (which would wait for the load there, a step early)."""
        load = super().loader(t, it, group, b, unit, ul)
        gave_up = self.xp_gave_up[0]
        nan = as_type(T.reinterpret("float32", tirx.const(0x7FC00000, "uint32")), self.compute_dt)

        def poisoned(leaf):
            value = load(leaf)
            if leaf.kind != "input":
                return value
            return T.if_then_else(tirx.all(gave_up != 0, t + 1 >= gave_up), nan, value)

        return poisoned

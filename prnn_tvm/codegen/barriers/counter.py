"""``counter``: one monotonic arrival counter. Thread 0 of each block adds with a gpu-scope *release* reduction
after a block barrier (cumulative over the block's writes), polls with *acquire* loads, and a block barrier
publishes the result. As fast as ``grid.sync()``, and bounded (``base``: the protocol). Device code:
``counter.cuh``."""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .base import Barrier
from .source import cuda_source


class Counter(Barrier):
    """The arrival counter between steps; the plain exchange. Step ``s`` waits for count
    ``(base + s + 1) * ctas``, compared wrap-safe."""

    name = "counter"
    function = "prnn_barrier_counter"

    def emit_wait(self, ordinal, base, args, stall) -> None:
        stall = args.stall_step if stall is None else stall
        call = T.cuda.func_call(
            self.function,
            args.sync.data,
            base,
            ordinal,
            args.timeout_us,
            stall,
            source_code=cuda_source("counter.cuh"),
            return_type="int32",
        )
        abort = T.bind(call, var=tirx.Var("barrier_abort", "int32"))
        with T.If(abort != 0):
            with T.Then():
                T.Break()

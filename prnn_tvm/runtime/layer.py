"""A compiled layer: the run-time half (:mod:`prnn_tvm.runtime`) plus what compiled it.

Call order (positional or by keyword): ``x, W_ih, b_ih``, the cell's recurrent weights
and per-unit params in declaration order, then the initial states (``h0``, ``c0``, ...;
zeros when omitted). ``Layer.recurrent`` takes the precomputed projection ``xp`` in
place of ``x, W_ih, b_ih``. Arrays may be NumPy (copied to the device; NumPy comes back)
or anything with ``__dlpack__`` on the layer's device (wrapped without a copy; TVM
tensors, which speak DLPack, come back).
"""

from __future__ import annotations

import tvm

from ..codegen.kernel import Kernel
from ..errors import PrnnError
from ..frontend.plan import CellPlan
from ..reference import layer_arg_names
from ..report import CompileReport
from ..target import GpuSpec, local_gpu
from .base import LaunchSpec, RuntimeLayer


class Layer(RuntimeLayer):
    """A recurrent layer compiled for one cell, batch, hidden size and target.

    Use :func:`prnn_tvm.compile_cell` to make one. ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)``
    returns ``(out, (h_n, c_n, ...))`` with ``out`` of shape (T, batch, hidden);
    :func:`prnn_tvm.export` writes it to a shared library that :func:`prnn_tvm.load` runs
    with the TVM runtime alone.

    ``barrier_timeout_us`` bounds every grid-barrier wait (a timeout raises
    :class:`~prnn_tvm.barrier.BarrierTimeout`); ``debug_stall_step`` (tests only) makes block 0
    skip its arrival at that step, forcing the timeout path.
    """

    def __init__(self, plan: CellPlan, kernel: Kernel, module, input_size: int, target: tvm.target.Target,
                 gpu: GpuSpec | None, report: CompileReport, source: str | None):
        self.plan, self.kernel = plan, kernel
        self.target, self.gpu = target, gpu
        self.report, self.cuda_source = report, source
        super().__init__(launch_spec(plan, kernel, input_size, report), module, target.kind.name == "cuda")

    @property
    def device(self) -> tvm.runtime.Device:
        if self.is_cuda and (local_gpu() is None or not self.module.imports
                             or self.module.imports[0].kind != "cuda"):
            raise PrnnError("this layer was compiled for CUDA on a machine without a usable GPU, so it holds "
                            "CUDA source only; compile it where the GPU is (or use target='llvm' to run on the CPU)")
        return super().device


def launch_spec(plan: CellPlan, kernel: Kernel, input_size: int, report: CompileReport) -> LaunchSpec:
    """What calling the compiled kernels needs, as plain data (kept with an exported library too)."""
    H = plan.hidden
    launch = {k: v for k, v in kernel.launch.items() if k != "geometry"}
    geometry = kernel.launch.get("geometry")
    registers = report.registers or (geometry.regs_estimate if geometry is not None else None)
    shapes = {w.name: (w.slices * H, H) for w in plan.weights}
    shapes.update({p.name: (p.slices * H,) for p in plan.params})
    return LaunchSpec(
        cell=plan.cell.name, arg_names=tuple(layer_arg_names(plan)), batch=plan.batch, hidden=H,
        input_size=input_size, proj_width=plan.input.slices * H, shapes=shapes,
        states=tuple(s.name for s in plan.states), dtype=plan.dtype,
        workspace=tuple(kernel.workspace) if kernel.workspace is not None else None,
        workspace_dtype=kernel.workspace_dtype, sync_words=kernel.sync_words, launch=launch,
        registers=registers, static_smem_bytes=report.static_smem_bytes or 0)

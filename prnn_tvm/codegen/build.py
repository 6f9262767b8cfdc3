"""Build a compiled layer: input projection + recurrent kernel in one TVM module.

Two things here are project-owned on purpose:

- a TIR pipeline ("prnn") that lowers the hand-placed recurrent kernel with TVM's
  ``tirx`` pipeline (placement kept exactly as written: no automatic syncs, no buffer
  compaction) and everything else (the dlight-scheduled projection) with the default one;
- CUDA compilation through nvcc (``prnn_tvm.codegen.ptxas``), so that every kernel comes with its
  ptxas report (registers, spills). Without a GPU, TVM emits source only and the report
  comes from compiling that source for the target arch here.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.tirx.compilation_pipeline import get_tir_pipeline, register_tir_pipeline

from ..frontend.plan import CellPlan
from ..target import GpuSpec
from . import ptxas
from .kernel import HAND_PLACED, Kernel
from .projection import projection_func

log = logging.getLogger(__name__)

PIPELINE = "prnn"


def _prnn_pipeline():
    default, finalize_host, finalize_device = get_tir_pipeline("s_tir")
    exact, _, _ = get_tir_pipeline("tirx")

    @tvm.transform.module_pass(opt_level=0)
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        placed = {gv: f for gv, f in mod.functions.items() if f.attrs and f.attrs.get(HAND_PLACED)}
        rest = {gv: f for gv, f in mod.functions.items() if gv not in placed}
        out = {}
        for funcs, pipeline in ((placed, exact), (rest, default)):
            if funcs:
                out.update(pipeline(tvm.IRModule(funcs)).functions)
        return tvm.IRModule(out)

    return _pipeline, finalize_host, finalize_device


register_tir_pipeline(PIPELINE, _prnn_pipeline)


@contextlib.contextmanager
def nvcc_compile(arch: str, reports: list):
    """Route TVM's CUDA compilation through nvcc for ``arch`` while building; restore after."""
    name = "tvm_callback_cuda_compile"
    previous = tvm.get_global_func(name, allow_missing=True)

    def compile_with_nvcc(code, *_):
        cubin, report = ptxas.compile_cuda(code, arch)
        reports.append(report)
        return bytearray(cubin)

    tvm_ffi.register_global_func(name, compile_with_nvcc, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)
        else:
            tvm_ffi.remove_global_func(name)


@dataclass(frozen=True)
class Built:
    """A compiled layer module: the runtime module, the CUDA source (None on the CPU) and ptxas's
    report (None on the CPU, or when nvcc is missing: ``note`` says why)."""

    module: object
    source: str | None = None
    ptxas: ptxas.PtxasReport | None = None
    note: str = ""

    @property
    def recurrent(self) -> ptxas.FunctionReport | None:
        return self.ptxas.function("recurrent") if self.ptxas is not None else None

    @property
    def spill_bytes(self) -> int:
        """The recurrent kernel's spill bytes (0 when not known)."""
        return self.recurrent.spills if self.recurrent is not None else 0


def build_module(plan: CellPlan, kernel: Kernel, input_size: int, target: tvm.target.Target,
                 gpu: GpuSpec | None) -> Built:
    """Compile the layer's functions (input projection, recurrent kernel) into one module (see
    :func:`build_functions`)."""
    return build_functions({"recurrent": kernel.func, "projection": projection_func(plan, input_size, target)},
                           target, gpu)


def build_functions(funcs: dict, target: tvm.target.Target, gpu: GpuSpec | None) -> Built:
    """Compile ``{name: PrimFunc}`` into one module, each function exported as its name.

    On a host whose CUDA runtime is loaded the module holds a cubin built by nvcc; otherwise
    CUDA builds hold source only and cannot run here, and the source is compiled with nvcc
    for ``gpu.arch`` anyway, to get ptxas's report.
    """
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    if target.kind.name != "cuda":
        return Built(tvm.tirx.build(mod, target=target, pipeline=PIPELINE))
    reports: list = []
    with target, nvcc_compile(gpu.arch, reports):
        lib = tvm.tirx.build(mod, target=target, pipeline=PIPELINE)
    source = lib.imports[0].inspect_source()
    if reports:
        return Built(lib, source, reports[-1])
    try:
        return Built(lib, source, ptxas.compile_cuda(source, gpu.arch)[1])
    except ptxas.NvccNotFound as err:
        note = str(err).splitlines()[0]
        log.warning("no ptxas report: %s", note)
        return Built(lib, source, None, note)

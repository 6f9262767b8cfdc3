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
import re
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.tirx.compilation_pipeline import get_tir_pipeline, register_tir_pipeline

from ..frontend.plan import CellPlan
from ..target import GpuSpec
from . import ptxas
from .kernel import HAND_PLACED, PLAIN_ARGS, Kernel
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


_RESTRICT = re.compile(r"\b(\w+\*) __restrict__ (\w+)_ptr\b")


def coherent_exchange(source: str, plain: set[str]) -> str:
    """``source`` with no ``__restrict__`` on the kernel arguments named in ``plain`` (those whose role is
    not :attr:`~prnn_tvm.signature.ArgRole.restrict`, listed in each kernel's ``PLAIN_ARGS``).

    TVM declares every pointer argument of a kernel ``__restrict__``, and nvcc reads such a pointer
    that the thread never writes through the non-coherent read-only path (``ld.global.nc``), which
    the PTX ISA allows only for data that stays read-only while the kernel runs, and which nvcc may
    treat as invariant when it schedules loads around a barrier. The exchange changes every step,
    and so, through one load, do the initial states: nvcc merges step 0's load of a state and a later
    step's load of the exchange into one load through a selected pointer (seen in the half template's
    PTX: 25 such ``ld.global.nc`` per step of Cho's GRU at 133x11). Plain loads after the barrier's
    acquire and block barrier are what the memory model orders; the recurrent kernels measured the
    same with them (within 1% on the H100). Weights, params, the projection and the lengths keep
    ``__restrict__`` and their read-only loads."""
    return _RESTRICT.sub(lambda m: f"{m[1]} {m[2]}_ptr" if m[2] in plain else m[0], source)


_REWRITES: list = []  # source rewrites installed by rewriting_sources, applied in order


@contextlib.contextmanager
def rewriting_sources(rewrite):
    """Within the block, every CUDA source a build compiles, and the one its layer keeps, is ``rewrite(source)``
    (after :func:`coherent_exchange`): instrumentation of the generated kernels, e.g. ``prnn_tvm.bench.timeline``'s
    clocks. Outside such a block a build compiles what TVM generated. The rewrite holds for the whole process while
    the block runs (builds on other threads included)."""
    _REWRITES.append(rewrite)
    try:
        yield
    finally:
        _REWRITES.remove(rewrite)


def rewriting() -> bool:
    """Whether a :func:`rewriting_sources` block is running (builds are instrumented, not what TVM generated)."""
    return bool(_REWRITES)


def _compiled_source(code: str, plain: set[str]) -> str:
    """What a build compiles of TVM's CUDA ``code``: :func:`coherent_exchange`, then any :func:`rewriting_sources`."""
    code = coherent_exchange(code, plain)
    for rewrite in _REWRITES:
        code = rewrite(code)
    return code


def plain_args(funcs) -> set[str]:
    """The arguments the PrimFuncs ``funcs`` list in their ``PLAIN_ARGS`` attribute (see :func:`coherent_exchange`)."""
    return {str(name) for f in funcs for name in ((f.attrs.get(PLAIN_ARGS, None) if f.attrs else None) or ())}


@contextlib.contextmanager
def nvcc_compile(arch: str, reports: list, plain: set[str]):
    """Route TVM's CUDA compilation through nvcc for ``arch`` while building, with ``__restrict__``
    off the ``plain`` arguments (:func:`coherent_exchange`) and any :func:`rewriting_sources`; restore after."""
    name = "tvm_callback_cuda_compile"
    previous = tvm.get_global_func(name, allow_missing=True)

    def compile_with_nvcc(code, *_):
        cubin, report = ptxas.compile_cuda(_compiled_source(code, plain), arch)
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


def build_module(
    plan: CellPlan, kernel: Kernel, input_size: int, target: tvm.target.Target, gpu: GpuSpec | None
) -> Built:
    """Compile the layer's functions (input projection, recurrent kernel) into one module (see
    :func:`build_functions`)."""
    return build_functions(layer_functions(plan, kernel, input_size, target), target, gpu)


def layer_functions(plan: CellPlan, kernel: Kernel, input_size: int, target: tvm.target.Target) -> dict:
    """A layer's functions by name, as its module holds them: the recurrent kernel and the input projection."""
    xp_dtype = kernel.launch.arg("xp").dtype  # the projection writes xp as the recurrent kernel reads it
    return {"recurrent": kernel.func, "projection": projection_func(plan, input_size, target, xp_dtype)}


def generated_source(funcs: dict, target: tvm.target.Target) -> str:
    """The CUDA source a build of ``{name: PrimFunc}`` compiles, without compiling it (where no GPU is loaded TVM
    emits source only): for comparing the generated code of two versions (``bench/source_hashes.py``)."""
    with target:
        lib = tvm.tirx.build(_module(funcs), target=target, pipeline=PIPELINE)
    return _compiled_source(lib.imports[0].inspect_source(), plain_args(funcs.values()))


def _module(funcs: dict) -> tvm.IRModule:
    return tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})


def build_functions(funcs: dict, target: tvm.target.Target, gpu: GpuSpec | None) -> Built:
    """Compile ``{name: PrimFunc}`` into one module, each function exported as its name.

    On a host whose CUDA runtime is loaded the module holds a cubin built by nvcc; otherwise
    CUDA builds hold source only and cannot run here, and the source is compiled with nvcc
    for ``gpu.arch`` anyway, to get ptxas's report.
    """
    mod = _module(funcs)
    if target.kind.name != "cuda":
        return Built(tvm.tirx.build(mod, target=target, pipeline=PIPELINE))
    reports: list = []
    plain = plain_args(funcs.values())
    with target, nvcc_compile(gpu.arch, reports, plain):
        lib = tvm.tirx.build(mod, target=target, pipeline=PIPELINE)
    source = _compiled_source(lib.imports[0].inspect_source(), plain)
    if reports:
        return Built(lib, source, reports[-1])
    try:
        return Built(lib, source, ptxas.report(source, gpu.arch))
    except ptxas.NvccNotFound as err:
        note = str(err).splitlines()[0]
        log.warning("no ptxas report: %s", note)
        return Built(lib, source, None, note)

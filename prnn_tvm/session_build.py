"""``compile_session``: the kernels of a resident session of a compiled CUDA layer (``prnn_tvm.runtime.session``
runs them)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass

from .codegen import session as session_code
from .codegen.build import build_functions
from .errors import ConfigError
from .frontend.plan import CellPlan
from .schedules import session_kernel
from .signature import SessionSignature, session_launches
from .target import smem_launch_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionKernels:
    """What a session of a CUDA layer runs (:func:`compile_session`), four launches of one module: ``resident``
    (``recurrent_session``, the layer's recurrent kernel in session mode: ``schedules/session.py``) and, on the
    caller's stream, ``publish``, ``collect`` and ``close`` (``prnn_tvm.codegen.session``). ``report``: the resident
    kernel's config and ptxas figures, one line; ``source``: the module's CUDA source; ``functions``: the PrimFuncs
    built into it, by name (an export with the session builds them into the layer's library)."""

    plan: CellPlan
    input_size: int
    module: object
    source: str
    resident: object
    publish: object
    collect: object
    close: object
    config: object
    report: str
    functions: dict

    @property
    def signature(self) -> SessionSignature:
        """The session's launches as plain data (what :class:`~prnn_tvm.runtime.session.Session` runs)."""
        p = self.plan
        return SessionSignature(
            p.cell.name, p.batch, p.hidden, p.dtype, p.outputs[0], self.resident, self.publish, self.collect, self.close
        )


def _resident(layer) -> tuple:
    """``(resident kernel, (its launch, publish, collect, close), the module built, the resident's ptxas figures or
    None, the functions)``: the session's config, else where ptxas spills it its fallbacks holding fewer weights in
    registers (``session_kernel``), the first that builds without spills (the last where none does: the caller
    refuses it)."""
    plan, target, gpu = layer.plan, layer.target, layer.gpu
    found = None
    for fallback in itertools.count():
        try:
            resident = session_kernel(plan, target, gpu, layer.kernel.config, layer.input_size, fallback)
        except ConfigError:
            if found is None:
                raise
            return found
        launch = resident.launch
        grids = session_code.grids(plan.batch * layer.input_size, len(plan.states) * plan.batch * plan.hidden)
        launches = (launch, *session_launches(launch, plan.dtype, grids))
        _, publish, collect, close = launches
        funcs = {
            launch.function: resident.func,
            publish.function: session_code.publish_func(publish),
            collect.function: session_code.collect_func(collect),
            close.function: session_code.close_func(close),
        }
        built = build_functions(funcs, target, gpu)
        fn = built.ptxas.function(launch.function) if built.ptxas is not None else None
        found = resident, launches, built, fn, funcs
        if fn is None or not fn.spills:
            return found
        log.info("session kernel %s spills %d bytes: the next with fewer weights in registers", resident.config,
                 fn.spills)


def compile_session(layer) -> SessionKernels:
    """The kernels of a resident session of a compiled CUDA ``layer`` (once per layer; ``prnn_tvm.runtime.session``
    runs them). ConfigError where the layer cannot run as a session, with the reason (a bidirectional layer, a
    wavefront stack: compile the deep stack, ``<cell>_d<layers>``)."""
    if layer._session is None:
        plan, gpu = layer.plan, layer.gpu
        resident, (launch, publish, collect, close), built, fn, funcs = _resident(layer)
        if fn is not None:
            launch = dataclasses.replace(
                launch,
                grid=dataclasses.replace(launch.grid, registers=fn.registers, static_smem_bytes=fn.static_smem_bytes),
            )
            if fn.spills:
                raise ConfigError(
                    f"the session kernel of this layer spills {fn.spills} bytes ({resident.config}): "
                    "compile the layer with a config that holds fewer weights per thread"
                )
            problem = smem_launch_problem(launch.grid.dynamic_smem_bytes, fn.static_smem_bytes, gpu.smem_per_block)
            if problem:
                raise ConfigError(
                    f"the session kernel of this layer cannot launch on {gpu.arch}: {problem} (the dynamic part is "
                    f"the layer's config, {resident.config}; the static part the session's own, the step's input "
                    f"of {plan.batch} x {layer.input_size} values): compile the layer with a config that keeps "
                    "fewer weights in shared memory, or a smaller batch or input"
                )
        figures = f"{fn.registers} registers, {fn.spills} spill bytes" if fn is not None else built.note
        report = (
            f"{launch.function}: {launch.grid.ctas} CTAs x {launch.grid.threads} threads, {figures} "
            f"({' '.join(f'{k}={v}' for k, v in resident.config.as_dict().items())})"
        )
        layer._session = SessionKernels(
            plan,
            layer.input_size,
            built.module,
            built.source,
            launch,
            publish,
            collect,
            close,
            resident.config,
            report,
            funcs,
        )
        log.info("session kernels of %s: %s", plan.cell.name, report)
    return layer._session

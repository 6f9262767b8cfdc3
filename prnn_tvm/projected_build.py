"""``compile_projected``: a compiled CUDA layer's recurrent kernel projecting its own input (``recurrent_projected``,
``schedules/projected.py``), one launch where the projection and the recurrence are two."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from .cache import layers as layer_cache
from .codegen.build import build_functions
from .errors import ConfigError
from .runtime.base import RuntimeLayer
from .schedules import projected_kernel
from .target import smem_launch_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProjectedKernel:
    """A layer's ``recurrent_projected`` launch (:func:`compile_projected`): ``launch`` (its grid with ptxas's
    figures where there are some), ``module`` the module built (its one function), ``source`` its CUDA source and
    ``func`` the PrimFunc (both None where it came from the layer cache), ``report`` one line (its config and ptxas
    figures), ``runtime`` a :class:`~prnn_tvm.runtime.base.RuntimeLayer` of that launch alone (its own launch state
    and error word, the layer's barrier timeout, which follows the layer's when set), which a
    :class:`~prnn_tvm.runtime.launcher.Launcher` launches."""

    launch: object
    module: object
    source: str
    func: object
    report: str
    runtime: object


def compile_projected(layer) -> ProjectedKernel:
    """The projected launch of a compiled CUDA ``layer`` with the layer's own config (once per layer, kept on it).
    ConfigError with the reason where it cannot run so (a stack or a bidirectional layer, the step's input and its
    projection past a CTA's shared memory beside the config's, a build that spills): the caller keeps the projection
    as a launch of its own."""
    found = layer._projected
    if isinstance(found, ConfigError):
        raise ConfigError(*found.args)  # a new one: raising the kept one would add the caller's frames to it
    if found is not None:
        return found
    try:
        layer._projected = _compiled(layer)
    except ConfigError as err:
        # why, kept without the frames: they hold this layer, which a kept traceback would put in a reference cycle
        # (the layer then freed by a later collection, which, during a CUDA graph capture, aborts the process)
        layer._projected = ConfigError(*err.args)
        log.info("no projected kernel of %s (its projection a launch of its own): %s", layer.plan.cell.name, err)
        raise
    log.info("projected kernel of %s: %s", layer.plan.cell.name, layer._projected.report)
    return layer._projected


def _compiled(layer) -> ProjectedKernel:
    """Built, or from the layer cache where the layer came from it (its ``source`` and ``func`` then None)."""
    plan, gpu = layer.plan, layer.gpu
    key = layer_cache.projected_key(layer)
    found = layer_cache.lookup_kernels(key, layer.target, gpu)
    if found is not None:
        module, (signature,), info = found
        runtime = RuntimeLayer(signature, module, True, layer.barrier_timeout_us)
        return ProjectedKernel(signature.launches[0], module, None, None, info["report"], runtime)
    kernel = projected_kernel(plan, layer.target, gpu, layer.kernel.config, layer.input_size)
    launch = kernel.launch
    built = build_functions({launch.function: kernel.func}, layer.target, gpu)
    fn = built.ptxas.function(launch.function) if built.ptxas is not None else None
    figures = built.note
    if fn is not None:
        if fn.spills:
            raise ConfigError(f"the projected kernel of this layer spills {fn.spills} bytes ({kernel.config})")
        problem = smem_launch_problem(launch.grid.dynamic_smem_bytes, fn.static_smem_bytes, gpu.smem_per_block)
        if problem:
            raise ConfigError(f"the projected kernel of this layer cannot launch on {gpu.arch}: {problem}")
        grid = dataclasses.replace(launch.grid, registers=fn.registers, static_smem_bytes=fn.static_smem_bytes)
        launch = dataclasses.replace(launch, grid=grid)
        figures = f"{fn.registers} registers, {fn.spills} spill bytes, {fn.static_smem_bytes} B static shared"
    report = (
        f"{launch.function}: {launch.grid.ctas} CTAs x {launch.grid.threads} threads, {figures} "
        f"({' '.join(f'{k}={v}' for k, v in kernel.config.as_dict().items())})"
    )
    signature = dataclasses.replace(layer.signature, launches=(launch,))
    module = layer_cache.store_kernels(
        key, built.module, [signature], built.source, layer.target, gpu, {"report": report}
    )
    runtime = RuntimeLayer(signature, module, True, layer.barrier_timeout_us)
    return ProjectedKernel(launch, module, built.source, kernel.func, report, runtime)

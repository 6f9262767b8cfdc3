"""Compiling one layer split over several GPUs of one host (``compile_cell(..., devices=[0, 1])``).

The kernel is the persistent template's, each GPU running a run of its CTAs and publishing its new states into
every GPU's copy of the exchange (``schedules/split.py``); the runtime half is :class:`~prnn_tvm.runtime.split.
SplitLayer`. A layer that would fit one GPU may be split all the same (its steps then pay NVLink latency for SMs it
did not need: compile it without ``devices`` unless it is too big for one GPU).
"""

from __future__ import annotations

import dataclasses
import logging

from .choice import ConfigChoice, ConfigOrigin
from .codegen.build import build_functions
from .codegen.projection import projection_func
from .errors import ConfigError
from .frontend.plan import CellPlan
from .runtime import peers
from .runtime.split import SplitLayer
from .schedules import split_kernels
from .signature import Signature, projection_launch

log = logging.getLogger(__name__)


def compile_split(plan: CellPlan, devices, input_size: int, target, gpu, config, report) -> SplitLayer:
    """The layer of ``plan`` split over ``devices`` (CUDA device indices, one per GPU, distinct): the first kernel
    of :func:`prnn_tvm.schedules.split_kernels` that ptxas builds without spills (else the last, reported);
    ``report(plan, kernel, built, choice)`` makes the compile report."""
    devices = peers.checked_devices(devices)
    if gpu is None:
        raise ConfigError("a layer split over GPUs runs CUDA kernels: compile it for target='cuda'")
    kernel = built = None
    for found in split_kernels(plan, target, gpu, len(devices), config):
        kernel, hop = found
        width = kernel.launch.arg("xp").shape[2]  # one GPU's columns of the input projection
        funcs = {"recurrent": kernel.func,
                 "projection": gpu_projection(plan, width, input_size, target, kernel.launch.arg("xp").dtype)}
        built = build_functions(funcs, target, gpu)
        if not built.spill_bytes:
            break
    origin = ConfigOrigin.USER if config is not None else ConfigOrigin.DEFAULT
    choice = ConfigChoice(kernel.config, origin, f"split over {len(devices)} GPUs, the grid below on each (tags "
                          f"exchange, shared layout; {hop})")
    rep = report(plan, kernel, built, choice)
    log.info("compiled %s over GPUs %s: %s", plan.cell.name, devices, rep.format().replace("\n", "; "))
    projection = projection_launch(plan.batch, input_size, width, plan.dtype, kernel.launch.arg("xp").dtype)
    signature = Signature(plan.cell.name, plan.batch, plan.hidden, input_size, plan.dtype, (projection, kernel.launch),
                          bool(plan.reversed_states))
    fn = built.recurrent
    if fn is not None:
        signature = signature.with_grid(kernel.launch.function, registers=fn.registers,
                                        static_smem_bytes=fn.static_smem_bytes)
    return SplitLayer(signature, built.module, devices, kernel, rep, built.source, plan, target)


def gpu_projection(plan: CellPlan, width: int, input_size: int, target, xp_dtype: str | None = None):
    """The input projection of one GPU's ``width`` columns (its units of every input slice, ``SplitLayer`` gives it
    those rows of ``W_ih``): the layer's projection at that width, writing ``xp`` in ``xp_dtype``."""
    return projection_func(dataclasses.replace(plan, hidden=width // plan.input.slices), input_size, target, xp_dtype)

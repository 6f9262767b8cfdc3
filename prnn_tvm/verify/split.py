"""A layer split over GPUs (``compile_cell(..., devices=...)``) emulated on the host: every GPU's recurrent launch at
once, in one address space, each with its own copy of the exchange and barrier state and the others' copies as its
peers (:func:`.emulator.emulate_devices`), as the GPUs run it over NVLink."""

from __future__ import annotations

import numpy as np

from prnn_tvm.runtime.split import gather
from prnn_tvm.signature import CTA_OFFSET, PEER_WORKSPACE, ArgRole

from .emulator import TIMEOUT_US, emulate_devices, host_values, kernel_parameters, launch_arrays, projection


def run_split(layer, inputs: dict, timeout_us: int = TIMEOUT_US, stall_step: int = -1, absent: int | None = None):
    """The recurrent launches of a split ``layer`` (a ``SplitLayer``) emulated on ``inputs`` as a caller passes them
    (:func:`.emulator.run_recurrent`). ``absent``: a GPU (its index in the layer's devices) that runs no step, as a
    peer that never started. Returns ``(out, [finals], [error word per GPU])``, the outputs gathered from the GPUs
    that own each unit."""
    xp = projection(inputs, layer.signature.launch("recurrent").arg("xp").dtype)
    per_gpu = [layer.own_columns({**inputs, "xp": xp}, g) for g in range(len(layer.devices))]  # its projection's
    outputs, words = run_each(layer, per_gpu, int(np.shape(inputs["x"])[0]), timeout_us, stall_step, absent)
    out, finals = gather(outputs, [layer.units_of(g) for g in range(len(layer.devices))], layer.signature.hidden)
    return out, list(finals), words


def run_each(layer, per_gpu: list, seq_len: int, timeout_us: int = TIMEOUT_US, stall_step: int = -1,
             absent: int | None = None) -> tuple:
    """The recurrent launches of a split ``layer`` emulated on arrays given per GPU (``per_gpu[g]``, by argument
    name: ``xp`` its own columns, as :meth:`~prnn_tvm.runtime.split.SplitLayer.bind_each` takes them). Returns
    ``([each GPU's [out, *finals]], [error word per GPU])``."""
    launch = layer.signature.launch("recurrent")
    scalars = {"seq_len": seq_len, "timeout_us": timeout_us, "stall_step": stall_step}
    wanted = {name for ctype, name in kernel_parameters(layer.cuda_source, launch.function) if not ctype.endswith("*")}
    given_by_split = {"error_host", CTA_OFFSET, *(PEER_WORKSPACE.format(k) for k in range(len(layer.devices)))}
    if wanted - set(scalars) - given_by_split:
        scalars.update(host_values(layer.kernel.func, layer.target, seq_len))
    gpus = len(layer.devices)
    devices = []
    for g in range(gpus):
        others = [d for d in range(gpus) if d != g]
        mine = {**scalars, CTA_OFFSET: g * layer.ctas_per_gpu, **({"seq_len": 0} if g == absent else {})}
        devices.append((launch_arrays(launch, per_gpu[g], seq_len), mine,
                        {PEER_WORKSPACE.format(k): (d, "workspace") for k, d in enumerate(others)}))
    runs = emulate_devices(layer.cuda_source, launch, devices)
    written = [a.name for a in launch.args if a.role in (ArgRole.OUTPUT, ArgRole.FINAL)]
    return [[run.buffers[name] for name in written] for run in runs], [run.error_word for run in runs]


def shared_problems(layer) -> list[str]:
    """What in each GPU's run of CTAs of a split ``layer`` does not fit its shared memory (:func:`.bounds.
    launch_problems` with that GPU's ``cta_offset``: a floor's polled columns follow its place among the GPUs)."""
    from tvm import tirx

    from .bounds import launch_problems

    func = layer.kernel.func
    offset = next(v for v in func.params if v.name == CTA_OFFSET)
    runs = [func.specialize({offset: tirx.const(g * layer.ctas_per_gpu, "int32")})
            for g in range(len(layer.devices))]
    return [problem for run in runs for problem in launch_problems(run, layer.kernel.launch.grid)]

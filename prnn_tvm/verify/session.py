"""A session's kernels run on the host CPU (:mod:`.emulator`): every request posted, the resident kernel, every
response collected, one launch after another.

A session's launches run at once on a GPU (the resident kernel polls what the caller posts); the emulator runs one
launch at a time. With rings as deep as the steps and one more (no slot is reused), the same kernels run in
sequence. Device transport: each step's publish (the step count advanced by hand, as each collect would), the
close mark, the resident kernel over every request until the close, then each step's collect against the barrier
state the requests were tagged with. Host transport: the host's request words and the close mark written by the
runtime's own host side (``prnn_tvm.runtime.session_host``, natively or in Python) into a host buffer that CTA 0
relays, the resident kernel, then each step's states collected from the host response buffer by that host side.
"""

from __future__ import annotations

import numpy as np

from prnn_tvm.runtime.session_host import READY, HostRings
from prnn_tvm.signature import REQUESTS, REQUESTS_HOST, RESPONSES, RESPONSES_HOST, ArgRole

from .emulator import TIMEOUT_US, emulate


def run_session(
    kernels,
    inputs: dict,
    seq_len: int,
    timeout_us: int = TIMEOUT_US,
    transport: str = "device",
    idle_us: int | None = None,
    host_step: str = "native",
) -> tuple:
    """``kernels`` (``prnn_tvm.compiler.SessionKernels``) over ``seq_len`` steps of ``inputs`` (a layer's call
    arguments by name: ``x`` (T, B, input), ``W_ih``, ``b_ih``, the weights and params, optional initial states),
    through the ``transport`` ``"device"`` or ``"host"``. With ``idle_us`` (the host transport) no close mark
    follows the requests: the kernel waits that long for the next and leaves idle. ``host_step``: the host
    transport's host side, ``"native"`` (where it is built, else Python) or ``"python"``. Returns ``({state: its
    values at every step (T, B, H)}, {state: final}, the resident kernel's error word, the barrier state after the
    run)``."""
    if transport not in ("device", "host") or (idle_us is not None and transport != "host"):
        raise ValueError(f"transport must be 'device' or 'host' (with idle_us: 'host'), got {transport!r}")
    resident, depth = kernels.resident, seq_len + 1
    arrays = {
        a.name: np.zeros(a.concrete_shape(depth), a.dtype)
        for a in resident.args
        if a.role in (ArgRole.WORKSPACE, ArgRole.SYNC, ArgRole.STATE, ArgRole.FINAL)
    }
    arrays.update(
        {
            a.name: np.asarray(inputs[a.name], a.dtype)
            for a in resident.args
            if a.name in inputs and a.role is not ArgRole.SCALAR
        }
    )
    scalars = {
        "seq_len": depth,
        "timeout_us": timeout_us,
        "stall_step": -1,
        "idle_us": timeout_us if idle_us is None else idle_us,
        "capacity": 2**31 - 1,
        REQUESTS_HOST: 0,
        RESPONSES_HOST: 0,
    }
    names = [a.name[:-2] for a in resident.args if a.role is ArgRole.FINAL]
    dtype = kernels.publish.arg("x").dtype
    xs = [np.asarray(inputs["x"][t], dtype) for t in range(seq_len)]
    if transport == "host":
        requests = np.zeros(arrays[REQUESTS].shape, "uint64")
        responses = np.zeros(arrays[RESPONSES].shape, "uint64")
        error = np.zeros(1, np.uint32)
        rings = HostRings(requests, responses, xs[0].size, dtype, dtype, error.ctypes.data, host_step == "native")
        base = int(arrays["sync"][2])
        tags = [(base + t + 1) & 0xFFFFFFFF for t in range(seq_len + 1)]
        for t in range(seq_len + (idle_us is None)):  # each step's request, then the close mark
            if t < seq_len:
                rings.post(xs[t], t, tags[t])
            else:
                rings.close(t, tags[t])
        run = emulate(kernels.source, resident, {**arrays, REQUESTS_HOST: requests, RESPONSES_HOST: responses},
                      scalars)
        responses[...] = run.buffers[RESPONSES_HOST]  # where the rings' host side reads them
        steps = []
        for t in range(seq_len):
            states = np.empty(responses.shape[1:], dtype)
            assert rings.collect(states, t, tags[t], 10**6) == READY, f"step {t}'s responses are not all tagged"
            steps.append(states)
        assert not run.buffers[RESPONSES].any(), "the host transport wrote device responses"
    else:
        steps, run = _device_transport(kernels, arrays, scalars, xs, seq_len)
    sequences = {name: np.stack([s[k] for s in steps]) for k, name in enumerate(names)}
    return sequences, {name: run.buffers[f"{name}_n"] for name in names}, run.error_word, run.buffers["sync"]


def _device_transport(kernels, arrays: dict, scalars: dict, xs: list, seq_len: int) -> tuple:
    """Each step's publish, the close, the resident kernel, each step's collect: (each step's states, the
    resident kernel's run)."""
    control = np.zeros(kernels.publish.arg("control").shape, "uint32")
    for t in range(seq_len + 1):  # each step's request, then the close mark
        control[0] = t
        small = {REQUESTS: arrays[REQUESTS], "control": control, "sync": arrays["sync"]}
        if t < seq_len:
            run = emulate(kernels.source, kernels.publish, {**small, "x": xs[t]}, scalars)
        else:
            run = emulate(kernels.source, kernels.close, small, scalars)
        arrays[REQUESTS] = run.buffers[REQUESTS]
    tagged_with = arrays["sync"].copy()  # the base the requests carry; the resident kernel advances it
    run = emulate(kernels.source, kernels.resident, arrays, scalars)
    steps = []
    for t in range(seq_len):
        control[0] = t
        states = np.zeros(kernels.collect.arg("states").shape, kernels.collect.arg("states").dtype)
        got = emulate(
            kernels.source,
            kernels.collect,
            {RESPONSES: run.buffers[RESPONSES], "states": states, "control": control, "sync": tagged_with.copy()},
            scalars,
        )
        steps.append(got.buffers["states"])
    return steps, run

"""A session's kernels run on the host CPU (:mod:`.emulator`): every request posted, the resident kernel, every
response collected, one launch after another.

A session's launches run at once on a GPU (the resident kernel polls what the caller's publishes post); the
emulator runs one launch at a time. With rings as deep as the steps and one more (no slot is reused), the same
kernels run in sequence: each step's publish (the step count advanced by hand, as each collect would), the close
mark, the resident kernel over every request until the close, then each step's collect against the barrier state
the requests were tagged with.
"""

from __future__ import annotations

import numpy as np

from prnn_tvm.signature import REQUESTS, RESPONSES, ArgRole

from .emulator import TIMEOUT_US, emulate


def run_session(kernels, inputs: dict, seq_len: int, timeout_us: int = TIMEOUT_US) -> tuple:
    """``kernels`` (``prnn_tvm.compiler.SessionKernels``) over ``seq_len`` steps of ``inputs`` (a layer's call
    arguments by name: ``x`` (T, B, input), ``W_ih``, ``b_ih``, the weights and params, optional initial states).
    Returns ``({state: its values at every step (T, B, H)}, {state: final}, the resident kernel's error word)``."""
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
    control = np.zeros(kernels.publish.arg("control").shape, "uint32")
    dtype = kernels.publish.arg("x").dtype
    weights = {name: np.asarray(inputs[name], dtype) for name in ("W_ih", "b_ih")}
    scalars = {
        "seq_len": depth,
        "timeout_us": timeout_us,
        "stall_step": -1,
        "idle_us": timeout_us,
        "capacity": 2**31 - 1,
    }
    for t in range(seq_len + 1):  # each step's request, then the close mark
        control[0] = t
        small = {REQUESTS: arrays[REQUESTS], "control": control, "sync": arrays["sync"]}
        if t < seq_len:
            run = emulate(
                kernels.source, kernels.publish, {**small, "x": np.asarray(inputs["x"][t], dtype), **weights}, scalars
            )
        else:
            run = emulate(kernels.source, kernels.close, small, scalars)
        arrays[REQUESTS] = run.buffers[REQUESTS]
    tagged_with = arrays["sync"].copy()  # the base the requests carry; the resident kernel advances it
    run = emulate(kernels.source, resident, arrays, scalars)
    names = [a.name[:-2] for a in resident.args if a.role is ArgRole.FINAL]
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
    sequences = {name: np.stack([s[k] for s in steps]) for k, name in enumerate(names)}
    return sequences, {name: run.buffers[f"{name}_n"] for name in names}, run.error_word

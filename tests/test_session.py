"""Resident sessions on the CPU: the session kernels (the resident kernel in session mode, the caller's publish,
collect and close) built and checked with ptxas, run as emitted on the host (``prnn_tvm.verify.session``) against
the float64 reference of the same steps, and what a session refuses. On the GPU: ``test_gpu_session.py``."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import ConfigError, InputError
from prnn_tvm.compiler import compile_session
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.runtime.session import Session
from prnn_tvm.signature import REQUESTS, RESPONSES
from prnn_tvm.verify import emulator
from prnn_tvm.verify.session import run_session

from .test_ptxas import assert_launchable


def _reference_steps(plan, inputs):
    """Every state at every step, by the float64 reference (one step at a time from the initial states)."""
    steps = {s.name: [] for s in plan.states}
    state = dict(inputs)
    for t in range(len(inputs["x"])):
        one = {**state, "x": inputs["x"][t : t + 1]}
        _, finals = reference_layer(plan, one)
        for name, value in finals.items():
            steps[name].append(value)
            state[f"{name}0"] = value
    return {name: np.stack(values) for name, values in steps.items()}


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize(
    "cell, hidden, batch, input_size",
    [
        ("lstm", 12, 2, 5),  # input size != hidden
        ("gru_d2", 13, 3, 5),  # a deep stack (two phases a step), prime hidden and batch
    ],
)
def test_a_session_serves_every_step_as_the_reference_computes_it(cell, hidden, batch, input_size):
    """Each step posted (publish), the close mark, the resident kernel over every request, each step collected:
    every state at every step and the final states equal the float64 reference; the kernel stops at the close."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, target="cuda", arch="sm_90")
    kernels = compile_session(layer)
    T = 5
    inputs = random_inputs(layer.plan, T, input_size, seed=1)
    steps, finals, error = run_session(kernels, inputs, T)
    want = _reference_steps(layer.plan, inputs)
    assert error == 0
    assert set(steps) == set(want) == set(finals)
    for name in want:
        assert np.abs(steps[name] - want[name]).max() < 1e-5, name
        assert np.abs(finals[name] - want[name][-1]).max() < 1e-5, name


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("lstm_d2", 128, 1, "float32"),  # a two-layer market model
        ("lstm", 640, 8, "float16"),  # an RNN-T prediction network
        ("gru_d3", 96, 4, "bfloat16"),
        ("rnn_tanh", 1, 1, "float32"),  # the smallest
    ],
)
def test_session_kernels_build_without_spills_and_leave_sms_free(cell, hidden, batch, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda", arch="sm_90", dtype=dtype)
    kernels = compile_session(layer)
    assert kernels.config.barrier == "tags" and kernels.config.layout == "shared"
    assert "0 spill bytes" in kernels.report, kernels.report
    assert kernels.resident.grid.ctas <= layer.gpu.sms - 4, kernels.report
    assert kernels.resident.grid.cooperative
    names = [a.name for a in kernels.resident.args]
    assert REQUESTS in names and RESPONSES in names and "xp" not in names and "lengths" not in names
    mailbox = kernels.resident.arg(REQUESTS)
    assert mailbox.shape[1:] == (
        kernels.resident.grid.ctas,
        batch,
        layer.plan.input.slices * kernels.config.units_per_cta,
    )


def test_the_session_kernel_is_the_layers_kernel_but_for_its_input_and_outputs():
    """A layer's session kernel keeps its config where that config runs ``tags`` in the shared layout."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        256,
        4,
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 4, "k_split": 8, "rows_per_thread": 2, "batch_tile": 4, "vec": 4, "barrier": "tags"},
    )
    kernels = compile_session(layer)
    assert kernels.config == layer.kernel.config
    assert_launchable(layer)


@pytest.mark.parametrize(
    "cell, options, message",
    [
        ("lstm", {"bidirectional": True}, "both directions"),
        ("lstm_x2", {}, "deep stack"),
    ],
)
def test_what_cannot_run_as_a_session_is_refused_with_the_reason(cell, options, message):
    layer = prnn_tvm.compile_cell(cell, 16, 2, target="cuda", arch="sm_90", **options)
    with pytest.raises(ConfigError, match=message):
        compile_session(layer)


def test_a_cpu_layer_has_no_session():
    layer = prnn_tvm.compile_cell("lstm", 8, 2, target="llvm")
    with pytest.raises(ConfigError, match="target='cuda'"):
        layer.session()


@pytest.mark.parametrize(
    "option, value",
    [
        ("release_after", -1.0),
        ("free_sms", 1.5),
        ("idle_timeout_s", 0.01),
        ("barrier_timeout_us", 0),
        ("release_after", float("nan")),
    ],
)
def test_bad_session_options_are_refused_before_anything_runs(option, value):
    layer = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90")
    with pytest.raises(InputError, match=option):
        kernels = compile_session(layer)
        Session(kernels.signature, kernels.module, {}, **{option: value})


def test_a_torch_modules_session_is_refused_where_it_cannot_run():
    pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    with pytest.raises(InputError, match="GPU"):
        pt.LSTM(8, 16).session(batch=2)  # parameters on the CPU
    with pytest.raises(ConfigError, match="bidirectional"):
        pt.GRU(8, 16, bidirectional=True).session(batch=2)
    with pytest.raises(InputError, match="batch"):
        pt.GRU(8, 16).session(batch=0)

"""Resident sessions on the CPU: the session kernels (the resident kernel in session mode, which projects each step's
input itself, and the caller's publish, collect and close) built and checked with ptxas, run as emitted on the host
(``prnn_tvm.verify.session``) through both transports against the float64 reference of the same steps, the host
transport's words, and what a session refuses. On the GPU: ``test_gpu_session.py``."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import ConfigError, InputError
from prnn_tvm.compiler import compile_session
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.runtime import session_words
from prnn_tvm.runtime.session import Session
from prnn_tvm.schedules.session import session_smem
from prnn_tvm.signature import REQUESTS, REQUESTS_HOST, RESPONSES, RESPONSES_HOST, SESSION_IDLE
from prnn_tvm.target import STATIC_SMEM_RESERVE
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
    "cell, hidden, batch, input_size, transport",
    [
        ("lstm", 12, 2, 5, "device"),  # input size != hidden
        ("gru_d2", 13, 3, 5, "device"),  # a deep stack (two phases a step), prime hidden and batch
        ("lstm", 12, 2, 5, "host"),
        ("gru_d2", 13, 3, 5, "host"),
        ("gru", 7, 2, 1, "host"),  # three input slices, an input of one value
        ("lstm", 9, 3, 181, "host"),  # an input larger than one take of the CTA (in chunks), odd sizes
    ],
)
def test_a_session_serves_every_step_as_the_reference_computes_it(cell, hidden, batch, input_size, transport):
    """Each step's raw input posted (the publish, or the host's words in page-locked memory that CTA 0 relays), the
    close mark, the resident kernel over every request (it projects each input itself), each step's states
    collected (the collect, or the host's response words): every state at every step and the final states equal
    the float64 reference; the kernel stops at the close."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, target="cuda", arch="sm_90")
    kernels = compile_session(layer)
    T = 5
    inputs = random_inputs(layer.plan, T, input_size, seed=1)
    steps, finals, error, sync = run_session(kernels, inputs, T, transport=transport)
    want = _reference_steps(layer.plan, inputs)
    assert error == 0
    assert set(steps) == set(want) == set(finals)
    for name in want:
        assert np.abs(steps[name] - want[name]).max() < 1e-5, name
        assert np.abs(finals[name] - want[name][-1]).max() < 1e-5, name
    assert sync[2] == T + 1  # the base advanced by the steps and the close: the next launch's tags are new


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
def test_a_host_session_without_requests_leaves_idle_with_the_last_steps_states():
    """Host transport, two requests and then none: every CTA (CTA 0 polling host memory, the others the device
    mailbox) gives up after idle_us at step 2 with the idle mark in the error word, and the final states are step 1's
    (no request was taken: the host relaunches from them)."""
    layer = prnn_tvm.compile_cell("lstm_d2", 10, 2, input_size=3, target="cuda", arch="sm_90")
    kernels = compile_session(layer)
    inputs = random_inputs(layer.plan, 2, 3, seed=2)
    steps, finals, error, sync = run_session(kernels, inputs, 2, transport="host", idle_us=300_000)
    want = _reference_steps(layer.plan, inputs)
    assert error == (2 | SESSION_IDLE) + 1
    for name in want:
        assert np.abs(steps[name] - want[name]).max() < 1e-5, name
        assert np.abs(finals[name] - want[name][-1]).max() < 1e-5, name
    assert sync[2] == 3  # the step that idled counts, as a close does


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
    assert {REQUESTS, RESPONSES, REQUESTS_HOST, RESPONSES_HOST, "W_ih", "b_ih"} <= set(names)
    assert "xp" not in names and "lengths" not in names
    values = batch * layer.input_size  # the raw input, not projected: two half values a word
    assert kernels.resident.arg(REQUESTS).shape[1:] == ((values + 1) // 2 if dtype != "float32" else values,)
    assert kernels.publish.arg("x").shape == (batch, layer.input_size)
    assert kernels.resident.arg("W_ih").shape == (layer.plan.input.slices * hidden, layer.input_size)
    assert [a.name for a in kernels.publish.args if a.role.data] == ["x"]  # a copy and tag, no projection


def test_an_input_too_large_for_shared_memory_is_refused_with_the_fix():
    layer = prnn_tvm.compile_cell("lstm", 16, 64, input_size=200, target="cuda", arch="sm_90")
    with pytest.raises(ConfigError, match="64 x 200: use a smaller batch"):
        compile_session(layer)


def test_a_session_past_a_ctas_shared_memory_is_refused_with_the_fix():
    """The session's own shared memory (the step's input) comes on top of the config's (its operand tiles, and the
    weights a tiered config keeps there): where no config leaves room for it the launch would fail, so the compile
    refuses, naming both parts."""
    layer = prnn_tvm.compile_cell("lstm", 16, 4, input_size=200, target="cuda", arch="sm_90")
    layer.gpu = dataclasses.replace(layer.gpu, smem_per_block=4 * 4 * 200)  # the input alone fills it
    with pytest.raises(ConfigError, match=r"session kernel.*shared memory for the step's input of 4 x 200 values\): "
                                          r"needs \d+ bytes of shared memory per CTA"):
        compile_session(layer)


def test_a_session_takes_a_config_that_leaves_room_for_its_input():
    """Where the layer's config leaves no room for the step's input beside it, the session runs a config that does:
    its dynamic and static shared memory together within a CTA's limit."""
    layer = prnn_tvm.compile_cell("lstm", 64, 4, input_size=200, target="cuda", arch="sm_90")
    dynamic, units = layer.kernel.launch.grid.dynamic_smem_bytes, layer.kernel.config.units_per_cta
    limit = dynamic + session_smem(layer.plan, 200, units) + STATIC_SMEM_RESERVE - 1  # one byte short for the config
    layer.gpu = dataclasses.replace(layer.gpu, smem_per_block=limit)
    grid = compile_session(layer).resident.grid
    assert grid.dynamic_smem_bytes < dynamic
    assert grid.dynamic_smem_bytes + grid.static_smem_bytes <= limit
    assert grid.static_smem_bytes >= 4 * 4 * 200


def test_the_host_transports_words_carry_value_and_tag_in_one_word():
    x = np.array([[1.5, -0.0, np.nan], [3.0, np.inf, 2.0]], "float16")
    got = session_words.request_words(x, 7)
    assert got.dtype == np.uint64 and got.shape == (6,)
    assert session_words.tagged(got, 7) and not session_words.tagged(got, 8)
    assert np.array_equal(got >> np.uint64(32), np.full(6, 7, np.uint64))
    assert np.array_equal((got & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32), x.astype("float32").ravel(),
                          equal_nan=True)
    staged = np.empty(6, np.uint64)
    assert session_words.request_words(x, 7, staged) is staged and np.array_equal(staged, got)
    close = np.array([np.uint32(0xFFFFFFFF)]).view(np.float32)  # an input whose bits are the close mark's
    sent = session_words.request_words(close, 3)
    assert int(sent[0]) & 0xFFFFFFFF == session_words.CLOSE_SENT_AS
    assert set(session_words.close_words(4, 3).tolist()) == {(3 << 32) | session_words.CLOSE}
    for dtype, bits in (("float16", np.uint16), ("bfloat16", np.uint16), ("float32", np.uint32)):
        states = np.array([[0.25, -2.0, 3.5]], dtype)
        words = (np.uint64(5) << np.uint64(32)) | states.view(bits).astype(np.uint64)
        assert np.array_equal(session_words.values(words, dtype), states) and session_words.tagged(words, 5)
        assert np.array_equal(session_words.tags(words), np.full((1, 3), 5, np.uint32))


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
        ("lstm_layernorm", {}, "sums over units"),
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

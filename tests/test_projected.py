"""A layer's recurrent kernel projecting its own input (``recurrent_projected``, ``schedules/projected.py``): run as
emitted on the host (``prnn_tvm.verify.emulator``) against the float64 reference and against the layer's two-launch
path (the projection, then the recurrent kernel), built with ptxas at the issue's shapes, and what it refuses."""

import gc
import weakref

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.dtypes import tolerance
from prnn_tvm.projected_build import compile_projected
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.signature import ArgRole
from prnn_tvm.verify import emulator


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, steps, layers",
    [
        ("lstm", 12, 2, 5, 3, 1),  # input size != hidden, several steps
        ("lstm", 1, 1, 1, 1, 1),  # hidden 1, one row, an input of one value
        ("gru", 7, 3, 1, 2, 1),  # three input slices, odd hidden and batch
        ("rnn_tanh", 9, 1, 181, 1, 1),  # an input past a warp's lanes many times, odd sizes
        ("rnn_relu", 13, 2, 13, 2, 1),
        ("lstm", 12, 2, 5, 3, 2),  # a wavefront stack (the split layout)
        ("gru", 7, 3, 1, 1, 3),  # three layers at T=1: the first layer's input read through the lag
        ("lstm", 1, 1, 1, 1, 2),
    ],
)
def test_a_projected_launch_is_the_two_launch_path_and_the_reference(cell, hidden, batch, input_size, steps, layers):
    """The projected launch on the raw input, the layer's recurrent launch on the projection made beforehand (as the
    two-launch path runs it), and the float64 reference: every output and final state within float32's tolerance of
    the reference, and of each other; no timeout. ``layers``: a wavefront stack's (its first layer's input projected
    in the kernel, through the stack's lag)."""
    layer = prnn_tvm.compile_cell(
        cell, hidden, batch, input_size=input_size, target="cuda", arch="sm_90", layers=layers
    )
    kernel = compile_projected(layer)
    inputs = random_inputs(layer.plan, steps, input_size, seed=3)
    run = emulator.run_launch(kernel.source, kernel.launch, inputs, steps, kernel=kernel.func, target=layer.target)
    out, finals, error = emulator.run_recurrent(layer, inputs)
    want_out, want_finals = reference_layer(layer.plan, inputs)
    bound = tolerance("float32", steps)
    assert run.error_word == 0 and error == 0
    assert np.abs(run.buffers["out"] - want_out).max() < bound
    assert np.abs(run.buffers["out"] - out).max() < bound
    for (name, want), two_launch in zip(want_finals.items(), finals):
        assert np.abs(run.buffers[f"{name}_n"] - want).max() < bound, name
        assert np.abs(run.buffers[f"{name}_n"] - two_launch).max() < bound, name


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("lstm", 128, 1, "float32"),  # each layer of the 2x128 B=1
        ("lstm", 640, 8, "float16"),  # the 1x640 B=8 (the tensor-core template, two batch groups)
        ("lstm", 480, 1, "float32"),  # each layer of the 3x480 B=1
        ("gru", 640, 8, "bfloat16"),
        ("lstm_x2", 128, 1, "float32"),  # the 2x128 B=1 as a wavefront stack
        ("lstm_x3", 480, 1, "float32"),  # the 3x480 B=1 as a wavefront stack
    ],
)
def test_projected_kernels_of_the_default_configs_build_without_spills(cell, hidden, batch, dtype):
    """The layer's own config, its arguments the recurrent launch's with ``x``, ``W_ih`` and ``b_ih`` in place of
    ``xp``, and the same owned buffers (the layer's launch state serves both launches)."""
    cell, _, layers = cell.partition("_x")
    layer = prnn_tvm.compile_cell(
        cell, hidden, batch, input_size=hidden, target="cuda", arch="sm_90", dtype=dtype, layers=int(layers or 1)
    )
    kernel = compile_projected(layer)
    assert ", 0 spill bytes" in kernel.report, kernel.report
    recurrent = layer.signature.launch("recurrent")
    assert kernel.launch.grid.ctas == recurrent.grid.ctas and kernel.launch.grid.threads == recurrent.grid.threads
    names = [a.name for a in kernel.launch.args]
    assert names[:3] == ["x", "W_ih", "b_ih"] and "xp" not in names
    assert kernel.launch.arg("x").shape[1:] == (batch, hidden)
    assert kernel.launch.arg("W_ih").shape == (layer.plan.input.slices * hidden, hidden)
    owned = [a for a in recurrent.args if a.role.owned]
    assert owned and owned == [a for a in kernel.launch.args if a.role.owned]
    assert compile_projected(layer) is kernel  # kept on the layer


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: prnn_tvm.compile_cell("lstm", 640, 8, input_size=640, target="cuda", arch="sm_90", dtype="float16",
                                       layers=2), "cannot launch on sm_90"),
        (lambda: prnn_tvm.compile_cell("lstm_bi", 8, 2, input_size=4, target="cuda", arch="sm_90"), "both directions"),
        (lambda: prnn_tvm.compile_cell("lstm", 16, 64, input_size=200, target="cuda", arch="sm_90"),
         "at most 8192 values"),
        (lambda: prnn_tvm.compile_cell("lstm", 8, 2, input_size=4, target="llvm"), "target llvm"),
    ],
    ids=["no room beside the config", "bidirectional", "input past shared memory", "cpu"],
)
def test_a_layer_that_cannot_project_in_its_kernel_says_why_once(make, match):
    """ConfigError with the reason (the caller keeps the projection's launch), kept: the next ask raises it again
    without building."""
    layer = make()
    with pytest.raises(ConfigError, match=match):
        compile_projected(layer)
    first = layer._projected
    with pytest.raises(ConfigError, match=match):
        compile_projected(layer)
    assert layer._projected is first
    assert first.__traceback__ is None  # its frames would hold the layer in a reference cycle
    gc.disable()  # no collection: the layer goes when its last reference does, never inside a later CUDA graph capture
    try:
        ref = weakref.ref(layer)
        del layer
        assert ref() is None
    finally:
        gc.enable()


def test_the_projected_launch_takes_the_recurrent_launchs_data_after_its_own():
    """Its data arguments (what ``prnn_tvm.torch``'s plan binds by position): the raw input, the projection's weight
    and bias, then the recurrent launch's after ``xp`` in its order (weights, params, initial states, lengths); its
    runtime is that launch alone."""
    layer = prnn_tvm.compile_cell("gru", 8, 2, input_size=3, target="cuda", arch="sm_90")
    kernel = compile_projected(layer)
    data = [a for a in kernel.launch.args if a.role.data]
    recurrent = [a for a in layer.signature.launch("recurrent").args if a.role.data]
    assert [a.name for a in data[:3]] == ["x", "W_ih", "b_ih"] and recurrent[0].name == "xp"
    assert [(a.role, a.name) for a in data[:3]] == [(ArgRole.INPUT, "x"), (ArgRole.WEIGHT, "W_ih"),
                                                     (ArgRole.PARAM, "b_ih")]
    assert data[3:] == recurrent[1:]
    assert [x.function for x in kernel.runtime.signature.launches] == ["recurrent_projected"]


def test_a_projected_kernel_that_fails_to_build_leaves_the_two_launches(monkeypatch, caplog):
    """A build of the optional one-launch kernel that fails for any reason (not only a ConfigError the build
    expects) must not fail the call that plans it: the plan keeps the projection as a launch of its own, and says
    why in the log."""
    from types import SimpleNamespace

    from prnn_tvm.torch import repeat

    def broken(layer):
        raise RuntimeError("nvcc crashed")

    monkeypatch.setattr(repeat, "compile_projected", broken)
    layer = SimpleNamespace(plan=SimpleNamespace(cell=SimpleNamespace(name="lstm")))
    x = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    with caplog.at_level("WARNING", logger="prnn_tvm.torch.repeat"):
        assert repeat._projected_step(None, layer, x, None, False) is None
    assert "nvcc crashed" in caplog.text and "a launch of its own" in caplog.text


def test_a_layers_barrier_timeout_reaches_its_training_kernels_and_projected_launch():
    """Setting a layer's ``barrier_timeout_us`` sets its derived runtimes' (they launch by their own scalars), and
    a bad value is refused before any of them changes."""
    from types import SimpleNamespace

    from prnn_tvm.runtime.base import RuntimeLayer

    layer = prnn_tvm.compile_cell("rnn_tanh", 3, 1, target="llvm")
    derived = [RuntimeLayer(layer.signature, None, False) for _ in range(3)]
    layer._training = SimpleNamespace(forward=derived[0], backward=derived[1])
    layer._projected = SimpleNamespace(runtime=derived[2])
    layer.barrier_timeout_us = 1234
    assert [d.barrier_timeout_us for d in derived] == [1234] * 3
    assert all(d.scalars()["timeout_us"] == 1234 for d in derived)
    with pytest.raises(ConfigError):
        layer.barrier_timeout_us = 0
    assert [d.barrier_timeout_us for d in derived] == [1234] * 3
    layer._projected = ConfigError("no projected kernel")  # why there is none: nothing to follow
    layer.barrier_timeout_us = 99
    assert [d.barrier_timeout_us for d in derived] == [99, 99, 1234]

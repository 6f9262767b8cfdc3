"""A compiled layer's call: argument binding and the errors bad inputs get."""

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import ConfigError, InputError, PrnnError
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.target import local_gpu


@pytest.fixture(scope="module")
def lstm():
    return prnn_tvm.compile_cell("lstm", 8, 2, target="llvm")


@pytest.fixture
def inputs(lstm):
    return random_inputs(lstm.plan, 3, 8)


def test_arg_names_follow_the_cell(lstm):
    assert lstm.arg_names == ["x", "W_ih", "b_ih", "W_hh", "b_hh", "h0", "c0", "lengths"]


def test_positional_and_keyword_calls_agree(lstm, inputs):
    a, _ = lstm(*[inputs.get(n) for n in lstm.arg_names])  # lengths None: omitted
    b, _ = lstm(**inputs)
    c, _ = lstm(**inputs, lengths=np.array([3, 3]))
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_dlpack_inputs_give_tvm_tensors(lstm, inputs):
    args = [tvm.runtime.tensor(inputs[n]) for n in lstm.arg_names[:-1]] + [tvm.runtime.tensor(np.int32([3, 3]))]
    out, finals = lstm(*args)
    assert isinstance(out, tvm.runtime.Tensor) and len(finals) == 2
    ref, _ = reference_layer(lstm.plan, inputs)
    assert np.abs(out.numpy() - ref).max() < 1e-5


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(x=a["x"][:, :1]), r"x has shape \(3, 1, 8\), expected \(3, 2, 8\)"),
        (lambda a: a.update(W_hh=a["W_hh"].astype(np.float64)), "W_hh has dtype float64, expected float32"),
        (lambda a: a.update(b_hh=a["b_hh"][:4]), r"b_hh has shape \(4,\)"),
        (lambda a: a.update(x=a["x"][:0]), "at least one"),
        (lambda a: a.update(x=a["x"][0]), "3-d array"),
        (lambda a: a.update(h0=[[0.0] * 8] * 2), "must be a NumPy array or a DLPack tensor"),
        (lambda a: a.pop("W_hh"), "missing argument.*W_hh"),
        (lambda a: a.update(bias=a["b_hh"]), "unknown argument 'bias'"),
    ],
)
def test_bad_inputs_are_refused(lstm, inputs, mutate, message):
    mutate(inputs)
    with pytest.raises(InputError, match=message):
        lstm(**inputs)


def test_too_many_positional_arguments(lstm, inputs):
    with pytest.raises(InputError, match="at most 8 arguments"):
        lstm(*[inputs.get(n) for n in lstm.arg_names], inputs["h0"])


def test_same_argument_twice(lstm, inputs):
    with pytest.raises(InputError, match="'x' given twice"):
        lstm(inputs["x"], x=inputs["x"], W_ih=inputs["W_ih"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hidden=0), "hidden must be a positive integer"),
        (dict(batch=-2), "batch must be a positive integer"),
        (dict(dtype="float8"), "float8 is not supported yet"),
        (dict(dtype="float64", target="cuda", arch="sm_90"), "float64 is for the CPU build"),
        (dict(target="vulkan"), "unknown target"),
        (dict(target="cuda", arch="sm_99"), "unknown GPU architecture"),
    ],
)
def test_compile_arguments_are_checked(kwargs, message):
    args = dict(cell="lstm", hidden=8, batch=2, target="llvm") | kwargs
    with pytest.raises(ConfigError, match=message):
        prnn_tvm.compile_cell(**args)


@pytest.mark.skipif(local_gpu() is not None, reason="checks the GPU-less behaviour")
def test_cuda_layer_without_gpu_says_so(inputs):
    layer = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90")
    assert "__global__" in layer.cuda_source
    with pytest.raises(PrnnError, match="CUDA source only"):
        layer(**inputs)

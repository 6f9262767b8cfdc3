"""Export on the GPU host, load in a fresh process with TVM's runtime only (``pytest -m gpu``)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime.loading import read_metadata
from prnn_tvm.target import gpu_spec

from .test_export import embedded_cuda_code

pytestmark = pytest.mark.gpu

RUNTIME_ONLY = textwrap.dedent("""
    import sys, numpy as np, tvm
    import prnn_tvm
    layer = prnn_tvm.load(sys.argv[1])
    data = np.load(sys.argv[2])
    for _ in range(2):  # a second launch reuses the barrier state
        out, finals = layer(**{k: data[k] for k in layer.arg_names if k in data})
        assert np.array_equal(out, data["out"]), "output differs"
        for i, f in enumerate(finals):
            assert np.array_equal(f, data[f"final{i}"]), "final state differs"
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY and "libtvm_compiler" not in maps, "the TVM compiler was loaded"
    print("runtime-only gpu ok", layer.metadata["arch"])
""")


@pytest.mark.parametrize(
    "cell, dtype", [("lstm", "float32"), ("gru", "float32"), ("mgu", "float32"), ("lstm", "float16")]
)
def test_exported_cubin_runs_with_the_runtime_only(cell, dtype, tmp_path):
    arch = gpu_spec().arch
    layer = prnn_tvm.compile_cell(cell, 256, 4, seq_len=64, dtype=dtype, target="cuda", arch=arch)
    path = prnn_tvm.export(layer, tmp_path / f"{cell}.so")
    fmt, code = embedded_cuda_code(path)  # what the runtime loads: a cubin, so no NVRTC compile at load
    assert fmt == b"cubin" and b"\x7fELF" in code
    assert read_metadata(path)["arch"] == arch
    assert_runs_with_the_runtime_only(layer, path, tmp_path)


def test_an_exported_sentinel_stack_runs_with_the_runtime_only(tmp_path):
    """A wavefront stack with ``sentinel``: its exchange sequence is a scratch argument that the runtime-only
    process allocates with each call (two calls: the slots of the first must not leak into the second)."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        256,
        8,
        seq_len=64,
        dtype="float16",
        target="cuda",
        arch=gpu_spec().arch,
        layers=3,
        config={"units_per_cta": 16, "k_groups": 1, "n_tiles": 1, "layout": "split", "barrier": "sentinel"},
    )
    assert layer.kernel.config.barrier == "sentinel" and layer.signature.scratch
    path = prnn_tvm.export(layer, tmp_path / "stack.so")
    assert [
        a["name"]
        for launch in read_metadata(path)["signature"]["launches"]
        for a in launch["args"]
        if a["role"] == "scratch"
    ] == ["exchange"]
    assert_runs_with_the_runtime_only(layer, path, tmp_path)


def assert_runs_with_the_runtime_only(layer, path, tmp_path):
    """The exported library at ``path``, loaded in a fresh process with TVM's runtime only, gives ``layer``'s
    outputs and final states bit for bit, twice."""
    inputs = random_inputs(layer.plan, 64, layer.input_size, seed=1)
    out, finals = layer(**inputs)
    np.savez(tmp_path / "io.npz", out=out, **{f"final{i}": f for i, f in enumerate(finals)}, **inputs)
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    r = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(path), str(tmp_path / "io.npz")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and "runtime-only gpu ok" in r.stdout, r.stdout[-1000:] + r.stderr[-3000:]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_in_process_load_matches(dtype, tmp_path):
    layer = prnn_tvm.compile_cell("rnn_tanh", 128, 2, dtype=dtype, target="cuda")
    loaded = prnn_tvm.load(prnn_tvm.export(layer, tmp_path / "rnn.so"))
    inputs = random_inputs(layer.plan, 16, layer.input_size)
    (a, fa), (b, fb) = layer(**inputs), loaded(**inputs)
    assert np.array_equal(a, b) and np.array_equal(fa[0], fb[0])

"""A session from an exported layer: what ``export(..., session=True)`` writes (the session's kernels in the layer's
module, their launches in the metadata), how the metadata reads back (with the TVM runtime alone), and what is
refused, with the reason. The exported session running on the GPU: ``test_gpu_session.py``."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import ExportError, InputError, LoadError
from prnn_tvm.cli import main
from prnn_tvm.compiler import compile_session
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime.loading import LoadedLayer, read_metadata, session_signature_of, signature_of
from prnn_tvm.runtime.session import open_session
from prnn_tvm.signature import SessionSignature
from prnn_tvm.target import local_gpu

from .test_export import embedded_cuda_code


@pytest.fixture(scope="module")
def deep_stack():
    return prnn_tvm.compile_cell("lstm_d2", 32, 2, input_size=8, target="cuda", arch="sm_90")


@pytest.fixture(scope="module")
def exported(deep_stack, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lib")
    return prnn_tvm.export(deep_stack, folder / "with.so", session=True), prnn_tvm.export(deep_stack, folder / "no.so")


def test_the_session_round_trips_in_the_metadata(deep_stack, exported):
    metadata = read_metadata(exported[0])
    session = session_signature_of(exported[0], metadata)
    assert session == compile_session(deep_stack).signature
    assert SessionSignature.from_dict(json.loads(json.dumps(session.as_dict()))) == session
    assert (session.cell, session.batch, session.hidden, session.input_size) == ("lstm_d2", 2, 32, 8)
    assert session.output == "l1_h" and session.resident.grid.cooperative
    assert signature_of(metadata) == deep_stack.signature  # the layer itself is unchanged
    assert "session" not in read_metadata(exported[1])  # off by default
    assert session_signature_of(exported[1], read_metadata(exported[1])) is None


def test_the_library_holds_the_layers_and_the_sessions_kernels_as_one_cubin(exported):
    fmt, code = embedded_cuda_code(exported[0])
    assert fmt == b"cubin" and b"\x7fELF" in code
    session = session_signature_of(exported[0], read_metadata(exported[0]))
    for function in ("recurrent", "projection", *(launch.function for launch in session.launches)):
        assert f"{function}_kernel".encode() in code, function
    assert b"recurrent_session_kernel" not in embedded_cuda_code(exported[1])[1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.pop("publish"), "session metadata is damaged"),
        (lambda s: s.update(batch=3), "damaged: export the layer again"),
        (lambda s: s["collect"].update(args=[{"name": "x"}]), "session metadata is damaged"),
    ],
)
def test_damaged_session_metadata_is_refused(exported, change, message):
    metadata = read_metadata(exported[0])
    change(metadata["session"])
    with pytest.raises(LoadError, match=message):
        session_signature_of(exported[0], metadata)


def test_what_cannot_carry_a_session_is_refused_at_export(tmp_path):
    cpu = prnn_tvm.compile_cell("lstm", 8, 2, target="llvm")
    with pytest.raises(ExportError, match="CPU build, and a session runs on the GPU"):
        prnn_tvm.export(cpu, tmp_path / "cpu.so", session=True)
    wavefront = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90", layers=2)
    with pytest.raises(ExportError, match="cannot run as a session .*deep stack.*export it without session=True"):
        prnn_tvm.export(wavefront, tmp_path / "wavefront.so", session=True)
    with pytest.raises(ExportError, match="session must be True or False"):
        prnn_tvm.export(cpu, tmp_path / "cpu.so", session="yes")
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_loaded_layer_without_session_kernels_says_how_to_get_them(exported, tmp_path):
    cpu = prnn_tvm.load(prnn_tvm.export(prnn_tvm.compile_cell("lstm", 8, 2, target="llvm"), tmp_path / "c.so"))
    with pytest.raises(LoadError, match="CPU layer without session kernels; a session runs on the GPU"):
        cpu.session()
    metadata = read_metadata(exported[1])  # a CUDA library exported without them (it cannot be loaded here)
    layer = LoadedLayer(exported[1], metadata, signature_of(metadata), None, tvm.cuda(0))
    with pytest.raises(LoadError, match=r"without session kernels; export the layer again .*session=True"):
        layer.session()


@pytest.mark.skipif(local_gpu() is not None, reason="checks the GPU-less behaviour")
def test_a_library_with_a_session_is_refused_without_a_gpu(exported):
    with pytest.raises(LoadError, match="needs a GPU"):
        prnn_tvm.load(exported[0])


def test_a_session_refuses_names_it_does_not_take(deep_stack):
    """Before anything runs on the GPU: a misspelt initial state is not silently dropped."""
    weights = {k: v for k, v in random_inputs(deep_stack.plan, 1, 8).items() if k != "x"}
    session = compile_session(deep_stack).signature
    with pytest.raises(InputError, match=r"takes no 'l0_h_0'.*initial states l0_h0, l0_c0, l1_h0, l1_c0"):
        open_session(session, None, {**weights, "l0_h_0": np.zeros((2, 32), "float32")})


RUNTIME_ONLY = textwrap.dedent("""
    import sys, tvm
    from prnn_tvm.runtime.loading import read_metadata, session_signature_of
    from pathlib import Path
    path = Path(sys.argv[1])
    session = session_signature_of(path, read_metadata(path))
    assert [launch.function for launch in session.launches][0] == "recurrent_session"
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY and "libtvm_compiler" not in maps, "the TVM compiler was loaded"
    print("runtime-only session metadata ok")
""")


def test_the_session_metadata_reads_with_the_runtime_only(exported):
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(exported[0])], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and "runtime-only session metadata ok" in done.stdout, done.stderr[-2000:]


def test_cli_export_with_a_session(tmp_path, capsys):
    out = tmp_path / "gru.so"
    args = ["export", "gru_d2", "--hidden", "16", "--batch", "2", "--arch", "sm_90", "--session", "-o", str(out)]
    assert main(args) == 0
    assert read_metadata(out)["session"]["resident"]["function"] == "recurrent_session"
    assert main(["export", "gru", "--hidden", "8", "--batch", "2", "--cpu", "--session", "-o", str(out)]) == 2
    assert "--session exports a resident session's kernels, which run on the GPU" in capsys.readouterr().err

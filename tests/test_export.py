"""Export and load: the library's contents, its metadata, the runtime-only load, and refusals."""

import ctypes
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import InputError, LoadError
from prnn_tvm.codegen import kernel as kernel_module
from prnn_tvm.codegen.ptxas import compile_cuda
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime import exporting, library
from prnn_tvm.runtime.loading import arch_runs_on, read_metadata, signature_of
from prnn_tvm.runtime.module_format import _Reader, replace_cuda_payload
from prnn_tvm.target import local_gpu

from .cli_run import run_cli


@pytest.fixture(scope="module")
def cpu_layer():
    return prnn_tvm.compile_cell("lstm", 16, 3, input_size=12, seq_len=7, target="llvm")


@pytest.fixture(scope="module")
def cpu_library(cpu_layer, tmp_path_factory):
    return prnn_tvm.export(cpu_layer, tmp_path_factory.mktemp("lib") / "lstm_cpu.so")


def test_metadata_describes_the_layer(cpu_layer, cpu_library):
    meta = read_metadata(cpu_library)
    assert meta["cell"] == "lstm" and meta["fingerprint"] == cpu_layer.plan.fingerprint()
    assert (meta["batch"], meta["hidden"], meta["input_size"], meta["seq_len"]) == (3, 16, 12, 7)
    assert meta["dtype"] == "float32" and meta["target"] == "llvm" and meta["arch"] is None
    assert meta["prnn_tvm_version"] == prnn_tvm.__version__ and meta["tvm_version"]
    assert meta["config_origin"] == cpu_layer.report.config_detail == "none"
    assert [i["name"] for i in meta["inputs"]] == cpu_layer.arg_names
    assert [o["name"] for o in meta["outputs"]] == ["out", "h_n", "c_n"]
    assert meta["functions"]["recurrent"][:5] == ["xp", "W_hh", "b_hh", "h0", "c0"]


def test_metadata_carries_the_signature(cpu_layer, cpu_library):
    meta = read_metadata(cpu_library)
    assert meta["schema"] == 3 and signature_of(meta) == cpu_layer.signature
    assert [i["name"] for i in meta["inputs"] if i.get("optional")] == ["h0", "c0", "lengths"]
    assert meta["functions"] == {x.function: [a.name for a in x.args] for x in cpu_layer.signature.launches}


DATA = pathlib.Path(__file__).parent / "data"


def test_schema_1_metadata_reads_as_the_same_signature():
    """Files exported before the typed signature (metadata schema 1) describe the same launches.

    The fixture is the metadata prnn-tvm 0.1.0 wrote for this layer (a two-phase cell with the
    ``tags`` barrier, weights declared out of alphabetical order, input size != hidden).
    """
    old = json.loads((DATA / "schema1-gru_cho-sm_90.json").read_text())
    layer = prnn_tvm.compile_cell("gru_cho", 256, 4, input_size=100, target="cuda", arch="sm_90", config=old["config"])
    now = layer.signature.launch("recurrent")  # the same but for the host error word and lengths (not in 0.1.0)
    old_launch = dataclasses.replace(
        now,
        args=tuple(a for a in now.args if a.name not in ("error_host", "lengths")),
        grid=dataclasses.replace(now.grid, registers=old["launch"]["registers"]),
    )
    assert signature_of(old) == dataclasses.replace(layer.signature, launches=(layer.signature.launches[0], old_launch))


@pytest.fixture(scope="module")
def layer_without_lengths():
    """The cpu layer as prnn-tvm built it before per-row lengths: its kernel does not take them."""
    with pytest.MonkeyPatch.context() as mp:
        made = kernel_module.recurrent_args
        mp.setattr(
            kernel_module,
            "recurrent_args",
            lambda *a, **kw: tuple(arg for arg in made(*a, **kw) if arg.name != "lengths"),
        )
        # a patched compiler: build the layer here, whatever the layer cache holds for this shape
        layer = prnn_tvm.compile_cell("lstm", 16, 3, input_size=12, seq_len=7, target="llvm", cache=False)
    assert "lengths" not in layer.arg_names
    return layer


def test_a_schema_1_library_still_loads_and_runs(layer_without_lengths, cpu_layer, tmp_path, monkeypatch):
    old = json.loads((DATA / "schema1-lstm-llvm.json").read_text())
    assert old["schema"] == 1 and "signature" not in old
    monkeypatch.setattr(exporting, "layer_metadata", lambda layer: old)  # write it as 0.1.0 did
    loaded = prnn_tvm.load(prnn_tvm.export(layer_without_lengths, tmp_path / "old.so"))
    assert loaded.signature == layer_without_lengths.signature
    inputs = random_inputs(cpu_layer.plan, 7, 12, seed=5)
    assert np.array_equal(loaded(**inputs)[0], cpu_layer(**inputs)[0])


def test_a_schema_2_library_runs_and_says_it_has_no_lengths(layer_without_lengths, cpu_layer, tmp_path):
    path = prnn_tvm.export(layer_without_lengths, tmp_path / "two.so")
    meta = read_metadata(path)
    assert meta["schema"] == 3 and "lengths" not in meta["functions"]["recurrent"]
    loaded = prnn_tvm.load(path)  # what a file written by schema 2 holds: the same signature, no lengths
    inputs = random_inputs(cpu_layer.plan, 7, 12, seed=5)
    assert np.array_equal(loaded(**inputs)[0], cpu_layer(**inputs)[0])
    with pytest.raises(InputError, match="unknown argument 'lengths'"):
        loaded(**inputs, lengths=np.int32([7, 7, 7]))


def test_round_trip_is_bitwise_identical(cpu_layer, cpu_library):
    loaded = prnn_tvm.load(cpu_library)
    assert loaded.arg_names == cpu_layer.arg_names and "lstm batch=3 hidden=16" in repr(loaded)
    assert json.loads(loaded.module["prnn_tvm_metadata"]())["cell"] == "lstm"  # the packed entry, for TVM users
    inputs = random_inputs(cpu_layer.plan, 7, 12)
    (out, finals), (out2, finals2) = cpu_layer(**inputs), loaded(**inputs)
    assert np.array_equal(out, out2) and all(np.array_equal(a, b) for a, b in zip(finals, finals2))
    xp = inputs["x"] @ inputs["W_ih"].T + inputs["b_ih"]
    rec, _ = loaded.recurrent(xp.astype(np.float32), inputs["W_hh"], inputs["b_hh"], inputs["h0"], inputs["c0"])
    assert np.abs(rec - out).max() < tolerance("float32", 7)


def test_libraries_in_one_process_each_read_their_own_metadata(cpu_layer, cpu_library, tmp_path):
    """Every library's metadata text has one symbol name, hidden: each library's functions return its own text,
    whatever text needs escaping in the assembler's string (quotes, backslashes, JSON's escapes)."""
    odd = 'a "quoted" back\\slash, \u00e9, a tab\t and a newline\n'
    other = tmp_path / "other.so"
    library.write_library(cpu_layer.module, other, library.layer_metadata(cpu_layer) | {"note": odd, "cell": "other"})
    first, second = ctypes.CDLL(str(cpu_library)), ctypes.CDLL(str(other))
    for lib in (first, second):
        lib.prnn_tvm_metadata.restype = ctypes.c_char_p
    assert json.loads(first.prnn_tvm_metadata().decode())["cell"] == "lstm"
    meta = json.loads(second.prnn_tvm_metadata().decode())
    assert meta["cell"] == "other" and meta["note"] == odd
    for path, cell in ((other, "other"), (cpu_library, "lstm")):  # the packed entry
        assert json.loads(tvm.runtime.load_module(str(path))["prnn_tvm_metadata"]())["cell"] == cell


RUNTIME_ONLY = textwrap.dedent("""
    import sys, numpy as np, tvm
    import prnn_tvm
    layer = prnn_tvm.load(sys.argv[1])
    data = np.load(sys.argv[2])
    out, finals = layer(**{k: data[k] for k in layer.arg_names if k in data})
    assert np.array_equal(out, data["out"]) and np.array_equal(finals[1], data["c_n"]), "outputs differ"
    maps = open("/proc/self/maps").read()
    assert tvm.base._RUNTIME_ONLY and "libtvm_compiler" not in maps, "the TVM compiler was loaded"
    assert not [m for m in sys.modules if m in ("prnn_tvm.compiler", "prnn_tvm.codegen.build", "tvm.tirx.build")]
    print("runtime-only ok")
""")


def test_load_with_the_runtime_only(cpu_layer, cpu_library, tmp_path):
    inputs = random_inputs(cpu_layer.plan, 7, 12, seed=3) | {"lengths": np.int32([7, 3, 1])}
    out, (h_n, c_n) = cpu_layer(**inputs)
    np.savez(tmp_path / "io.npz", out=out, c_n=c_n, **inputs)
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    r = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(cpu_library), str(tmp_path / "io.npz")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and "runtime-only ok" in r.stdout, r.stderr[-2000:]


def test_a_stack_exports_and_loads_with_the_runtime_only(tmp_path):
    """A wavefront stack (``layers=``) is a layer like any other: its library runs in a runtime-only process
    (the delays live in the kernel), and its metadata names it as ``resolve`` takes it back."""
    layer = prnn_tvm.compile_cell("lstm", 6, 3, input_size=4, target="llvm", layers=3)
    library = prnn_tvm.export(layer, tmp_path / "stack.so")
    assert read_metadata(library)["cell"] == "lstm_x3" and prnn_tvm.resolve("lstm_x3").delays == layer.plan.cell.delays
    inputs = random_inputs(layer.plan, 9, 4, seed=2) | {"lengths": np.int32([9, 4, 1])}
    out, finals = layer(**inputs)
    np.savez(tmp_path / "io.npz", out=out, c_n=finals[1], **inputs)  # finals[1]: layer 0's c
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    r = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(library), str(tmp_path / "io.npz")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and "runtime-only ok" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(x=a["x"][:, :2]), r"x has shape \(5, 2, 12\), expected \(5, 3, 12\)"),
        (lambda a: a.update(W_ih=a["W_ih"][:, :8]), r"W_ih has shape \(64, 8\), expected \(64, 12\)"),
        (lambda a: a.update(W_hh=a["W_hh"].astype(np.float64)), "W_hh has dtype float64"),
    ],
)
def test_wrong_inputs_are_refused(cpu_library, mutate, message):
    loaded = prnn_tvm.load(cpu_library)
    inputs = random_inputs(_plan(), 5, 12)
    mutate(inputs)
    with pytest.raises(InputError, match=message):
        loaded(**inputs)


def _plan():
    return prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 3, 16, "float32")


def test_non_contiguous_dlpack_input_is_refused(cpu_library):
    loaded = prnn_tvm.load(cpu_library)
    inputs = random_inputs(_plan(), 5, 12)
    buf = np.empty(2 * inputs["W_hh"].size + 64, np.float32)  # 64-byte aligned start, strided view
    start = (-buf.ctypes.data % 64) // 4
    view = buf[start : start + 2 * inputs["W_hh"].size].reshape(64, 32)[:, ::2]
    view[...] = inputs["W_hh"]
    inputs["W_hh"] = _DLPack(view)  # anything with __dlpack__ is wrapped without a copy
    with pytest.raises(InputError, match="W_hh.*contiguous"):
        loaded(**inputs)


class _DLPack:
    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_files_that_are_not_layers_are_refused(cpu_layer, cpu_library, tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library at all" * 10)
    with pytest.raises(LoadError, match="junk.so is not a loadable shared library"):
        prnn_tvm.load(junk)
    cut = tmp_path / "cut.so"
    cut.write_bytes(cpu_library.read_bytes()[:4096])
    with pytest.raises(LoadError, match="cut.so is not a loadable shared library"):
        prnn_tvm.load(cut)
    plain = tmp_path / "plain.so"
    cpu_layer.compiled_module().export_library(str(plain))  # a TVM library without prnn-tvm's metadata
    with pytest.raises(LoadError, match="plain.so is not a prnn-tvm layer library"):
        prnn_tvm.load(plain)
    with pytest.raises(LoadError, match="no such file"):
        prnn_tvm.load(tmp_path / "missing.so")


def test_arch_compatibility_rule():
    assert arch_runs_on("sm_80", "sm_86") and arch_runs_on("sm_90", "sm_90")
    assert not arch_runs_on("sm_90", "sm_80") and not arch_runs_on("sm_86", "sm_80")
    assert not arch_runs_on("sm_80", "sm_90")


@pytest.fixture(scope="module")
def cuda_export(tmp_path_factory):
    layer = prnn_tvm.compile_cell("gru", 64, 2, target="cuda", arch="sm_90")
    return layer, prnn_tvm.export(layer, tmp_path_factory.mktemp("lib") / "gru_sm90.so")


def embedded_cuda_code(path) -> tuple[bytes, bytes]:
    """(format, the rest of the payload) of the CUDA module an exported library carries."""
    assert b"__global__" not in path.read_bytes()  # no CUDA source inside
    lib = ctypes.CDLL(str(path))  # the host library loads without a GPU; read the embedded imports
    size = int.from_bytes(bytes((ctypes.c_ubyte * 8).in_dll(lib, "__tvm_ffi__library_bin")), "little")
    blob = bytes((ctypes.c_ubyte * (size + 8)).in_dll(lib, "__tvm_ffi__library_bin"))
    r = _Reader(blob)
    r.u64()
    tree = r.u64_array(), r.u64_array()
    kinds = [r.string()]
    kinds.append(r.string())
    assert len(tree[0]) == 3 and kinds == [b"_lib", b"cuda"]
    payload = _Reader(r.string())
    return payload.string(), payload.data


def test_cuda_library_holds_a_cubin_not_source(cuda_export):
    layer, path = cuda_export
    fmt, data = embedded_cuda_code(path)
    assert fmt == b"cubin"
    cubin, _ = compile_cuda(layer.cuda_source, "sm_90")
    assert cubin.startswith(b"\x7fELF") and data.endswith(cubin)
    meta = read_metadata(path)
    assert meta["arch"] == "sm_90" and signature_of(meta) == layer.signature
    assert signature_of(meta).launch("recurrent").grid.ctas == layer.report.ctas
    assert meta["report"]["registers"] == layer.report.registers


def test_payload_rewrite_refuses_unknown_layouts():
    with pytest.raises(prnn_tvm.ExportError, match="layout"):
        replace_cuda_payload(b"\x10" + b"\0" * 15, b"\x7fELF")


@pytest.mark.skipif(local_gpu() is not None, reason="checks the GPU-less behaviour")
def test_cuda_library_without_gpu_says_so(cuda_export):
    with pytest.raises(LoadError, match="needs a GPU"):
        prnn_tvm.load(cuda_export[1])


def test_cli_export(tmp_path):
    out = tmp_path / "rnn.so"
    r = run_cli("export", "rnn_tanh", "--hidden", "8", "--batch", "2", "--cpu", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "exported" in r.stdout and read_metadata(out)["cell"] == "rnn_tanh"


def readme_block(heading: str) -> str:
    """The first Python block of the README section ``heading`` (the README's examples run as written)."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_export_and_load_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_block("## Export and load"), "README.md", "exec"), {})
    assert (tmp_path / "lstm_h64.so").is_file()


def test_a_re_export_to_the_same_path_loads_the_new_library(tmp_path):
    """The dynamic loader hands back a library already loaded from a path: the second load of a path exported
    twice ran the first cell, its checksum passing. Each load maps a copy named by its contents."""
    path = tmp_path / "m.so"
    first = prnn_tvm.compile_cell("rnn_tanh", 8, 2, target="llvm")
    second = prnn_tvm.compile_cell("gru", 8, 2, target="llvm")
    prnn_tvm.export(first, path)
    assert prnn_tvm.load(path).metadata["cell"] == "rnn_tanh"
    prnn_tvm.export(second, path)
    loaded = prnn_tvm.load(path)
    assert loaded.metadata["cell"] == "gru" and "W_hh" in loaded.signature.arg_names
    inputs = random_inputs(second.plan, 4, 8)
    assert np.array_equal(loaded(**inputs)[0], second(**inputs)[0])
    again = prnn_tvm.load(path)  # the same content: the same copy
    assert np.array_equal(again(**inputs)[0], second(**inputs)[0])

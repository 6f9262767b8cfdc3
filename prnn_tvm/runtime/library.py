"""A compiled module written as one shared library with its metadata: what :func:`prnn_tvm.export` writes and
the layer cache (:mod:`prnn_tvm.cache`) keeps.

The library holds the host code, the kernels as *compiled* GPU code (a cubin for the layer's architecture:
loading it needs neither nvcc, NVRTC nor the TVM compiler), and the metadata as JSON, returned by the C
function ``prnn_tvm_metadata()`` and by the packed function ``prnn_tvm_metadata`` of the loaded module.
:func:`prnn_tvm.load` reads it back.

Where the cubin comes from: on a machine without a GPU driver TVM 0.27 cannot create a real CUDA module, so
its build holds CUDA source (format ``"cuda"``), which the runtime would compile with NVRTC at load. The
project compiles that source with nvcc for the layer's arch anyway (:func:`prnn_tvm.codegen.ptxas.compile_cuda`,
cached), so the library gets that cubin in the source's place (:mod:`prnn_tvm.runtime.module_format`). On a
GPU host the module already holds the same cubin; the rewrite is then a no-op in effect. Writing one needs
nvcc (CUDA) and a host C++ compiler (``g++``, for linking); no GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import tvm
import tvm_ffi

from ..codegen import ptxas
from ..errors import ExportError
from .loading import CHECKSUM, FORMAT, METADATA_SYMBOL, SCHEMA, checksum_trailer, first_line
from .module_format import pack_with_cubin


def write_library(module, path: Path, metadata: dict, cubin: bytes | None = None) -> None:
    """Link ``module`` with ``metadata`` (and ``cubin`` in place of its CUDA code) into the library ``path``,
    whole or not at all (a file beside it, renamed into place, ends with the checksum load verifies)."""
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_export_") as tmp:
        meta_c = Path(tmp, "prnn_metadata.c")
        meta_c.write_text(_metadata_source(json.dumps(metadata, sort_keys=True)))
        pack = None
        if cubin is not None:
            pack = lambda mod, _system_lib, prefix, workdir: pack_with_cubin(mod, prefix, workdir, cubin)  # noqa: E731
        includes = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
        built = Path(tmp, "layer.so")
        try:
            module.export_library(
                str(built),
                fpack_imports=pack,
                addons=[str(meta_c)],
                options=[f"-I{d}" for d in includes],
                workspace_dir=tmp,
            )
        except (RuntimeError, OSError) as err:  # the host compiler's or linker's message, first line
            needed = "; a host C++ compiler (g++) is needed" if shutil.which("g++") is None else ""
            raise ExportError(f"linking {path.name} failed: {first_line(err)}{needed}") from err
        body = built.read_bytes()
    write_whole(path, body + checksum_trailer(body))


def write_whole(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a file beside it renamed into place (a library loaded from it stays
    intact); ExportError when it cannot be written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise ExportError(f"cannot write {path}: {err.strerror}") from err


def layer_metadata(layer) -> dict:
    """The JSON-able description a layer's library carries: what, for which shapes and GPU, how to call it.

    ``signature`` is the layer's :class:`~prnn_tvm.signature.Signature` (what the loader runs);
    ``functions``, ``inputs`` and ``outputs`` say the same for readers without prnn-tvm.
    """
    rep, sig = layer.report, layer.signature

    def described(arg):
        d = {"name": arg.name, "shape": list(arg.shape), "dtype": arg.dtype}
        return d | ({"optional": True} if arg.role.optional else {})

    return {
        **kernels_metadata(sig, layer.gpu.arch if layer.is_cuda else None),
        "fingerprint": rep.fingerprint,
        "seq_len": rep.seq_len,
        "template": rep.template,
        "config": rep.config,
        "config_origin": rep.config_detail,
        "inputs": [described(a) for a in sig.inputs],
        "outputs": [described(a) for a in sig.outputs],
        "report": rep.as_dict(),
    }


def kernels_metadata(signature, arch: str | None) -> dict:
    """The metadata every library carries (what :func:`prnn_tvm.load` reads): ``signature``'s launches, shapes
    and dtype, the target (CUDA for ``arch``, else the CPU) and the versions that wrote it."""
    from .. import __version__

    return {
        "format": FORMAT,
        "schema": SCHEMA,
        "checksum": CHECKSUM,
        "cell": signature.cell,
        "batch": signature.batch,
        "hidden": signature.hidden,
        "input_size": signature.input_size,
        "dtype": signature.dtype,
        "target": "cuda" if arch else "llvm",
        "arch": arch,
        "prnn_tvm_version": __version__,
        "tvm_version": tvm.__version__,
        "functions": {x.function: [a.name for a in x.args] for x in signature.launches},
        "signature": signature.as_dict(),
    }


def cubin(source: str | None, arch: str, what: str) -> bytes:
    """nvcc's cubin of the CUDA ``source`` of ``what`` (a cell's name) for ``arch``; ExportError without one."""
    if not source:
        raise ExportError(f"{what}: the layer holds no CUDA source to compile")
    try:
        code, _ = ptxas.compile_cuda(source, arch)
    except ptxas.NvccNotFound as err:
        raise ExportError(f"{err}; export compiles the kernels to a cubin for {arch}") from err
    if not code.startswith(b"\x7fELF"):
        raise ExportError(f"nvcc returned no cubin for {arch}")
    return code


def _metadata_source(text: str) -> str:
    """C for the metadata: a plain C function (ctypes can read it) and a packed function (TVM can)."""
    literal = json.dumps(text)  # a valid C string literal for JSON text (ASCII, escaped)
    return f"""#include <tvm/ffi/c_api.h>
#ifdef __cplusplus
extern "C" {{
#endif
static const char prnn_metadata_json[] = {literal};
TVM_FFI_DLL_EXPORT const char* {METADATA_SYMBOL}(void) {{ return prnn_metadata_json; }}
TVM_FFI_DLL_EXPORT int __tvm_ffi_{METADATA_SYMBOL}(void* self, const TVMFFIAny* args, int32_t num_args,
                                                   TVMFFIAny* result) {{
  TVMFFIByteArray text = {{prnn_metadata_json, sizeof(prnn_metadata_json) - 1}};
  (void)self; (void)args; (void)num_args;
  return TVMFFIStringFromByteArray(&text, result);
}}
#ifdef __cplusplus
}}
#endif
"""

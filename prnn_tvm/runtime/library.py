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

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

import tvm
import tvm_ffi
from tvm.support import cc

from ..codegen import ptxas
from ..errors import ExportError
from .loading import CHECKSUM, FORMAT, METADATA_SYMBOL, SCHEMA, checksum_trailer, first_line
from .module_format import pack_with_cubin

TEXT_SYMBOL = "prnn_tvm_metadata_text"  # the metadata's JSON in a library, hidden (each library reads its own)


def write_library(module, path: Path, metadata: dict, cubin: bytes | None = None) -> None:
    """Link ``module`` with ``metadata`` (and ``cubin`` in place of its CUDA code) into the library ``path``,
    whole or not at all (a file beside it, renamed into place, ends with the checksum load verifies)."""
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_export_") as tmp:
        functions, text = Path(tmp, "prnn_metadata_functions.o"), Path(tmp, "prnn_metadata_text.s")
        pack = None
        if cubin is not None:
            pack = lambda mod, _system_lib, prefix, workdir: pack_with_cubin(mod, prefix, workdir, cubin)  # noqa: E731
        built = Path(tmp, "layer.so")
        try:
            functions.write_bytes(_metadata_functions(cc.get_cc()))
            text.write_text(_metadata_text(json.dumps(metadata, sort_keys=True)))
            module.export_library(str(built), fpack_imports=pack, addons=[str(functions), str(text)], workspace_dir=tmp)
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


@functools.cache
def _metadata_functions(compiler: str) -> bytes:
    """The object of the metadata's functions, compiled by ``compiler`` once per process: a plain C function (ctypes
    can read it) and a packed function (TVM can), both returning the text a library's :func:`_metadata_text`
    holds. A library links it with that text as assembler data, so writing one compiles no C (the layer cache
    writes hundreds)."""
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_export_") as tmp:
        source, obj = Path(tmp, "prnn_metadata.c"), Path(tmp, "prnn_metadata.o")
        source.write_text(_FUNCTIONS)
        includes = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
        cc.create_shared(str(obj), [str(source)], options=["-c", "-fPIC", *(f"-I{d}" for d in includes)], cc=compiler)
        return obj.read_bytes()


_FUNCTIONS = f"""#include <string.h>
#include <tvm/ffi/c_api.h>
#ifdef __cplusplus
extern "C" {{
#endif
extern const char {TEXT_SYMBOL}[] __attribute__((visibility("hidden")));
TVM_FFI_DLL_EXPORT const char* {METADATA_SYMBOL}(void) {{ return {TEXT_SYMBOL}; }}
TVM_FFI_DLL_EXPORT int __tvm_ffi_{METADATA_SYMBOL}(void* self, const TVMFFIAny* args, int32_t num_args,
                                                   TVMFFIAny* result) {{
  TVMFFIByteArray text = {{{TEXT_SYMBOL}, strlen({TEXT_SYMBOL})}};
  (void)self; (void)args; (void)num_args;
  return TVMFFIStringFromByteArray(&text, result);
}}
#ifdef __cplusplus
}}
#endif
"""


def _metadata_text(text: str) -> str:
    """Assembler data for the metadata's JSON ``text`` (ASCII): a hidden symbol, so each library's functions read
    its own text, ending in a zero byte."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return (
        f'\t.section .rodata\n\t.globl {TEXT_SYMBOL}\n\t.hidden {TEXT_SYMBOL}\n\t.type {TEXT_SYMBOL}, %object\n'
        f'{TEXT_SYMBOL}:\n\t.ascii "{escaped}"\n\t.byte 0\n\t.size {TEXT_SYMBOL}, . - {TEXT_SYMBOL}\n'
        '\t.section .note.GNU-stack,"",%progbits\n'
    )

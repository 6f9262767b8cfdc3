"""``export``: write a compiled layer to one shared library that the TVM runtime alone can run.

The library holds the host code, the projection and recurrent kernels as *compiled* GPU
code (a cubin for the layer's architecture: loading it needs neither nvcc, NVRTC nor the
TVM compiler), and the layer's metadata as JSON, returned by the C function
``prnn_tvm_metadata()`` and by the packed function ``prnn_tvm_metadata`` of the loaded
module. :func:`prnn_tvm.load` reads it back.

Where the cubin comes from: on a machine without a GPU driver TVM 0.27 cannot create a
real CUDA module, so its build holds CUDA source (format ``"cuda"``), which the runtime
would compile with NVRTC at load. The project compiles that source with nvcc for the
layer's arch anyway (:func:`prnn_tvm.codegen.ptxas.compile_cuda`, cached), so export puts
that cubin in the source's place (:mod:`prnn_tvm.runtime.module_format`). On a GPU host the module already holds
the same cubin; the rewrite is then a no-op in effect. The build host needs nvcc and a
host C++ compiler (``g++``, for linking the library); no GPU.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import tvm
import tvm_ffi

from ..codegen import ptxas
from ..errors import ExportError
from .layer import Layer
from .loading import CHECKSUM, FORMAT, METADATA_SYMBOL, SCHEMA, checksum_trailer, first_line
from .module_format import pack_with_cubin

log = logging.getLogger(__name__)


def export(layer, path, **compile_kwargs) -> Path:
    """Write ``layer`` to the shared library ``path`` for inference elsewhere.

    Parameters
    ----------
    layer : Layer or str or Cell
        A compiled layer, or a cell to compile first with ``compile_kwargs``
        (those of :func:`prnn_tvm.compile_cell`: ``hidden``, ``batch``, ``arch``, ...).
    path : str or Path
        The library to write (``.so``). It is written whole or not at all (a file beside it, renamed
        into place), so a library loaded from it before stays intact.

    Use it on a build machine (nvcc and a C++ compiler; a GPU is not needed) and
    :func:`prnn_tvm.load` where the layer runs. Weights are not part of the library:
    they are passed at each call, as to the compiled layer. Returns the path.
    """
    if not isinstance(layer, Layer):
        from ..compiler import compile_cell  # the compiler only when asked to compile

        layer = compile_cell(layer, **compile_kwargs)
    elif compile_kwargs:
        raise ExportError(f"compile arguments ({', '.join(compile_kwargs)}) given with an already compiled layer")
    path = _writable(Path(path))
    metadata = layer_metadata(layer)
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_export_") as tmp:
        meta_c = Path(tmp, "prnn_metadata.c")
        meta_c.write_text(_metadata_source(json.dumps(metadata, sort_keys=True)))
        pack = None
        if layer.is_cuda:
            cubin = _cubin(layer)
            pack = lambda mod, _system_lib, prefix, workdir: pack_with_cubin(mod, prefix, workdir, cubin)  # noqa: E731
        includes = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
        built = Path(tmp, "layer.so")
        try:
            layer.module.export_library(str(built), fpack_imports=pack, addons=[str(meta_c)],
                                        options=[f"-I{d}" for d in includes], workspace_dir=tmp)
        except (RuntimeError, OSError) as err:  # the host compiler's or linker's message, first line
            needed = "; a host C++ compiler (g++) is needed" if shutil.which("g++") is None else ""
            raise ExportError(f"linking {path.name} failed: {first_line(err)}{needed}") from err
        body = built.read_bytes()
        partial = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:  # whole or not at all, the checksum load verifies before mapping the file last
            partial.write_bytes(body + checksum_trailer(body))
            os.replace(partial, path)
        except OSError as err:
            partial.unlink(missing_ok=True)
            raise ExportError(f"cannot write {path}: {err.strerror}") from err
    log.info("exported %s (%s) to %s", layer.signature.cell, layer.report.target, path)
    return path


def _writable(path: Path) -> Path:
    """``path`` if a library can be written there, else ExportError saying why (before anything is built)."""
    if path.is_dir():
        raise ExportError(f"{path} is a directory; give the path of the library to write (.so)")
    if path.suffix != ".so":
        raise ExportError(f"{path.name}: an exported layer is a shared library, which prnn_tvm.load (and TVM's loader) "
                          f"knows by its name ending in .so; name it {path.stem or path.name}.so")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    if path.exists() and not path.is_file():
        raise ExportError(f"cannot write {path}: it exists and is not a regular file")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {path}: the folder {path.parent} is not writable")
    return path


def layer_metadata(layer: Layer) -> dict:
    """The JSON-able description an exported library carries: what, for which shapes and GPU, how to call it.

    ``signature`` is the layer's :class:`~prnn_tvm.signature.Signature` (what the loader runs);
    ``functions``, ``inputs`` and ``outputs`` say the same for readers without prnn-tvm.
    """
    from .. import __version__

    rep, sig = layer.report, layer.signature

    def described(arg):
        d = {"name": arg.name, "shape": list(arg.shape), "dtype": arg.dtype}
        return d | ({"optional": True} if arg.role.optional else {})

    return {
        "format": FORMAT, "schema": SCHEMA, "checksum": CHECKSUM,
        "cell": rep.cell, "fingerprint": rep.fingerprint,
        "batch": sig.batch, "hidden": sig.hidden, "input_size": sig.input_size, "seq_len": rep.seq_len,
        "dtype": sig.dtype, "target": "cuda" if layer.is_cuda else "llvm",
        "arch": layer.gpu.arch if layer.is_cuda else None,
        "template": rep.template, "config": rep.config, "config_origin": rep.config_detail,
        "prnn_tvm_version": __version__, "tvm_version": tvm.__version__,
        "functions": {x.function: [a.name for a in x.args] for x in sig.launches},
        "inputs": [described(a) for a in sig.inputs], "outputs": [described(a) for a in sig.outputs],
        "signature": sig.as_dict(), "report": rep.as_dict(),
    }


def _cubin(layer: Layer) -> bytes:
    if not layer.cuda_source:
        raise ExportError(f"{layer.signature.cell}: the layer holds no CUDA source to compile")
    try:
        cubin, _ = ptxas.compile_cuda(layer.cuda_source, layer.gpu.arch)
    except ptxas.NvccNotFound as err:
        raise ExportError(f"{err}; export compiles the kernels to a cubin for {layer.gpu.arch}") from err
    if not cubin.startswith(b"\x7fELF"):
        raise ExportError(f"nvcc returned no cubin for {layer.gpu.arch}")
    return cubin


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

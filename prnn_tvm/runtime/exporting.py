"""``export``: write a compiled layer to one shared library that the TVM runtime alone can run.

The library holds the host code, the projection and recurrent kernels as *compiled* GPU
code (a cubin for the layer's architecture: loading it needs neither nvcc, NVRTC nor the
TVM compiler), and the layer's metadata as JSON, returned by the C function
``prnn_tvm_metadata()`` and by the packed function ``prnn_tvm_metadata`` of the loaded
module. :func:`prnn_tvm.load` reads it back.

Where the cubin comes from: on a machine without a GPU driver TVM 0.27 cannot create a
real CUDA module, so its build holds CUDA source (format ``"cuda"``), which the runtime
would compile with NVRTC at load. The project compiles that source with nvcc for the
layer's arch anyway (:func:`prnn_tvm.ptxas.compile_cuda`, cached), so export puts that
cubin in the source's place: TVM serializes a CUDA module as (format, function table,
payload), and the serialized imports are rewritten to (``"cubin"``, the same table, the
cubin) before they are linked into the library. On a GPU host the module already holds
the same cubin; the rewrite is then a no-op in effect. The build host needs nvcc and a
host C++ compiler (``g++``, for linking the library); no GPU.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
from pathlib import Path

import tvm
import tvm_ffi
from tvm.runtime import _ffi_api as _runtime_api

from ..codegen import ptxas
from ..errors import ExportError
from .layer import Layer
from .loading import FORMAT, METADATA_SYMBOL, SCHEMA, first_line

log = logging.getLogger(__name__)

_BLOB_SYMBOL = "__tvm_ffi__library_bin"


def export(layer, path, **compile_kwargs) -> Path:
    """Write ``layer`` to the shared library ``path`` for inference elsewhere.

    Parameters
    ----------
    layer : Layer or str or Cell
        A compiled layer, or a cell to compile first with ``compile_kwargs``
        (those of :func:`prnn_tvm.compile_cell`: ``hidden``, ``batch``, ``arch``, ...).
    path : str or Path
        The library to write (``.so``).

    Use it on a build machine (nvcc and a C++ compiler; a GPU is not needed) and
    :func:`prnn_tvm.load` where the layer runs. Weights are not part of the library:
    they are passed at each call, as to the compiled layer. Returns the path.
    """
    if not isinstance(layer, Layer):
        from ..compiler import compile_cell  # the compiler only when asked to compile

        layer = compile_cell(layer, **compile_kwargs)
    elif compile_kwargs:
        raise ExportError(f"compile arguments ({', '.join(compile_kwargs)}) given with an already compiled layer")
    path = Path(path)
    metadata = layer_metadata(layer)
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_export_") as tmp:
        meta_c = Path(tmp, "prnn_metadata.c")
        meta_c.write_text(_metadata_source(json.dumps(metadata, sort_keys=True)))
        pack = None
        if layer.is_cuda:
            cubin = _cubin(layer)
            pack = lambda mod, _system_lib, prefix, workdir: _pack_with_cubin(mod, prefix, workdir, cubin)  # noqa: E731
        includes = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
        try:
            layer.module.export_library(str(path), fpack_imports=pack, addons=[str(meta_c)],
                                        options=[f"-I{d}" for d in includes], workspace_dir=tmp)
        except (RuntimeError, OSError) as err:  # the host compiler's or linker's message, first line
            raise ExportError(f"linking {path.name} failed: {first_line(err)}; a host C++ compiler (g++) is "
                              "needed") from err
    log.info("exported %s (%s, %s) to %s", layer.spec.cell, metadata["target"], metadata["arch"], path)
    return path


def layer_metadata(layer: Layer) -> dict:
    """The JSON-able description an exported library carries: what, for which shapes and GPU, how to call it."""
    from .. import __version__

    rep, spec = layer.report, layer.spec
    B, H, n_in, T = spec.batch, spec.hidden, spec.input_size, "T"
    inputs = [{"name": "x", "shape": [T, B, n_in]}, {"name": "W_ih", "shape": [spec.proj_width, n_in]},
              {"name": "b_ih", "shape": [spec.proj_width]}]
    inputs += [{"name": n, "shape": list(s)} for n, s in spec.shapes.items()]
    inputs += [{"name": f"{s}0", "shape": [B, H], "optional": True} for s in spec.states]
    outputs = [{"name": "out", "shape": [T, B, H]}] + [{"name": f"{s}_n", "shape": [B, H]} for s in spec.states]
    return {
        "format": FORMAT, "schema": SCHEMA,
        "cell": rep.cell, "fingerprint": rep.fingerprint,
        "batch": B, "hidden": H, "input_size": n_in, "seq_len": rep.seq_len, "dtype": spec.dtype,
        "target": "cuda" if layer.is_cuda else "llvm", "arch": layer.gpu.arch if layer.is_cuda else None,
        "template": rep.template, "config": rep.config, "config_origin": rep.config_origin,
        "prnn_tvm_version": __version__, "tvm_version": tvm.__version__,
        "functions": {"projection": ["x", "W_ih", "b_ih", "xp"],
                      "recurrent": ["xp", *spec.arg_names[3:], "out", *(f"{s}_n" for s in spec.states),
                                    *(["workspace"] if spec.workspace else []),
                                    *(["sync", "timeout_us", "stall_step"] if spec.sync_words else [])]},
        "inputs": inputs, "outputs": outputs,
        "launch": spec.as_dict(), "report": rep.as_dict(),
    }


def _cubin(layer: Layer) -> bytes:
    if not layer.cuda_source:
        raise ExportError(f"{layer.spec.cell}: the layer holds no CUDA source to compile")
    try:
        cubin, _ = ptxas.compile_cuda(layer.cuda_source, layer.gpu.arch)
    except ptxas.NvccNotFound as err:
        raise ExportError(f"{err}; export compiles the kernels to a cubin for {layer.gpu.arch}") from err
    if not cubin.startswith(b"\x7fELF"):
        raise ExportError(f"nvcc returned no cubin for {layer.gpu.arch}")
    return cubin


# --------------------------------------------------------------- the serialized imports
# Layout (TVM 0.27, little endian): u64 byte count, the import tree in CSR form (row
# pointers, then child indices: u64 arrays, each length-prefixed), then per module its kind
# (length-prefixed string) followed, except for the host library "_lib", by its
# length-prefixed payload. A CUDA payload is: format (string), function table
# (u64 count; per entry: key, name, arg dtypes as 4-byte records, launch tags as strings,
# 4-byte arg tags), code (length-prefixed bytes), nothing after.
class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())

    def u64_array(self) -> list[int]:
        return [self.u64() for _ in range(self.u64())]


def _string(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def replace_cuda_payload(blob: bytes, cubin: bytes) -> bytes:
    """The serialized imports ``blob`` with every CUDA module's code replaced by ``cubin``."""
    r = _Reader(blob)
    try:
        if r.u64() != len(blob) - 8:
            raise ValueError("byte count")
        tree = (r.u64_array(), r.u64_array())
        kinds, payloads = [], []
        for _ in range(len(tree[0]) - 1):
            kinds.append(r.string())
            payloads.append(None if kinds[-1] == b"_lib" else r.string())
        if r.pos != len(blob):
            raise ValueError("trailing bytes")
        found = 0
        for i, kind in enumerate(kinds):
            if kind == b"cuda":
                payloads[i] = _cubin_payload(payloads[i], cubin)
                found += 1
    except ValueError as err:
        raise ExportError(f"TVM {tvm.__version__} serialized the module's imports in a layout this prnn-tvm "
                          f"does not know ({err}); export with the pinned apache-tvm") from err
    if not found:
        raise ExportError("the layer's module has no CUDA kernels to replace with a cubin")
    body = b"".join(struct.pack("<Q", len(a)) + b"".join(struct.pack("<Q", v) for v in a) for a in tree)
    body += b"".join(_string(k) + (b"" if p is None else _string(p)) for k, p in zip(kinds, payloads))
    return struct.pack("<Q", len(body)) + body


def _cubin_payload(payload: bytes, cubin: bytes) -> bytes:
    r = _Reader(payload)
    fmt = r.string()
    if fmt not in (b"cuda", b"ptx", b"cubin", b"fatbin"):
        raise ValueError(f"CUDA code format {fmt!r}")
    start = r.pos
    for _ in range(r.u64()):
        r.string(), r.string()                                  # key, name
        r.take(4 * r.u64())                                     # argument dtypes
        for _ in range(r.u64()):
            r.string()                                          # launch parameter tags
        r.take(4 * r.u64())                                     # argument tags
    table = payload[start:r.pos]
    r.string()                                                  # the code: source, PTX or cubin
    if r.pos != len(payload):
        raise ValueError("CUDA payload has bytes after its code")
    return _string(b"cubin") + table + _string(cubin)


def _pack_with_cubin(mod, prefix: str, workdir: str, cubin: bytes) -> str:
    """``fpack_imports`` for ``export_library``: the imports as C, CUDA code replaced by ``cubin``."""
    blob = bytes(_runtime_api.ModulePackImportsToTensor(mod).numpy())
    blob = replace_cuda_payload(blob, cubin)
    path = os.path.join(workdir, f"{prefix}devc.c")
    Path(path).write_text(_c_array(prefix + _BLOB_SYMBOL, blob))
    return path


def _c_array(symbol: str, data: bytes) -> str:
    rows = (",".join(str(b) for b in data[i:i + 40]) for i in range(0, len(data), 40))
    # extern first: in C++ a namespace-scope const would otherwise have internal linkage
    return (f'#ifdef __cplusplus\nextern "C" {{\n#endif\nextern const unsigned char {symbol}[];\n'
            f"const unsigned char {symbol}[{len(data)}] = {{\n" + ",\n".join(rows) +
            "\n};\n#ifdef __cplusplus\n}\n#endif\n")


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

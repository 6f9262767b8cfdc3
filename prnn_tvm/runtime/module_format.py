"""TVM 0.27's serialized module imports, rewritten so that an exported library carries a cubin.

A CUDA build on a machine without a GPU driver holds CUDA source (format ``"cuda"``),
which the runtime would compile with NVRTC at load. TVM serializes a module's imports as
(format, function table, payload) per CUDA module; :func:`replace_cuda_payload` rewrites
them to (``"cubin"``, the same table, nvcc's cubin) before they are linked into the
library, and :func:`pack_with_cubin` is the ``fpack_imports`` hook that does it for
``export_library``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import tvm
from tvm.runtime import _ffi_api as _runtime_api

from ..errors import ExportError

_BLOB_SYMBOL = "__tvm_ffi__library_bin"


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
        chunk = self.data[self.pos : self.pos + n]
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
        raise ExportError(
            f"TVM {tvm.__version__} serialized the module's imports in a layout this prnn-tvm "
            f"does not know ({err}); export with the pinned apache-tvm"
        ) from err
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
        r.string(), r.string()  # key, name
        r.take(4 * r.u64())  # argument dtypes
        for _ in range(r.u64()):
            r.string()  # launch parameter tags
        r.take(4 * r.u64())  # argument tags
    table = payload[start : r.pos]
    r.string()  # the code: source, PTX or cubin
    if r.pos != len(payload):
        raise ValueError("CUDA payload has bytes after its code")
    return _string(b"cubin") + table + _string(cubin)


def pack_with_cubin(mod, prefix: str, workdir: str, cubin: bytes) -> str:
    """``fpack_imports`` for ``export_library``: the imports as C, CUDA code replaced by ``cubin``."""
    blob = bytes(_runtime_api.ModulePackImportsToTensor(mod).numpy())
    blob = replace_cuda_payload(blob, cubin)
    path = os.path.join(workdir, f"{prefix}devc.c")
    Path(path).write_text(_c_array(prefix + _BLOB_SYMBOL, blob))
    return path


def _c_array(symbol: str, data: bytes) -> str:
    rows = (",".join(str(b) for b in data[i : i + 40]) for i in range(0, len(data), 40))
    # extern first: in C++ a namespace-scope const would otherwise have internal linkage
    return (
        f'#ifdef __cplusplus\nextern "C" {{\n#endif\nextern const unsigned char {symbol}[];\n'
        f"const unsigned char {symbol}[{len(data)}] = {{\n" + ",\n".join(rows) + "\n};\n#ifdef __cplusplus\n}\n#endif\n"
    )

"""``load``: run a layer exported with :func:`prnn_tvm.export`, with the TVM runtime alone.

Imports only TVM's runtime, tvm_ffi and NumPy, so it works under TVM's runtime-only
import (``TVM_USE_RUNTIME_LIB=1``); the CUDA loader library that mode leaves out is
loaded here when a CUDA library is loaded. The library's metadata is checked first: a file
that is not a prnn-tvm library, or one built for another GPU, is refused with the reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import tvm
import tvm_ffi

from ..errors import LoadError
from ..signature import Grid, GridSync, Launch, Signature, projection_launch, recurrent_args
from .base import RuntimeLayer

log = logging.getLogger(__name__)

FORMAT = "prnn-tvm layer"
# Exported files end with MAGIC + sha256(everything before), checked before the file is ever
# mapped (a damaged library can kill the process inside dlopen). Their metadata says so with
# CHECKSUM, so a file cut short (trailer gone) is told from one exported before checksums.
CHECKSUM = "sha256 trailer"
CHECKSUM_MAGIC = b"PRNN-TVM-SHA256\0"
CHECKSUM_BYTES = len(CHECKSUM_MAGIC) + hashlib.sha256().digest_size
# 3: a typed signature (prnn_tvm.signature) that may hold per-row lengths; 2: the same before them;
# 1: a flat launch spec. All three are read.
SCHEMA = 3
READABLE_SCHEMAS = (1, 2, 3)
METADATA_SYMBOL = "prnn_tvm_metadata"


class LoadedLayer(RuntimeLayer):
    """A layer loaded from an exported library: called exactly like the compiled one.

    ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` returns ``(out, (h_n, c_n))``; the
    weights are arguments, not part of the library. ``metadata`` is the library's
    description (cell and math hash, shapes, arch, config, versions, argument layout).
    """

    def __init__(self, path: Path, metadata: dict, signature: Signature, module, device: tvm.runtime.Device):
        self.path, self.metadata = path, metadata
        self._device = device
        super().__init__(signature, module, metadata["target"] == "cuda")
        self.cell, self.batch, self.hidden = metadata["cell"], metadata["batch"], metadata["hidden"]

    @property
    def device(self) -> tvm.runtime.Device:
        return self._device

    def __repr__(self) -> str:
        m = self.metadata
        where = f"cuda {m['arch']}" if m["target"] == "cuda" else "cpu"
        return (f"<LoadedLayer {m['cell']} batch={m['batch']} hidden={m['hidden']} input={m['input_size']} "
                f"{m['dtype']} {where} from {self.path.name}>")


def read_metadata(path: str | Path) -> dict:
    """The metadata of an exported library, checked to be a prnn-tvm layer this version can run."""
    path = Path(path)
    if path.is_dir():
        raise LoadError(f"{path} is a directory; give the path of an exported library (.so)")
    if not path.is_file():
        raise LoadError(f"{path}: no such file")
    problem = _checksum_problem(path) or _elf_problem(path)
    if problem:
        raise LoadError(f"{path.name} is not a loadable shared library ({problem}); "
                        "export the layer again with prnn-tvm export")
    try:
        lib = ctypes.CDLL(str(path.resolve()), mode=ctypes.RTLD_LOCAL)
    except OSError as err:
        raise LoadError(f"{path.name} is not a loadable shared library ({first_line(err)}); "
                        "export the layer again with prnn-tvm export") from err
    try:
        fn = getattr(lib, METADATA_SYMBOL)
    except AttributeError:
        raise LoadError(f"{path.name} is not a prnn-tvm layer library (it has no {METADATA_SYMBOL}); "
                        "export one with prnn-tvm export") from None
    fn.restype = ctypes.c_char_p
    try:
        metadata = json.loads(fn().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LoadError(f"{path.name}: its metadata is damaged ({err}); export the layer again") from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise LoadError(f"{path.name}: its metadata does not describe a prnn-tvm layer; export the layer again")
    if metadata.get("schema") not in READABLE_SCHEMAS:
        raise LoadError(f"{path.name} was written with metadata schema {metadata.get('schema')}, this prnn-tvm "
                        f"reads schemas {', '.join(map(str, READABLE_SCHEMAS))}; export it again with this version")
    return metadata


def signature_of(metadata: dict) -> Signature:
    """The layer's signature from its metadata, whichever readable schema wrote it."""
    if metadata["schema"] > 1:
        return Signature.from_dict(metadata["signature"])
    return _schema_1_signature(metadata["launch"], metadata.get("config") or {})


def _schema_1_signature(spec: dict, config: dict) -> Signature:
    """Schema 1 kept a flat spec of the two launches; their argument lists are the ones
    :func:`~prnn_tvm.signature.recurrent_args` still makes from the same names and shapes."""
    B, H, dtype, states = spec["batch"], spec["hidden"], spec.get("dtype", "float32"), tuple(spec["states"])
    shapes = spec["shapes"]  # JSON with sorted keys: the declaration order is the one of arg_names
    declared = [n for n in spec["arg_names"][3:] if n in shapes]
    weights = {n: tuple(shapes[n]) for n in declared if len(shapes[n]) == 2}
    params = {n: tuple(shapes[n]) for n in declared if len(shapes[n]) == 1}
    launch, grid, sync = spec.get("launch") or {}, None, None
    if "ctas" in launch:
        grid = Grid(launch["ctas"], launch["threads"], launch["smem_bytes"], bool(launch.get("cooperative")),
                    spec.get("registers"), spec.get("static_smem_bytes") or 0)
    if launch.get("cooperative"):
        sync = GridSync(config.get("barrier", "grid_sync"), spec.get("sync_words"),
                        launch.get("sync_counts", "barriers"), launch.get("phases", 1))
    workspace = tuple(spec["workspace"]) if spec.get("workspace") else None
    args = recurrent_args(B, H, spec["proj_width"], weights, params, states, dtype, workspace,
                          spec.get("workspace_dtype"), spec.get("sync_words"))
    # its kernels report timeouts on the device alone and run every row the whole sequence
    args = tuple(a for a in args if a.name not in ("error_host", "lengths"))
    projection = projection_launch(B, spec["input_size"], spec["proj_width"], dtype)
    return Signature(spec["cell"], B, H, spec["input_size"], dtype,
                     (projection, Launch("recurrent", args, grid, sync)))


def load(path: str | Path, device: tvm.runtime.Device | None = None) -> LoadedLayer:
    """Load an exported layer for inference; needs only the TVM runtime (and a GPU for a CUDA layer).

    Parameters
    ----------
    path : str or Path
        A library written by :func:`prnn_tvm.export` (``prnn-tvm export``).
    device : tvm.runtime.Device, optional
        Where to run it: default ``cuda(0)`` for a CUDA layer, ``cpu(0)`` for a CPU one.

    Raises :class:`~prnn_tvm.errors.LoadError` when the file is not a prnn-tvm library, or
    when its kernels were compiled for a GPU architecture this GPU cannot run.
    """
    path = Path(path)
    metadata = read_metadata(path)
    try:
        signature = signature_of(metadata)
    except (KeyError, TypeError, ValueError) as err:
        raise LoadError(f"{path.name}: its metadata is damaged ({type(err).__name__}: {err}); export the layer "
                        "again") from err
    if metadata["target"] == "cuda":
        _ensure_cuda_runtime()
        device = device if device is not None else tvm.cuda(0)
        _check_arch(path, metadata["arch"], device)
    else:
        device = device if device is not None else tvm.cpu(0)
        if device.dlpack_device_type() != tvm.cpu(0).dlpack_device_type():
            raise LoadError(f"{path.name} holds a CPU build; it cannot run on {device}")
    if metadata.get("tvm_version") != tvm.__version__:
        log.warning("%s was exported with TVM %s, this is TVM %s", path.name, metadata.get("tvm_version"),
                    tvm.__version__)
    try:
        module = tvm.runtime.load_module(str(path))
    except Exception as err:  # TVM's loader error: keep its first line
        raise LoadError(f"TVM cannot load {path.name}: {first_line(err)}") from err
    for launch in signature.launches:
        if not module.implements_function(launch.function, True):
            raise LoadError(f"{path.name} has no '{launch.function}' function; it is damaged or not a prnn-tvm "
                            "layer")
    layer = LoadedLayer(path, metadata, signature, module, device)
    log.info("loaded %r", layer)
    return layer


def checksum_trailer(body: bytes) -> bytes:
    """What export appends to a library: the magic and the SHA-256 of everything before it."""
    return CHECKSUM_MAGIC + hashlib.sha256(body).digest()


def _checksum_problem(path: Path) -> str | None:
    """Why ``path`` is not the file export wrote (checksum), or None."""
    data = path.read_bytes()
    body, trailer = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if trailer.startswith(CHECKSUM_MAGIC):
        if checksum_trailer(body) != trailer:
            return "its checksum does not match: it was changed or damaged after export"
        return None
    if json.dumps({"checksum": CHECKSUM})[1:-1].encode() in data:
        return "its checksum trailer is missing: it was cut short or changed after export"
    log.warning("%s carries no checksum (exported by prnn-tvm 0.1.0): it is loaded without that check", path.name)
    return None


def _elf_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole 64-bit ELF file, or None. Checked before dlopen, because
    the loader maps a truncated library and the process dies of SIGBUS on touching it."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return "not a 64-bit little-endian ELF file"
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
        if end > size:
            return f"truncated: {size} bytes, its headers need {end}"
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    for i in range(phnum):
        offset, _, _, filesz = struct.unpack_from("<QQQQ", table, i * phentsize + 8)
        if offset + filesz > size:
            return f"truncated: {size} bytes, a segment ends at {offset + filesz}"
    return None


def _ensure_cuda_runtime() -> None:
    """Runtime-only TVM skips its CUDA loader library; load it by hand (once) when it is missing."""
    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None:
        return
    lib = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise LoadError(f"cannot load TVM's CUDA runtime ({first_line(err)}): a CUDA layer needs a GPU and "
                        "its driver") from err


def _check_arch(path: Path, arch: str, device) -> None:
    """A cubin runs on its own architecture and on later minor versions of the same major one."""
    gpu = device if device.exist else None
    if gpu is None:
        raise LoadError(f"{path.name} holds CUDA kernels for {arch}, and there is no usable GPU here")
    here = "sm_" + gpu.compute_version.replace(".", "")
    if not arch_runs_on(arch, here):
        raise LoadError(f"{path.name} holds kernels compiled for {arch}; this GPU ({gpu.device_name}) is {here}: "
                        f"export the layer again with --arch {here}")
    if here != arch:
        log.warning("%s was compiled for %s and runs on this %s GPU; tuning and grid were chosen for %s",
                    path.name, arch, here, arch)


def arch_runs_on(built: str, here: str) -> bool:
    """Whether a cubin for ``built`` (``"sm_80"``) runs on a GPU of arch ``here``: same major, minor >= built's."""
    (major, minor), (got_major, got_minor) = _version(built), _version(here)
    return got_major == major and got_minor >= minor


def _version(arch: str) -> tuple[int, int]:
    digits = "".join(ch for ch in arch if ch.isdigit())
    return int(digits[:-1]), int(digits[-1])


def first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__

"""``load``: run a layer exported with :func:`prnn_tvm.export`, with the TVM runtime alone.

Imports only TVM's runtime, tvm_ffi and NumPy, so it works under TVM's runtime-only
import (``TVM_USE_RUNTIME_LIB=1``); the CUDA loader library that mode leaves out is
loaded here when a CUDA library is loaded. The library's metadata is checked first: a file
that is not a prnn-tvm library, or one built for another GPU, is refused with the reason.

A library is mapped from a copy of this process's own, named by its contents' SHA-256: the
dynamic loader hands back the library already loaded from a path, so loading a file that was
exported again to the same path would otherwise run the first one (with the new one's checksum
passing). Loads of one content share one copy; the copies go when the process ends.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path

import tvm
import tvm_ffi

from ..errors import LoadError
from ..files import MiB, regular_file
from ..signature import Grid, GridSync, Launch, SessionSignature, Signature, projection_launch, recurrent_args
from .base import RuntimeLayer
from .session import FREE_SMS, RELEASE_AFTER_S, Session, open_session

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
MAX_LIBRARY_BYTES = 1024 * MiB  # an exported layer is a few MB of host code and cubin
# What a loaded layer reads from its metadata, with the type each must have (schema 1 keeps its launch as "launch",
# later ones as "signature")
REQUIRED = {"cell": str, "batch": int, "hidden": int, "input_size": int, "dtype": str, "target": str}


class LoadedLayer(RuntimeLayer):
    """A layer loaded from an exported library: called exactly like the compiled one.

    ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` returns ``(out, (h_n, c_n))``; the
    weights are arguments, not part of the library. ``metadata`` is the library's
    description (cell and math hash, shapes, arch, config, versions, argument layout).
    ``session_signature``: the launches of a resident session, where the library carries them
    (exported with ``session=True``), else None.
    """

    def __init__(
        self,
        path: Path,
        metadata: dict,
        signature: Signature,
        module,
        device: tvm.runtime.Device,
        session_signature: SessionSignature | None = None,
    ):
        self.path, self.metadata = path, metadata
        self._device = device
        super().__init__(signature, module, metadata["target"] == "cuda")
        self.cell, self.batch, self.hidden = metadata["cell"], metadata["batch"], metadata["hidden"]
        self.session_signature = session_signature

    def session(self, *, release_after: float = RELEASE_AFTER_S, free_sms: int = FREE_SMS, **arrays) -> Session:
        """A resident session of this layer, as a compiled layer's ``session()`` opens it (same arguments, same
        :class:`~prnn_tvm.runtime.session.Session`), from the session kernels the library carries: a library
        exported with ``session=True`` (``prnn-tvm export --session``) for CUDA."""
        if self.session_signature is None:
            what = "CUDA" if self.is_cuda else "CPU"
            fix = (
                "export the layer again with prnn_tvm.export(layer, path, session=True) (prnn-tvm export --session)"
                if self.is_cuda
                else "a session runs on the GPU: export the CUDA layer with session=True"
            )
            raise LoadError(f"{self.path.name} holds a {what} layer without session kernels; {fix}")
        return open_session(self.session_signature, self.module, arrays, release_after=release_after, free_sms=free_sms)

    @property
    def device(self) -> tvm.runtime.Device:
        return self._device

    def __repr__(self) -> str:
        m = self.metadata
        where = f"cuda {m['arch']}" if m["target"] == "cuda" else "cpu"
        return (
            f"<LoadedLayer {m['cell']} batch={m['batch']} hidden={m['hidden']} input={m['input_size']} "
            f"{m['dtype']} {where} from {self.path.name}>"
        )


def read_metadata(path: str | Path) -> dict:
    """The metadata of an exported library, checked to be a prnn-tvm layer this version can run."""
    return _opened(Path(path))[0]


def _opened(path: Path) -> tuple[dict, Path]:
    """The metadata of the library at ``path`` and the path to map it from (:func:`_private_copy`)."""
    if regular_file(path, "library", "an exported library (.so)", MAX_LIBRARY_BYTES, LoadError) is None:
        raise LoadError(f"{path}: no such file")
    data = path.read_bytes()
    problem = _checksum_problem(path, data) or _elf_problem(data)
    if problem:
        raise LoadError(
            f"{path.name} is not a loadable shared library ({problem}); export the layer again with prnn-tvm export"
        )
    mapped = _private_copy(path, data)
    try:
        lib = _dlopen(mapped, path)
    except LoadError as err:
        if mapped == path.resolve():
            raise
        log.warning(
            "%s: its copy %s cannot be mapped (%s; a folder mounted noexec?): loading it from its own path, "
            "where a library exported again to that path in this process loads the first one",
            path.name,
            mapped,
            err.__cause__,
        )
        mapped = path.resolve()
        lib = _dlopen(mapped, path)
    return _metadata(path, lib), mapped


def _dlopen(file: Path, path: Path):
    """``file`` (``path`` or its copy) mapped by the dynamic loader."""
    try:
        return ctypes.CDLL(str(file), mode=ctypes.RTLD_LOCAL)
    except OSError as err:
        raise LoadError(
            f"{path.name} is not a loadable shared library ({first_line(err)}); "
            "export the layer again with prnn-tvm export"
        ) from err


def _metadata(path: Path, lib) -> dict:
    """The metadata a mapped library returns, checked: a prnn-tvm layer of a readable schema, with every key
    a loaded layer reads (:data:`REQUIRED`) of its type."""
    try:
        fn = getattr(lib, METADATA_SYMBOL)
    except AttributeError:
        raise LoadError(
            f"{path.name} is not a prnn-tvm layer library (it has no {METADATA_SYMBOL}); "
            "export one with prnn-tvm export"
        ) from None
    fn.restype = ctypes.c_char_p
    try:
        metadata = json.loads(fn().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LoadError(f"{path.name}: its metadata is damaged ({err}); export the layer again") from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise LoadError(f"{path.name}: its metadata does not describe a prnn-tvm layer; export the layer again")
    if metadata.get("schema") not in READABLE_SCHEMAS:
        raise LoadError(
            f"{path.name} was written with metadata schema {metadata.get('schema')}, this prnn-tvm "
            f"reads schemas {', '.join(map(str, READABLE_SCHEMAS))}; export it again with this version"
        )
    required = {**REQUIRED, ("launch" if metadata["schema"] == 1 else "signature"): dict}
    for key, kind in required.items():
        value = metadata.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            problem = "has no" if key not in metadata else f"has a {type(value).__name__} as its"
            raise LoadError(
                f"{path.name}: its metadata {problem} '{key}' (a {kind.__name__}); it is damaged or was "
                "not written by prnn-tvm export: export the layer again"
            )
    if metadata["target"] not in ("cuda", "llvm") or (
        metadata["target"] == "cuda" and not isinstance(metadata.get("arch"), str)
    ):
        raise LoadError(
            f"{path.name}: its metadata's target {metadata['target']!r} (arch {metadata.get('arch')!r}) "
            "is neither 'llvm' nor 'cuda' with an arch; export the layer again"
        )
    return metadata


_COPIES: dict = {}  # SHA-256 of a library -> this process's copy of it


def _private_copy(path: Path, data: bytes) -> Path:
    """A copy of ``data`` (the library at ``path``) in a folder of this process's own, named by its SHA-256, made
    once per content: what the dynamic loader maps (see the module's doc)."""
    digest = hashlib.sha256(data).hexdigest()
    if digest not in _COPIES:
        folder = _copies_folder()
        target = folder / f"{digest}.so"
        try:
            partial = folder / f"{digest}.part"
            partial.write_bytes(data)
            os.replace(partial, target)
        except OSError as err:
            log.warning("cannot copy %s into %s (%s): loading it from its own path", path.name, folder, err)
            return path.resolve()
        _COPIES[digest] = target
    return _COPIES[digest]


def _copies_folder() -> Path:
    """This process's folder of library copies (made on first use, removed at exit by the process that made it)."""
    global _FOLDER
    if _FOLDER is None or _FOLDER[0] != os.getpid():
        folder = Path(tempfile.mkdtemp(prefix="prnn_tvm_libraries_"))
        pid = os.getpid()
        atexit.register(lambda: os.getpid() == pid and shutil.rmtree(folder, ignore_errors=True))
        _FOLDER = (pid, folder)
        _COPIES.clear()  # a forked child makes its own
    return _FOLDER[1]


_FOLDER = None


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
        grid = Grid(
            launch["ctas"],
            launch["threads"],
            launch["smem_bytes"],
            bool(launch.get("cooperative")),
            spec.get("registers"),
            spec.get("static_smem_bytes") or 0,
        )
    if launch.get("cooperative"):
        sync = GridSync(
            config.get("barrier", "grid_sync"),
            spec.get("sync_words"),
            launch.get("sync_counts", "barriers"),
            launch.get("phases", 1),
        )
    workspace = tuple(spec["workspace"]) if spec.get("workspace") else None
    args = recurrent_args(
        B,
        H,
        spec["proj_width"],
        weights,
        params,
        states,
        dtype,
        workspace,
        spec.get("workspace_dtype"),
        spec.get("sync_words"),
    )
    # its kernels report timeouts on the device alone and run every row the whole sequence
    args = tuple(a for a in args if a.name not in ("error_host", "lengths"))
    projection = projection_launch(B, spec["input_size"], spec["proj_width"], dtype)
    return Signature(spec["cell"], B, H, spec["input_size"], dtype, (projection, Launch("recurrent", args, grid, sync)))


def session_signature_of(path: Path, metadata: dict) -> SessionSignature | None:
    """The session launches the library at ``path`` carries (its metadata's ``session``), None where it carries
    none; LoadError where they are damaged or do not belong to the layer."""
    found = metadata.get("session")
    if found is None:
        return None
    try:
        session = SessionSignature.from_dict(found)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise LoadError(
            f"{path.name}: its session metadata is damaged ({type(err).__name__}: {err}); export the layer again"
        ) from err
    theirs = (session.cell, session.batch, session.hidden, session.dtype)
    ours = (metadata["cell"], metadata["batch"], metadata["hidden"], metadata["dtype"])
    if theirs != ours or metadata["target"] != "cuda":
        raise LoadError(
            f"{path.name}: its session kernels are for {theirs} on CUDA, the layer is {ours} on "
            f"{metadata['target']}; it is damaged: export the layer again"
        )
    return session


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
    if device is not None and not isinstance(device, tvm.runtime.Device):
        raise LoadError(f"device must be a tvm.runtime.Device (tvm.cuda(0), tvm.cpu(0)), got {device!r}")
    metadata, mapped = _opened(path)
    try:
        signature = signature_of(metadata)
    except (KeyError, TypeError, ValueError) as err:
        raise LoadError(
            f"{path.name}: its metadata is damaged ({type(err).__name__}: {err}); export the layer again"
        ) from err
    session = session_signature_of(path, metadata)
    if metadata["target"] == "cuda":
        _ensure_cuda_runtime()
        device = device if device is not None else tvm.cuda(0)
        _check_arch(path, metadata["arch"], device)
    else:
        device = device if device is not None else tvm.cpu(0)
        if device.dlpack_device_type() != tvm.cpu(0).dlpack_device_type():
            raise LoadError(f"{path.name} holds a CPU build; it cannot run on {device}")
    if metadata.get("tvm_version") != tvm.__version__:
        log.warning(
            "%s was exported with TVM %s, this is TVM %s", path.name, metadata.get("tvm_version"), tvm.__version__
        )
    try:
        module = tvm.runtime.load_module(str(mapped))
    except Exception as err:  # TVM's loader error: keep its first line
        raise LoadError(f"TVM cannot load {path.name}: {first_line(err)}") from err
    for launch in (*signature.launches, *(session.launches if session else ())):
        if not module.implements_function(launch.function, True):
            raise LoadError(f"{path.name} has no '{launch.function}' function; it is damaged or not a prnn-tvm layer")
    layer = LoadedLayer(path, metadata, signature, module, device, session)
    log.info("loaded %r", layer)
    return layer


def checksum_trailer(body: bytes) -> bytes:
    """What export appends to a library: the magic and the SHA-256 of everything before it."""
    return CHECKSUM_MAGIC + hashlib.sha256(body).digest()


def _checksum_problem(path: Path, data: bytes) -> str | None:
    """Why ``data`` (the file at ``path``) is not the file export wrote (checksum), or None."""
    body, trailer = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if trailer.startswith(CHECKSUM_MAGIC):
        if checksum_trailer(body) != trailer:
            return "its checksum does not match: it was changed or damaged after export"
        return None
    if json.dumps({"checksum": CHECKSUM})[1:-1].encode() in data:
        return "its checksum trailer is missing: it was cut short or changed after export"
    log.warning("%s carries no checksum (exported by prnn-tvm 0.1.0): it is loaded without that check", path.name)
    return None


def _elf_problem(data: bytes) -> str | None:
    """Why ``data`` is not a whole 64-bit ELF file, or None. Checked before dlopen, because
    the loader maps a truncated library and the process dies of SIGBUS on touching it."""
    size = len(data)
    head = data[:64]
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return "not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", head, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
    end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
    if end > size:
        return f"truncated: {size} bytes, its headers need {end}"
    if phentsize < 40:
        return f"program headers of {phentsize} bytes"
    table = data[phoff : phoff + phnum * phentsize]
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
        raise LoadError(
            f"cannot load TVM's CUDA runtime ({first_line(err)}): a CUDA layer needs a GPU and its driver"
        ) from err


def _check_arch(path: Path, arch: str, device) -> None:
    """A cubin runs on its own architecture and on later minor versions of the same major one."""
    gpu = device if device.exist else None
    if gpu is None:
        raise LoadError(f"{path.name} holds CUDA kernels for {arch}, and there is no usable GPU here")
    here = "sm_" + gpu.compute_version.replace(".", "")
    if not arch_runs_on(arch, here):
        raise LoadError(
            f"{path.name} holds kernels compiled for {arch}; this GPU ({gpu.device_name}) is {here}: "
            f"export the layer again with --arch {here}"
        )
    if here != arch:
        log.warning(
            "%s was compiled for %s and runs on this %s GPU; tuning and grid were chosen for %s",
            path.name,
            arch,
            here,
            arch,
        )


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

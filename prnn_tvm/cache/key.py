"""What keys a cached layer: everything that changes the code a compile generates.

Keyed like the tuning records (the cell's math hash, batch, hidden, dtype, the GPU: its arch, SM count and
limits) plus the rest of a compile's inputs (input size, the sequence length the report records, the layer
options, the config asked for, and when none is, the tuning logs that could choose one: their path, size and
modification time) and what the code is made by (:func:`code_identity`): the versions of TVM, tvm-ffi and
prnn-tvm, the exported library's schema, a hash of the project's own code generators' files, the host's
machine and LLVM target for the CPU build, and nvcc's identity for a CUDA one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import shutil
from pathlib import Path

import tvm
import tvm_ffi

from .. import records
from ..runtime.loading import SCHEMA

log = logging.getLogger(__name__)

# The project's code generators, relative to the prnn_tvm package: what lowers a plan into code, and what writes
# the entries (the library, the cache). Any change to one of these files is a new key (so a change to the generated
# code can never serve a stale kernel); the templates (prnn_tvm.schedules) are hashed whole beside them. Cells are
# keyed by their math (the fingerprint).
GENERATORS = (
    "codegen",
    "frontend",
    "cache",
    "runtime/library.py",
    "runtime/module_format.py",
    "compiler.py",
    "projected_build.py",
    "choice.py",
    "signature.py",
    "dtypes.py",
    "target.py",
    "records.py",
    "report.py",
)
SUFFIXES = (".py", ".cuh", ".h")


def layer_key(
    plan, input_size: int, seq_len: int | None, target, gpu, config, tuning_logs, layers: int, bidirectional: bool
) -> dict | None:
    """The key of ``compile_cell``'s layer (its arguments after resolution), or None where the config cannot
    be told in JSON (nothing is cached then)."""
    asked = config_text(config)
    if asked is False:
        log.debug("layer cache: config %r has no JSON form; not cached", config)
        return None
    consulted = gpu is not None and config is None
    return {
        "kind": "layer",
        "cell": plan.cell.name,
        "fingerprint": plan.fingerprint(),
        "batch": plan.batch,
        "hidden": plan.hidden,
        "input_size": input_size,
        "seq_len": seq_len,
        "dtype": plan.dtype,
        "layers": layers,
        "bidirectional": bool(bidirectional),
        "config": asked,
        "tuning_records": log_stamps(tuning_logs, gpu) if consulted else None,
        "target": target_identity(target, gpu),
        "code": code_identity(),
    }


def derived_key(key: dict, kind: str, **more) -> dict:
    """The key of kernels compiled from a cached layer (``kind``: its backward, its training kernels)."""
    return {**key, "kind": kind, **more}


def config_text(config):
    """A config as JSON takes it: None, its knobs (a dict, or a config object's ``as_dict()`` with its type's
    name), or False where it has no JSON form."""
    if config is None:
        return None
    if hasattr(config, "as_dict"):
        return {"type": type(config).__name__, "knobs": config_text(config.as_dict())}
    if isinstance(config, dict) and all(isinstance(k, str) for k in config):
        ok = all(v is None or isinstance(v, (bool, int, float, str)) for v in config.values())
        return dict(config) if ok else False
    return False


def log_stamps(tuning_logs, gpu) -> list:
    """The tuning logs a compile would read (``prnn_tvm.choice``), each as [path, size, mtime in ns] ([path,
    None] where there is none): a log that gains records is a new key."""
    if tuning_logs is None:
        logs = records.default_logs(gpu.arch)
    elif isinstance(tuning_logs, (str, Path)):
        logs = [tuning_logs]
    else:
        logs = list(tuning_logs)
    stamps = []
    for path in logs:
        path = Path(path).expanduser().resolve()
        try:
            info = path.stat()
            stamps.append([str(path), info.st_size, info.st_mtime_ns])
        except OSError:
            stamps.append([str(path), None])
    return stamps


def target_identity(target, gpu) -> dict:
    """The target as the code depends on it: the CUDA GPU's spec, nvcc and the host code's LLVM target, or the host
    and LLVM target."""
    if gpu is not None:
        return {"kind": "cuda", "gpu": {k: getattr(gpu, k) for k in gpu.__dataclass_fields__}, "nvcc": nvcc_identity(),
                "host": str(target.host)}
    return {"kind": "llvm", "target": str(target), "machine": platform.machine()}


@functools.lru_cache(maxsize=1)
def nvcc_identity() -> list | None:
    """nvcc's resolved path, size and modification time (None without nvcc): a new toolkit is a new key."""
    found = shutil.which("nvcc")
    if found is None:
        return None
    path = Path(found).resolve()
    info = path.stat()
    return [str(path), info.st_size, info.st_mtime_ns]


@functools.lru_cache(maxsize=1)
def code_identity() -> dict:
    """Versions and the hash of the code generators' files (read once per process)."""
    from .. import __version__

    return {
        "prnn_tvm": __version__,
        "tvm": tvm.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "library_schema": SCHEMA,
        "generators": generators_hash(),
    }


def generators_hash() -> str:
    """A SHA-256 over the code generators' files (:func:`generator_files`), name and content."""
    digest = hashlib.sha256()
    for label, path in generator_files():
        digest.update(f"{label}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:32]


def generator_files() -> list[tuple[str, Path]]:
    """``(label, path)`` of every file of :data:`GENERATORS` and of the templates, in a fixed order."""
    from .. import schedules

    package = Path(__file__).resolve().parents[1]
    roots = [(f"prnn_tvm/{name}", package / name) for name in GENERATORS]
    roots.append(("schedules", Path(schedules.__file__).resolve().parent))
    found = []
    for label, root in roots:
        if root.is_dir():
            found += [(f"{label}/{p.relative_to(root)}", p) for p in sorted(root.rglob("*")) if p.suffix in SUFFIXES]
        else:
            found.append((label, root))
    return found

"""nvcc's results on disk, keyed by what nvcc was given: the source's hash, the arch, the command's flags and nvcc's
identity. Where two compiles generate the same source (a layer asked for with another config object, other tuning
logs that choose the same config, a training forward that is its layer's kernel, another process of a test run),
ptxas runs once: the cubin and ptxas's log are read back, so the report is the one nvcc would print.

The entries live in ``nvcc/`` under the layer cache's folder (a :class:`.store.Store` of their own, so that
``prnn-tvm cache list`` shows layers alone), follow the same settings (``PRNN_TVM_CACHE=0`` turns them off) and
are cleared with the layers. Nothing is ever worse than without them: an entry that cannot be read or written is
a compile.
"""

from __future__ import annotations

import hashlib
import logging
import time

from .settings import settings
from .store import Store

log = logging.getLogger(__name__)

CUBIN, LOG = "kernel.cubin", "ptxas.log"
FOLDER = "nvcc"


def nvcc_store() -> Store | None:
    """The store of nvcc's results; None where the cache is turned off. Unlike a layer's entry, a result is keyed by
    the source compiled itself, so an instrumented source (``codegen.build.rewriting_sources``) is stored under
    its own key and never answers for another."""
    s = settings()
    return Store(s.folder / FOLDER, s.max_bytes) if s.enabled else None


def key(source: str, arch: str, flags: list[str]) -> dict:
    from .key import nvcc_identity  # (imports TVM)

    return {
        "kind": "nvcc",
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "arch": arch,
        "flags": list(flags),
        "nvcc": nvcc_identity(),
    }


def lookup(source: str, arch: str, flags: list[str]) -> tuple[bytes, str] | None:
    """``(cubin, ptxas's log)`` of an earlier compile of ``source`` for ``arch`` with ``flags``, or None."""
    store = nvcc_store()
    if store is None:
        return None
    try:
        entry = store.get(key(source, arch, flags))
        return None if entry is None else (entry.file(CUBIN).read_bytes(), entry.file(LOG).read_text())
    except OSError as err:  # unreadable, or removed by another process since: compile
        log.debug("nvcc cache: %s; compiling", err)
        return None


def store(source: str, arch: str, flags: list[str], cubin: bytes, ptxas_log: str) -> None:
    """Keep ``cubin`` and ``ptxas_log`` of ``source``; a cache that cannot be written is left as it is."""
    cache = nvcc_store()
    if cache is None:
        return

    def write(folder):
        folder.joinpath(CUBIN).write_bytes(cubin)
        folder.joinpath(LOG).write_text(ptxas_log)

    info = {"kind": "nvcc", "describes": {"target": f"cuda {arch}"}, "created": time.time()}
    try:
        cache.put(key(source, arch, flags), info, write)
    except OSError as err:
        log.debug("nvcc cache: cannot store a result (%s)", err)

"""nvcc's outputs cached on disk beside the layers: a cubin and ptxas's report, keyed by the source, the arch,
the flags and nvcc itself, so that a kernel compiled once is not compiled again by another process (a command, a
tuning run, the test suite's workers and the processes its tests start).

A store of its own under the cache folder's ``nvcc/`` (:class:`~.store.Store`: whole entries, safe under
concurrent processes), trimmed to a quarter of the cache's bound, used when the layer cache is
(``PRNN_TVM_CACHE``). Nothing is worse than without it: an entry that cannot be read or written is a compile.
Imports only the standard library.
"""

from __future__ import annotations

import hashlib
import logging
import os

from .settings import settings
from .store import Store

log = logging.getLogger(__name__)

CUBIN, REPORT = "kernel.cubin", "ptxas.log"


def key(source: str, arch: str, flags: list, nvcc: str) -> dict:
    """The key of ``source`` compiled for ``arch`` with ``flags`` by the ``nvcc`` at that path (its size and
    modification time: a new toolkit is a new key)."""
    info = os.stat(nvcc)
    return {
        "kind": "cubin",
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "arch": arch,
        "flags": list(flags),
        "nvcc": [os.path.realpath(nvcc), info.st_size, info.st_mtime_ns],
    }


def lookup(found: dict) -> tuple[bytes, str] | None:
    """``(cubin, ptxas log)`` stored under ``found``, or None."""
    store = _store()
    if store is None:
        return None
    try:
        entry = store.get(found)
        return None if entry is None else (entry.file(CUBIN).read_bytes(), entry.file(REPORT).read_text())
    except OSError as err:
        log.debug("nvcc cache: cannot read an entry (%s); compiling", err)
        return None


def store(found: dict, cubin: bytes, report: str) -> None:
    """Keep ``cubin`` and its ptxas ``report`` under ``found`` (nothing where the cache cannot be written)."""
    s = _store()
    if s is None:
        return

    def write(folder):
        (folder / CUBIN).write_bytes(cubin)
        (folder / REPORT).write_text(report)

    try:
        s.put(found, {"kind": "cubin", "describes": {"target": f"cuda {found['arch']}"}}, write)
    except OSError as err:
        log.debug("nvcc cache: cannot store an entry (%s)", err)


def _store() -> Store | None:
    s = settings()
    return Store(s.folder / "nvcc", s.max_bytes // 4) if s.enabled else None

"""The native host step of a session (``session_native.c``): built once per machine with the host C compiler, kept
in the layer cache (:mod:`prnn_tvm.cache`) for every later process, loaded as a CPython extension module.

:class:`~prnn_tvm.runtime.session_host.HostRings` calls it once per host step (:class:`Ring` describes its rings to
it). Where it cannot be built (no C compiler, no Python headers) or loaded, :func:`native` returns None, a warning
says so once, and the session's host step runs in Python (``session_host``): slower, the same words. An exported
layer's session needs no compiler where a process on that machine built the module before (it is in the cache).

Imports only the standard library and :mod:`prnn_tvm.cache`'s settings and store (which do too): it runs under
TVM's runtime-only import.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from ..cache.settings import settings
from ..cache.store import Store

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("session_native.c")
NAME = "prnn_tvm_session_host"  # the extension module's name (its PyInit_ function's)
COMPILERS = ("cc", "gcc", "clang")
FLAGS = ("-O2", "-shared", "-fPIC", "-std=gnu11")
LIBRARY = NAME + ".so"
PACK_FLOAT32, PACK_PAIRS, PACK_WIDEN = 0, 1, 2  # a request's words (session_native.c's enum)


class Ring(ctypes.Structure):
    """What the native step knows of a session's rings (``prnn_ring`` in ``session_native.c``): addresses of the
    request and response rings, the kernel's error word and the widening table, and how words are packed."""

    _fields_ = [
        ("requests", ctypes.c_void_p),
        ("responses", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
        ("widen", ctypes.c_void_p),
        ("depth", ctypes.c_int64),
        ("request_words", ctypes.c_int64),
        ("response_words", ctypes.c_int64),
        ("values", ctypes.c_int64),
        ("mode", ctypes.c_int64),
        ("input_bytes", ctypes.c_int64),
        ("state_bytes", ctypes.c_int64),
    ]


@functools.cache
def native():
    """The native step's module (``post``, ``collect``, ``step``), or None where it cannot be built or loaded here
    (logged once, with the reason)."""
    try:
        return _load(_built())
    except (OSError, ImportError, subprocess.SubprocessError, _NotBuilt) as err:
        log.warning(
            "a session's host step runs in Python (about 10-15 us a step more): its native step cannot be built or "
            "loaded here (%s). Install a C compiler (cc) and Python's headers (python3-dev) for it",
            err,
        )
        return None


class _NotBuilt(Exception):
    """The native step cannot be built here (the reason)."""


def _key() -> dict:
    """What the built module depends on: its source, the flags, the Python ABI and the machine."""
    return {
        "kind": "session-host-native",
        "source": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
        "flags": FLAGS,
        "abi": sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag,
        "machine": platform.machine(),
    }


def _built() -> Path:
    """The built module's file: from the cache, else built (into the cache where it is on, else a folder of this
    process)."""
    config = settings()
    if not config.enabled:
        return _built_here()
    store, key = Store(config.folder, config.max_bytes), _key()
    entry = store.get(key)
    if entry is None:
        describes = {  # as `prnn-tvm cache list` shows it
            "cell": "session host step",
            "dtype": "",
            "target": f"{platform.machine()} {sys.implementation.cache_tag}",
        }
        entry = store.put(key, {"kind": "native", "describes": describes}, _compile)
        if entry is None:  # removed by another process at once: built again, for this process alone
            return _built_here()
        log.info("built a session's native host step into %s", entry.folder)
    return entry.file(LIBRARY)


def _built_here() -> Path:
    """The module built into a new folder of this process's own."""
    folder = Path(tempfile.mkdtemp(prefix="prnn-tvm-native-"))
    _compile(folder)
    return folder / LIBRARY


def _compile(folder: Path) -> None:
    compiler = next((found for name in COMPILERS if (found := shutil.which(name))), None)
    if compiler is None:
        raise _NotBuilt(f"no C compiler ({', '.join(COMPILERS)}) on the PATH")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        raise _NotBuilt(f"no Python.h in {include}")
    done = subprocess.run(
        [compiler, *FLAGS, f"-I{include}", str(SOURCE), "-o", str(folder / LIBRARY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise _NotBuilt(f"{compiler} failed: {done.stderr.strip()[-2000:]}")


def _load(path: Path):
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module

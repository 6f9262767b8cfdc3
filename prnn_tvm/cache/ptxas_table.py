"""A table of ptxas's reports known ahead, read instead of running nvcc where only the report is wanted: a CUDA build
on a machine without a GPU compiles its source for ptxas's figures alone (the test suite's case: hundreds of kernel
sources, ~1 s of nvcc each).

An entry is keyed by a SHA-256 over everything that decides ptxas's output: the CUDA source's SHA-256, the arch,
nvcc's flags and nvcc's version text (``nvcc --version``); for a whole program (a probe of ``bench/probes/``, whose
source is its file and the project's files it includes), the host compiler's version text too. A changed source,
arch, flag or toolkit is a key the table does not hold, and nvcc runs as without it: a table can be incomplete, never
answer for another source. Without nvcc there is no key (the build says nvcc is missing, as without a table).

- ``PRNN_TVM_PTXAS_TABLE=FILE``: the table, JSON lines ``{"key", "arch", "log"}`` with ptxas's lines of nvcc's output
  (unset: none; ``tests/conftest.py`` sets ``tests/data/ptxas-reports.jsonl``);
- ``PRNN_TVM_PTXAS_TABLE_CHECK``: the fraction of hits compiled anyway and compared with the table (default 0.02):
  a report that differs raises :class:`PtxasTableError`, so a table edited by hand or left stale by a toolkit that
  kept its version text fails the run that meets it;
- ``PRNN_TVM_PTXAS_TABLE_RECORD=1``: every report compiled for a source the table does not hold is appended to it
  (the table still answers for the sources it holds: a recording run adds the missing reports; ``make ptxas-table``
  removes the table first and so writes it anew, from a run of the suite).

Imports only the standard library.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
from pathlib import Path

from ..errors import PrnnError
from ..files import append_locked

log = logging.getLogger(__name__)

TABLE, CHECK, RECORD = "PRNN_TVM_PTXAS_TABLE", "PRNN_TVM_PTXAS_TABLE_CHECK", "PRNN_TVM_PTXAS_TABLE_RECORD"
DEFAULT_CHECK = 0.02


class PtxasTableError(PrnnError):
    """A report of the table differs from the one ptxas gives for its source: the table is stale or was edited."""


def table_path() -> Path | None:
    """The table's file, or None where ``PRNN_TVM_PTXAS_TABLE`` is unset."""
    text = os.environ.get(TABLE, "")
    return Path(text) if text else None


def check_rate() -> float:
    """The fraction of hits compiled anyway (``PRNN_TVM_PTXAS_TABLE_CHECK``); PtxasTableError naming it if bad."""
    text = os.environ.get(CHECK, str(DEFAULT_CHECK))
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise PtxasTableError(f"{CHECK}={text!r}: the fraction of table hits to recompile must be within 0 and 1")
    return rate


def recording() -> bool:
    return os.environ.get(RECORD, "") == "1" and table_path() is not None


@functools.lru_cache(maxsize=8)
def _version_text(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _version(program: str) -> str | None:
    """``program --version``'s text for the one on the PATH, or None where there is none (or it fails)."""
    found = shutil.which(program)
    if found is None:
        return None
    try:
        return _version_text(str(Path(found).resolve()))
    except (OSError, subprocess.CalledProcessError):
        return None


def key(source: str, arch: str, flags: list[str], host: str | None = None) -> str | None:
    """The entry's key for nvcc on the PATH, or None without nvcc. ``host``: the host compiler a whole build runs
    (nvcc's is ``gcc``, or ``-ccbin``'s), whose version text enters the key (None without it); a cubin has none."""
    version = _version("nvcc")
    if version is None:
        return None
    fields = {"source": hashlib.sha256(source.encode()).hexdigest(), "arch": arch, "flags": flags, "nvcc": version}
    if host is not None:
        fields["host"] = _version(host)
        if fields["host"] is None:
            return None
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _entries(path: Path, size: int, mtime_ns: int) -> dict:
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            entries[entry["key"]] = entry["log"]
        except (ValueError, KeyError, TypeError) as err:
            raise PtxasTableError(
                f"{path}:{number}: not an entry of a ptxas table ({err}); run `make ptxas-table`"
            ) from err
    return entries


def lookup(key_: str | None) -> str | None:
    """ptxas's log for ``key_`` in the table, or None (no table, no key, or none of that key)."""
    path = table_path()
    if path is None or key_ is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return None
    return _entries(path, info.st_size, info.st_mtime_ns).get(key_)


def should_check() -> bool:
    """Whether this hit is compiled anyway and compared (at the rate ``PRNN_TVM_PTXAS_TABLE_CHECK`` sets)."""
    return random.random() < check_rate()


def ptxas_lines(ptxas_log: str) -> str:
    """What an entry keeps of nvcc's output: ptxas's lines, which the report is read from (its kernels, their
    properties and registers), without the timing that varies run to run or the front end's warnings about the
    source (up to hundreds of KB for one kernel)."""
    return "".join(
        line
        for line in ptxas_log.splitlines(True)
        if (line.startswith("ptxas") or "bytes stack frame" in line) and "Compile time = " not in line
    )


def record(key_: str | None, arch: str, ptxas_log: str) -> None:
    """Append the entry to the table where ``PRNN_TVM_PTXAS_TABLE_RECORD=1`` (one locked write: processes share it)."""
    if key_ is None or not recording():
        return
    data = (json.dumps({"key": key_, "arch": arch, "log": ptxas_lines(ptxas_log)}) + "\n").encode()
    append_locked(table_path(), data)

"""Tuning records: append-only JSON lines, one measured (or failed) config per line.

A record's *key* is everything that makes a measurement stale when it changes: the
cell's math hash, the kernel's compile-time shapes (batch, hidden), dtype, the target
arch and its SM count, the schedule template and the TVM version. Sequence length and
input size are not in the key: the kernel takes any length (the tuned per-step time is
what is compared) and the input projection is not tuned. The *value* is the config, the
measured seconds per sequence of each repeat, an error kind when the config failed, and
when/where it was measured.

Appends take an exclusive ``flock`` and write each batch of lines with one ``write``
call on an ``O_APPEND`` descriptor, so two tuners appending to one log never interleave
bytes. A log is a regular file of at most :data:`MAX_LOG_BYTES` (a directory, a device or a
FIFO is refused, never read forever). Every field of a record is typed: a line that does not
parse, has a field of the wrong type, or holds values no measurement gives (a time that is
not a positive number, a sequence length outside [1, 2^31), a step faster than
:data:`MIN_STEP_S`) is skipped with a warning naming the file, the line and why (the first
:data:`WARNED_LINES` of a file, then a count); records of another schema are skipped with one
warning per file; nothing is ever rewritten. A record of another key (another TVM version,
GPU or SM count) is never used for a compile; ``unmatched`` says which keys a log has for the
same cell and shapes, so a compile can say why it used none.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from importlib import resources
from pathlib import Path

from .errors import ConfigError
from .files import MiB, append_locked, regular_file

log = logging.getLogger(__name__)

SCHEMA = 1
MAX_LOG_BYTES = 256 * MiB  # the shipped sm_90 log holds ~5,900 records in 3.7 MB
MAX_SEQ_LEN = 2**31 - 1  # a timed sequence's length: kernels count steps in 32-bit integers
MIN_STEP_S = 1e-8  # no recurrent step takes less than 10 ns (a grid barrier alone takes ~1 us)
WARNED_LINES = 10  # corrupt lines of one file warned about one by one; the rest are counted


class ErrorKind(str, Enum):
    """Why a config has no time: every failure of a trial becomes a record with one of these."""

    BUILD = "build"  # TVM or nvcc failed
    SPILL = "spill"  # ptxas spilled more than the tuner allows
    LAUNCH = "launch"  # the launch was refused (co-residency, resources)
    TIMEOUT = "timeout"  # a grid-barrier wait timed out
    WRONG = "wrong"  # the output disagreed with the float64 reference
    RUNTIME = "runtime"  # any other error while running


@dataclass(frozen=True)
class TuneKey:
    """What a measurement depends on; records match a compile only on an equal key."""

    fingerprint: str
    batch: int
    hidden: int
    dtype: str
    arch: str
    sms: int
    template: str
    tvm: str

    def describe(self) -> str:
        return (
            f"math hash {self.fingerprint}, batch={self.batch} hidden={self.hidden} {self.dtype}, "
            f"{self.arch} with {self.sms} SMs, {self.template}, TVM {self.tvm}"
        )


@dataclass(frozen=True)
class Record:
    """One trial: a config of one key and what measuring it gave."""

    key: TuneKey
    config: dict
    costs: tuple = ()  # seconds per sequence, one per repeat (empty on error)
    seq_len: int = 0
    error: ErrorKind | None = None
    detail: str = ""  # the error's message, or a short note
    cell: str = ""  # the cell's name (informational; the key has its math hash)
    registers: int | None = None  # ptxas, per thread
    spill_bytes: int | None = None
    max_abs_error: float | None = None
    build_s: float = 0.0
    device: str = ""
    timestamp: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)

    @property
    def per_step_s(self) -> float:
        """Median seconds per timestep; infinite for a failed trial."""
        return statistics.median(self.costs) / self.seq_len if self.ok else math.inf

    def to_json(self) -> str:
        d = asdict(self)
        d["error"] = self.error.value if self.error else None
        d["costs"] = list(self.costs)
        return json.dumps({"schema": SCHEMA, **d}, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Record:
        """The record of one log line; ValueError saying why it is none (see :meth:`from_dict`)."""
        return cls.from_dict(json.loads(line))

    @classmethod
    def from_dict(cls, d) -> Record:
        """The record of a parsed line: every field checked for its type before use (a string is no list of
        times, a float no sequence length), then :meth:`check`; ValueError naming the field otherwise."""
        if not isinstance(d, dict):
            raise ValueError(f"a record is a JSON object, got {type(d).__name__}")
        d = dict(d)
        if d.pop("schema", None) != SCHEMA:
            raise ValueError(f"not a schema-{SCHEMA} tuning record")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(map(repr, unknown))}")
        key = d.get("key")
        if not isinstance(key, dict) or set(key) != set(TuneKey.__dataclass_fields__):
            raise ValueError(f"key {key!r}: a key is an object of {', '.join(TuneKey.__dataclass_fields__)}")
        d["key"] = TuneKey(**key)
        costs = d.get("costs", [])
        if not isinstance(costs, list) or not all(_is_number(c) for c in costs):
            raise ValueError(f"costs {costs!r}: a list of seconds per sequence")
        d["costs"] = tuple(float(c) for c in costs)
        error = d.get("error")
        if error is not None and error not in {e.value for e in ErrorKind}:
            raise ValueError(f"error {error!r}: one of {', '.join(e.value for e in ErrorKind)}, or null")
        d["error"] = ErrorKind(error) if error else None
        record = cls(**d)
        record.check()
        return record

    def check(self) -> None:
        """ValueError for values no measurement gives: a time that is not a positive number, a
        sequence length outside [1, 2^31), a step faster than :data:`MIN_STEP_S`, a field of the wrong type."""
        if not all(_is_number(c) and math.isfinite(c) and c > 0 for c in self.costs):
            raise ValueError(f"costs {list(self.costs)}: times must be positive numbers")
        if not _is_int(self.seq_len) or (self.costs and self.seq_len < 1):
            raise ValueError(f"seq_len {self.seq_len!r}: a timed record needs the sequence length it timed")
        if self.seq_len > MAX_SEQ_LEN:
            raise ValueError(f"seq_len {self.seq_len}: more steps than a kernel counts (at most {MAX_SEQ_LEN})")
        if self.costs and min(self.costs) / self.seq_len < MIN_STEP_S:
            raise ValueError(
                f"costs {list(self.costs)} over seq_len {self.seq_len}: a step of "
                f"{min(self.costs) / self.seq_len:.1e} s is no measurement (at least {MIN_STEP_S:.0e} s)"
            )
        k = self.key
        if not all(_is_int(getattr(k, f)) and getattr(k, f) > 0 for f in ("batch", "hidden", "sms")):
            raise ValueError(f"key {k}: batch, hidden and sms must be positive integers")
        texts = [(f"key.{f}", getattr(k, f)) for f in ("fingerprint", "dtype", "arch", "template", "tvm")]
        texts += [(f, getattr(self, f)) for f in ("detail", "cell", "device")]
        for name, value in texts:
            if not isinstance(value, str):
                raise ValueError(f"{name} {value!r}: a string")
        if not isinstance(self.config, dict) or not all(
            isinstance(knob, str) and (value is None or isinstance(value, (str, bool)) or _is_number(value))
            for knob, value in self.config.items()
        ):
            raise ValueError(f"config {self.config!r}: a config is a dict of knobs (names to numbers or strings)")
        for name in ("registers", "spill_bytes"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 0):
                raise ValueError(f"{name} {value!r}: a whole number of at least 0, or null")
        for name in ("max_abs_error", "build_s", "timestamp"):
            value = getattr(self, name)
            if not (_is_number(value) or (value is None and name == "max_abs_error")):
                raise ValueError(f"{name} {value!r}: a number")


def key_for(plan, gpu, template: str) -> TuneKey:
    """The key of ``plan`` (a CellPlan) compiled for ``gpu`` (a GpuSpec) with ``template``."""
    import tvm  # only here: reading and writing records needs no compiler

    return TuneKey(
        plan.fingerprint(), plan.batch, plan.hidden, plan.dtype, gpu.arch, gpu.sms, template, tvm.__version__
    )


def default_log(arch: str) -> Path:
    """The shipped log for ``arch`` (``tuning_logs/<arch>.jsonl`` inside the package): read, never written."""
    return Path(str(resources.files("prnn_tvm.tuning_logs"))) / f"{arch}.jsonl"


def user_log(arch: str) -> Path:
    """Where ``prnn-tvm tune`` writes this user's records for ``arch`` by default:
    ``$XDG_DATA_HOME/prnn-tvm/tuning_logs/<arch>.jsonl``, else under ``~/.local/share``."""
    base = os.environ.get("XDG_DATA_HOME") or ""
    data = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return data / "prnn-tvm" / "tuning_logs" / f"{arch}.jsonl"


def default_logs(arch: str) -> list[Path]:
    """The logs a compile reads when none are named: the shipped one, then the user's (:func:`user_log`)."""
    return [default_log(arch), user_log(arch)]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _log_file(path: str | Path) -> Path | None:
    """The log at ``path`` if it exists (a regular file of at most :data:`MAX_LOG_BYTES`), else None."""
    return regular_file(path, "tuning log", "a .jsonl file", MAX_LOG_BYTES, ConfigError)


def append(path: str | Path, records: list[Record]) -> None:
    """Append ``records`` to the log at ``path`` (created with its folder if missing)."""
    if not records:
        return
    path = Path(path)
    _log_file(path)  # a FIFO would block the open, a device swallow the records
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(r.to_json() + "\n" for r in records).encode()
    append_locked(path, data)


def load(path: str | Path) -> list[Record]:
    """Every well-formed record of the log at ``path`` (none if it does not exist). Records of another
    schema are skipped with one warning for the file; corrupt lines with one warning each, up to
    :data:`WARNED_LINES`, then one for the rest.

    A file is parsed once per version in a process (its path, size, modification time and inode, what a layer's
    cache key stamps it by: ``cache.key.log_stamps``); every compile reads the shipped log (thousands of records,
    ~0.15 s to parse and check), and a later load of the same version gives the same records and says the same
    warnings again."""
    stamp = _stamp(path)
    return list(_warned(stamp)) if stamp is not None else []


def load_all(paths) -> Found:
    """Every record of the logs ``paths`` in order, as :func:`load` reads each (and says its warnings), indexed by key:
    the same :class:`Found` while no file changes (a compile looks several keys up in the shipped log's thousands of
    records: scans of all of them each time took ~0.05 s of CPU per compile)."""
    stamps = tuple(stamp for stamp in map(_stamp, paths) if stamp is not None)
    for stamp in stamps:
        _warned(stamp)
    return _found(stamps)


def _stamp(path: str | Path) -> tuple | None:
    """What a version of the log at ``path`` is known by (:func:`_parsed`'s arguments), or None where there is none."""
    path = _log_file(path)
    if path is None:
        return None
    info = path.stat()
    return path, info.st_size, info.st_mtime_ns, info.st_ino


def _warned(stamp: tuple) -> tuple[Record, ...]:
    """The records of one version of a log, its warnings said."""
    found, warnings = _parsed(*stamp)
    for message, args in warnings:
        log.warning(message, *args)
    return found


@functools.lru_cache(maxsize=8)
def _found(stamps: tuple) -> Found:
    return Found(r for stamp in stamps for r in _parsed(*stamp)[0])


class Found(tuple):
    """Records, with their index by key (built when first asked for): what :func:`load_all` returns and the lookups
    below (:func:`for_key`, :func:`ranked`, :func:`unmatched`, :func:`grouped`) read instead of scanning every
    record."""

    @functools.cached_property
    def by_key(self) -> dict[TuneKey, list[Record]]:
        return _grouped(self)


def grouped(records) -> dict[TuneKey, list[Record]]:
    """``records`` by key, in order (a :class:`Found`'s own index)."""
    return records.by_key if isinstance(records, Found) else _grouped(records)


def _grouped(records) -> dict[TuneKey, list[Record]]:
    index: dict = {}
    for r in records:
        index.setdefault(r.key, []).append(r)
    return index


@functools.lru_cache(maxsize=8)
def _parsed(path: Path, size: int, mtime_ns: int, inode: int) -> tuple[tuple[Record, ...], tuple]:
    """(the records of one version of the log at ``path``, the warnings its reading says: (message, args))."""
    records, corrupt, schemas, warnings = [], 0, {}, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                schema = d.get("schema") if isinstance(d, dict) else None
                if schema != SCHEMA and (_is_int(schema) or isinstance(schema, str)):
                    schemas.setdefault(schema, []).append(number)
                    continue
                records.append(Record.from_dict(d))
            except (ValueError, TypeError, KeyError, RecursionError) as err:
                corrupt += 1
                if corrupt <= WARNED_LINES:
                    warnings.append(("%s:%d: skipping a corrupt tuning record (%s)", (path, number, _excerpt(err))))
    if corrupt > WARNED_LINES:
        warnings.append(("%s: skipped %d more corrupt lines", (path, corrupt - WARNED_LINES)))
    for schema, lines in schemas.items():
        warnings.append(
            (
                "%s: skipping %d record(s) of schema %s (lines %d-%d); this prnn-tvm reads schema %d: %s",
                (
                    path,
                    len(lines),
                    _excerpt(schema),
                    lines[0],
                    lines[-1],
                    SCHEMA,
                    "use the prnn-tvm that wrote them" if _is_int(schema) and schema > SCHEMA else "tune again",
                ),
            )
        )
    return tuple(records), tuple(warnings)


def _excerpt(value, limit: int = 200) -> str:
    """``value`` as text on one line of at most ``limit`` characters (a log line may hold anything)."""
    text = str(value).encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."


def for_key(records: list[Record], key: TuneKey) -> list[Record]:
    if isinstance(records, Found):
        return list(records.by_key.get(key, ()))
    return [r for r in records if r.key == key]


def best(records: list[Record], key: TuneKey) -> Record | None:
    """The fastest successful record of ``key`` (median per-step time), or None."""
    return next(iter(ranked(records, key, 1)), None)


def ranked(records: list[Record], key: TuneKey, limit: int | None = None) -> list[Record]:
    """The fastest successful record of each config of ``key``, fastest first, at most ``limit`` of them."""
    fastest = {}
    for r in sorted((r for r in for_key(records, key) if r.ok), key=lambda r: r.per_step_s):
        fastest.setdefault(json.dumps(r.config, sort_keys=True), r)
    return list(fastest.values())[:limit]


def unmatched(records: list[Record], key: TuneKey) -> str:
    """Why no record of ``records`` serves ``key`` though some are for the same cell, shapes and
    template: the TVM versions, archs and SM counts they were measured with; "" when none are."""
    near = {
        (k.tvm, k.arch, k.sms, k.dtype)
        for k, recs in grouped(records).items()
        if (k.fingerprint, k.batch, k.hidden, k.template) == (key.fingerprint, key.batch, key.hidden, key.template)
        and k != key
        and any(r.ok for r in recs)
    }
    if not near:
        return ""
    found = "; ".join(f"TVM {tvm}, {arch} with {sms} SMs, {dtype}" for tvm, arch, sms, dtype in sorted(near))
    return (
        f"records for this cell and shapes were measured with {found}, not with TVM {key.tvm}, {key.arch} "
        f"with {key.sms} SMs, {key.dtype}"
    )

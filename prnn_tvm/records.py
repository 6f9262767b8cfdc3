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
bytes. A line that does not parse, or holds values no measurement gives (a time that is
not a positive number, a sequence length below one), is skipped with a warning naming
the file, the line and why; nothing is ever rewritten. A record of another key (another
TVM version, GPU or SM count) is never used for a compile; ``unmatched`` says which keys a
log has for the same cell and shapes, so a compile can say why it used none.
"""

from __future__ import annotations

import fcntl
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

log = logging.getLogger(__name__)

SCHEMA = 1


class ErrorKind(str, Enum):
    """Why a config has no time: every failure of a trial becomes a record with one of these."""

    BUILD = "build"        # TVM or nvcc failed
    SPILL = "spill"        # ptxas spilled more than the tuner allows
    LAUNCH = "launch"      # the launch was refused (co-residency, resources)
    TIMEOUT = "timeout"    # a grid-barrier wait timed out
    WRONG = "wrong"        # the output disagreed with the float64 reference
    RUNTIME = "runtime"    # any other error while running


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
        return (f"math hash {self.fingerprint}, batch={self.batch} hidden={self.hidden} {self.dtype}, "
                f"{self.arch} with {self.sms} SMs, {self.template}, TVM {self.tvm}")


@dataclass(frozen=True)
class Record:
    """One trial: a config of one key and what measuring it gave."""

    key: TuneKey
    config: dict
    costs: tuple = ()              # seconds per sequence, one per repeat (empty on error)
    seq_len: int = 0
    error: ErrorKind | None = None
    detail: str = ""               # the error's message, or a short note
    cell: str = ""                 # the cell's name (informational; the key has its math hash)
    registers: int | None = None   # ptxas, per thread
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
        d = json.loads(line)
        if not isinstance(d, dict) or d.pop("schema", None) != SCHEMA:
            raise ValueError(f"not a schema-{SCHEMA} tuning record")
        d["key"] = TuneKey(**d["key"])
        d["error"] = ErrorKind(d["error"]) if d.get("error") else None
        d["costs"] = tuple(float(c) for c in d.get("costs", ()))
        record = cls(**d)
        record.check()
        return record

    def check(self) -> None:
        """ValueError for values no measurement gives: a time that is not a positive number, a
        sequence length below one, a key or config of the wrong types."""
        if not all(math.isfinite(c) and c > 0 for c in self.costs):
            raise ValueError(f"costs {list(self.costs)}: times must be positive numbers")
        if self.costs and (isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1):
            raise ValueError(f"seq_len {self.seq_len!r}: a timed record needs the sequence length it timed")
        k = self.key
        if not all(isinstance(getattr(k, f), int) and getattr(k, f) > 0 for f in ("batch", "hidden", "sms")):
            raise ValueError(f"key {k}: batch, hidden and sms must be positive integers")
        if not isinstance(self.config, dict):
            raise ValueError(f"config {self.config!r}: a config is a dict of knobs")


def key_for(plan, gpu, template: str) -> TuneKey:
    """The key of ``plan`` (a CellPlan) compiled for ``gpu`` (a GpuSpec) with ``template``."""
    import tvm  # only here: reading and writing records needs no compiler

    return TuneKey(plan.fingerprint(), plan.batch, plan.hidden, plan.dtype, gpu.arch, gpu.sms, template,
                   tvm.__version__)


def default_log(arch: str) -> Path:
    """The shipped log for ``arch`` (``tuning_logs/<arch>.jsonl`` inside the package)."""
    return Path(str(resources.files("prnn_tvm.tuning_logs"))) / f"{arch}.jsonl"


def append(path: str | Path, records: list[Record]) -> None:
    """Append ``records`` to the log at ``path`` (created with its folder if missing)."""
    if not records:
        return
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"tuning log {path} is a directory; give the path of a .jsonl file")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(r.to_json() + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        written = 0
        while written < len(data):  # one write in practice; the lock covers a short write
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)  # closing releases the lock


def load(path: str | Path) -> list[Record]:
    """Every well-formed record of the log at ``path`` (none if it does not exist)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"tuning log {path} is a directory; give the path of a .jsonl file")
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(Record.from_json(line))
            except (ValueError, TypeError, KeyError) as err:
                log.warning("%s:%d: skipping a corrupt tuning record (%s)", path, number, err)
    return records


def for_key(records: list[Record], key: TuneKey) -> list[Record]:
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
    near = {(r.key.tvm, r.key.arch, r.key.sms, r.key.dtype) for r in records
            if (r.key.fingerprint, r.key.batch, r.key.hidden, r.key.template)
            == (key.fingerprint, key.batch, key.hidden, key.template) and r.key != key and r.ok}
    if not near:
        return ""
    found = "; ".join(f"TVM {tvm}, {arch} with {sms} SMs, {dtype}" for tvm, arch, sms, dtype in sorted(near))
    return (f"records for this cell and shapes were measured with {found}, not with TVM {key.tvm}, {key.arch} "
            f"with {key.sms} SMs, {key.dtype}")

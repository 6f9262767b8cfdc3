"""The cache's folders on disk: one per key, complete or absent, trimmed least recently used first.

Layout under the cache folder::

    entries/<digest>/   a complete entry: its files and entry.json (the key, what the entry describes)
    tmp/                entries being written, and entries on their way out
    lock                taken (flock) while entries are removed

An entry is written whole in a folder under ``tmp/`` and renamed into ``entries/`` in one step, so a
reader finds a complete entry or none; of two processes storing one key, the first rename wins and the
other drops its copy. Removing renames the folder back under ``tmp/`` before deleting it, so a reader never
sees half an entry (one that finds a file gone treats the entry as missing). A hit touches ``entry.json``:
its modification time is the entry's last use, which :meth:`Store.trim` evicts by. Imports only the
standard library.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

INFO = "entry.json"
STALE_S = 3600  # a folder under tmp/ this old belongs to a process that died while writing it


def canonical(key: dict) -> dict:
    """``key`` as JSON reads it back (tuples become lists): what an entry stores and is compared with."""
    return json.loads(json.dumps(key, sort_keys=True))


def digest(key: dict) -> str:
    """The folder name of ``key``: a SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """A complete entry: its ``folder`` and ``info`` (entry.json: ``key`` and what the writer put beside it)."""

    folder: Path
    info: dict

    def file(self, name: str) -> Path:
        return self.folder / name

    @property
    def digest(self) -> str:
        return self.folder.name

    @property
    def size(self) -> int:
        """Bytes of its files (0 once it was removed)."""
        try:
            return sum(f.stat().st_size for f in os.scandir(self.folder) if f.is_file())
        except FileNotFoundError:
            return 0

    @property
    def last_used(self) -> float:
        """When it was stored or last found (seconds since the epoch; 0 once removed)."""
        try:
            return self.file(INFO).stat().st_mtime
        except FileNotFoundError:
            return 0.0


# Bytes of each entry folder (by path and inode) this process has measured: an entry's files do not change once it is
# in place (renamed in whole, renamed out to go), so a store's trim stats only the entries new to it, not every file
# of every entry after every store (a test run stores ~1,400 entries: quadratic in stats before). A key stored again
# after it went (its folder may take the old inode) is the same layer, of about the same size: the bound stays near.
_SIZES: dict = {}


def _size(folder: os.DirEntry) -> int:
    key = (folder.path, folder.inode())
    if key not in _SIZES:
        _SIZES[key] = Entry(Path(folder.path), {}).size
    return _SIZES[key]


class Store:
    """The entries under ``root``, trimmed to ``max_bytes`` after each store."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = Path(root), max_bytes
        self.entries_dir, self.tmp_dir = self.root / "entries", self.root / "tmp"

    def get(self, key: dict) -> Entry | None:
        """The entry of ``key``, or None; a damaged one (unreadable entry.json, another key) is removed."""
        folder = self.entries_dir / digest(key)
        try:
            info = json.loads(folder.joinpath(INFO).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError as err:
            log.warning("layer cache: %s is damaged (%s); removing it", folder, err)
            self.remove(Entry(folder, {}))
            return None
        if not isinstance(info, dict) or info.get("key") != canonical(key):
            log.warning("layer cache: %s holds another key; removing it", folder)
            self.remove(Entry(folder, {}))
            return None
        with contextlib.suppress(OSError):  # a read-only cache still serves; it just forgets the order of use
            os.utime(folder / INFO)
        return Entry(folder, info)

    def put(self, key: dict, info: dict, write) -> Entry | None:
        """Store ``key``'s entry: ``write(folder)`` writes its files into a fresh folder, then it appears whole.
        Returns the entry (another process's where it stored the key first), or None when it vanished at once
        (cleared or evicted by another process). OSError when the cache cannot be written."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.entries_dir.mkdir(exist_ok=True)
        name = digest(key)
        folder = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=self.tmp_dir))
        try:
            write(folder)
            folder.joinpath(INFO).write_text(json.dumps({**info, "key": canonical(key)}))
            os.rename(folder, self.entries_dir / name)
        except OSError as err:
            shutil.rmtree(folder, ignore_errors=True)
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            log.debug("layer cache: %s was stored by another process first", name)
        self.trim(keep=name)
        return self.get(key)

    def entries(self) -> list[Entry]:
        """Every complete entry, most recently used first (those whose entry.json cannot be read are left out)."""
        found = []
        for folder in self._folders():
            try:
                found.append(Entry(folder, json.loads(folder.joinpath(INFO).read_text())))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda e: e.last_used, reverse=True)

    def size(self) -> int:
        return sum(Entry(folder, {}).size for folder in self._folders())

    def _folders(self) -> list[Path]:
        return [Path(folder.path) for folder in self._scanned()]

    def _scanned(self) -> list[os.DirEntry]:
        try:
            return list(os.scandir(self.entries_dir))
        except FileNotFoundError:
            return []

    def remove(self, entry: Entry) -> None:
        """Take ``entry`` out (a rename, then the files go); nothing if another process took it first, or the
        cache cannot be written (a warning)."""
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            gone = Path(tempfile.mkdtemp(prefix=f"{entry.folder.name}.removed.", dir=self.tmp_dir))
        except OSError as err:
            log.warning("layer cache: cannot remove %s (%s)", entry.folder, err)
            return
        with contextlib.suppress(FileNotFoundError):
            os.rename(entry.folder, gone / "entry")
        shutil.rmtree(gone, ignore_errors=True)

    def trim(self, keep: str | None = None) -> int:
        """Remove the least recently used entries until the cache holds at most ``max_bytes`` (never ``keep``,
        the digest just stored), and what dead writers left under tmp/; returns how many entries went. Reads
        sizes and times only, no entry.json: an entry's size once per process (:data:`_SIZES`), its time only where
        the bound is passed."""
        sized = [(folder, _size(folder)) for folder in self._scanned()]
        total = sum(size for _, size in sized)
        if total <= self.max_bytes:
            return 0
        listed = [(entry.last_used, size, entry) for entry, size in ((Entry(Path(f.path), {}), n) for f, n in sized)]
        removed = 0
        with self._locked():
            for _, size, entry in sorted(listed, key=lambda item: item[0]):  # least recently used first
                if total <= self.max_bytes:
                    break
                if entry.digest == keep:
                    continue
                total -= size
                self.remove(entry)
                removed += 1
            self._drop_stale()
        log.info("layer cache: removed %d least recently used entries (bound %d MB)", removed, self.max_bytes >> 20)
        return removed

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        entries = self.entries()
        with self._locked():
            for entry in entries:
                self.remove(entry)
            self._drop_stale()
        return len(entries)

    def _drop_stale(self) -> None:
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for folder in os.scandir(self.tmp_dir):
                with contextlib.suppress(OSError):
                    if now - folder.stat().st_mtime > STALE_S:
                        shutil.rmtree(folder.path, ignore_errors=True)

    @contextlib.contextmanager
    def _locked(self):
        """One remover at a time (stores and lookups take no lock)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

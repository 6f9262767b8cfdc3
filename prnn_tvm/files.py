"""Reading a file the user names: a regular file of bounded size, or a clear error.

Every file prnn-tvm reads on a user's word (a tuning log, a cell file, a benchmark CSV, an
exported library) goes through :func:`regular_file` first, so that a directory, a device
(``/dev/urandom``, a symlink to ``/dev/zero``), a FIFO or a file far larger than any the
project writes is refused with its kind and size, never read forever. Imports only the
standard library (the runtime-only import of :func:`prnn_tvm.load` uses it too).
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from .errors import PrnnError

MiB = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def regular_file(path: str | Path, what: str, expected: str, limit: int, error: type[PrnnError]) -> Path | None:
    """``path`` as a Path when it is a regular file of at most ``limit`` bytes (symlinks followed), None when
    it does not exist; else ``error`` saying what the file (``what``: "tuning log") is and what was
    ``expected`` ("a .jsonl file")."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise error(f"{what} {path} cannot be read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise error(f"{what} {path} is {kind}; give the path of {expected}")
    if info.st_size > limit:
        raise error(
            f"{what} {path} has {info.st_size} bytes, more than the {limit // MiB} MiB {expected} "
            "ever holds; give the path of one"
        )
    return path


def append_locked(path: str | Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created if missing) under an exclusive ``flock``, in one ``write`` on an
    ``O_APPEND`` descriptor, so that processes appending to one file never interleave their lines."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        written = 0
        while written < len(data):  # one write in practice; the lock covers a short write
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)  # closing releases the lock

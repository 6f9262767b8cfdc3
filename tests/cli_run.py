"""``prnn-tvm`` commands and Python scripts run in the test process: ``prnn_tvm.cli.main``, or a script as
``__main__``, with its stdout and stderr captured and its exit status, as a fresh process would give them, without
the process's start-up (importing TVM and torch again costs seconds of CPU per command). The tests whose point is the
process itself (the entry points, import laziness, loading with the runtime alone, several ranks) still start one."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path


def run_cli(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``prnn-tvm *args`` (in ``cwd``) as a :class:`subprocess.CompletedProcess`: the exit status ``main`` returns or
    exits with, and what it printed; an exception that escapes ``main`` is printed with its traceback and gives
    status 1, as the interpreter would. The root logger's set-up and the working folder are restored afterwards."""
    from prnn_tvm.cli import main

    return _captured(["prnn-tvm", *args], lambda: main(list(args)), cwd)


def run_script(script: str | Path, *args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``python script *args`` (in ``cwd``) as :func:`run_cli` runs a command: the script runs as ``__main__``
    with ``sys.argv`` set and its folder first on ``sys.path`` (both restored afterwards); its status is the one
    it exits with (0 when it ends)."""
    script = str(script)
    argv, path = sys.argv[:], sys.path[:]

    def main():
        sys.argv, sys.path[0:0] = [script, *args], [str(Path(script).resolve().parent)]
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv, sys.path[:] = argv, path

    return _captured([sys.executable, script, *args], main, cwd)


def _captured(argv: list[str], main, cwd) -> subprocess.CompletedProcess:
    """``main()``'s exit status and output as a process running ``argv`` in ``cwd`` gives them."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []  # main's logging.basicConfig then writes to the captured stderr, as in a process of its own
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main()
            except SystemExit as done:
                status = _exit_status(done.code)
            except Exception:  # a crash, shown as the interpreter shows one
                traceback.print_exc()
                status = 1
    finally:
        os.chdir(here)
        root.handlers, root.level = handlers, level
    return subprocess.CompletedProcess(argv, status or 0, out.getvalue(), err.getvalue())


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives a process: 0 for None, the number, or 1 with the message printed."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1

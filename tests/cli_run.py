"""``prnn-tvm`` commands run in the test process: ``prnn_tvm.cli.main`` with its stdout and stderr captured and its
exit status, as a fresh process would give them, without the process's start-up (importing TVM and torch again costs
seconds of CPU per command). The tests whose point is the process itself (the entry points, import laziness, loading
with the runtime alone) still start one."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path


def run_cli(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``prnn-tvm *args`` (in ``cwd``) as a :class:`subprocess.CompletedProcess`: the exit status ``main`` returns or
    exits with, and what it printed; an exception that escapes ``main`` is printed with its traceback and gives
    status 1, as the interpreter would. The root logger's set-up and the working folder are restored afterwards."""
    from prnn_tvm.cli import main

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
                status = main(list(args))
            except SystemExit as done:
                status = _exit_status(done.code)
            except Exception:  # a crash, shown as the interpreter shows one
                traceback.print_exc()
                status = 1
    finally:
        os.chdir(here)
        root.handlers, root.level = handlers, level
    return subprocess.CompletedProcess(["prnn-tvm", *args], status, out.getvalue(), err.getvalue())


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives a process: 0 for None, the number, or 1 with the message printed."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1

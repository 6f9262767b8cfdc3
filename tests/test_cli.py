"""The command line: a compile smoke test, and one-line errors for bad arguments."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "prnn_tvm.cli", *args], capture_output=True, text=True)


def test_compile_reports_kernel_and_cpu_check():
    r = run("compile", "lstm", "--hidden", "32", "--batch", "3", "--seq", "5", "--arch", "sm_90")
    assert r.returncode == 0, r.stderr
    for text in ("cell        lstm", "schedule    persistent_cuda", "(default", "CTAs x", "registers/thread",
                 "0 B spill stores", "cpu check   max abs error", ": ok"):
        assert text in r.stdout, r.stdout


@pytest.mark.parametrize("args, message", [
    (["compile", "lstmx", "--hidden", "8", "--batch", "1"], "unknown cell 'lstmx'"),
    (["compile", "lstm", "--hidden", "0", "--batch", "1"], "--hidden: expected a positive integer, got 0"),
    (["compile", "lstm", "--hidden", "8", "--batch", "-3"], "--batch: expected a positive integer, got -3"),
    (["compile", "lstm", "--hidden", "8", "--batch", "1", "--arch", "sm_99"], "unknown GPU architecture 'sm_99'"),
    (["compile", "lstm", "--batch", "1"], "required: --hidden"),
])
def test_bad_arguments_exit_with_one_line(args, message):
    r = run(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cells_lists_builtins():
    r = run("cells")
    listed = {line.split()[0] for line in r.stdout.splitlines()}
    assert r.returncode == 0 and {"lstm", "gru", "rnn_tanh", "rnn_relu"} <= listed

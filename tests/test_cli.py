"""The command line: a compile smoke test, and one-line errors for bad arguments. The commands run in the test
process (``tests/cli_run.py``); ``prnn-tvm cells`` runs as a process of its own, through ``python -m prnn_tvm.cli``."""

import subprocess
import sys

import pytest

from .cli_run import run_cli as run


def test_compile_reports_kernel_and_cpu_check():
    r = run("compile", "lstm", "--hidden", "32", "--batch", "3", "--seq", "5", "--arch", "sm_90")
    assert r.returncode == 0, r.stderr
    for text in (
        "cell        lstm",
        "schedule    persistent_cuda",
        "(default",
        "CTAs x",
        "registers/thread",
        "0 B spill stores",
        "cpu check   max abs error",
        ": ok",
        "grad check  relative error",
        "training    recurrent_save: ",
        "training    recurrent_backward: ",
    ):
        assert text in r.stdout, r.stdout
    assert "FAILED" not in r.stdout


FLOOR_CELL = """
import numpy as np
from tvm import te
from prnn_tvm import Cell

def step(c):
    x, h = c.input(1), c.state("h")
    hu = c.matvec(h, c.weight("U"), name="hu")
    return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + te.floor(hu[n, j])), name="h_new")}

def reference(x, state, p):
    return {"h": np.tanh(x + np.floor(state["h"] @ p["U"].T))}

CELL = Cell("floor_rnn", step, reference, output="h")
"""


def test_a_cell_without_derivative_rules_compiles_and_says_it_cannot_train(tmp_path):
    (tmp_path / "floor_rnn.py").write_text(FLOOR_CELL)
    r = run("compile", str(tmp_path / "floor_rnn.py"), "--hidden", "8", "--batch", "2", "--seq", "4", "--arch", "sm_90")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu check   max abs error" in r.stdout and "grad check  not derivable: cannot differentiate" in r.stdout
    assert "training    " not in r.stdout


def test_compile_a_stack_in_one_launch():
    r = run("compile", "gru", "--layers", "3", "--hidden", "8", "--batch", "2", "--seq", "5", "--arch", "sm_90")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cell        gru_x3 " in r.stdout and "0 B spill stores" in r.stdout
    assert "cpu check   max abs error" in r.stdout and ": ok" in r.stdout
    assert "grad check  not derivable: 'gru_x3' is a wavefront stack, which has no backward" in r.stdout


def test_compile_both_directions_in_one_launch():
    r = run("compile", "lstm", "--bidirectional", "--hidden", "8", "--batch", "2", "--seq", "5", "--arch", "sm_90")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cell        lstm_bi " in r.stdout and "0 B spill stores" in r.stdout
    assert "cpu check   max abs error" in r.stdout and ": ok" in r.stdout
    assert "grad check  not derivable: 'lstm_bi' runs both directions of a layer in one launch" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["compile", "lstmx", "--hidden", "8", "--batch", "1"], "unknown cell 'lstmx'"),
        (
            ["compile", "lstm", "--layers", "0", "--hidden", "8", "--batch", "1"],
            "--layers: expected a positive integer",
        ),
        (["compile", "lstm", "--hidden", "0", "--batch", "1"], "--hidden: expected a positive integer, got 0"),
        (["compile", "lstm", "--hidden", "8", "--batch", "-3"], "--batch: expected a positive integer, got -3"),
        (["compile", "lstm", "--hidden", "8", "--batch", "1", "--arch", "sm_99"], "unknown GPU architecture 'sm_99'"),
        (["compile", "lstm", "--batch", "1"], "required: --hidden"),
        (
            ["compile", "lstm", "--bidirectional", "--layers", "2", "--hidden", "8", "--batch", "1"],
            "--bidirectional takes one layer",
        ),
    ],
)
def test_bad_arguments_exit_with_one_line(args, message):
    r = run(*args)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_cells_lists_builtins():
    r = subprocess.run([sys.executable, "-m", "prnn_tvm.cli", "cells"], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    listed = {line.split()[0] for line in lines}
    assert r.returncode == 0 and {"lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_peephole"} <= listed
    starts = {len(line) - len(line.split(maxsplit=1)[1]) for line in lines}  # where each description starts
    assert len(starts) == 1 and "``" not in r.stdout, r.stdout  # one column, the docstrings' reST as plain text


def _log(tmp_path, *records_):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in records_))
    return path


def test_records_print_control_characters_escaped(tmp_path):
    """A cell name from a log is printed as text, never as a terminal escape or an extra line."""
    from prnn_tvm.records import Record, TuneKey

    key = TuneKey("abc", 4, 64, "float32", "sm_90", 132, "persistent_cuda", "0.27.0.post1")
    path = _log(tmp_path, Record(key, {}, (1e-3,), 256, cell="\x1b[31mred\nline"))
    for action in ("show", "best"):
        r = run("records", action, "--log", str(path))
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\\x1b[31mred\\nline" in r.stdout, r.stdout
        assert len(r.stdout.strip().splitlines()) == 2  # the header and the one key


def test_records_best_has_a_dtype_column(tmp_path):
    """Two keys that differ only in dtype printed two identical-looking lines."""
    from prnn_tvm.records import Record, TuneKey

    keys = [
        TuneKey("abc", 16, 1024, dtype, "sm_90", 132, "persistent_cuda", "0.27.0.post1")
        for dtype in ("float32", "float16")
    ]
    r = run("records", "best", "--log", str(_log(tmp_path, *(Record(k, {}, (1e-3,), 256, cell="lstm") for k in keys))))
    lines = r.stdout.strip().splitlines()[1:]
    assert r.returncode == 0 and len(lines) == 2 and len(set(lines)) == 2, r.stdout
    assert "float32" in lines[0] and "float16" in lines[1]

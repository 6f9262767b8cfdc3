"""Cells are found by name, file or object; the driver knows no cell by name."""

import ast
import pathlib
import textwrap

import pytest

import prnn_tvm
from prnn_tvm import Cell, CellError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_builtin_cells_are_the_files_in_cells():
    files = {p.stem for p in (ROOT / "cells").glob("*.py") if p.stem != "__init__"}
    assert set(prnn_tvm.builtin_cells()) == files
    assert {"rnn_tanh", "rnn_relu", "lstm", "gru", "lstm_peephole", "mgu", "gru_cho", "indrnn", "stacked_rnn"} <= files


@pytest.mark.parametrize("name", sorted(prnn_tvm.builtin_cells()))
def test_every_cell_documents_its_equations_and_source(name):
    doc = prnn_tvm.resolve(name).doc
    assert "=" in doc and any(str(year) in doc for year in range(1985, 2030)), doc


def test_resolve_name_object_and_file(tmp_path):
    lstm = prnn_tvm.resolve("lstm")
    assert prnn_tvm.resolve(lstm) is lstm
    path = tmp_path / "my_cell.py"
    path.write_text(
        textwrap.dedent("""
        import numpy as np
        from tvm import te
        from prnn_tvm import Cell

        def step(c):
            x, h, W = c.input(), c.state("h"), c.weight("W")
            hw = c.matvec(h, W, "hw")
            return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")}

        MINE = Cell("mine", step, lambda x, s, p: {"h": np.tanh(x + s["h"] @ p["W"].T)})
    """)
    )
    cell = prnn_tvm.resolve(f"{path}:MINE")
    assert isinstance(cell, Cell) and cell.name == "mine"
    with pytest.raises(CellError, match="defines no Cell named CELL"):
        prnn_tvm.resolve(str(path))


@pytest.mark.parametrize(
    "spec, message", [("lstmm", "unknown cell 'lstmm'"), ("nope.py", "does not exist"), (3, "a Cell object")]
)
def test_resolve_errors(spec, message):
    with pytest.raises(CellError, match=message):
        prnn_tvm.resolve(spec)


def _code_strings_and_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield "string", node.value
        elif isinstance(node, ast.ImportFrom):
            yield "import", f"{'.' * node.level}{node.module or ''}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield "import", alias.name


# Integrations with PyTorch map its fixed classes (nn.LSTM, nn.GRU, nn.RNN) onto the built-in cells
# of the same math; they are the one place a cell's name may appear outside cells/.
PYTORCH_FRONTENDS = {"prnn_tvm/torch/", "prnn_tvm/bench"}


@pytest.mark.parametrize("folder", ["prnn_tvm", "schedules"])
def test_driver_and_schedules_know_no_cell_by_name(folder):
    names = set(prnn_tvm.builtin_cells())
    for path in (ROOT / folder).rglob("*.py"):
        if any(str(path.relative_to(ROOT)).startswith(f) for f in PYTORCH_FRONTENDS):
            continue
        for kind, value in _code_strings_and_imports(path):
            if kind == "import":
                assert not any(value.endswith(f"cells.{n}") for n in names), f"{path.name} imports {value}"
            else:
                assert not any(n == value.strip().lower() for n in names), f"{path.name} mentions cell {value!r}"

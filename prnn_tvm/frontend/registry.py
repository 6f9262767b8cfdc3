"""Resolve a cell from a name, a file, or a Cell object.

Built-in cells are the modules of ``prnn_tvm.cells`` that define ``CELL``: the files are
the registry, so there is no table to keep in step with them.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

from ..errors import CellError
from ..files import MiB, regular_file
from .cell import Cell, user_frame
from .directions import bidirectional
from .heads import headed
from .stack import stacked


def builtin_cells() -> dict[str, Cell]:
    """Name -> Cell for every built-in cell, in file-name order."""
    from .. import cells

    found = {}
    for info in sorted(pkgutil.iter_modules(cells.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{cells.__name__}.{info.name}")
        cell = getattr(module, "CELL", None)
        if isinstance(cell, Cell):
            found[cell.name] = cell
    return found


def resolve(spec: str | Cell) -> Cell:
    """A Cell from a Cell, a built-in name (``"lstm"``) or ``path/to/file.py[:ATTR]``, or a stack of one,
    ``<spec>_x<layers>`` (``lstm_x4``: :func:`prnn_tvm.frontend.stack.stacked`, the name a stack's layer,
    its tuning records and its exports carry) or ``<spec>_d<layers>`` (the deep stack), or one whose recurrent
    products are head-wise, ``<spec>_h<heads>`` (``lstm_h12``: :func:`prnn_tvm.frontend.heads.headed`), or both
    directions of one, ``<spec>_bi`` (:func:`prnn_tvm.frontend.directions.bidirectional`).

    A file must define ``CELL`` (or the attribute named after the colon) as a Cell.
    """
    if isinstance(spec, Cell):
        return spec
    if not isinstance(spec, str) or not spec:
        raise CellError(f"a cell is a Cell object, a built-in name or a .py file, got {spec!r}")
    path, _, attr = spec.rpartition(":") if ".py:" in spec else (spec, "", "CELL")
    if path.endswith(".py"):
        return _from_file(Path(path), attr)
    cells = builtin_cells()
    if spec in cells:
        return cells[spec]
    for mark, wavefront in (("_x", True), ("_d", False)):  # a stack's name, as compile_cell(..., layers=) names it
        base, _, layers = spec.rpartition(mark)
        if base and layers.isdigit() and int(layers) > 0:
            return stacked(resolve(base), int(layers), wavefront)
    base, _, heads = spec.rpartition("_h")  # head-wise products, as headed(cell, heads) names them
    if base and heads.isdigit() and int(heads) > 0:
        return headed(resolve(base), int(heads))
    if spec.endswith("_bi") and len(spec) > 3:  # both directions, as compile_cell(..., bidirectional=True)
        return bidirectional(resolve(spec[:-3]))
    raise CellError(
        f"unknown cell '{spec}'; built-in cells: {', '.join(cells)} "
        "(or give a path/to/cell.py defining CELL; <cell>_x<layers> for a wavefront stack of it, "
        "<cell>_d<layers> for a deep stack, <cell>_h<heads> for head-wise products, <cell>_bi for both "
        "directions of it)"
    )


MAX_CELL_FILE_BYTES = 16 * MiB  # a cell file is a page of Python


def _from_file(path: Path, attr: str) -> Cell:
    if regular_file(path, "cell file", "a .py file defining CELL", MAX_CELL_FILE_BYTES, CellError) is None:
        raise CellError(f"cell file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"prnn_tvm_user_cell_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as err:
        raise CellError(f"{path}, line {err.lineno}: {err.msg}; the cell file is not valid Python") from err
    except (Exception, SystemExit) as err:  # the user's module failed (or exited) while importing: say where
        what = (
            f"called sys.exit({err.code!r}) while being imported"
            if isinstance(err, SystemExit)
            else f"raised {type(err).__name__} while being imported: {err}"
        )
        raise CellError(f"{path} {what} ({user_frame(err)}); a cell file only defines its cell") from err
    cell = getattr(module, attr, None)
    if not isinstance(cell, Cell):
        raise CellError(
            f"{path} defines no Cell named {attr} (it has {type(cell).__name__} there)"
            if cell is not None
            else f"{path} defines no Cell named {attr}"
        )
    return cell

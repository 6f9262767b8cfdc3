"""prnn-tvm: compile recurrent cells written in TVM tensor expressions to persistent GPU kernels."""

from .analysis import analyze
from .barrier import BarrierTimeout
from .cell import Cell, CellBuilder, Role
from .compiler import compile_cell
from .errors import CellError, ConfigError, InputError, LaunchError, PrnnError
from .layer import Layer
from .plan import CellPlan
from .registry import builtin_cells, resolve
from .report import CompileReport

__version__ = "0.1.0"

__all__ = [
    "Cell", "CellBuilder", "Role", "CellPlan", "analyze", "builtin_cells", "resolve", "compile_cell",
    "Layer", "CompileReport",
    "CellError", "ConfigError", "InputError", "LaunchError", "PrnnError", "BarrierTimeout",
]

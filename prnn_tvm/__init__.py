"""prnn-tvm: compile recurrent cells written in TVM tensor expressions to persistent GPU kernels."""

from tvm.base import _RUNTIME_ONLY

from .errors import BarrierTimeout, CellError, ConfigError, ExportError, InputError, LaunchError, LoadError, PrnnError
from .runtime.loading import LoadedLayer, load

__version__ = "0.1.0"

__all__ = [
    "Cell", "CellBuilder", "Role", "CellPlan", "analyze", "builtin_cells", "resolve", "compile_cell",
    "compile_backward", "compile_training", "Layer", "CompileReport", "export", "load", "LoadedLayer",
    "CellError", "ConfigError", "InputError", "LaunchError", "PrnnError", "BarrierTimeout", "ExportError",
    "LoadError",
]

# Under TVM's runtime-only import (TVM_USE_RUNTIME_LIB=1, inference machines) only `load`
# and the errors exist: everything below needs the TVM compiler.
if not _RUNTIME_ONLY:
    from .compiler import compile_backward, compile_cell, compile_training
    from .frontend.analysis import analyze
    from .frontend.cell import Cell, CellBuilder, Role
    from .frontend.plan import CellPlan
    from .frontend.registry import builtin_cells, resolve
    from .report import CompileReport
    from .runtime.exporting import export
    from .runtime.layer import Layer
else:
    __all__ = ["load", "LoadedLayer", "CellError", "ConfigError", "InputError", "LaunchError", "PrnnError",
               "BarrierTimeout", "ExportError", "LoadError"]

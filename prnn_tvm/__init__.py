"""prnn-tvm: compile recurrent cells written in TVM tensor expressions to persistent GPU kernels.

The names below are imported when first used (``prnn_tvm.compile_cell`` imports the compiler, and TVM, then):
``import prnn_tvm`` and the command line's ``--help`` cost milliseconds, not TVM's import.
"""

import importlib

from .errors import (  # noqa: F401  (re-exported: the public errors)
    BarrierTimeout,
    CellError,
    ConfigError,
    ExportError,
    InputError,
    LaunchError,
    LoadError,
    PrnnError,
)

__version__ = "0.1.0"

# name -> the module that defines it. Under TVM's runtime-only import (TVM_USE_RUNTIME_LIB=1, inference machines)
# only `load`, `LoadedLayer` and the errors exist: everything else needs the TVM compiler.
_RUNTIME = {"load": ".runtime.loading", "LoadedLayer": ".runtime.loading"}
_COMPILER = {
    "compile_cell": ".compiler",
    "compile_backward": ".compiler",
    "compile_training": ".compiler",
    "analyze": ".frontend.analysis",
    "Cell": ".frontend.cell",
    "CellBuilder": ".frontend.cell",
    "Role": ".frontend.cell",
    "CellPlan": ".frontend.plan",
    "builtin_cells": ".frontend.registry",
    "resolve": ".frontend.registry",
    "CompileReport": ".report",
    "export": ".runtime.exporting",
    "Layer": ".runtime.layer",
}
_ERRORS = [
    "CellError",
    "ConfigError",
    "InputError",
    "LaunchError",
    "PrnnError",
    "BarrierTimeout",
    "ExportError",
    "LoadError",
]


def _runtime_only() -> bool:
    """Whether TVM was imported runtime-only (``TVM_USE_RUNTIME_LIB=1``, or a runtime-only TVM)."""
    from tvm.base import _RUNTIME_ONLY

    return _RUNTIME_ONLY


def __getattr__(name: str):
    if name == "__all__":  # `from prnn_tvm import *`: what this TVM provides
        return [*_RUNTIME, *_ERRORS] + ([] if _runtime_only() else list(_COMPILER))
    where = _RUNTIME.get(name) or _COMPILER.get(name)
    if where is None:
        raise AttributeError(f"module 'prnn_tvm' has no attribute '{name}'")
    if name in _COMPILER and _runtime_only():
        raise AttributeError(
            f"prnn_tvm.{name} needs the TVM compiler, and TVM was imported runtime-only "
            "(TVM_USE_RUNTIME_LIB=1): only prnn_tvm.load, LoadedLayer and the errors are here"
        )
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # found once: later lookups do not come here
    return value


def __dir__():
    return sorted({*globals(), *_RUNTIME, *_COMPILER, *_ERRORS})

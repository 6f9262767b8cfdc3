"""The compiler's functions for modules that must import without TVM (``prnn_tvm.torch``): each imports its
module, and with it TVM, at its first call, so ``import prnn_tvm.torch`` costs torch's import and not TVM's
(seconds). Calling one is calling the function it names."""

from __future__ import annotations

import importlib


def _deferred(module: str, name: str):
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}``, imported at the first call."
    return call


compile_cell = _deferred("prnn_tvm.compiler", "compile_cell")
compile_backward = _deferred("prnn_tvm.compiler", "compile_backward")
compile_training = _deferred("prnn_tvm.compiler", "compile_training")
compile_projected = _deferred("prnn_tvm.projected_build", "compile_projected")
analyze = _deferred("prnn_tvm.frontend.analysis", "analyze")
resolve = _deferred("prnn_tvm.frontend.registry", "resolve")
split_direction_name = _deferred("prnn_tvm.frontend.directions", "split_direction_name")
split_layer_name = _deferred("prnn_tvm.frontend.stack", "split_layer_name")
stacked = _deferred("prnn_tvm.frontend.stack", "stacked")

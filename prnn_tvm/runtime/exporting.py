"""``export``: write a compiled layer to one shared library that the TVM runtime alone can run.

What the library holds, and where its cubin comes from: :mod:`prnn_tvm.runtime.library`. A layer that came
from the layer cache (:mod:`prnn_tvm.cache`) already has its library, written from an equal layer with the
same metadata: export copies it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import ExportError
from .layer import Layer
from .library import cubin, layer_metadata, write_library, write_whole

log = logging.getLogger(__name__)


def export(layer, path, **compile_kwargs) -> Path:
    """Write ``layer`` to the shared library ``path`` for inference elsewhere.

    Parameters
    ----------
    layer : Layer or str or Cell
        A compiled layer, or a cell to compile first with ``compile_kwargs``
        (those of :func:`prnn_tvm.compile_cell`: ``hidden``, ``batch``, ``arch``, ...).
    path : str or Path
        The library to write (``.so``). It is written whole or not at all (a file beside it, renamed
        into place), so a library loaded from it before stays intact.

    Use it on a build machine (nvcc and a C++ compiler; a GPU is not needed) and
    :func:`prnn_tvm.load` where the layer runs. Weights are not part of the library:
    they are passed at each call, as to the compiled layer. Returns the path.
    """
    if not isinstance(layer, Layer):
        from ..compiler import compile_cell  # the compiler only when asked to compile

        layer = compile_cell(layer, **compile_kwargs)
    elif compile_kwargs:
        raise ExportError(f"compile arguments ({', '.join(compile_kwargs)}) given with an already compiled layer")
    path = _writable(Path(path))
    metadata = layer_metadata(layer)
    library = _cached_library(layer, metadata)
    if library is not None:
        write_whole(path, library)
    else:
        code = cubin(layer.cuda_source, layer.gpu.arch, layer.signature.cell) if layer.is_cuda else None
        write_library(layer.compiled_module(), path, metadata, code)
    log.info("exported %s (%s) to %s", layer.signature.cell, layer.report.target, path)
    return path


def _cached_library(layer: Layer, metadata: dict) -> bytes | None:
    """The bytes of the library ``layer`` was restored from (the layer cache's) where it carries ``metadata``,
    else None: a layer compiled here, or one whose entry was evicted since."""
    if layer.library is None or json.dumps(metadata, sort_keys=True) != json.dumps(
        layer.library_metadata, sort_keys=True
    ):
        return None
    try:
        return layer.library.read_bytes()
    except OSError:
        return None


def _writable(path: Path) -> Path:
    """``path`` if a library can be written there, else ExportError saying why (before anything is built)."""
    if path.is_dir():
        raise ExportError(f"{path} is a directory; give the path of the library to write (.so)")
    if path.suffix != ".so":
        raise ExportError(
            f"{path.name}: an exported layer is a shared library, which prnn_tvm.load (and TVM's loader) "
            f"knows by its name ending in .so; name it {path.stem or path.name}.so"
        )
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    if path.exists() and not path.is_file():
        raise ExportError(f"cannot write {path}: it exists and is not a regular file")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {path}: the folder {path.parent} is not writable")
    return path

"""``export``: write a compiled layer to one shared library that the TVM runtime alone can run.

What the library holds, and where its cubin comes from: :mod:`prnn_tvm.runtime.library`. A layer that came
from the layer cache (:mod:`prnn_tvm.cache`) already has its library, written from an equal layer with the
same metadata: export copies it.

With ``session=True`` the library also carries the kernels of a resident session (:func:`prnn_tvm.compile_session`:
the resident kernel, publish, collect, close), built into the same module as the layer's, and their launches in its
metadata (``session``), so that the loaded layer offers ``.session()`` with the TVM runtime alone.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..codegen.build import build_functions, layer_functions
from ..errors import ConfigError, ExportError
from ..session_build import compile_session
from .layer import Layer
from .library import cubin, layer_metadata, write_library, write_whole

log = logging.getLogger(__name__)


def export(layer, path, *, session: bool = False, **compile_kwargs) -> Path:
    """Write ``layer`` to the shared library ``path`` for inference elsewhere.

    Parameters
    ----------
    layer : Layer or str or Cell
        A compiled layer, or a cell to compile first with ``compile_kwargs``
        (those of :func:`prnn_tvm.compile_cell`: ``hidden``, ``batch``, ``arch``, ...).
    path : str or Path
        The library to write (``.so``). It is written whole or not at all (a file beside it, renamed
        into place), so a library loaded from it before stays intact.
    session : bool
        Also carry a resident session's kernels, so that ``prnn_tvm.load(path).session(...)`` runs one (a CUDA
        layer that can run as a session: a single layer or a deep stack, ``<cell>_d<layers>``). Off by default:
        it compiles a second persistent kernel (the export takes about twice as long, the library grows by its
        code), a layer that cannot run as a session (a wavefront stack, a bidirectional or CPU layer) exports
        without it, and a layer from the layer cache is then written from its cached library as it is.

    Use it on a build machine (nvcc and a C++ compiler; a GPU is not needed) and
    :func:`prnn_tvm.load` where the layer runs. Weights are not part of the library:
    they are passed at each call, as to the compiled layer. Returns the path.
    """
    if not isinstance(layer, Layer):
        from ..compiler import compile_cell  # the compiler only when asked to compile

        layer = compile_cell(layer, **compile_kwargs)
    elif compile_kwargs:
        raise ExportError(f"compile arguments ({', '.join(compile_kwargs)}) given with an already compiled layer")
    if session not in (True, False):
        raise ExportError(f"session must be True or False, got {session!r}")
    path = _writable(Path(path))
    metadata = layer_metadata(layer)
    library = None if session else _cached_library(layer, metadata)
    if library is not None:
        write_whole(path, library)
    elif session:
        module, source, metadata = _with_session(layer, metadata)
        write_library(module, path, metadata, cubin(source, layer.gpu.arch, layer.signature.cell))
    else:
        code = cubin(layer.cuda_source, layer.gpu.arch, layer.signature.cell) if layer.is_cuda else None
        write_library(layer.compiled_module(), path, metadata, code)
    with_session = " with its session kernels" if session else ""
    log.info("exported %s (%s)%s to %s", layer.signature.cell, layer.report.target, with_session, path)
    return path


def _with_session(layer: Layer, metadata: dict) -> tuple:
    """The module of ``layer``'s functions and its session's, built together (one CUDA module, one cubin), its CUDA
    source, and ``metadata`` with the session's launches; ExportError where the layer cannot run as a session."""
    cell = layer.signature.cell
    if not layer.is_cuda:
        raise ExportError(
            f"{cell} is a CPU build, and a session runs on the GPU: export the CUDA layer with session=True, "
            "or this one without"
        )
    try:
        kernels = compile_session(layer)
    except ConfigError as err:
        raise ExportError(f"{cell} cannot run as a session ({err}); export it without session=True") from err
    functions = layer_functions(layer.plan, layer.kernel, layer.input_size, layer.target)
    built = build_functions({**functions, **kernels.functions}, layer.target, layer.gpu)
    return built.module, built.source, {**metadata, "session": kernels.signature.as_dict()}


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

"""Compiled layers to cache entries and back: what ``compile_cell``, ``compile_backward`` and ``compile_training``
look up before they build, and store after.

An entry holds the library of the compiled module (:func:`prnn_tvm.runtime.library.write_library`: host code,
the kernels as a cubin for a CUDA layer, the metadata :func:`prnn_tvm.load` reads), the CUDA source, and in
entry.json the report, the signatures and the warnings the build logged. A layer is restored by loading that
library where it can run (the CPU build; a CUDA build on a GPU of its arch): a stored layer and a found one are
the same kind of object, whose module is the library's. Elsewhere (a CUDA build without its GPU) the entry holds
no library (writing one costs a host compile and a link, for code nothing here can run): a restored layer has
the report, signature and CUDA source, and builds its module again only if asked for it (``layer.module``,
``export``).

A layer built here is stored, then restored from its entry, so the first compile and every later one return
alike. Nothing is ever worse than without the cache: an entry that cannot be written (no g++, no nvcc, a full
or read-only disk) or read (damaged, removed by another process) is a warning and a build.
"""

from __future__ import annotations

import contextlib
import logging
import time

from ..codegen.build import build_module, rewriting
from ..errors import ExportError, LoadError
from ..report import CompileReport
from ..runtime.layer import Layer
from ..runtime.library import cubin, kernels_metadata, layer_metadata, write_library
from ..runtime.loading import load
from ..schedules import by_name
from ..signature import Signature
from ..target import local_gpu
from .key import derived_key, layer_key
from .settings import settings
from .store import Store

log = logging.getLogger(__name__)

LIBRARY, SOURCE = "layer.so", "kernel.cu"


def key_for(plan, input_size, seq_len, target, gpu, config, tuning_logs, layers, bidirectional, cache) -> dict | None:
    """The key of a ``compile_cell`` (see :func:`.key.layer_key`), or None where nothing is cached: ``cache``
    False, the cache turned off (``PRNN_TVM_CACHE=0``), or a build whose sources are being rewritten
    (``codegen.build.rewriting_sources``: instrumented code is never stored)."""
    if not cache or not settings().enabled or rewriting():
        return None
    return layer_key(plan, input_size, seq_len, target, gpu, config, tuning_logs, layers, bidirectional)


def lookup(key: dict | None, plan, target, gpu, input_size: int) -> Layer | None:
    """The cached layer of ``key``, restored, or None."""
    entry = _get(key)
    if entry is None:
        return None
    layer = _restored(entry, key, plan, target, gpu, _Rebuild(plan, input_size, target, gpu, entry))
    if layer is not None:
        for name, level, message in entry.info.get("warnings", ()):
            logging.getLogger(name).log(level, "%s", message)
        log.info("%s from the layer cache (%s)", plan.cell.name, entry.folder)
    return layer


def store(key: dict | None, layer: Layer, warnings=()) -> Layer:
    """Store the freshly built ``layer`` under ``key`` (with the ``warnings`` its build logged) and return it
    as restored from its entry; ``layer`` itself where nothing was stored."""
    if key is None:
        return layer
    metadata = layer_metadata(layer)
    info = {
        "kind": "layer",
        "describes": describe(layer.signature, layer.report.target),
        "created": time.time(),
        "report": layer.report.as_dict(),
        "signature": layer.signature.as_dict(),
        "metadata": metadata,
        "warnings": list(warnings),
    }

    runnable = _runnable(layer.target, layer.gpu)

    def write(folder):
        if runnable:
            code = cubin(layer.cuda_source, layer.gpu.arch, layer.signature.cell) if layer.is_cuda else None
            write_library(layer.module, folder / LIBRARY, metadata, code)
        if layer.cuda_source:
            (folder / SOURCE).write_text(layer.cuda_source)

    entry = _put(key, info, write)
    if entry is None:
        return layer
    rebuild = _Rebuild(
        layer.plan, layer.input_size, layer.target, layer.gpu, entry, layer.kernel, None if runnable else layer.module
    )
    return _restored(entry, key, layer.plan, layer.target, layer.gpu, rebuild) or layer


def lookup_kernels(key: dict | None, target, gpu) -> tuple | None:
    """``(module, signatures, info)`` of the kernels cached under ``key`` (a layer's backward or training
    kernels, :func:`.key.derived_key`), loaded; None where there are none, or they cannot run here."""
    if key is None or not _runnable(target, gpu):
        return None
    entry = _get(key)
    if entry is None:
        return None
    try:
        module = _loaded(entry).module
    except LoadError as err:
        log.warning("layer cache: %s; building the kernels", err)
        return None
    return module, [Signature.from_dict(s) for s in entry.info["signatures"]], entry.info


def store_kernels(key: dict | None, module, signatures: list, source: str | None, target, gpu, info: dict):
    """Store ``module`` (launches ``signatures``, CUDA ``source``) under ``key`` with ``info``; returns the module
    loaded from the entry (``module`` itself where nothing was stored, or it cannot run here)."""
    if key is None or not _runnable(target, gpu):
        return module
    first = signatures[0]
    whole = Signature(
        first.cell,
        first.batch,
        first.hidden,
        first.input_size,
        first.dtype,
        tuple(x for s in signatures for x in s.launches),
    )
    arch = gpu.arch if gpu is not None else None
    info = {
        "kind": key["kind"],
        "describes": describe(first, f"cuda {arch}" if arch else "llvm"),
        "created": time.time(),
        "signatures": [s.as_dict() for s in signatures],
        **info,
    }

    def write(folder):
        write_library(
            module, folder / LIBRARY, kernels_metadata(whole, arch), cubin(source, arch, first.cell) if arch else None
        )

    entry = _put(key, info, write)
    if entry is None:
        return module
    try:
        return _loaded(entry).module
    except LoadError as err:
        log.warning("layer cache: %s; running the kernels as built", err)
        return module


# What a layer's key holds that its CPU backward's code does not read: the backward is one kernel of the plan alone
# (``schedules.cpu_backward.backward_kernel``: the sequence length a runtime argument, the input projection's size
# not among its arguments) and takes no config. Layers that differ only in these share one backward.
BACKWARD_UNREAD = ("input_size", "seq_len", "config", "tuning_records")


def backward_key(layer: Layer) -> dict | None:
    """The key of ``layer``'s backward (None for a layer that was not cached): its key without
    :data:`BACKWARD_UNREAD`."""
    if layer.cache_key is None:
        return None
    return derived_key({k: v for k, v in layer.cache_key.items() if k not in BACKWARD_UNREAD}, "backward")


def training_key(layer: Layer) -> dict | None:
    """The key of ``layer``'s training kernels (None for a layer that was not cached)."""
    return derived_key(layer.cache_key, "training") if layer.cache_key is not None else None


def projected_key(layer: Layer) -> dict | None:
    """The key of ``layer``'s projected launch (None for a layer that was not cached)."""
    return derived_key(layer.cache_key, "projected") if layer.cache_key is not None else None


def describe(signature: Signature, target: str) -> dict:
    """What ``prnn-tvm cache list`` shows of an entry."""
    return {
        "cell": signature.cell,
        "batch": signature.batch,
        "hidden": signature.hidden,
        "input_size": signature.input_size,
        "dtype": signature.dtype,
        "target": target,
    }


@contextlib.contextmanager
def warnings_logged():
    """Collect what prnn-tvm's loggers warn about inside the block, as ``[logger, level, message]`` (a cached
    layer says it again when found: a build's spill or an ignored tuning record is news to every process)."""
    said: list = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append([record.name, record.levelno, record.getMessage()])

    handler, root = Collect(logging.WARNING), logging.getLogger("prnn_tvm")
    root.addHandler(handler)
    try:
        yield said
    finally:
        root.removeHandler(handler)


class _Rebuild:
    """What a restored layer's library does not hold, made when first asked for: the template's kernel (from the
    template and config its report names) and the compiled module; a layer just built hands over its own."""

    def __init__(self, plan, input_size, target, gpu, entry, kernel=None, module=None):
        self.plan, self.input_size, self.target, self.gpu = plan, input_size, target, gpu
        self.template, self.config = entry.info["report"]["template"], entry.info["report"]["config"]
        self._kernel, self._module = kernel, module

    def kernel(self):
        if self._kernel is None:
            template = by_name(self.template)
            config = template.config_from_dict(self.config) if self.config else None
            self._kernel = template.apply(self.plan, self.target, self.gpu, config)
        return self._kernel

    def module(self):
        if self._module is None:
            log.info("%s: building the module its cached library holds, as asked", self.plan.cell.name)
            self._module = build_module(self.plan, self.kernel(), self.input_size, self.target, self.gpu).module
        return self._module


def _restored(entry, key, plan, target, gpu, rebuild) -> Layer | None:
    """The layer of ``entry``; None (and the entry removed) where its files cannot be read or loaded."""
    info = entry.info
    try:
        source = entry.file(SOURCE).read_text() if entry.file(SOURCE).exists() else None
        report, metadata = CompileReport.from_dict(info["report"]), info["metadata"]
        if _runnable(target, gpu):
            loaded = _loaded(entry)
            signature, module, library = loaded.signature, loaded.module, entry.file(LIBRARY)
        else:
            signature, module, library = Signature.from_dict(info["signature"]), None, None
    except (OSError, KeyError, TypeError, ValueError, LoadError) as err:
        log.warning("layer cache: the entry %s cannot be used (%s); building the layer", entry.folder, err)
        _store().remove(entry)  # (done already for a library that does not load)
        return None
    layer = Layer.restored(plan, signature, module, report, source, target, gpu, library, metadata, rebuild)
    layer.cache_key = key
    return layer


def _loaded(entry):
    """The entry's library, loaded (a damaged or vanished one is removed, and LoadError raised)."""
    try:
        return load(entry.file(LIBRARY))
    except LoadError:
        _store().remove(entry)
        raise


def _runnable(target, gpu) -> bool:
    """Whether a library of ``target`` loads and runs here: the CPU build, or CUDA on a local GPU of its arch."""
    if gpu is None:
        return True
    dev = local_gpu()
    return dev is not None and f"sm_{dev.compute_version.replace('.', '')}" == gpu.arch


def _get(key):
    """``Store.get``, or None (with a warning) where the cache cannot be read."""
    if key is None:
        return None
    try:
        return _store().get(key)
    except OSError as err:
        log.warning("layer cache: cannot read it (%s); compiling", err)
        return None


def _put(key, info, write):
    """``Store.put``, or None (with a warning, once per reason) where the entry cannot be written."""
    try:
        return _store().put(key, info, write)
    except (ExportError, OSError) as err:
        reason = str(err).splitlines()[0]
        if reason not in _WARNED:
            _WARNED.add(reason)
            log.warning("layer cache: cannot store a compiled layer (%s); compiling without the cache", reason)
        return None


_WARNED: set = set()


def _store() -> Store:
    s = settings()
    return Store(s.folder, s.max_bytes)

"""``compile_cell``: cell definition in, runnable (or inspectable) layer out."""

from __future__ import annotations

import logging

import tvm

from . import ptxas
from .analysis import analyze
from .build import build_module
from .cell import Cell
from .errors import ConfigError
from .layer import Layer
from .registry import resolve
from .report import CompileReport
from .schedules import TEMPLATES
from .target import GpuSpec, gpu_spec

log = logging.getLogger(__name__)

SUPPORTED_DTYPES = ("float32",)


def compile_cell(cell: str | Cell, hidden: int, batch: int, *, input_size: int | None = None,
                 seq_len: int | None = None, dtype: str = "float32", target: str = "cuda",
                 arch: str | None = None, config=None) -> Layer:
    """Compile a recurrent cell into a layer: input projection + recurrent kernel.

    Parameters
    ----------
    cell : str or Cell
        A built-in name (``"lstm"``), a ``path/to/cell.py`` defining ``CELL``, or a Cell.
    hidden, batch : int
        Hidden size and batch size; the kernel is specialized for both.
    input_size : int, optional
        Features per timestep of ``x`` (default: ``hidden``).
    seq_len : int, optional
        The sequence length the layer is meant for (recorded in the report and used to
        pick tuning records); the kernel itself accepts any length.
    dtype : str
        ``"float32"``.
    target : str
        ``"cuda"`` for the persistent GPU kernel, ``"llvm"`` (or ``"cpu"``) for the CPU
        reference build.
    arch : str or GpuSpec, optional
        CUDA architecture (``"sm_90"``), or a full GpuSpec; defaults to the local GPU's.
        Without a GPU the layer holds CUDA source only: it can be inspected, not run.
    config : PersistentConfig, optional
        Schedule knobs; default: derived from the target.

    Use ``layer.report.format()`` to see the grid, registers and spills.
    """
    cell = resolve(cell)
    for name, value in (("hidden", hidden), ("batch", batch), ("input_size", input_size), ("seq_len", seq_len)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    input_size = input_size or hidden
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(f"dtype {dtype} is not supported yet; supported: {', '.join(SUPPORTED_DTYPES)}")
    tgt, gpu = _target(target, arch)
    plan = analyze(cell, batch, hidden, dtype)
    # First template that accepts the target wins. An untuned build walks its ranked default
    # configs until ptxas reports no spills (the register estimate is a model; ptxas decides).
    for template in TEMPLATES:
        candidates = [config] if config is not None else (template.default_configs(plan, tgt, gpu) or [None])
        kernel = template.apply(plan, tgt, gpu, candidates[0])
        if kernel is not None:
            break
    else:
        raise ConfigError(f"no schedule template accepts target {tgt}")
    for attempt, cfg in enumerate(candidates):
        if attempt:
            kernel = template.apply(plan, tgt, gpu, cfg)
        module, source, report = build_module(plan, kernel, input_size, tgt, gpu)
        note = ""
        if source is not None and report is None:
            try:
                _, report = ptxas.compile_cuda(source, gpu.arch)
            except ptxas.NvccNotFound as err:
                note = str(err).splitlines()[0]
                log.warning("no ptxas report: %s", note)
        spills = report.function("recurrent").spills if report is not None else 0
        if not spills or attempt == len(candidates) - 1:
            break
        log.info("%s: config %s spills %d B; trying the next default", cell.name, cfg, spills)
    rep = _report(cell, plan, kernel, input_size, seq_len, tgt, gpu, config is not None, report, note)
    log.info("compiled %s: %s", cell.name, rep.format().replace("\n", "; "))
    return Layer(plan, kernel, module, input_size, tgt, gpu, rep, source)


def _target(target, arch):
    if isinstance(target, tvm.target.Target):
        kind = target.kind.name
        arch = arch or str(target.attrs.get("arch", "")) or None
    else:
        kind = {"cpu": "llvm"}.get(str(target), str(target))
    if kind == "llvm":
        return tvm.target.Target("llvm"), None
    if kind == "cuda":
        gpu = arch if isinstance(arch, GpuSpec) else gpu_spec(arch)
        return gpu.target(), gpu
    raise ConfigError(f"unknown target '{target}'; use 'cuda' or 'llvm'")


def _report(cell, plan, kernel, input_size, seq_len, tgt, gpu, user_config, ptx, note) -> CompileReport:
    fn = ptx.function("recurrent") if ptx is not None else None
    launch = kernel.launch
    return CompileReport(
        cell=cell.name, fingerprint=plan.fingerprint(), batch=plan.batch, hidden=plan.hidden,
        input_size=input_size, seq_len=seq_len, dtype=plan.dtype,
        target=f"cuda {gpu.arch}" if gpu else "llvm (CPU reference)", template=kernel.template,
        config=kernel.config.as_dict() if kernel.config is not None else {},
        config_origin="user" if user_config else ("default" if kernel.config is not None else "none"),
        ctas=launch.get("ctas"), threads=launch.get("threads"), dynamic_smem_bytes=launch.get("smem_bytes"),
        registers=fn.registers if fn else None, stack_bytes=fn.stack_bytes if fn else None,
        spill_store_bytes=fn.spill_store_bytes if fn else None, spill_load_bytes=fn.spill_load_bytes if fn else None,
        static_smem_bytes=fn.static_smem_bytes if fn else None, ptxas_note=note,
    )

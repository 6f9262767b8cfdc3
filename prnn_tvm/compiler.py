"""``compile_cell``: cell definition in, runnable (or inspectable) layer out."""

from __future__ import annotations

import logging
from pathlib import Path

import tvm

from . import records
from .codegen import ptxas
from .codegen.build import build_module
from .errors import ConfigError
from .frontend.analysis import analyze
from .frontend.cell import Cell
from .frontend.registry import resolve
from .report import CompileReport
from .runtime.layer import Layer
from .schedules import TEMPLATES
from .target import GpuSpec, gpu_spec

log = logging.getLogger(__name__)

SUPPORTED_DTYPES = ("float32",)


def compile_cell(cell: str | Cell, hidden: int, batch: int, *, input_size: int | None = None,
                 seq_len: int | None = None, dtype: str = "float32", target: str = "cuda",
                 arch: str | None = None, config=None, tuning_logs=None) -> Layer:
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
        Schedule knobs. Default: the best tuning record for this cell, shapes and GPU in
        ``tuning_logs`` (see ``prnn-tvm tune``), else the default derived from the target.
    tuning_logs : path or list of paths, optional
        Tuning logs to look in (default: the package's ``tuning_logs/<arch>.jsonl``);
        ``[]`` ignores tuning records.

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
    origin = "user" if config is not None else ("default" if kernel.config is not None else "none")
    if config is None and kernel.config is not None:
        tuned, origin = _tuned_config(plan, template, gpu, tuning_logs)
        try:
            if tuned is not None:
                kernel = template.apply(plan, tgt, gpu, tuned)
                candidates = [tuned, *candidates]  # the defaults stay behind it, should it spill here
        except ConfigError as err:
            log.warning("ignoring the tuned config %s: %s", tuned, err)
            origin = "default: the tuned config does not fit this GPU"
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
        if attempt == 0 and origin.startswith("tuned"):
            origin = f"default: the tuned config spills {spills} B here"
    rep = _report(cell, plan, kernel, input_size, seq_len, tgt, gpu, origin, report, note)
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


def _tuned_config(plan, template, gpu, logs):
    """(the best recorded config of this key, where it came from) or (None, why the default is used)."""
    if logs is None:
        logs = [records.default_log(gpu.arch)]
    elif isinstance(logs, (str, Path)):
        logs = [logs]
    if not logs:
        return None, "default: tuning records not consulted"
    key = records.key_for(plan, gpu, template.NAME)
    found = [r for path in logs for r in records.load(path)]
    best = records.best(found, key)
    if best is None:
        where = ", ".join(Path(p).name for p in logs)
        return None, f"default: no tuning record for this cell, shapes and GPU in {where}"
    try:
        cfg = template.config_from_dict(best.config)
    except (ConfigError, TypeError) as err:
        log.warning("ignoring the tuned config %s: %s", best.config, err)
        return None, "default: the tuned record's config is not one of this template's"
    log.info("using the tuned config of %s (%.2f us/step)", key.describe(), best.per_step_s * 1e6)
    return cfg, f"tuned: {best.per_step_s * 1e6:.2f} us/step measured on {best.device or key.arch}"


def _report(cell, plan, kernel, input_size, seq_len, tgt, gpu, origin, ptx, note) -> CompileReport:
    fn = ptx.function("recurrent") if ptx is not None else None
    launch = kernel.launch
    return CompileReport(
        cell=cell.name, fingerprint=plan.fingerprint(), batch=plan.batch, hidden=plan.hidden,
        input_size=input_size, seq_len=seq_len, dtype=plan.dtype,
        target=f"cuda {gpu.arch}" if gpu else "llvm (CPU reference)", template=kernel.template,
        config=kernel.config.as_dict() if kernel.config is not None else {},
        config_origin=origin,
        ctas=launch.get("ctas"), threads=launch.get("threads"), dynamic_smem_bytes=launch.get("smem_bytes"),
        registers=fn.registers if fn else None, stack_bytes=fn.stack_bytes if fn else None,
        spill_store_bytes=fn.spill_store_bytes if fn else None, spill_load_bytes=fn.spill_load_bytes if fn else None,
        static_smem_bytes=fn.static_smem_bytes if fn else None, ptxas_note=note,
    )

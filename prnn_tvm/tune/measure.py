"""Measuring configs: a builder (parallel processes) and runners (the GPU, or the CPU for tests).

``Builder.build`` compiles a batch of configs, each in a worker process when
``workers > 1`` (nvcc takes most of a build), and returns one :class:`Built` per config:
the compiled layer exported (:func:`prnn_tvm.export`, when the runner needs a library) and
ptxas's report, or the error that stopped it. ``GpuRunner.run`` loads it (:func:`prnn_tvm.load`), checks the
layer's output against the cell's float64 reference (a wrong answer is an error, not a
time) and times the recurrent kernel. Every failure is returned as an
:class:`~prnn_tvm.records.ErrorKind`; nothing raised by one config escapes.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import functools
import logging
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

from prnn_tvm.checks import max_abs_error
from prnn_tvm.compiler import compile_cell
from prnn_tvm.dtypes import BOUND_MAGNITUDE, tolerance
from prnn_tvm.errors import BarrierTimeout, LaunchError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.records import ErrorKind
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.report import CompileReport
from prnn_tvm.runtime import exporting
from prnn_tvm.runtime.loading import load
from prnn_tvm.target import GpuSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneTask:
    """What is tuned: a cell (name or path, so worker processes can load it) at fixed shapes,
    with the schedule template of that name."""

    cell: str
    hidden: int
    batch: int
    seq_len: int
    dtype: str
    gpu: GpuSpec
    template: str

    @property
    def plan(self) -> CellPlan:
        return _plan(self.cell, self.batch, self.hidden, self.dtype)


@dataclass(frozen=True)
class Built:
    """A built config: its report and library, or why it failed."""

    index: int
    config: object  # the template's config
    report: CompileReport | None = None
    library: str | None = None
    error: ErrorKind | None = None
    detail: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class Measured:
    """A run of a built config: seconds per sequence for each repeat, or why there are none."""

    costs: tuple = ()
    max_abs_error: float | None = None
    error: ErrorKind | None = None
    detail: str = ""


class Builder:
    """Compiles configs of one task with nvcc; ``workers`` processes (0: in this process)."""

    def __init__(
        self, task: TuneTask, out_dir: str | Path, workers: int = 0, export: bool = True, max_spill_bytes: int = 0
    ):
        self.task, self.out_dir, self.export = task, Path(out_dir), export
        self.workers, self.max_spill_bytes = workers, max_spill_bytes

    def build(self, jobs: list[tuple[int, object]]) -> list[Built]:
        args = [(self.task, i, cfg, str(self.out_dir), self.export, self.max_spill_bytes) for i, cfg in jobs]
        if self.workers <= 1:
            return [_build(*a) for a in args]
        return list(_pool(self.workers).map(_build, *zip(*args)))


@functools.lru_cache(maxsize=1)
def _pool(workers: int) -> cf.ProcessPoolExecutor:
    """Build processes, started once per Python process (each imports TVM, which takes seconds).

    Spawned, not forked: a forked child of a process that holds a CUDA context is unusable.
    """
    pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    atexit.register(pool.shutdown, cancel_futures=True)
    return pool


class GpuRunner:
    """Runs built configs on the local GPU: check against the reference, then time.

    ``repeat`` timings of ``number`` launches each (after one warm-up launch), of the
    recurrent kernel on the task's sequence length.
    """

    needs_library = True

    def __init__(self, repeat: int = 5, number: int = 3, tolerance: float | None = None):
        self.repeat, self.number = repeat, number
        self.tolerance = tolerance  # default: the dtype policy's bound at the task's sequence length
        self._task = None

    def setup(self, task: TuneTask) -> None:
        plan = task.plan
        self._task = task
        if self.tolerance is None:
            self.tolerance = tolerance(task.dtype, task.seq_len)
        inputs = random_inputs(plan, task.seq_len, plan.hidden, seed=0)
        self._expected = reference_layer(plan, inputs)
        # on the device once: each trial's check and timing then copy nothing
        self._inputs = {name: tvm.runtime.tensor(value, tvm.cuda(0)) for name, value in inputs.items()}

    def run(self, built: Built) -> Measured:
        plan = self._task.plan
        try:
            layer = load(built.library)
            out, finals = layer(**self._inputs)
            layer.check()  # device tensors: the call did not wait; a timed-out launch is a timeout, not wrong
            err = max_abs_error(plan, (out.numpy(), [f.numpy() for f in finals]), self._expected, BOUND_MAGNITUDE)
            if not err <= self.tolerance:  # also catches NaN
                return Measured((), err, ErrorKind.WRONG, f"max abs error {err:.3g} > {self.tolerance:.1e}")
            costs = tuple(
                layer.time(number=self.number, repeat=1, **self._inputs)["recurrent"] for _ in range(self.repeat)
            )
            return Measured(costs, err)
        except BarrierTimeout as e:
            return Measured((), None, ErrorKind.TIMEOUT, str(e))
        except LaunchError as e:
            return Measured((), None, ErrorKind.LAUNCH, str(e))
        except Exception as e:  # noqa: BLE001 - one config's failure is a record, never the end of tuning
            return Measured((), None, ErrorKind.RUNTIME, f"{type(e).__name__}: {e}")

    def healthy(self) -> bool:
        """Whether the GPU still runs anything (an illegal access poisons the CUDA context for good)."""
        try:
            return float(tvm.runtime.tensor(np.ones(1, np.float32), tvm.cuda(0)).numpy()[0]) == 1.0
        except Exception:  # noqa: BLE001 - any failure here means the context is gone
            return False


class CpuRunner:
    """Runs the CPU reference build in place of each config (for tests of the tuning loop).

    The configs are built for real (nvcc, ptxas, spills); the time is the CPU build's,
    the same for every config, so it exercises the loop and the records, not the search.
    """

    needs_library = False

    def setup(self, task: TuneTask) -> None:
        self._layer = compile_cell(task.cell, task.hidden, task.batch, target="llvm")
        self._inputs = random_inputs(task.plan, task.seq_len, task.hidden, seed=0)
        self._expected = reference_layer(task.plan, self._inputs)

    def run(self, built: Built) -> Measured:
        start = time.perf_counter()
        result = self._layer(**self._inputs)
        seconds = time.perf_counter() - start
        return Measured((seconds,), max_abs_error(self._layer.plan, result, self._expected))

    def healthy(self) -> bool:
        return True


def _build(task: TuneTask, index: int, cfg, out_dir: str, export: bool, max_spill_bytes: int) -> Built:
    start = time.perf_counter()
    done = functools.partial(Built, index, cfg)
    try:
        layer = compile_cell(
            task.cell,
            task.hidden,
            task.batch,
            seq_len=task.seq_len,
            dtype=task.dtype,
            target="cuda",
            arch=task.gpu,
            config=cfg,
            cache=False,
        )  # a trial: not for the cache
    except Exception as e:  # noqa: BLE001 -- one config's failed build (TVM raises builtin types) is its record
        return done(error=ErrorKind.BUILD, detail=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - start)
    report = layer.report
    if report.template != task.template:
        return done(
            report,
            error=ErrorKind.BUILD,
            detail=f"built with template {report.template}, tuning {task.template}",
            seconds=time.perf_counter() - start,
        )
    if report.spill_bytes and report.spill_bytes > max_spill_bytes:
        return done(
            report,
            error=ErrorKind.SPILL,
            detail=f"ptxas spills {report.spill_bytes} bytes",
            seconds=time.perf_counter() - start,
        )
    library = None
    if export:
        library = str(exporting.export(layer, Path(out_dir, f"config{index}.so")))
    return done(report, library, seconds=time.perf_counter() - start)


@functools.lru_cache(maxsize=8)
def _plan(cell: str, batch: int, hidden: int, dtype: str) -> CellPlan:
    return analyze(resolve(cell), batch, hidden, dtype)

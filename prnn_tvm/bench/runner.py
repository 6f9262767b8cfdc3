"""A benchmark run on the local GPU: compile each case, measure it, keep going past failures.

:func:`run` returns one row per case (the CSV schema of :mod:`prnn_tvm.bench.table`),
with the environment in every row. A case that fails (compile error, mismatch with
cuDNN, launch failure, barrier timeout) becomes a row with ``status="error"`` and the
reason; the run never stops at one case.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import subprocess
import time
from collections.abc import Sequence

from ..compiler import compile_cell
from ..runtime.layer import Layer
from ..target import GpuSpec, gpu_spec, local_gpu
from .matrix import Case, build_cases
from .table import per_step_us, ratios

log = logging.getLogger(__name__)


def missing_requirements() -> str | None:
    """None when a measuring run can start here, else one line saying what is missing."""
    missing = [
        f"{what} ({hint})"
        for module, what, hint in (
            ("torch", "PyTorch", "pip install torch"),
            ("matplotlib", "matplotlib", "pip install matplotlib"),
        )
        if importlib.util.find_spec(module) is None
    ]
    if local_gpu() is None:
        missing.append("a CUDA GPU")
    elif not missing:
        import torch

        if not torch.cuda.is_available():
            missing.append(f"a CUDA build of PyTorch (this one is {torch.__version__})")
    return f"prnn-tvm bench cannot measure here: missing {' and '.join(missing)}" if missing else None


def environment(gpu: GpuSpec) -> dict:
    """The environment columns: GPU, driver and library versions."""
    import torch
    import tvm

    return {
        "gpu": gpu.device_name or torch.cuda.get_device_name(),
        "sms": gpu.sms,
        "arch": gpu.arch,
        "peak_fp32_tflops": round(gpu.peak_fp32_flops / 1e12, 2),
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "tvm": tvm.__version__,
        "torch": torch.__version__,
        "cudnn": str(torch.backends.cudnn.version()),
        "prnn_tvm": _version("prnn-tvm"),
    }


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class _Layers:
    """Compiled layers by case, kept until their case is measured (compile errors kept as results)."""

    def __init__(self):
        self._built: dict[tuple, tuple[Layer | Exception, float]] = {}

    def get(self, cell: str, dtype: str, hidden: int, batch: int, seq_len: int | None = None):
        key = (cell, dtype, hidden, batch)
        if key not in self._built:
            start = time.perf_counter()
            try:
                built = compile_cell(cell, hidden, batch, seq_len=seq_len, dtype=dtype, target="cuda")
            except Exception as err:  # noqa: BLE001 - a compile failure is that case's result
                # without its traceback, whose frame of this method would hold this cache in a reference cycle
                # (its compiled layers freed by whichever collection comes next: inside a CUDA graph capture, fatal)
                built = err.with_traceback(None)
            self._built[key] = built, time.perf_counter() - start
        return self._built[key]

    def take(self, case: Case):
        result = self.get(case.cell, case.dtype, case.hidden, case.batch, case.seq_len)
        del self._built[(case.cell, case.dtype, case.hidden, case.batch)]
        return result

    def compiles_clean(self, batches: Sequence[int], seq_len: int):
        """The spill check for :func:`~prnn_tvm.bench.matrix.largest_hidden`, building through this cache."""

        def check(cell: str, dtype: str, hidden: int) -> bool:
            for batch in sorted(batches, reverse=True):
                built, _ = self.get(cell, dtype, hidden, batch, seq_len)
                if isinstance(built, Layer) and built.report.spill_bytes:
                    return False
            return True

        return check


def run(
    cells: Sequence[str],
    hiddens: Sequence[int | str],
    batches: Sequence[int],
    seq_len: int,
    dtypes: Sequence[str],
    repeats: int = 5,
    number: int = 3,
    progress: bool = True,
    extra: Sequence[Case] = (),
) -> list[dict]:
    """Measure every case of the matrix on the local GPU; one row per case, in order.

    Parameters
    ----------
    cells, hiddens, batches, seq_len, dtypes
        The matrix (see :func:`~prnn_tvm.bench.matrix.build_cases`; ``"max"`` in
        ``hiddens`` is the largest size each cell supports here without spills).
    repeats, number
        Each implementation is timed ``repeats`` times over ``number`` back-to-back calls,
        after warm-up; the rows hold the median and the minimum.
    progress : bool
        Show a progress bar (tqdm) with the case being measured and the last result.
    extra : sequence of Case
        Cases measured after the matrix's, those it has already left out (the sizes where the weight tiers stop:
        ``prnn-tvm bench`` adds them with ``"max"``, :mod:`~prnn_tvm.bench.tiers`).
    """
    import torch
    from tqdm import tqdm

    from .measure import measure

    problem = missing_requirements()
    if problem:
        raise RuntimeError(problem)
    torch.backends.cudnn.allow_tf32 = False  # true fp32 on both sides of every comparison
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = gpu_spec()
    env = environment(gpu)
    layers, probes = _Layers(), {}
    log.info("planning the matrix on %s (largest hidden sizes are checked for spills by building)", gpu.arch)
    cases = build_cases(cells, hiddens, batches, seq_len, dtypes, gpu, layers.compiles_clean(batches, seq_len))
    cases += [case for case in dict.fromkeys(extra) if case not in cases]
    rows = []
    bar = tqdm(cases, desc="bench", unit="case", disable=not progress, dynamic_ncols=True)
    last = ""
    for case in bar:
        bar.set_postfix_str(case.label + (f" | last: {last}" if last else ""))
        row = {
            "cell": case.cell,
            "dtype": case.dtype,
            "hidden": case.hidden,
            "batch": case.batch,
            "seq_len": case.seq_len,
            **env,
        }
        try:
            layer, row["compile_s"] = layers.take(case)
            if isinstance(layer, Exception):
                raise layer
            rep = layer.report
            row.update(
                config=json.dumps(rep.config),
                config_origin=rep.config_detail,
                ctas=rep.ctas,
                threads=rep.threads,
                registers=rep.registers,
                spill_bytes=rep.spill_bytes,
            )
            row.update(measure(case, layer, gpu, repeats, number, probes))
            row["status"] = "ok"
            log.info("%s: %s", case.label, _summary(row))
            speedup = ratios(row)["cudnn_over_prnn"]
            last = f"{case.label} " + (f"{speedup:.1f}x cuDNN" if speedup is not None else "ok")
        except Exception as err:  # noqa: BLE001 - a failed case is a result; the run goes on
            row.update(status="error", error=f"{type(err).__name__}: {err}")
            log.warning("%s: %s", case.label, row["error"].splitlines()[0])
            last = f"{case.label} error"
            recover(torch)
            layer = None  # a re-raised compile error's traceback holds this frame: no cycle through it
        rows.append(row)
    return rows


def _summary(row: dict) -> str:
    """One line of per-step figures for the log (missing figures left out)."""
    parts = []
    for label, column in (
        ("ours", "prnn_layer_ms"),
        ("kernel", "prnn_kernel_ms"),
        ("cuDNN", "cudnn_ms"),
        ("graph", "graph_layer_ms"),
        ("floor", "floor_step_us"),
    ):
        us = per_step_us(row, column)
        if us is not None:
            parts.append(f"{label} {us:.2f}")
    return "us/step: " + ", ".join(parts)


def recover(torch) -> None:
    """After a failed case: wait for the GPU and free cached memory, so the next case starts clean."""
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001 - a broken context fails every later case, each as its own row
        log.error("GPU unusable after the failure: %s", err)

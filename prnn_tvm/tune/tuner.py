"""The tuning loop: space, search, builder, runner, records.

Each round the search proposes a batch of unmeasured configs, the builder compiles them
(in parallel), the runner checks and times each one on the GPU, and every outcome (a
time or an error kind) is appended to the log before the next round. Configs already
in the log for the same key are not measured again: a tuning run resumes where the
last one stopped, and the model starts from what the log knows.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from prnn_tvm import records
from prnn_tvm.errors import PrnnError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.records import Record, TuneKey, key_for
from prnn_tvm.schedules import template_for
from prnn_tvm.target import GpuSpec, gpu_spec, local_gpu

from .measure import Builder, Built, GpuRunner, Measured, TuneTask
from .search import STRATEGIES, FirstThen
from .space import ConfigSpace

log = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """What a tuning run did: its new records, the best record of the key, where they went."""

    key: TuneKey
    log_path: Path
    space_size: int
    new: list[Record] = field(default_factory=list)
    best: Record | None = None
    default: Record | None = None  # the untuned config's record, when it was measured
    seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.new)


def tune(
    cell: str,
    hidden: int,
    batch: int,
    *,
    seq_len: int = 256,
    dtype: str = "float32",
    arch: str | None = None,
    trials: int = 64,
    batch_size: int = 16,
    strategy: str = "xgb",
    log_path: str | Path | None = None,
    runner=None,
    workers: int = 0,
    max_spill_bytes: int = 0,
    seed: int = 0,
    progress: bool = True,
    first=(),
    remeasure: bool = False,
) -> TuneResult:
    """Tune the kernel of ``cell`` at (hidden, batch) and append the trials to a log.

    The template is the one ``compile_cell`` picks for this cell, dtype and GPU; its knobs
    and space come from it (``prnn_tvm.schedules.template.Template``).

    Parameters
    ----------
    cell : str
        A built-in cell name or ``path/to/cell.py`` (worker processes load it by that).
    trials : int
        New configs to measure (fewer when the valid space runs out).
    strategy : str
        ``"xgb"`` (cost-model search), ``"random"`` or ``"grid"`` (every config in order).
    log_path : path, optional
        Where records are appended; default the user's log (:func:`prnn_tvm.records.user_log`:
        ``$XDG_DATA_HOME/prnn-tvm/tuning_logs/<arch>.jsonl``), which compiles read after the shipped one. The
        shipped logs in the package are never written.
    runner : optional
        Default: a :class:`~prnn_tvm.tune.measure.GpuRunner` on the local GPU (tuning
        needs one; without it this raises ``PrnnError``).
    workers : int
        Build processes (0 builds in this process). They are spawned, so a script that
        calls ``tune`` with workers needs the ``if __name__ == "__main__":`` guard.
    first : configs (or their dicts)
        Measured before the search proposes any, in this order: those in the space and not in the log yet
        (they count as trials). ``bench/tune_knob.py`` passes the best records with a new knob set.
    remeasure : bool
        Measure the ``first`` configs even where the log has them (after a change to the generated code: a
        config's best is the fastest of its records, so an old record stays the figure until one beats it).

    Use ``compile_cell`` afterwards: it picks the best record of the same key itself.
    """
    if strategy not in STRATEGIES:
        raise PrnnError(f"search strategy '{strategy}' unknown; use one of {', '.join(STRATEGIES)}")
    if runner is None:
        if local_gpu() is None:
            raise PrnnError(
                "tuning measures kernels on a GPU and there is none here; run it on the machine "
                "with the GPU (records then ship in tuning_logs/ for every machine of that GPU)"
            )
        runner = GpuRunner()
    start = time.perf_counter()
    gpu = gpu_spec(arch)
    plan = analyze(resolve(cell), batch, hidden, dtype)
    template = template_for(plan, gpu.target())
    if template.config_type is None:
        raise PrnnError(f"the {template.name} template has no knobs to tune")
    space = ConfigSpace(plan, gpu, template)
    key = key_for(plan, gpu, template.name)
    log_path = Path(log_path) if log_path is not None else records.user_log(gpu.arch)
    result = TuneResult(key, log_path, len(space))
    measured = known_times(space, records.for_key(records.load(log_path), key))
    firsts = list(dict.fromkeys(i for c in first if (i := space.index(c)) is not None))
    if remeasure:
        measured = {i: t for i, t in measured.items() if i not in firsts}
    log.info(
        "tuning %s: %d valid configs (%d pruned), %d already in %s",
        cell,
        len(space),
        space.rejected,
        len(measured),
        log_path,
    )
    task = TuneTask(cell, hidden, batch, seq_len, dtype, gpu, template.name)
    runner.setup(task)
    budget = min(trials, len(space) - len(measured))
    with tempfile.TemporaryDirectory(prefix="prnn_tvm_tune_") as tmp:
        builder = Builder(task, tmp, workers, export=runner.needs_library, max_spill_bytes=max_spill_bytes)

        def measure(indices: list[int]) -> list[Record]:
            batch_records = []
            for built in builder.build([(i, space.configs[i]) for i in indices]):
                rep = built.report
                space.record_ptxas(built.index, rep and rep.registers, rep and rep.spill_bytes)
                batch_records.append(_record(key, plan, task, built, runner, gpu))
            records.append(log_path, batch_records)  # each round lands before the next starts
            result.new += batch_records
            if any(r.error == records.ErrorKind.RUNTIME for r in batch_records) and not runner.healthy():
                raise PrnnError(
                    f"the GPU stopped working during tuning (see the runtime errors in {log_path}); "
                    "the records so far are kept: restart to resume"
                )
            return batch_records

        search = STRATEGIES[strategy]()
        if firsts:
            search = FirstThen(firsts, search)
        search_loop(
            space,
            search,
            measure,
            budget,
            batch_size,
            np.random.default_rng(seed),
            measured,
            desc=f"tune {plan.cell.name}" if progress else None,
        )
    everything = records.for_key(records.load(log_path), key)
    result.best = records.best(everything, key)
    defaults = [space.configs[i].as_dict() for i in space.defaults()[:1]]
    result.default = next((r for r in everything if r.ok and r.config in defaults), None)
    result.seconds = time.perf_counter() - start
    return result


def search_loop(
    space: ConfigSpace,
    search,
    measure,
    budget: int,
    batch_size: int,
    rng: np.random.Generator,
    measured: dict | None = None,
    desc: str | None = None,
) -> dict[int, float]:
    """Propose, measure, repeat until ``budget`` new configs are measured; return index -> s/step.

    ``measure(indices)`` returns a :class:`Record` per index (failed ones count as
    trials, at infinite cost). ``measured`` holds what is known before the first round;
    ``desc`` shows a progress bar (trial n/N, the last and best time, errors so far).
    """
    measured = dict(measured or {})
    done, errors = 0, 0
    with tqdm(total=budget, desc=desc, unit="trial", disable=desc is None) as bar:
        while done < budget:
            proposed = search.propose(space, measured, min(batch_size, budget - done), rng)
            if not proposed:
                break
            for i, rec in zip(proposed, measure(proposed)):
                measured[i] = rec.per_step_s
                done, errors = done + 1, errors + (not rec.ok)
                bar.update()
                best = min(measured.values())
                bar.set_postfix_str(f"now {_us(rec)} best {best * 1e6:.2f} us/step errors {errors}")
    return measured


def _record(key: TuneKey, plan: CellPlan, task: TuneTask, built: Built, runner, gpu: GpuSpec) -> Record:
    rep = built.report
    m = runner.run(built) if built.error is None else Measured(error=built.error, detail=built.detail)
    return Record(
        key,
        built.config.as_dict(),
        m.costs,
        task.seq_len,
        m.error,
        m.detail,
        plan.cell.name,
        rep and rep.registers,
        rep and rep.spill_bytes,
        m.max_abs_error,
        round(built.seconds, 3),
        gpu.device_name,
    )


def with_knob(space: ConfigSpace, recs: list[Record], knob: str, values, top: int, bases=()) -> list[dict]:
    """The configs of the ``top`` fastest successfully measured configs of ``recs`` that stay in ``space`` with
    ``knob`` set to one of ``values``: each with every such value, fastest first (``tune(first=...)`` measures
    them before its search). Where ``recs`` has no successful record, ``bases`` (config dicts, in their order: a case
    without records seeds from the template's untuned defaults) stand for them."""
    seeds, seen, taken = [], set(), 0
    ordered = [r.config for r in sorted((r for r in recs if r.ok), key=lambda r: r.per_step_s)]
    for base in ordered or list(bases):
        if taken == top:
            break
        fresh = []  # a config measured twice, or two that the knob's value makes equal, is seeded once
        for config in ({**base, knob: v} for v in values):
            i = space.index(config)
            if i is not None and i not in seen:
                seen.add(i)
                fresh.append(config)
        if fresh:
            taken += 1
            seeds += fresh
    return seeds


def known_times(space: ConfigSpace, recs: list[Record]) -> dict[int, float]:
    """Per-step seconds (``inf`` if failed) of the configs of ``space`` that ``recs`` measured, best of repeats."""
    known: dict[int, float] = {}
    for r in recs:
        i = space.index(r.config)
        if i is not None:
            known[i] = min(known.get(i, math.inf), r.per_step_s)
    return known


def _us(rec: Record) -> str:
    return f"{rec.per_step_s * 1e6:.2f} us/step" if rec.ok else rec.error.value

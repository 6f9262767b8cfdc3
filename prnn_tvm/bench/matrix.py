"""Which cases a benchmark run measures: the default matrix, and the largest hidden size per cell.

The largest hidden size is not a table entry: it is the largest multiple of
``HIDDEN_STEP`` for which the cell's CUDA template has a valid config at every batch of the
run (its ranked defaults, which check registers, shared memory and co-residency before
building), and, when the caller supplies a compile check, whose build does not spill at
any of those batches.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import GPU_DTYPES, policy
from ..errors import ConfigError
from ..target import GpuSpec

if TYPE_CHECKING:
    from ..frontend.plan import CellPlan

log = logging.getLogger(__name__)

DEFAULT_CELLS = ("rnn_tanh", "lstm", "gru")
LARGEST = "max"  # in a list of hidden sizes: the largest this cell supports on the GPU
DEFAULT_HIDDEN = (256, 512, 1024, LARGEST)
DEFAULT_BATCHES = (1, 4, 8, 16, 64)
DEFAULT_SEQ_LEN = 256
DEFAULT_DTYPES = ("float32",)  # `--dtype float32 float16 bfloat16` adds the half-precision rows
HIDDEN_STEP = 128


@dataclass(frozen=True)
class Case:
    """One measured point: a cell at one dtype, hidden size, batch and sequence length."""

    cell: str
    hidden: int
    batch: int
    seq_len: int
    dtype: str = "float32"

    @property
    def label(self) -> str:
        return f"{self.cell} {self.dtype} H={self.hidden} B={self.batch}"

    @classmethod
    def parse(cls, spec: str, seq_len: int = DEFAULT_SEQ_LEN, dtype: str = "float32") -> Case:
        """A case written as the tuning and A/B scripts take it on their command lines, ``CELL:HIDDENxBATCH``
        (``lstm:1024x16``; a stack of a cell is ``lstm_x4:512x8``)."""
        found = _CASE.fullmatch(spec)
        if found is None:
            raise ValueError(f"a case is written CELL:HIDDENxBATCH (lstm:1024x16, lstm_x4:512x8), got {spec!r}")
        return cls(found["cell"], int(found["hidden"]), int(found["batch"]), seq_len, dtype)


_CASE = re.compile(r"(?P<cell>[^:\s]+):(?P<hidden>[1-9]\d*)x(?P<batch>[1-9]\d*)")


def config_fits(cell: str, hidden: int, batch: int, gpu: GpuSpec, dtype: str = "float32") -> bool:
    """Whether the cell's CUDA template has at least one valid config for this shape on ``gpu``."""
    from ..frontend.analysis import analyze  # the compiler when asked (the command line reads this module's
    from ..frontend.registry import resolve  # defaults for its help)
    from ..schedules import template_for

    target = gpu.target()
    try:
        plan = analyze(resolve(cell), batch, hidden, dtype)
        template_for(plan, target).default_configs(plan, target, gpu)
    except ConfigError:
        return False
    return True


def largest_hidden(
    cell: str,
    gpu: GpuSpec,
    batches: Sequence[int],
    dtype: str = "float32",
    step: int = HIDDEN_STEP,
    compiles_clean: Callable[[int], bool] | None = None,
) -> int:
    """The largest multiple of ``step`` that the compiler supports for ``cell`` at every batch.

    Parameters
    ----------
    cell, gpu, batches, dtype
        The cell, the GPU it is planned for, the batches of the run and the dtype.
    step : int
        Granularity of the search (128: the sizes cuDNN and users favour).
    compiles_clean : callable, optional
        ``compiles_clean(hidden) -> bool``: build at every batch and report whether ptxas
        spilled nowhere. A hidden size that spills is stepped down from. Without it only
        the config validation (a register model) decides.

    The search starts at the on-chip bound (every SM's registers and shared memory holding the
    recurrent weights: the weight tiers) and walks down.
    """
    if dtype not in GPU_DTYPES:
        raise ConfigError(f"dtype {dtype} has no GPU kernel: no largest hidden size")
    from ..frontend.analysis import analyze
    from ..frontend.registry import resolve

    plan = analyze(resolve(cell), 1, step, dtype)
    rows = sum(r.slices for r in plan.reductions) or 1
    on_chip = gpu.sms * (4 * gpu.regs_per_sm + gpu.smem_per_sm)  # bytes
    bound = int(math.sqrt(on_chip / (rows * policy(dtype).itemsize))) // step * step
    for hidden in range(bound, 0, -step):
        if not all(config_fits(cell, hidden, b, gpu, dtype) for b in sorted(batches, reverse=True)):
            continue
        if compiles_clean is None or compiles_clean(hidden):
            log.info("%s: largest supported hidden size on %s is %d", cell, gpu.arch, hidden)
            return hidden
        log.info("%s: hidden %d has valid configs but spills; trying %d", cell, hidden, hidden - step)
    raise ConfigError(f"no hidden size (multiple of {step}) fits cell '{cell}' on {gpu.arch}")


def build_cases(
    cells: Sequence[str],
    hiddens: Sequence[int | str],
    batches: Sequence[int],
    seq_len: int,
    dtypes: Sequence[str],
    gpu: GpuSpec,
    compiles_clean: Callable[[str, str, int], bool] | None = None,
) -> list[Case]:
    """The cases of a run, in cell, dtype, hidden, batch order.

    ``hiddens`` may contain :data:`LARGEST`, resolved per cell with :func:`largest_hidden`
    (``compiles_clean(cell, dtype, hidden)`` is its optional spill check). A dtype the
    compiler does not support has no largest size: only its explicit sizes are listed (each
    will be recorded as an error row by the run).
    """
    cases = []
    for cell, dtype in itertools.product(cells, dtypes):
        sizes = []
        for h in hiddens:
            if h != LARGEST:
                sizes.append(int(h))
            elif dtype in GPU_DTYPES:
                check = (lambda hid, c=cell, d=dtype: compiles_clean(c, d, hid)) if compiles_clean else None
                sizes.append(largest_hidden(cell, gpu, batches, dtype, compiles_clean=check))
            else:
                log.warning("%s %s: not supported by the compiler yet; no largest hidden size", cell, dtype)
        for hidden, batch in itertools.product(dict.fromkeys(sizes), batches):
            cases.append(Case(cell, hidden, batch, seq_len, dtype))
    return cases


def flops(plan: CellPlan, input_size: int, seq_len: int) -> tuple[float, float]:
    """(whole layer, recurrent part) FLOPs of one sequence: 2*B*G*H*(I + H)*T for a G-gate cell.

    Counted from the plan, so any cell works: the input projection is
    2*B*I*(slices*H) per step, each recurrent product 2*B*H*(slices*H) per step.
    """
    B, H = plan.batch, plan.hidden
    recurrent = sum(2 * B * H * r.slices * H for r in plan.reductions) * seq_len
    projection = 2 * B * input_size * plan.input.slices * H * seq_len
    return float(projection + recurrent), float(recurrent)

"""Replaying a search on a space whose every config was already measured.

With the time of every valid config known (a ``--search grid`` run, or a synthetic cost
in tests), a search strategy can be replayed offline at any budget and seed: the
measure step looks the time up instead of running the GPU. This is how the tuner is
compared with random search, and how a change to the model or the search is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prnn_tvm.records import ErrorKind, Record, TuneKey

from .space import ConfigSpace
from .tuner import search_loop

_KEY = TuneKey("replay", 0, 0, "", "", 0, "", "")


@dataclass(frozen=True)
class ReplayResult:
    """Per seed, the best time found after each budget, as a fraction of the space's best (1.0: found it)."""

    strategy: str
    budgets: tuple
    fractions: np.ndarray  # (seeds, budgets): best possible / best found

    def mean(self) -> np.ndarray:
        return self.fractions.mean(axis=0)

    def hit_rate(self, at_least: float = 0.95) -> np.ndarray:
        """Share of seeds whose best reached ``at_least`` of the optimum, per budget."""
        return (self.fractions >= at_least).mean(axis=0)


def replay(
    space: ConfigSpace,
    per_step: dict[int, float],
    make_search,
    budgets=(16, 32, 64),
    seeds=range(10),
    batch_size: int = 16,
) -> ReplayResult:
    """Run ``make_search()`` against known per-step times (index -> seconds, ``inf`` = failed)."""
    optimum = min(per_step.values())
    budgets = tuple(budgets)
    rows = []
    for seed in seeds:
        order = []  # the measurement order, to read the best after each budget

        def measure(indices, order=order):
            order.extend(indices)
            return [_record(space, i, per_step[i]) for i in indices]

        search_loop(space, make_search(), measure, max(budgets), batch_size, np.random.default_rng(seed))
        found = np.minimum.accumulate([per_step[i] for i in order])
        rows.append([optimum / found[min(b, len(found)) - 1] for b in budgets])
    return ReplayResult(make_search().name, budgets, np.asarray(rows))


def _record(space: ConfigSpace, index: int, seconds: float) -> Record:
    cfg = space.configs[index].as_dict()
    if math.isfinite(seconds):
        return Record(_KEY, cfg, (seconds,), seq_len=1)
    return Record(_KEY, cfg, error=ErrorKind.RUNTIME, seq_len=1)

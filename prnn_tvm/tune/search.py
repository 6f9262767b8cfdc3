"""Search strategies: which unmeasured configs of a space to measure next.

Each strategy's ``propose(space, measured, n, rng)`` returns up to ``n`` indices not in
``measured`` (index -> seconds per step, ``math.inf`` for a failed trial).

``ModelSearch`` is the tuner: refit the XGBoost cost model on every trial so far, score
the whole valid space with it and take the best-predicted unmeasured configs, with a
fraction of random picks for exploration. Scoring every config replaces AutoTVM's
simulated annealing over the model: after ``validate`` prunes it the space holds at most
a few thousand configs (183 for an LSTM at hidden 1024, batch 4 on an H100; 1515 at
hidden 512, batch 16), which the model scores in milliseconds, so annealing could only
approximate the same argmax. The first batch, before there is anything to learn from,
is the template's default configs then random ones.
"""

from __future__ import annotations

import math

import numpy as np

from .model import XGBoostCostModel
from .space import ConfigSpace


class GridSearch:
    """Every config in space order: for measuring a small space exhaustively."""

    name = "grid"

    def propose(self, space: ConfigSpace, measured: dict, n: int, rng: np.random.Generator) -> list[int]:
        return [i for i in range(len(space)) if i not in measured][:n]


class RandomSearch:
    """Uniformly random unmeasured configs: the baseline the model must beat."""

    name = "random"

    def propose(self, space: ConfigSpace, measured: dict, n: int, rng: np.random.Generator) -> list[int]:
        return _random(space, measured, n, rng, ())


class ModelSearch:
    """Cost-model guided search (see the module docstring)."""

    name = "xgb"

    def __init__(self, model: XGBoostCostModel | None = None, explore: float = 0.2):
        self.model = model or XGBoostCostModel()
        self.explore = explore

    def propose(self, space: ConfigSpace, measured: dict, n: int, rng: np.random.Generator) -> list[int]:
        done = np.fromiter(measured, dtype=np.int64, count=len(measured))
        self.model.fit(space.features[done], np.array([measured[i] for i in done]))
        if not self.model.fitted:
            first = [i for i in space.defaults() if i not in measured][:n]
            return first + _random(space, measured, n - len(first), rng, first)
        score = self.model.predict(space.features)
        score[done] = math.inf
        n_model = n - int(round(self.explore * n))
        chosen = [int(i) for i in np.argsort(score, kind="stable")[:n_model] if np.isfinite(score[i])]
        return chosen + _random(space, measured, n - len(chosen), rng, chosen)


STRATEGIES = {s.name: s for s in (ModelSearch, RandomSearch, GridSearch)}


class FirstThen:
    """The given indices first, in their order (those not measured yet), then what ``then`` proposes: how a
    tuning run measures chosen configs (the best records with a new knob set, say) before its search."""

    def __init__(self, first, then):
        self.first, self.then, self.name = list(first), then, then.name

    def propose(self, space: ConfigSpace, measured: dict, n: int, rng: np.random.Generator) -> list[int]:
        chosen = [i for i in self.first if i not in measured][:n]
        self.first = [i for i in self.first if i not in measured and i not in chosen]
        if len(chosen) < n:
            chosen += [i for i in self.then.propose(space, measured, n - len(chosen), rng) if i not in chosen]
        return chosen


def _random(space: ConfigSpace, measured: dict, n: int, rng: np.random.Generator, taken) -> list[int]:
    left = np.array([i for i in range(len(space)) if i not in measured and i not in taken], dtype=np.int64)
    if n <= 0 or not len(left):
        return []
    return [int(i) for i in rng.choice(left, size=min(n, len(left)), replace=False)]

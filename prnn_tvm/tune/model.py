"""XGBoost cost model: learns per-step time from the features of measured configs.

Two objectives, chosen by ``objective``:

- ``"rank"`` (default): pairwise ranking (``rank:pairwise``) on log-time. Only the order
  of configs matters to the search, and a ranking loss spends no capacity on the absolute
  scale, which shifts between shapes and GPUs.
- ``"regression"``: squared error on log-time.

Failed trials (spills, wrong answers, ...) train as twice the slowest time measured so
far: the search learns to avoid their region without their absent time dominating the fit.

xgboost is an optional dependency (the ``tune`` extra: only this model needs it, and it brings scipy and NCCL);
the model imports it when made, and says how to install it where it is missing.
"""

from __future__ import annotations

import numpy as np

from ..errors import PrnnError

OBJECTIVES = {"rank": "rank:pairwise", "regression": "reg:squarederror"}


class XGBoostCostModel:
    """Fit on (features, seconds) of measured configs; ``predict`` scores any configs, lower is faster."""

    def __init__(self, objective: str = "rank", rounds: int = 60, seed: int = 0):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective '{objective}' unknown; use one of {', '.join(OBJECTIVES)}")
        self.objective, self.rounds, self.seed = objective, rounds, seed
        self._xgb = xgboost()
        self._booster = None

    @property
    def fitted(self) -> bool:
        return self._booster is not None

    def fit(self, features: np.ndarray, seconds: np.ndarray) -> None:
        """Train from scratch on every trial so far (``math.inf`` marks a failed one)."""
        seconds = np.asarray(seconds, dtype=np.float64)
        ok = np.isfinite(seconds)
        if ok.sum() < 2:  # nothing to learn an order from yet
            return
        y = np.log(np.where(ok, seconds, 2 * seconds[ok].max()))
        params = {
            "objective": OBJECTIVES[self.objective],
            "eta": 0.3,
            "max_depth": 4,
            "min_child_weight": 1,
            "subsample": 1.0,
            "seed": self.seed,
            "nthread": 1,
            "verbosity": 0,
        }
        # ranking: larger label = better, so rank on negated log-time
        xgb = self._xgb
        data = xgb.DMatrix(np.asarray(features, dtype=np.float64), label=-y if self.objective == "rank" else y)
        self._booster = xgb.train(params, data, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """A score per row: lower means predicted faster (log-seconds for regression)."""
        if self._booster is None:
            raise RuntimeError("the cost model has not been fitted")
        score = self._booster.predict(self._xgb.DMatrix(np.asarray(features, dtype=np.float64)))
        return -score if self.objective == "rank" else score


def xgboost():
    """The xgboost module; PrnnError saying how to install it where it is missing."""
    try:
        import xgboost as xgb
    except ImportError:
        raise PrnnError(
            "the xgb search's cost model needs xgboost, which prnn-tvm installs with its tune extra: "
            "pip install 'prnn-tvm[tune]' (from the repository: pip install -e '.[tune]'); or tune "
            "without a model: prnn-tvm tune --search random (or grid)"
        ) from None
    return xgb

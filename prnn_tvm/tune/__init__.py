"""Auto-tuning of a schedule template's knobs (AutoTVM's design, through the template contract).

Four roles, one module each: the config ``space`` (knobs, pruning, features), the XGBoost
cost ``model``, the ``search`` that proposes what to measure, and ``measure`` (parallel
builder, GPU runner); ``tuner`` composes them, and ``prnn_tvm.records`` keeps every trial.
"""

from prnn_tvm.records import ErrorKind, Record, TuneKey, best, default_log, key_for, load

from .tuner import TuneResult, tune

__all__ = ["tune", "TuneResult", "Record", "TuneKey", "ErrorKind", "best", "default_log", "key_for", "load"]

"""Which config a compile builds: the caller's, the best tuning record's, or the template's default.

The order, for a template with knobs:

1. a config the caller passed (a config object or its dict) is built as it is;
2. else the best record of this cell's math, shapes, dtype, GPU and template in the tuning
   logs, if it fits this GPU; a float16 layer without one takes the bfloat16 layer's record and
   the other way round (``SHARED_RECORDS``);
3. else, or when the tuned config spills here, the template's ranked defaults: the first
   whose build ptxas reports without spills (the register estimate that ranks them is a
   model; ptxas decides). The last one is kept even if it spills, and the report says so.

Each step is recorded in the :class:`ConfigChoice` the report carries: its
:class:`ConfigOrigin`, why (the record's time, or why no record was used) and the spill
bytes of every candidate passed over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from . import records
from .errors import ConfigError
from .report import ConfigOrigin
from .schedules import as_config

log = logging.getLogger(__name__)

# Dtypes whose kernels are the same but for the type of their mma operands, so a config measured
# for one ranks the same for the other: the tensor-core template's float16 and bfloat16 layers
# (H100, same config: bfloat16 kernels take 0.98-1.08x the time of float16 ones over the
# benchmark's 36 LSTM and GRU shapes).
SHARED_RECORDS = {"float16": "bfloat16", "bfloat16": "float16"}


@dataclass(frozen=True)
class ConfigChoice:
    """A config and where it came from.

    ``reason`` says why: the tuned record's time and device, or why the default was used;
    ``passed_over`` holds the spill bytes of each candidate built before this one and dropped.
    """

    config: object | None
    origin: ConfigOrigin
    reason: str = ""
    passed_over: tuple = ()

    def describe(self) -> str:
        """``tuned: 2.81 us/step measured on ...``, ``default: no tuning record ...``, ``user``."""
        text = self.origin.value + (f": {self.reason}" if self.reason else "")
        if self.passed_over:
            spills = ", ".join(f"{b} B" for b in self.passed_over)
            text += f" (after {len(self.passed_over)} that spilled: {spills})"
        return text


def choose_and_build(plan, template, target, gpu, build, config=None, tuning_logs=None):
    """Pick the config (see the module docstring), build it with ``build(kernel)``; return
    ``(kernel, built, choice)``.

    ``build(kernel)`` compiles a kernel and returns something with ``spill_bytes`` (None or
    0 when ptxas reported none, or was not run).
    """
    if config is not None:
        cfg = as_config(template, config)
        kernel = template.apply(plan, target, gpu, cfg)
        return kernel, build(kernel), ConfigChoice(cfg, ConfigOrigin.USER)
    defaults = template.default_configs(plan, target, gpu)
    if not defaults:
        kernel = template.apply(plan, target, gpu)
        return kernel, build(kernel), ConfigChoice(None, ConfigOrigin.NONE)
    tuned, why_default = tuned_config(plan, template, gpu, tuning_logs)
    candidates = [ConfigChoice(cfg, ConfigOrigin.DEFAULT, why_default) for cfg in defaults]
    if tuned is not None:
        try:
            kernel = template.apply(plan, target, gpu, tuned.config)
        except ConfigError as err:
            log.warning("ignoring the tuned config %s: %s", tuned.config, err)
            candidates = [replace(c, reason="the tuned config does not fit this GPU") for c in candidates]
        else:
            built = build(kernel)
            if not built.spill_bytes:
                return kernel, built, tuned
            log.info("%s: the tuned config %s spills %d B; using the defaults", plan.cell.name, tuned.config,
                     built.spill_bytes)
            reason = f"the tuned config spills {built.spill_bytes} B here"
            candidates = [replace(c, reason=reason) for c in candidates]
    passed_over = []
    for i, choice in enumerate(candidates):
        kernel = template.apply(plan, target, gpu, choice.config)
        built = build(kernel)
        if not built.spill_bytes or i == len(candidates) - 1:
            return kernel, built, replace(choice, passed_over=tuple(passed_over))
        log.info("%s: default config %s spills %d B; trying the next one", plan.cell.name, choice.config,
                 built.spill_bytes)
        passed_over.append(built.spill_bytes)
    raise AssertionError("unreachable: the last candidate is always returned")


def tuned_config(plan, template, gpu, logs) -> tuple[ConfigChoice | None, str]:
    """(the best recorded config of this key as a choice, "") or (None, why the default is used)."""
    if logs is None:
        logs = [records.default_log(gpu.arch)]
    elif isinstance(logs, (str, Path)):
        logs = [logs]
    if not logs:
        return None, "tuning records not consulted"
    key = records.key_for(plan, gpu, template.name)
    found = [r for path in logs for r in records.load(path)]
    best, measured_for = records.best(found, key), ""
    if best is None and key.dtype in SHARED_RECORDS:
        best = records.best(found, replace(key, dtype=SHARED_RECORDS[key.dtype]))
        measured_for = f" for {SHARED_RECORDS[key.dtype]}" if best is not None else ""
    if best is None:
        where = ", ".join(Path(p).name for p in logs)
        other = records.unmatched(found, key)
        if other:
            log.info("%s: %s", plan.cell.name, other)
        return None, f"no tuning record for this cell, shapes and GPU in {where}" + (f" ({other})" if other else "")
    try:
        cfg = template.config_from_dict(best.config)
    except ConfigError as err:
        log.warning("ignoring the tuned config %s: %s", best.config, err)
        return None, "the tuned record's config is not one of this template's"
    log.info("using the tuned config of %s (%.2f us/step%s)", key.describe(), best.per_step_s * 1e6, measured_for)
    reason = f"{best.per_step_s * 1e6:.2f} us/step measured{measured_for} on {best.device or key.arch}"
    return ConfigChoice(cfg, ConfigOrigin.TUNED, reason), ""

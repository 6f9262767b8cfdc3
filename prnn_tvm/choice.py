"""Which template and config a compile builds: the caller's, the best tuning record's, or a template's default.

Every template that accepts the plan is considered (``schedules.templates_for``, in their order). The order:

1. a config the caller passed (a config object or its dict) is built as it is, by the first
   template whose config it is;
2. else the best records of this cell's math, shapes, dtype and GPU in the tuning logs, of any
   of those templates with knobs, fastest first, if they fit this GPU; a template without its
   own takes the records of the other dtypes of its record family
   (``prnn_tvm.dtypes.sharing_records``: float16 and bfloat16). Where the best config spills here
   (records outlive changes to the kernels, which can move ptxas's registers), the next fastest
   configs are tried, up to ``TUNED_CANDIDATES`` in all;
3. else, where no record of these shapes exists, the configs the templates carry over from the records of
   neighbouring hidden sizes (``prnn_tvm.neighbours``), up to ``TUNED_CANDIDATES``, each passed over like a
   tuned one; they are default choices, whose reason names the record;
4. else, or when none of those builds without spills, the templates' ranked defaults, the
   first template's first: the first whose build ptxas reports without spills (the register
   estimate that ranks them is a model; ptxas decides). The last one is kept even if it spills,
   and the report says so. Where no template has knobs, the first builds without a config.

A kernel whose grid, with ptxas's registers and shared memory, cannot be co-resident
(:func:`unlaunchable`) is never kept: a caller's config is refused, a tuned one falls back
to the defaults, a default is passed over (and none left is refused).

Each step is recorded in the :class:`ConfigChoice` the report carries: its
:class:`ConfigOrigin`, why (the record's time, or why no record was used) and the spill
bytes of every candidate passed over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from . import records
from .dtypes import sharing_records
from .errors import ConfigError
from .neighbours import carried_configs
from .report import ConfigOrigin
from .schedules import as_config
from .target import in_clusters, resident_ctas

log = logging.getLogger(__name__)

# Tuned configs a compile builds, fastest first, before it takes the defaults: each one that spills costs a build.
TUNED_CANDIDATES = 3


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
    template: object = None  # the template that builds it (``schedules.template.Template``)

    def describe(self) -> str:
        """``tuned: 2.81 us/step measured on ...``, ``default: no tuning record ...``, ``user``."""
        text = self.origin.value + (f": {self.reason}" if self.reason else "")
        if self.passed_over:
            spills = ", ".join(f"{b} B" for b in self.passed_over)
            text += f" (after {len(self.passed_over)} that spilled: {spills})"
        return text


def choose_and_build(plan, templates, target, gpu, build, config=None, tuning_logs=None):
    """Pick the template and config (see the module docstring) among ``templates`` (those that accept ``plan``,
    best first), build it with ``build(kernel)``; return ``(kernel, built, choice)``.

    ``build(kernel)`` compiles a kernel and returns something with ``spill_bytes`` (None or
    0 when ptxas reported none, or was not run).
    """
    if config is not None:
        template, cfg = _callers_config(templates, config)
        kernel = template.apply(plan, target, gpu, cfg)
        built = build(kernel)
        problem = unlaunchable(kernel, built, gpu)
        if problem:
            raise ConfigError(f"config {cfg} of cell '{plan.cell.name}': {problem}")
        return kernel, built, ConfigChoice(cfg, ConfigOrigin.USER, template=template)
    knobbed = [t for t in templates if t.config_type is not None]
    if not knobbed:  # no template with knobs: the first builds as it is
        return _as_it_is(plan, templates, target, gpu, build)
    tuned, why_default = tuned_configs(plan, knobbed, gpu, tuning_logs)
    failures = []  # why each faster tuned config was not kept
    for choice in tuned:
        try:
            kernel = choice.template.apply(plan, target, gpu, choice.config)
        except ConfigError as err:
            log.warning("ignoring the tuned config %s: %s", choice.config, err)
            failures.append("does not fit this GPU")
            continue
        built = build(kernel)
        problem = unlaunchable(kernel, built, gpu)
        if not built.spill_bytes and not problem:
            if failures:
                faster = "the faster one" if len(failures) == 1 else f"the {len(failures)} faster ones"
                choice = replace(choice, reason=f"{choice.reason}; {faster}: {', '.join(failures)}")
            return kernel, built, choice
        failures.append(f"{problem or f'spills {built.spill_bytes} B'} here")
        log.info("%s: the tuned config %s %s", plan.cell.name, choice.config, failures[-1])
    if failures:
        what = "tuned" if tuned[0].origin is ConfigOrigin.TUNED else "carried-over"
        why_default = (
            f"the {what} config {failures[0]}"
            if len(failures) == 1
            else f"the {len(failures)} fastest {what} configs: {', '.join(failures)}"
        )
    # ranked only here, where no tuned config was kept (ranking validates every config of the space)
    candidates = [
        ConfigChoice(cfg, ConfigOrigin.DEFAULT, why_default, template=t)
        for t in templates
        for cfg in t.default_configs(plan, target, gpu)
    ]
    if not candidates:  # no template with a default: the first builds as it is
        return _as_it_is(plan, templates, target, gpu, build)
    passed_over, unfit = [], 0
    for i, choice in enumerate(candidates):
        kernel = choice.template.apply(plan, target, gpu, choice.config)
        built = build(kernel)
        problem = unlaunchable(kernel, built, gpu)
        if problem:  # it could not run at all: the next, or a refusal
            log.info("%s: default config %s: %s; trying the next one", plan.cell.name, choice.config, problem)
            if i == len(candidates) - 1:
                raise ConfigError(
                    f"no default config of cell '{plan.cell.name}' can launch; the last, {choice.config}: {problem}"
                )
            unfit += 1
            continue
        if not built.spill_bytes or i == len(candidates) - 1:
            if unfit:
                choice = replace(
                    choice,
                    reason=f"{choice.reason}; {unfit} ranked before it cannot be co-resident with ptxas's registers",
                )
            return kernel, built, replace(choice, passed_over=tuple(passed_over))
        log.info(
            "%s: default config %s spills %d B; trying the next one", plan.cell.name, choice.config, built.spill_bytes
        )
        passed_over.append(built.spill_bytes)
    raise AssertionError("unreachable: the last candidate is returned or refused")


def _as_it_is(plan, templates, target, gpu, build) -> tuple:
    """The first template's kernel without a config, built (a template without knobs)."""
    kernel = templates[0].apply(plan, target, gpu)
    return kernel, build(kernel), ConfigChoice(None, ConfigOrigin.NONE, template=templates[0])


def _callers_config(templates, config) -> tuple:
    """``(template, config)``: the first of ``templates`` whose config ``config`` is (an object of its config type,
    or a dict of its knobs); the ConfigError of the only template, or every template's reason."""
    errors = []
    for template in templates:
        try:
            return template, as_config(template, config)
        except ConfigError as err:
            errors.append((template, err))
    if len(errors) == 1:
        raise errors[0][1]
    raise ConfigError(
        "no template that places this cell takes the config "
        + "; ".join(f"{template.name}: {err}" for template, err in errors)
    )


def unlaunchable(kernel, built, gpu) -> str:
    """Why ``kernel``'s cooperative grid cannot be co-resident on ``gpu`` with ptxas's registers and shared
    memory (the template validated its config with an estimate of them), or "" where it can, or where
    nothing says (no grid barrier, no ptxas report)."""
    fn = built.recurrent
    grid = fn and kernel.launch.grid
    if fn is None or grid is None or not grid.cooperative or gpu is None:
        return ""
    grid = replace(grid, registers=fn.registers, static_smem_bytes=fn.static_smem_bytes)  # as the runtime checks
    fit = resident_ctas(grid, gpu)
    if grid.ctas <= fit:
        return ""
    return (
        f"its grid of {grid.ctas} CTAs{in_clusters(grid)} cannot be co-resident on {gpu.arch}: ptxas gives "
        f"{fn.registers} registers per thread and {grid.smem_bytes} bytes of shared memory per CTA of "
        f"{grid.threads} threads, so {fit} fit ({gpu.sms} SMs); raise units_per_cta or lower the registers it needs"
    )


def _names(logs) -> str:
    """The logs a compile read, by file name (by path where two share a name); a missing one is left out,
    unless none exists."""
    shown = [Path(p) for p in logs if Path(p).is_file()] or [Path(p) for p in logs]
    names = [p.name for p in shown]
    return ", ".join(names if len(set(names)) == len(names) else map(str, shown))


def carried_choices(found, plan, templates, gpu, why: str) -> list[ConfigChoice]:
    """The configs ``templates`` carry over from the records of neighbouring hidden sizes (``neighbours``), as
    default choices saying so after ``why``, at most ``TUNED_CANDIDATES`` in all."""
    choices = []
    for template in templates:
        key = records.key_for(plan, gpu, template.name)
        for cfg, record, near in carried_configs(found, plan, template, gpu, key, TUNED_CANDIDATES - len(choices)):
            reason = (
                f"{why}; carried over from the record at hidden={near.hidden}{_dtype_note(near, key)} "
                f"({record.per_step_s * 1e6:.2f} us/step there)"
            )
            choices.append(ConfigChoice(cfg, ConfigOrigin.DEFAULT, reason, template=template))
    if choices:
        log.info("%s: no tuning record; %s", plan.cell.name, choices[0].reason.removeprefix(f"{why}; "))
    return choices


def _dtype_note(near, key) -> str:
    return f" in {near.dtype}" if near.dtype != key.dtype else ""


def tuned_configs(plan, templates, gpu, logs) -> tuple[list[ConfigChoice], str]:
    """(the fastest recorded configs of ``plan`` for any of ``templates`` as choices, best first, at most
    ``TUNED_CANDIDATES``, "") or (the configs carried over from neighbouring hidden sizes' records as default
    choices, best first, why the default is used)."""
    if logs is None:
        logs = records.default_logs(gpu.arch)
    elif isinstance(logs, (str, Path)):
        logs = [logs]
    if not logs:
        return [], "tuning records not consulted"
    found = records.load_all(logs)
    ranked, near, recorded = [], [], False  # (seconds per step, choice); why records of other keys do not serve
    for template in templates:
        key = records.key_for(plan, gpu, template.name)
        fastest, measured_for = records.ranked(found, key, TUNED_CANDIDATES), ""
        for other in sharing_records(key.dtype) if not fastest else ():
            fastest = records.ranked(found, replace(key, dtype=other), TUNED_CANDIDATES)
            if fastest:
                measured_for = f" for {other}"
                break
        if not fastest:
            near.append(records.unmatched(found, key))
            continue
        recorded = True
        for record in fastest:
            try:
                cfg = template.config_from_dict(record.config)
            except ConfigError as err:
                log.warning("ignoring the tuned config %s: %s", record.config, err)
                continue
            reason = f"{record.per_step_s * 1e6:.2f} us/step measured{measured_for} on {record.device or key.arch}"
            ranked.append((record.per_step_s, key, ConfigChoice(cfg, ConfigOrigin.TUNED, reason, template=template)))
    if not recorded:
        where = _names(logs)
        other = "; ".join(n for n in near if n)
        if other:
            log.info("%s: %s", plan.cell.name, other)
        why = f"no tuning record for this cell, shapes and GPU in {where}" + (f" ({other})" if other else "")
        return carried_choices(found, plan, templates, gpu, why), why
    if not ranked:
        return [], "the tuned record's config is not one of this template's"
    ranked.sort(key=lambda entry: entry[0])
    choices = [choice for _, _, choice in ranked[:TUNED_CANDIDATES]]
    log.info("using the tuned configs of %s (best %s)", ranked[0][1].describe(), choices[0].reason)
    return choices, ""

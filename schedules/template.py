"""The contract between a schedule template and everything that uses one.

The compiler, the config choice, the tuner, tuning records and the benchmark see a
template only through :class:`Template`; nothing outside ``schedules/`` imports a
particular template. They get them from :func:`prnn_tvm.schedules.templates_for` (every
template that accepts a plan and target, in order), :func:`prnn_tvm.schedules.template_for`
(the first of them) or :func:`prnn_tvm.schedules.by_name` (a tuning record's template).
``accepts`` answers with an :class:`Acceptance`: true, or false with the reason.

A template with knobs has a frozen dataclass of them (``config_type``) whose fields carry
their short names for tables in their metadata (``field(metadata={"short": "U"})``; an
empty short name shows the value alone). A template without knobs has
``config_type = None``, no defaults and an empty space.
"""

from __future__ import annotations

import dataclasses
import numbers
import typing
from dataclasses import dataclass
from typing import Protocol

from prnn_tvm.codegen.kernel import Kernel
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import GpuSpec


@dataclass(frozen=True)
class Acceptance:
    """A template's answer to ``accepts(plan, target)``: true where it places the plan, else false with
    ``reason`` (why not, in words: "places float32 layers, not float16")."""

    reason: str | None = None

    def __bool__(self) -> bool:
        return self.reason is None


ACCEPTED = Acceptance()


def refused(reason: str) -> Acceptance:
    """The answer of a template that does not place a plan, and why."""
    return Acceptance(reason)


class Template(Protocol):
    """What a schedule template provides.

    Attributes
    ----------
    name : str
        Keys tuning records (with the cell's math, shapes, dtype and GPU) and names the
        schedule in reports.
    config_type : type or None
        The frozen dataclass of the template's knobs, or None for a template without any.
    """

    name: str
    config_type: type | None

    def accepts(self, plan: CellPlan, target) -> Acceptance:
        """Whether this template places ``plan`` on ``target`` (a ``tvm.target.Target``), and if not, why."""

    def apply(self, plan: CellPlan, target, gpu: GpuSpec | None, config=None) -> Kernel:
        """Build the kernel for an accepted plan and target; ConfigError if ``config`` does not fit."""

    def default_configs(self, plan: CellPlan, target, gpu: GpuSpec | None) -> list:
        """The untuned configs, best first; a build falls back along them when ptxas spills the first."""

    def space(self, plan: CellPlan, gpu: GpuSpec) -> list:
        """The tuning space: candidate configs, not yet validated."""

    def carried_over(self, config, plan: CellPlan, gpu: GpuSpec):
        """``config``, a tuning record's config of the same cell, batch, dtype and GPU at another hidden size, as
        this template carries it over to ``plan`` (valid for it), or None where it carries none over. A compile
        builds these where ``plan``'s own shapes have no record (``prnn_tvm.neighbours``)."""

    def validate(self, config, plan: CellPlan, gpu: GpuSpec) -> None:
        """Raise ConfigError, with the reason, for a config that cannot fit; before anything is built."""

    def geometry(self, config, plan: CellPlan):
        """What a config implies for ``plan`` (grid, tiles, registers, shared memory: the template's geometry,
        with ``ctas``, ``threads``, ``batch_chunks``, ``items_per_thread``), or None for a template without
        knobs."""

    def features(self, config, plan: CellPlan, gpu: GpuSpec) -> dict:
        """The cost model's view of a valid config: name -> number, the same names for every config.

        ``registers`` must be among them (the template's estimate; the tuner replaces it
        with ptxas's figure once the config is built).
        """

    def config_from_dict(self, knobs: dict):
        """The config a tuning record or a user stores as a dict; ConfigError when it is not one."""


def config_from_dict(config_type: type, knobs: dict):
    """Build ``config_type`` from a dict of knobs, checking names and types (whole numbers for ints).

    Unknown or missing knobs and values of the wrong type are a ConfigError naming the knob
    and what is accepted; NumPy integers are taken as ints.
    """
    if not isinstance(knobs, dict):
        raise ConfigError(f"a config is a dict of knobs or a {config_type.__name__}, got {type(knobs).__name__}")
    fields = {f.name: f for f in dataclasses.fields(config_type)}
    hints = typing.get_type_hints(config_type)
    unknown = [k for k in knobs if k not in fields]
    if unknown:
        raise ConfigError(f"unknown knob(s) {', '.join(map(str, unknown))} for {config_type.__name__}; its knobs "
                          f"are {', '.join(fields)}")
    missing = [n for n, f in fields.items() if n not in knobs and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{config_type.__name__} needs the knob(s) {', '.join(missing)}")
    values = {}
    for name, value in knobs.items():
        want = hints[name]
        if want is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            values[name] = int(value)
        elif want is str and isinstance(value, str):
            values[name] = value
        else:
            raise ConfigError(f"knob {name}={value!r}: expected {'a whole number' if want is int else 'a string'}")
    return config_type(**values)


def as_config(template: Template, config):
    """``config`` as the template's config type: a dict is converted, the type itself passes."""
    if template.config_type is not None and isinstance(config, template.config_type):
        return config
    if template.config_type is None:
        raise ConfigError(f"the {template.name} template has no knobs; do not pass a config for it")
    return template.config_from_dict(config)


def short_names(config_type: type | None) -> dict:
    """Knob name -> its short name in tables (from the fields' metadata; the name itself by default)."""
    if config_type is None:
        return {}
    return {f.name: f.metadata.get("short", f.name) for f in dataclasses.fields(config_type)}


def knob_text(knobs: dict, shorts: dict | None = None) -> str:
    """``U=8 ks=16 r=2 bt=4 v=4 tags``: knobs in short form (an empty short name shows the value alone)."""
    shorts = shorts or {}
    parts = []
    for name, value in knobs.items():
        short = shorts.get(name, name)
        parts.append(f"{short}={value}" if short else str(value))
    return " ".join(parts)

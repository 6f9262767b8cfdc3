"""Schedule templates: each places a cell plan on a target (``template.Template`` is the contract).

``TEMPLATES`` is tried in order; the first whose ``accepts(plan, target)`` holds builds the
kernel. Everything outside this package reaches a template through :func:`template_for`
or :func:`by_name`, never by importing it.
"""

from __future__ import annotations

import dataclasses

from prnn_tvm.dtypes import POLICIES
from prnn_tvm.errors import ConfigError

from . import cpu_backward, cpu_reference, persistent_cuda, persistent_mma
from .template import Template, as_config, knob_text, short_names

TEMPLATES: tuple = (persistent_cuda.TEMPLATE, persistent_mma.TEMPLATE, cpu_reference.TEMPLATE)

__all__ = ["TEMPLATES", "Template", "as_config", "backward_for", "by_name", "knob_short_names", "knob_text",
           "template_for"]


def template_for(plan, target) -> Template:
    """The first template that places ``plan`` (a CellPlan) on ``target`` (a ``tvm.target.Target``)."""
    for template in TEMPLATES:
        if template.accepts(plan, target):
            return template
    takes = [d for d in POLICIES if any(t.accepts(dataclasses.replace(plan, dtype=d), target) for t in TEMPLATES)]
    raise ConfigError(f"no schedule template places a {plan.dtype} '{plan.cell.name}' cell on target "
                      f"{target.kind.name}, which takes {', '.join(takes) or 'no dtype'}"
                      + (" (float64 is for the CPU build: target='llvm')" if plan.dtype == "float64" else ""))


def backward_for(plan, target):
    """The backward of ``plan``'s recurrent kernel on ``target`` (a ``Kernel``): built for the CPU so far."""
    if target.kind.name != "llvm":
        raise ConfigError(f"the backward kernel is built for the CPU (target 'llvm') so far, not for "
                          f"{target.kind.name}")
    return cpu_backward.backward_kernel(plan)


def by_name(name: str) -> Template:
    """The template of that name (as tuning records and reports name it)."""
    for template in TEMPLATES:
        if template.name == name:
            return template
    raise ConfigError(f"no schedule template named '{name}'; templates: {', '.join(t.name for t in TEMPLATES)}")


def knob_short_names() -> dict:
    """Knob name -> short name over every template's knobs (for tables that show configs of any template)."""
    names: dict = {}
    for template in TEMPLATES:
        names.update(short_names(template.config_type))
    return names

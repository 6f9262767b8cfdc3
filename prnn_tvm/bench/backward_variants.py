"""The backward configs a config-by-config benchmark adds after the ranked defaults (``bench/backward_configs.py``,
``bench/cell_backward_configs.py``): the first config with some knobs changed, each where it builds."""

from __future__ import annotations

import dataclasses

from prnn_tvm import schedules
from prnn_tvm.errors import ConfigError


def add_variants(first, changes: list, configs: list, plan, gpu) -> list:
    """``configs`` extended by ``first`` with each of ``changes`` (knob -> value) applied: skipped where the config's
    type has no such knob or it is already there; a config the template refuses is printed with the reason."""
    for change in changes:
        try:
            other = dataclasses.replace(first, **change)
        except TypeError:  # a knob this template's config does not have
            continue
        if other in configs:
            continue
        try:
            schedules.backward_kernel(plan, gpu, other)
            configs.append(other)
        except ConfigError as err:
            print(f"skipped {other.as_dict()}: {err}")
    return configs

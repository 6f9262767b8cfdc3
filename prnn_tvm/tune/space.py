"""The tuning space of a schedule template for one cell plan and GPU.

The knobs and their candidate values come from the template (``Template.space``, derived
from the shapes and the target); ``Template.validate`` prunes every config that cannot
fit before anything is built. A config is addressed by its index in the space or by its
small dict (what tuning records store); each has a fixed feature vector for the cost
model: the template's features, then ptxas's spill bytes once it has been built.
"""

from __future__ import annotations

import numpy as np

from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.schedules import Template
from prnn_tvm.target import GpuSpec

SPILLS = "spill_bytes"  # the feature ptxas fills in; the template's ``registers`` is replaced likewise


class ConfigSpace:
    """Valid configs of ``template`` for ``plan`` on ``gpu``, with features.

    ``rejected`` counts the candidates ``validate`` pruned; ``feature_names`` names the
    columns of ``features``. ``record_ptxas`` replaces a config's estimated registers with
    what ptxas reported once it has been built, and records its spills.
    """

    def __init__(self, plan: CellPlan, gpu: GpuSpec, template: Template):
        self.plan, self.gpu, self.template = plan, gpu, template
        self.configs: list = []
        rows = []
        self.rejected = 0
        for cfg in template.space(plan, gpu):
            try:
                template.validate(cfg, plan, gpu)
            except ConfigError:
                self.rejected += 1
                continue
            self.configs.append(cfg)
            rows.append({**template.features(cfg, plan, gpu), SPILLS: 0.0})
        if not self.configs:
            raise ConfigError(
                f"no {template.name} config fits cell '{plan.cell.name}' at hidden={plan.hidden}, "
                f"batch={plan.batch} on {gpu.arch}: nothing to tune"
            )
        self.feature_names = tuple(rows[0])
        self.features = np.asarray([[row[k] for k in self.feature_names] for row in rows], dtype=np.float64)
        self._index = {cfg: i for i, cfg in enumerate(self.configs)}

    def __len__(self) -> int:
        return len(self.configs)

    def index(self, config) -> int | None:
        """The index of a config (or its dict), None if it is not in the valid space."""
        if isinstance(config, dict):
            try:
                config = self.template.config_from_dict(config)
            except ConfigError:
                return None
        return self._index.get(config)

    def defaults(self) -> list[int]:
        """Indices of the untuned configs (the template's ranked defaults), best first."""
        found = (self.index(c) for c in self.template.default_configs(self.plan, self.gpu.target(), self.gpu))
        return [i for i in found if i is not None]

    def record_ptxas(self, index: int, registers: int | None, spill_bytes: int | None) -> None:
        for name, value in (("registers", registers), (SPILLS, spill_bytes)):
            if value is not None:
                self.features[index, self.feature_names.index(name)] = value

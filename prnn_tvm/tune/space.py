"""The tuning space of the persistent template for one cell plan and GPU.

The template's knobs and candidate values come from ``persistent_config.space`` (derived
from the shapes and the target); ``validate`` prunes every config that cannot fit before
anything is built. A config is addressed by its index in the space or by its small dict
(``PersistentConfig.as_dict``); each has a fixed feature vector for the cost model.
"""

from __future__ import annotations

import numpy as np

from prnn_tvm.codegen.barrier import BARRIERS
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.schedules.persistent_config import PersistentConfig, estimated_cycles, ranked_configs, space, validate
from prnn_tvm.target import GpuSpec, ctas_per_sm

KNOBS = ("units_per_cta", "k_split", "rows_per_thread", "batch_tile", "vec")
GEOMETRY = ("ctas", "threads", "rows", "k_chunks", "weights_per_thread", "batch_chunks", "items_per_thread",
            "tagged_per_thread", "smem_bytes", "regs_estimate")
# knob values, one-hot barrier, derived geometry, occupancy, the analytic cost estimate, then the
# two ptxas figures (the register estimate and 0 until the config is built)
FEATURES = (*KNOBS, *(f"barrier={b}" for b in BARRIERS), *GEOMETRY, "ctas_per_sm", "log2_estimated_cycles",
            "registers", "spill_bytes")
_REGISTERS, _SPILLS = len(FEATURES) - 2, len(FEATURES) - 1


class ConfigSpace:
    """Valid configs of ``persistent_cuda`` for ``plan`` on ``gpu``, with features.

    ``rejected`` counts the candidates ``validate`` pruned. ``record_ptxas`` replaces a
    config's estimated registers with what ptxas reported once it has been built.
    """

    def __init__(self, plan: CellPlan, gpu: GpuSpec, barriers: tuple = tuple(BARRIERS)):
        self.plan, self.gpu = plan, gpu
        self.configs: list[PersistentConfig] = []
        rows = []
        self.rejected = 0
        for cfg in space(plan, gpu, barriers):
            try:
                g = validate(cfg, plan, gpu)
            except ConfigError:
                self.rejected += 1
                continue
            self.configs.append(cfg)
            rows.append([*(getattr(cfg, k) for k in KNOBS), *(float(cfg.barrier == b) for b in BARRIERS),
                         *(getattr(g, k) for k in GEOMETRY),
                         ctas_per_sm(g.threads, g.regs_estimate, g.smem_bytes, gpu),
                         np.log2(estimated_cycles(cfg, g)), g.regs_estimate, 0.0])
        if not self.configs:
            raise ConfigError(f"no persistent config fits cell '{plan.cell.name}' at hidden={plan.hidden}, "
                              f"batch={plan.batch} on {gpu.arch}: nothing to tune")
        self.features = np.asarray(rows, dtype=np.float64)
        self._index = {cfg: i for i, cfg in enumerate(self.configs)}

    def __len__(self) -> int:
        return len(self.configs)

    def index(self, config: PersistentConfig | dict) -> int | None:
        """The index of a config (or its dict), None if it is not in the valid space."""
        if isinstance(config, dict):
            try:
                config = PersistentConfig(**config)
            except TypeError:
                return None
        return self._index.get(config)

    def defaults(self) -> list[int]:
        """Indices of the untuned configs (the template's ranked defaults), best first."""
        found = (self.index(c) for c in ranked_configs(self.plan, self.gpu))
        return [i for i in found if i is not None]

    def record_ptxas(self, index: int, registers: int | None, spill_bytes: int | None) -> None:
        if registers is not None:
            self.features[index, _REGISTERS] = registers
        if spill_bytes is not None:
            self.features[index, _SPILLS] = spill_bytes

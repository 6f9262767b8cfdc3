"""Tensor-core persistent CUDA template: half-precision layers (float16, bfloat16) on sm_80+.

The step is the persistent template's (``persistent_cuda``: operand exchange, fused
pointwise math, grid barrier between steps); the products are ``mma.sync.m16n8k16`` with
the recurrent weights held as A fragments in registers for the whole launch
(``persistent_fragments``) and float32 accumulation. Exchanged states and stages travel in
the half type; private states (LSTM's c) and the pointwise math stay float32
(``prnn_tvm.dtypes``). Knobs and their validation: ``persistent_mma_config``.
"""

from __future__ import annotations

from prnn_tvm.codegen.kernel import Kernel
from prnn_tvm.frontend.plan import CellPlan
from prnn_tvm.target import GpuSpec

from . import persistent_mma_config as mc
from .persistent_cuda import PersistentBuilder
from .persistent_fragments import FragmentWeights
from .persistent_mma_config import MmaConfig
from .template import config_from_dict


class PersistentMma:
    """The template's contract (``schedules.template.Template``) for half-precision ``cuda`` layers."""

    name = "persistent_mma"
    config_type = MmaConfig

    def accepts(self, plan: CellPlan, target) -> bool:
        return target.kind.name == "cuda" and plan.dtype in mc.DTYPES

    def apply(self, plan: CellPlan, target, gpu: GpuSpec, config: MmaConfig | None = None) -> Kernel:
        cfg = config if config is not None else mc.ranked_configs(plan, gpu, limit=1)[0]
        g = mc.validate(cfg, plan, gpu)
        builder = _MmaBuilder(plan, cfg, g)
        return Kernel(builder.build(), self.name, builder.launch, cfg)

    def default_configs(self, plan: CellPlan, target, gpu: GpuSpec) -> list:
        return mc.ranked_configs(plan, gpu)

    def space(self, plan: CellPlan, gpu: GpuSpec) -> list:
        return mc.space(plan, gpu)

    def validate(self, config: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> None:
        mc.validate(config, plan, gpu)

    def features(self, config: MmaConfig, plan: CellPlan, gpu: GpuSpec) -> dict:
        return mc.features(config, plan, gpu)

    def config_from_dict(self, knobs: dict) -> MmaConfig:
        return config_from_dict(MmaConfig, knobs)


TEMPLATE = PersistentMma()


class _MmaBuilder(FragmentWeights, PersistentBuilder):
    """The persistent step with tensor-core products."""

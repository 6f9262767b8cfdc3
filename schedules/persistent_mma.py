"""Tensor-core persistent CUDA template: half-precision layers (float16, bfloat16) on sm_80+.

The step is the persistent template's (``persistent_cuda``: operand exchange, fused
pointwise math, grid barrier between steps); the products are ``mma.sync.m16n8k16`` with
the recurrent weights held as A fragments in registers for the whole launch
(``persistent_fragments``; with ``gate_layout="in_warp"`` a unit's gates in one
warp, ``persistent_warp_gates``) and float32 accumulation. Exchanged states and stages travel in
the half type; private states (LSTM's c) and the pointwise math stay float32
(``prnn_tvm.dtypes``). Knobs and their validation: ``persistent_mma_config``.
"""

from __future__ import annotations

from . import persistent_mma_config as mc
from .persistent_cuda import PersistentBuilder, PersistentTemplate
from .persistent_fragments import FragmentWeights
from .persistent_mma_config import MmaConfig
from .persistent_warp_gates import WarpGates


class _MmaBuilder(WarpGates, FragmentWeights, PersistentBuilder):
    """The persistent step with tensor-core products."""

    XP_PREFETCH_STEPS = 2  # timed on the H100: bench/results/exchange-probes-h100.md, "Two source changes timed"
    # the block kernels' (issue 49): 4 steps on, after the barrier, a 128-byte line a lane, from one warp — the best
    # or within 7% of it at heads of 16, 32, 64 and sLSTM (bench/results/xp-prefetch-block-h100.md)
    XP_PREFETCH_EARLY_STEPS = 4
    XP_PREFETCH_EARLY_BYTES = 128


TEMPLATE = PersistentTemplate("persistent_mma", MmaConfig, mc, _MmaBuilder)  # half-precision cuda layers

"""``compile_xp_ready``: a compiled CUDA layer's recurrent kernel that waits, chunk by chunk, for an input projection
computed beside it (``schedules/xp_ready.py``), built only for a caller that overlaps the two
(``prnn_tvm.torch.overlap``): the layer's own kernel stays without the wait."""

from __future__ import annotations

from .cache import layers as layer_cache
from .projected_build import ProjectedKernel, kept_variant
from .schedules import xp_ready_kernel


def compile_xp_ready(layer) -> ProjectedKernel:
    """The kernel of a compiled CUDA ``layer`` with its config that takes the chunk flags
    (:data:`~prnn_tvm.signature.XP_READY_SCALARS`), once per layer, kept on it (its ``runtime`` is what a
    :class:`~prnn_tvm.runtime.launcher.Launcher` launches). ConfigError with the reason where the config does not load
    each step's projection ahead of the step (every layout but ``in_warp``, a grid barrier, a stack, both directions)
    or the build spills: the caller projects before the launch."""
    return kept_variant(
        layer,
        "_xp_ready",
        layer_cache.xp_ready_key(layer),
        lambda: xp_ready_kernel(layer.plan, layer.target, layer.gpu, layer.kernel.config),
        "kernel waiting for its projection's chunks",
    )

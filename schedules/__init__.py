"""Schedule templates, tried in order; the first that accepts the target builds the kernel.

Each module exposes ``NAME``, ``apply(plan, target, gpu, config=None) -> Kernel | None``
(None means "not mine") and ``default_configs(plan, target, gpu)``: its untuned configs,
best first, which a build falls back along when ptxas spills the first.
"""

from . import cpu_reference, persistent_cuda

TEMPLATES = (persistent_cuda, cpu_reference)

"""Schedule templates, tried in order; the first that accepts the target builds the kernel.

Each module exposes ``NAME`` and ``apply(plan, target, gpu, config=None) -> Kernel | None``
(None means "not mine").
"""

from . import cpu_reference, persistent_cuda

TEMPLATES = (persistent_cuda, cpu_reference)

"""``torch.autocast`` as a module reads it: the dtype it runs lower-precision ops in on a device type."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import

# torch 2.4 and later ask by device type; torch 2.3 has a function per device type (the CPU's and the GPU's)
_BY_DEVICE_TYPE = hasattr(torch, "get_autocast_dtype")


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast`` runs lower-precision ops in on ``device_type`` ("cpu", "cuda"), or None where
    it is off."""
    if _BY_DEVICE_TYPE:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None

"""``torch.autocast`` as a module reads it: the dtype it runs lower-precision ops in on a device type."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import

# torch 2.4 and later ask by device type; torch 2.3 has a function per device type (the CPU's and the GPU's).
# Bound here, so that torch.compile reads no ``torch`` of this module's (a second name of the one its caller reads
# costs a guard evaluated in Python on every compiled call).
_BY_DEVICE_TYPE = hasattr(torch, "get_autocast_dtype")
_enabled, _dtype = (torch.is_autocast_enabled, torch.get_autocast_dtype) if _BY_DEVICE_TYPE else (None, None)
_old_forms = None if _BY_DEVICE_TYPE else (
    torch.is_autocast_enabled, torch.get_autocast_gpu_dtype, torch.is_autocast_cpu_enabled,
    torch.get_autocast_cpu_dtype,
)  # fmt: skip


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast`` runs lower-precision ops in on ``device_type`` ("cpu", "cuda"), or None where
    it is off."""
    if _BY_DEVICE_TYPE:
        return _dtype(device_type) if _enabled(device_type) else None
    gpu_enabled, gpu_dtype, cpu_enabled, cpu_dtype = _old_forms
    if device_type == "cuda":
        return gpu_dtype() if gpu_enabled() else None
    if device_type == "cpu":
        return cpu_dtype() if cpu_enabled() else None
    return None

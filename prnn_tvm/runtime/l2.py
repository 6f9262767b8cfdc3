"""An L2 persistence window over the weights a kernel reads from global memory every step (the third weight tier:
``l2_chunks`` of the persistent template, ``l2_k_tiles`` of the tensor-core one), through the CUDA runtime library
TVM's CUDA runtime links (``peers.cudart``).

Where switched on (:func:`use_window`; off by default), before such a launch the launcher sets an access-policy
window on the launch's stream (``cudaStreamSetAttribute``, ``cudaStreamAttributeAccessPolicyWindow``): the whole
weight buffer (up to the device's largest window), a hit ratio of the persisting L2 set-aside over the window's
bytes (lines assigned persisting at random in that ratio, the rest normal: as streaming they would be evicted
first, and the streamed part of the weights is a strided subset of the buffer, the first columns of every row,
which one window cannot single out), and clears it after the launch, so that the caller's later work on the stream
is untouched. The set-aside (``cudaLimitPersistingL2CacheSize``) is raised once per device to the most the device
allows: that part of L2 then serves persisting lines first for the whole process. Where the runtime refuses the
window (an older driver, the legacy default stream), or the stream is being captured into a CUDA graph, the launch
runs without it (a refusal's reason logged once). It is off by default: on the H100 it changed nothing measurable
for LSTM fp32 2048 at batch 4 (11.29 us a step with it, 10.86 without) and made the call of LSTM fp16 4096 at batch
4 slower (45.15 against 39.96, the kernel alone the same), while raising the process's persisting set-aside for
every later kernel; :func:`use_window` switches it on and off for the process (to measure both).
"""

from __future__ import annotations

import ctypes
import functools
import logging

from .peers import cudart

log = logging.getLogger(__name__)

STREAM_ACCESS_POLICY_WINDOW = 1  # cudaStreamAttributeAccessPolicyWindow (cudaLaunchAttributeAccessPolicyWindow)
LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize
ATTR_MAX_PERSISTING_L2 = 108  # cudaDevAttrMaxPersistingL2CacheSize
ATTR_MAX_WINDOW = 109  # cudaDevAttrMaxAccessPolicyWindowSize
NORMAL, STREAMING, PERSISTING = 0, 1, 2  # cudaAccessProperty

_enabled = False


def use_window(enabled: bool) -> None:
    """Whether launches of kernels that stream weights set an L2 persistence window or not (the default)."""
    global _enabled
    _enabled = bool(enabled)


def window_enabled() -> bool:
    return _enabled


class AccessPolicyWindow(ctypes.Structure):
    """``cudaAccessPolicyWindow`` (driver_types.h)."""

    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hitRatio", ctypes.c_float),
        ("hitProp", ctypes.c_int),
        ("missProp", ctypes.c_int),
    ]


class StreamAttrValue(ctypes.Union):
    """``cudaStreamAttrValue`` (``cudaLaunchAttributeValue``: 64 bytes, the window at offset 0)."""

    _fields_ = [("accessPolicyWindow", AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


@functools.cache
def device_limits(device: int) -> tuple[int, int]:
    """``(persisting L2 set-aside in bytes, largest window in bytes)`` of ``device``, the set-aside raised to the most
    the device allows (once per process and device); (0, 0) where the runtime refuses (the reason logged)."""
    lib, most, window = cudart(), ctypes.c_int(0), ctypes.c_int(0)
    if lib.cudaDeviceGetAttribute(ctypes.byref(most), ATTR_MAX_PERSISTING_L2, device) or lib.cudaDeviceGetAttribute(
        ctypes.byref(window), ATTR_MAX_WINDOW, device
    ):
        return _refused("cudaDeviceGetAttribute")
    from .peers import current_device_kept

    with current_device_kept():
        if lib.cudaSetDevice(device) or lib.cudaDeviceSetLimit(LIMIT_PERSISTING_L2, ctypes.c_size_t(most.value)):
            return _refused("cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)")
        granted = ctypes.c_size_t(0)
        if lib.cudaDeviceGetLimit(ctypes.byref(granted), LIMIT_PERSISTING_L2):
            return _refused("cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize)")
    log.info("GPU %d: %d B of L2 set aside for persisting lines, windows up to %d B", device, granted.value,
             window.value)
    return granted.value, window.value


def _refused(what: str) -> tuple[int, int]:
    lib = cudart()
    code = lib.cudaGetLastError()  # clear the (not sticky) error the call left
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    log.warning("%s failed (CUDA error %d: %s): weights streamed from global memory run without an L2 persistence "
                "window", what, code, lib.cudaGetErrorString(code).decode())
    return 0, 0


def window_value(pointer: int, nbytes: int, device: int) -> StreamAttrValue | None:
    """The window over ``nbytes`` from ``pointer`` on ``device``, or None where the device sets none aside."""
    aside, largest = device_limits(device)
    if not aside or not largest:
        return None
    value = StreamAttrValue()
    size = min(nbytes, largest)
    value.accessPolicyWindow = AccessPolicyWindow(pointer, size, min(1.0, aside / size), PERSISTING, NORMAL)
    return value


class Window:
    """``with Window(stream, pointer, nbytes, device):`` a launch inside runs with the window on ``stream``."""

    _warned: set = set()

    def __init__(self, stream: int, pointer: int, nbytes: int, device: int):
        self.stream, self.value = stream, window_value(pointer, nbytes, device) if _enabled else None

    def __enter__(self):
        if self.value is not None and (self._capturing() or not self._set(self.value)):
            self.value = None

    def _capturing(self) -> bool:
        """Whether the stream is being captured into a CUDA graph: no window then (a graph's kernel node would take
        it as a node attribute, not set here)."""
        status = ctypes.c_int(0)
        return cudart().cudaStreamIsCapturing(ctypes.c_void_p(self.stream), ctypes.byref(status)) != 0 or bool(
            status.value)

    def __exit__(self, *exc):
        if self.value is not None:
            self._set(StreamAttrValue())  # num_bytes 0: no window

    def _set(self, value: StreamAttrValue) -> bool:
        lib = cudart()
        code = lib.cudaStreamSetAttribute(ctypes.c_void_p(self.stream), STREAM_ACCESS_POLICY_WINDOW,
                                          ctypes.byref(value))
        if code == 0:
            return True
        lib.cudaGetLastError()
        if self.stream not in self._warned:
            self._warned.add(self.stream)
            log.warning("cudaStreamSetAttribute(access policy window) on stream %#x failed (CUDA error %d): the "
                        "launch runs without an L2 persistence window", self.stream, code)
        return False

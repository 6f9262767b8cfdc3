"""Peer access between the GPUs of one host, through the CUDA runtime library that TVM's CUDA runtime loaded.

TVM's CUDA runtime (``tvm/lib/libtvm_runtime_cuda.so``) links ``libcudart`` dynamically (``ldd`` names
``libcudart.so.13`` for apache-tvm 0.27); once TVM has made a CUDA device, that library is mapped into this process,
and :func:`cudart` opens the same file (``/proc/self/maps`` names it), so that the peer access enabled here is the
one TVM's contexts (the runtime's primary contexts) see. No torch: a compiled layer runs with TVM alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from pathlib import Path

from ..errors import ConfigError, LaunchError

PEER_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled


@functools.cache
def cudart() -> ctypes.CDLL:
    """The CUDA runtime library of this process (the one TVM loaded; else the system's)."""
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if "libcudart.so" in Path(path).name:
                return ctypes.CDLL(path)
    found = ctypes.util.find_library("cudart")
    if found is None:
        raise LaunchError("no CUDA runtime library (libcudart) in this process or on the library path: a split "
                          "layer needs TVM's CUDA runtime loaded (a machine with a GPU driver)")
    return ctypes.CDLL(found)


def _check(code: int, what: str) -> None:
    if code != 0:
        lib = cudart()
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        raise LaunchError(f"{what} failed: CUDA error {code} ({lib.cudaGetErrorString(code).decode()})")


def checked_devices(devices) -> tuple:
    """``devices`` as a tuple of distinct device indices, at least two; ConfigError naming the fix otherwise."""
    try:
        found = tuple(devices)
    except TypeError:
        raise ConfigError(f"devices must be a list of CUDA device indices like [0, 1], got {devices!r}") from None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in found):
        raise ConfigError(f"devices must be CUDA device indices (whole numbers from 0), got {devices!r}")
    if len(set(found)) != len(found):
        raise ConfigError(f"devices {list(found)} names a GPU twice: name each GPU once")
    if len(found) < 2:
        raise ConfigError(f"devices={list(found)}: a split layer runs on 2 GPUs or more; for one GPU leave "
                          "devices out")
    return found


def device_count() -> int:
    """The CUDA devices this process sees."""
    n = ctypes.c_int(0)
    _check(cudart().cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    return n.value


def can_access_peer(device: int, peer: int) -> bool:
    """Whether ``device`` can read and write ``peer``'s memory (NVLink or PCIe P2P)."""
    ok = ctypes.c_int(0)
    _check(cudart().cudaDeviceCanAccessPeer(ctypes.byref(ok), device, peer),
           f"cudaDeviceCanAccessPeer({device}, {peer})")
    return bool(ok.value)


def enable_peer_access(devices) -> None:
    """Let every device of ``devices`` store into every other's memory; LaunchError naming the pair where the
    hardware cannot (or a device that is not there). Leaves the current device as it found it."""
    devices = list(devices)
    count = device_count()
    missing = [d for d in devices if d >= count]
    if missing:
        raise LaunchError(f"devices {devices} asked for, but this process sees {count} GPU(s): devices {missing} "
                          "are not there (check CUDA_VISIBLE_DEVICES, or compile for fewer devices)")
    lib = cudart()
    with current_device_kept():
        for d in devices:
            for p in devices:
                if p == d:
                    continue
                if not can_access_peer(d, p):
                    raise LaunchError(f"GPU {d} cannot access GPU {p}'s memory (no peer-to-peer path between them): "
                                      "a split layer stores each step's states into every peer; use GPUs joined by "
                                      "NVLink (nvidia-smi topo -m)")
                _check(lib.cudaSetDevice(d), f"cudaSetDevice({d})")
                code = lib.cudaDeviceEnablePeerAccess(p, 0)
                if code == PEER_ALREADY_ENABLED:
                    lib.cudaGetLastError()  # clear the (not sticky) error the call left
                else:
                    _check(code, f"cudaDeviceEnablePeerAccess({p}) on GPU {d}")


@contextlib.contextmanager
def current_device_kept():
    """The CUDA runtime's current device, restored on exit: TVM sets it to each launch's device and leaves it there,
    which would move the caller's (torch's ``device="cuda"`` among them) to the last GPU launched on."""
    current = ctypes.c_int(0)
    if cudart().cudaGetDevice(ctypes.byref(current)) != 0:  # no usable GPU (an emulated split): none to keep
        yield
        return
    try:
        yield
    finally:
        cudart().cudaSetDevice(current.value)


def keeps_current_device(method):
    """``method`` run under :func:`current_device_kept`: what it allocates, copies or waits for on other GPUs (TVM
    sets the runtime's device for each and leaves it) does not move the caller's current device."""

    @functools.wraps(method)
    def kept(*args, **kwargs):
        with current_device_kept():
            return method(*args, **kwargs)

    return kept


class StreamJoin:
    """Orders the next launches on each of ``devices``' streams after the launches already queued on all of them,
    without the host waiting: an event recorded on every device's stream, which every other device's stream waits
    for (``cudaStreamWaitEvent`` works across devices). A split layer's launch on one GPU must not start before
    every peer's previous launch has ended: its first step would overwrite, in a peer's copy of the exchange, values
    that peer still polls for."""

    DISABLE_TIMING = 2  # cudaEventDisableTiming

    def __init__(self, devices):
        self.devices, self.events = list(devices), []
        lib = cudart()
        with current_device_kept():
            for d in self.devices:
                _check(lib.cudaSetDevice(d), f"cudaSetDevice({d})")
                event = ctypes.c_void_p()
                _check(lib.cudaEventCreateWithFlags(ctypes.byref(event), self.DISABLE_TIMING),
                       f"cudaEventCreateWithFlags on GPU {d}")
                self.events.append(event)

    def join(self, streams) -> None:
        """After the launches queued on ``streams`` (one raw stream handle per device, in order)."""
        lib = cudart()
        with current_device_kept():
            for d, stream, event in zip(self.devices, streams, self.events):
                _check(lib.cudaSetDevice(d), f"cudaSetDevice({d})")
                _check(lib.cudaEventRecord(event, ctypes.c_void_p(stream)), f"cudaEventRecord on GPU {d}")
            for d, stream in zip(self.devices, streams):
                _check(lib.cudaSetDevice(d), f"cudaSetDevice({d})")
                for other, event in zip(self.devices, self.events):
                    if other != d:
                        _check(lib.cudaStreamWaitEvent(ctypes.c_void_p(stream), event, 0),
                               f"cudaStreamWaitEvent on GPU {d} for GPU {other}")

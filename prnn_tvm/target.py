"""GPU facts the schedule needs before anything is built: SMs, registers, shared memory; and the CPU build's target.

Known architectures carry the numbers of their flagship part (the H100 SXM for sm_90);
on a machine with a GPU, :func:`gpu_spec` takes the SM count from the device itself.
TVM is imported by the functions that need it: the command line names architectures without it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from .errors import ConfigError


@dataclass(frozen=True)
class GpuSpec:
    """Per-architecture limits used by config validation and occupancy checks."""

    arch: str  # "sm_90"
    sms: int  # streaming multiprocessors
    smem_per_sm: int  # bytes of shared memory per SM
    smem_per_block: int  # bytes one block may opt in to
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    fp32_lanes_per_sm: int = 64  # FP32 FMA units per SM (architecture whitepapers)
    boost_clock_mhz: int = 0  # the flagship part's boost clock (datasheets); 0 = unknown
    tensor_flops_per_sm_clock: int = 0  # dense fp16/bf16 mma, fp32 accumulation (whitepapers); 0 = none
    l2_bytes: int = 0  # the L2 cache (whitepapers); 0 = unknown
    # GPCs, which a thread-block cluster's CTAs share (the most of any part of the architecture: each may leave up to
    # cluster - 1 CTA slots unused, :func:`resident_ctas`); 0 = no clusters (before sm_90)
    gpcs: int = 0
    device_name: str = ""

    @property
    def compute_version(self) -> tuple[int, int]:
        digits = self.arch[3:]
        return int(digits[:-1]), int(digits[-1])

    @property
    def peak_fp32_flops(self) -> float:
        """Peak fp32 FLOP/s without tensor cores: SMs x FP32 lanes x 2 (an FMA) x boost clock.

        The benchmark's floor uses it. With the table's clocks it gives NVIDIA's published
        figures (H100 SXM 66.9, A100 19.5, V100 15.7 TFLOP/s); a part clocked lower than the
        flagship (H100 PCIe) gets a slightly high peak, so its floor errs low.
        """
        return self.sms * self.fp32_lanes_per_sm * 2 * self.boost_clock_mhz * 1e6

    @property
    def peak_half_flops(self) -> float:
        """Peak dense fp16/bf16 tensor-core FLOP/s with fp32 accumulation: SMs x FLOPs per SM clock x
        boost clock (H100 SXM: 4096 per SM clock, 1070 TFLOP/s at 1980 MHz; NVIDIA quotes 989 at the
        1830 MHz its tensor figures assume, so the half floor errs low, as a floor may)."""
        return self.sms * self.tensor_flops_per_sm_clock * self.boost_clock_mhz * 1e6

    def target(self):
        """The TVM target for this GPU, with an LLVM host (:func:`cpu_target`: its level of optimization)."""
        import tvm

        return tvm.target.Target({"kind": "cuda", "arch": self.arch}, host=cpu_target())


_KNOWN = {
    "sm_70": GpuSpec(
        "sm_70",
        80,
        96 * 1024,
        96 * 1024,
        max_threads_per_sm=2048,  # V100
        boost_clock_mhz=1530,
        tensor_flops_per_sm_clock=1024,
        l2_bytes=6 * 1024 * 1024,
    ),
    "sm_75": GpuSpec(
        "sm_75",
        40,
        64 * 1024,
        64 * 1024,
        max_threads_per_sm=1024,
        max_ctas_per_sm=16,  # T4
        boost_clock_mhz=1590,
        tensor_flops_per_sm_clock=1024,
        l2_bytes=4 * 1024 * 1024,
    ),
    "sm_80": GpuSpec(
        "sm_80",
        108,
        164 * 1024,
        163 * 1024,
        boost_clock_mhz=1410,  # A100
        tensor_flops_per_sm_clock=2048,
        l2_bytes=40 * 1024 * 1024,
    ),
    "sm_86": GpuSpec(
        "sm_86",
        82,
        100 * 1024,
        99 * 1024,
        max_threads_per_sm=1536,
        max_ctas_per_sm=16,
        fp32_lanes_per_sm=128,
        boost_clock_mhz=1695,
        tensor_flops_per_sm_clock=512,
        l2_bytes=6 * 1024 * 1024,
    ),  # RTX 3090
    "sm_89": GpuSpec(
        "sm_89",
        128,
        100 * 1024,
        99 * 1024,
        max_threads_per_sm=1536,
        max_ctas_per_sm=24,
        fp32_lanes_per_sm=128,
        boost_clock_mhz=2520,
        tensor_flops_per_sm_clock=512,
        l2_bytes=72 * 1024 * 1024,
    ),  # RTX 4090
    "sm_90": GpuSpec(
        "sm_90",
        132,
        228 * 1024,
        227 * 1024,  # H100 SXM
        fp32_lanes_per_sm=128,
        boost_clock_mhz=1980,
        tensor_flops_per_sm_clock=4096,
        l2_bytes=50 * 1024 * 1024,
        gpcs=8,  # GH100: every H100 and H200 part
    ),
}


def known_archs() -> list[str]:
    return sorted(_KNOWN)


def parse_arch(arch: str) -> str:
    """Normalize ``"sm_90"``, ``"90"``, ``"9.0"`` or ``"sm_90a"`` to ``"sm_90"``; refuse unknown ones."""
    m = re.fullmatch(r"(?:sm_?)?(\d)\.?(\d)a?", str(arch).strip().lower())
    name = f"sm_{m.group(1)}{m.group(2)}" if m else str(arch)
    if name not in _KNOWN:
        raise ConfigError(f"unknown GPU architecture '{arch}'; known: {', '.join(known_archs())}")
    return name


CPU_OPT_LEVEL = "PRNN_TVM_CPU_OPT_LEVEL"
CPU_OPT_LEVELS = ("0", "1", "2", "3")


def cpu_target(environ=None):
    """The TVM target of the CPU build and of a CUDA build's host code: LLVM at its own optimization level (3), or at
    the level ``PRNN_TVM_CPU_OPT_LEVEL`` names (0 to 3; read from ``environ``, default ``os.environ``). The test suite
    builds hundreds of CPU layers and CUDA layers at level 0, where LLVM's code generation takes about a quarter of
    the CPU time of level 3 (``tests/conftest.py``, docs/tests.md); a layer cached at one level is another key than
    at the other (the target's text is part of it). ConfigError naming the variable for another value."""
    import tvm

    env = os.environ if environ is None else environ
    level = env.get(CPU_OPT_LEVEL, "").strip()
    if not level:
        return tvm.target.Target("llvm")
    if level not in CPU_OPT_LEVELS:
        raise ConfigError(f"{CPU_OPT_LEVEL}={env[CPU_OPT_LEVEL]!r}: LLVM's optimization level of the CPU build is "
                          f"one of {', '.join(CPU_OPT_LEVELS)} (unset: LLVM's own, 3)")
    return tvm.target.Target({"kind": "llvm", "opt-level": int(level)})


def local_gpu():
    """The first CUDA device (a ``tvm.runtime.Device``), or None on a machine without a usable GPU."""
    import tvm

    try:
        dev = tvm.cuda(0)
        return dev if dev.exist else None
    except Exception:  # noqa: BLE001 - no CUDA runtime library at all: same as no GPU
        return None


def gpu_spec(arch: str | None = None) -> GpuSpec:
    """The spec for ``arch``; with no arch, the local GPU's (which must exist).

    When the local GPU has the requested architecture its real SM count is used, so a
    grid sized for an H100 SXM (132 SMs) is not planned for an H100 PCIe (114).
    """
    dev = local_gpu()
    local_arch = f"sm_{dev.compute_version.replace('.', '')}" if dev is not None else None
    if arch is None:
        if local_arch is None:
            raise ConfigError("no GPU here: name the target architecture (e.g. --arch sm_90)")
        arch = local_arch
    spec = _KNOWN[parse_arch(arch)]
    if dev is not None and local_arch == spec.arch:
        spec = replace(spec, sms=dev.multi_processor_count, device_name=dev.device_name)
    return spec


# TVM's CUDA launcher raises a kernel's shared-memory limit above the default 48 KB (cuFuncSetAttribute)
# only where the *dynamic* part alone reaches 48 KB, yet the static part (the barrier's words) counts against
# the limit too: a kernel with dynamic shared memory just under 48 KB fails at launch (CUDA_ERROR_INVALID_VALUE).
DEFAULT_SMEM_PER_BLOCK = 48 * 1024
STATIC_SMEM_RESERVE = 1024  # bytes: more than any template's static shared memory (ptxas: 64 B or less)


def launchable_smem(dynamic: int) -> int:
    """A kernel's ``dynamic`` bytes of shared memory as it allocates them: exactly 48 KB where the static
    shared memory could take the total past 48 KB while the dynamic part stays under it (see above)."""
    if DEFAULT_SMEM_PER_BLOCK - STATIC_SMEM_RESERVE < dynamic < DEFAULT_SMEM_PER_BLOCK:
        return DEFAULT_SMEM_PER_BLOCK
    return dynamic


def smem_launch_problem(dynamic: int, static: int, per_block: int | None = None) -> str | None:
    """Why a kernel with ``dynamic`` and ``static`` bytes of shared memory per CTA would fail at launch
    through TVM's CUDA launcher (see above), or past ``per_block`` bytes (what a CTA may opt in to), or None."""
    if per_block is not None and dynamic + static > per_block:
        return (
            f"its {dynamic} B of dynamic and {static} B of static shared memory per CTA pass the {per_block} B "
            "a CTA may have"
        )
    if dynamic < DEFAULT_SMEM_PER_BLOCK < dynamic + static:
        return (
            f"its {dynamic} B of dynamic and {static} B of static shared memory pass the default limit of "
            f"{DEFAULT_SMEM_PER_BLOCK} B, which TVM's launcher raises only from {DEFAULT_SMEM_PER_BLOCK} B of "
            "dynamic memory up"
        )
    return None


def ctas_per_sm(threads: int, regs: int, smem: int, gpu: GpuSpec) -> int:
    """How many CTAs of this shape one SM holds.

    Registers are allocated per warp (in units of 256) from four sub-partitions of a
    quarter of the register file each, so a CTA's warps fit only if every sub-partition
    takes its share: this is why ptxas caps a 320-thread kernel at 168 registers.
    """
    warps = math.ceil(threads / 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    warps_by_regs = 4 * ((gpu.regs_per_sm // 4) // regs_per_warp)
    by_regs = warps_by_regs // warps
    by_smem = gpu.smem_per_sm // (smem + 1024) if smem else gpu.max_ctas_per_sm  # 1 KB reserved per CTA
    by_threads = gpu.max_threads_per_sm // threads
    return max(0, min(by_regs, by_smem, by_threads, gpu.max_ctas_per_sm))


def resident_ctas(grid, gpu: GpuSpec) -> int:
    """How many CTAs of ``grid``'s shape (a :class:`~prnn_tvm.signature.Grid`: threads, registers and shared
    memory per CTA, and the CTAs of a thread-block cluster) the whole GPU holds at once, in whole clusters.

    A cluster's CTAs run in one GPC, so each GPC may leave up to ``cluster - 1`` of its CTA slots unused: with
    ``gpcs`` GPCs at most, at least ``(slots - gpcs * (cluster - 1)) // cluster`` clusters fit (a lower bound of
    what ``cudaOccupancyMaxActiveClusters`` reports: the H100's 132 SMs, one CTA each, give 62 clusters of 2, 27 of
    4 and 9 of 8). No cluster fits where the architecture has none (``gpcs`` 0)."""
    slots = ctas_per_sm(grid.threads, grid.registers, grid.smem_bytes, gpu) * gpu.sms
    cluster = getattr(grid, "cluster", 1)
    if cluster == 1:
        return slots
    return max(0, slots - gpu.gpcs * (cluster - 1)) // cluster * cluster if gpu.gpcs else 0


def in_clusters(grid) -> str:
    """How a co-residency message names ``grid``'s clusters: "" without any."""
    cluster = getattr(grid, "cluster", 1)
    return f" in clusters of {cluster} (at most {cluster - 1} CTA slots left unused per GPC)" if cluster > 1 else ""


def max_regs_per_thread(threads: int, gpu: GpuSpec) -> int:
    """The most registers a thread of a ``threads``-wide CTA can have with one CTA per SM."""
    per_warp = (gpu.regs_per_sm // 4) // math.ceil(math.ceil(threads / 32) / 4)
    return min(gpu.max_regs_per_thread, per_warp // 32 // 8 * 8)

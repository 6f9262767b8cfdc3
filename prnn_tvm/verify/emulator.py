"""Running a layer's emitted CUDA kernel on the host CPU, as written (no GPU, no model of the kernel).

The CUDA source TVM emits for a layer is compiled with g++ against ``emulator.h`` (CUDA's built-ins for the host:
thread blocks as host threads, their threads as fibers, warp shuffles, block and grid barriers; the grid and the
program's ``main`` in ``emulator_runtime.cpp``, compiled once and linked into every kernel's program), after two
rewrites that CUDA has no host form for: inline PTX (:mod:`.ptx`) and the dynamic shared memory declaration.
The kernel then runs as it would on a GPU, block against block, so a wrong lane reduction, exchange or barrier
gives wrong numbers, and an access past the end of any buffer or of a block's shared memory stops the run with
the buffer's name. What it cannot see: the GPU's weaker memory order, ptxas, timing, tensor-core instructions.

Use :func:`run_recurrent` for a layer's recurrent launch on a caller's inputs, :func:`run_launch` for any launch
of a source (the training kernels), :func:`emulate` for one with every argument given.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx

from prnn_tvm.errors import PrnnError
from prnn_tvm.signature import ArgRole, Launch

from . import bounds, ptx

HEADER = Path(__file__).with_name("emulator.h")
RUNTIME = Path(__file__).with_name("emulator_runtime.cpp")
CXX_FLAGS = ("-std=c++17", "-pthread", "-fno-strict-aliasing", "-w")
# A kernel's program is built once per source and run a few times: unoptimized, its g++ build takes half the CPU
# time of -O1's and its runs a little more (tests/test_emulated.py, kernels and runtime at one level: from an empty
# cache 48.7 s of CPU at -O0 against 67.6 s at -O1, builds and runs; the runs alone 29.9 against 27.4 s). The
# runtime, built once and running every fiber switch, is optimized.
KERNEL_OPT, RUNTIME_OPT = "-O0", "-O1"
# headers the emitted source includes that the host has no use for (emulator.h defines what they would)
STUB_HEADERS = ("cuda.h", "cooperative_groups.h", "cuda/barrier")
TIMEOUT_US = 20_000_000  # the kernels' own barrier timeout in an emulated run: 20 s of host time


class EmulationError(PrnnError):
    """The emulated kernel faulted (with what it touched), did not finish, or could not be built."""


@dataclass(frozen=True)
class Emulated:
    """A finished emulated launch: every buffer argument after the run, by name, and the host error word
    (``error_host``: 0, or what a timed-out barrier reported)."""

    buffers: dict
    error_word: int


def available() -> bool:
    """Whether this machine can emulate kernels (a host C++ compiler)."""
    return shutil.which("g++") is not None


def kernel_parameters(source: str, function: str) -> list[tuple[str, str]]:
    """``(C type, name)`` of each parameter of ``function``'s kernel in ``source``, in order."""
    m = re.search(
        rf'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?{function}_kernel\(([^)]*)\) \{{', source
    )
    if m is None:
        raise EmulationError(f"no definition of kernel '{function}_kernel' in the source")
    params = []
    for param in m.group(1).split(","):
        ctype, name = param.replace("__restrict__", "").strip().rsplit(None, 1)
        params.append((ctype.strip(), name))
    return params


def host_source(source: str, function: str) -> str:
    """The translation unit the emulator compiles for a kernel: the header, ``source`` translated and a launcher for
    ``function``'s kernel (``main`` is the runtime's)."""
    body = ptx.translate_source(source)
    body = re.sub(
        r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];",
        r"\1* \2 = (\1*)prnn_emu::dynamic_shared;",
        body,
    )
    body = re.sub(r"__shared__ (alignas\(\d+\)) ", r"\1 __shared__ ", body)  # C++: the attribute first
    args = ", ".join(
        f"*({ctype}*)args[{i}]" if not ctype.endswith("*") else f"({ctype})*(void**)args[{i}]"
        for i, (ctype, _) in enumerate(kernel_parameters(source, function))
    )
    return (
        f'#include "{HEADER.name}"\n{body}\n'
        f"void prnn_emu::call_kernel(void** args) {{ {function}_kernel({args}); }}\n"
    )


def build(source: str, function: str) -> Path:
    """The emulator program for ``function``'s kernel of ``source``, compiled once per source (cached in the
    temporary directory) and linked with the runtime (:func:`runtime_object`)."""
    runtime = runtime_object()
    text = host_source(source, function)
    key = hashlib.sha256((text + runtime.parent.name).encode()).hexdigest()[:20]
    return _compiled(key, "kernel.cpp", text, "kernel", [KERNEL_OPT], [str(runtime)], "the emulated kernel")


def runtime_object() -> Path:
    """The emulator's runtime (``emulator_runtime.cpp``: the grid, fibers, barriers and ``main``) as an object file,
    compiled once per version of it, of the header and of the flags (cached in the temporary directory): the part
    of every kernel's program that does not change with the kernel, and most of a whole program's compile."""
    text = RUNTIME.read_text()
    flags = [*CXX_FLAGS, RUNTIME_OPT, KERNEL_OPT]  # (the kernel's level too: a key for the pair)
    key = hashlib.sha256((text + HEADER.read_text() + " ".join(flags)).encode()).hexdigest()[:20]
    return _compiled(f"runtime-{key}", RUNTIME.name, text, "emulator_runtime.o", [RUNTIME_OPT, "-c"], [],
                     "the emulator's runtime")


def _compiled(key: str, name: str, text: str, result: str, flags: list, inputs: list, what: str) -> Path:
    """``result``, what g++ makes of ``text`` (written as ``name``, compiled against the header with ``flags``, then
    linked with ``inputs``) in the folder of ``key``, built once: it lands whole under its name (another process may
    be building the same)."""
    if not available():
        raise EmulationError("emulating a kernel needs g++, which is not on this machine's PATH")
    where = Path(tempfile.gettempdir(), "prnn_emulator", key)
    if (where / result).exists():
        return where / result
    where.mkdir(parents=True, exist_ok=True)
    for stub in STUB_HEADERS:
        Path(where, "include", stub).parent.mkdir(parents=True, exist_ok=True)
        Path(where, "include", stub).write_text("// the emulator's stand-in: emulator.h defines what is used\n")
    (where / name).write_text(text)
    partial = where / f"{result}.{os.getpid()}"
    done = subprocess.run(
        ["g++", *CXX_FLAGS, *flags, f"-I{HEADER.parent}", f"-I{where / 'include'}", str(where / name), *inputs,
         "-o", str(partial)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise EmulationError(f"g++ could not build {what} ({where / name}):\n{done.stderr[-4000:]}")
    os.replace(partial, where / result)
    return where / result


def emulate(source: str, launch: Launch, arrays: dict, scalars: dict, timeout_s: float = 300.0) -> Emulated:
    """Run ``launch``'s kernel of ``source`` on the host, on ``launch.grid``: ``arrays`` (NumPy, by argument name:
    every buffer the kernel takes) are copied in and back out, ``scalars`` by name (``seq_len`` among them;
    ``error_host`` is supplied: a host word the kernel may report to). An integer parameter named in ``arrays``
    takes that array's address (page-locked host memory a kernel reaches through its address), copied in and out
    likewise."""
    return emulate_devices(source, launch, [(arrays, scalars, {})], timeout_s)[0]


def emulate_devices(source: str, launch: Launch, devices: list, timeout_s: float = 300.0) -> list:
    """:func:`emulate` on several GPUs at once, one address space (a layer split over GPUs): each of ``devices`` is
    ``(arrays, scalars, peers)`` for one GPU, which runs the whole ``launch.grid`` with them; ``peers`` maps an
    int64 parameter to ``(device index, argument name)``: the address of that GPU's copy of that buffer. Returns
    an :class:`Emulated` per GPU."""
    grid = launch.grid
    if grid is None:
        raise EmulationError(f"launch '{launch.function}' has no grid of its own (not a hand-placed kernel)")
    program = build(source, launch.function)
    params = kernel_parameters(source, launch.function)
    with tempfile.TemporaryDirectory(prefix="prnn_emulated_") as tmp:
        lines = [f"grid {grid.ctas} 1 1 {grid.threads} 1 1 {grid.dynamic_smem_bytes}"]
        if len(devices) > 1:
            lines.append(f"devices {len(devices)} ")
        files = []
        for d, (arrays, scalars, peers) in enumerate(devices):
            if len(devices) > 1:
                lines.append(f"device {d} ")
            files.append(_manifest_lines(params, arrays, scalars, peers, Path(tmp, f"gpu{d}"), lines))
        Path(tmp, "manifest").write_text("\n".join(lines) + "\n")
        try:
            done = subprocess.run(
                [str(program), str(Path(tmp, "manifest"))], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as e:
            raise EmulationError(
                f"the emulated '{launch.function}' kernel did not finish in {timeout_s:.0f} s "
                "(a barrier or poll that never completes)"
            ) from e
        if done.returncode != 0:
            raise EmulationError(
                f"the emulated '{launch.function}' kernel failed: "
                f"{done.stderr.strip() or f'exit status {done.returncode}'}"
            )
        return [_read_back(found, arrays) for found, (arrays, _, _) in zip(files, devices)]


def _manifest_lines(params: list, arrays: dict, scalars: dict, peers: dict, where: Path, lines: list) -> dict:
    """Append one GPU's argument lines to the manifest ``lines``, its buffers written under ``where``; returns the
    files by argument name."""
    where.mkdir()
    files = {}
    for ctype, name in params:
        if name == "error_host":
            files[name] = where / name
            lines.append(f"hostword {name} {files[name]}")
        elif name in peers:
            device, buffer = peers[name]
            lines.append(f"peer {name} {device} {buffer}")
        elif ctype.endswith("*") or name in arrays:
            arg = name.removesuffix("_ptr")
            if arg not in arrays:
                raise EmulationError(f"kernel parameter {name}: no array '{arg}' given")
            files[arg] = where / arg
            data = np.ascontiguousarray(arrays[arg])
            data.tofile(files[arg])
            lines.append(f"{'buffer' if ctype.endswith('*') else 'hostbuffer'} {arg} {data.nbytes} {files[arg]}")
        else:
            if name not in scalars:
                raise EmulationError(f"kernel parameter {name}: no scalar '{name}' given")
            wide = ctype in ("int64_t", "uint64_t", "long long", "unsigned long long")
            lines.append(f"{'int64' if wide else 'int32'} {name} {int(scalars[name])}")
    return files


def _read_back(files: dict, arrays: dict) -> Emulated:
    out = {
        name: np.fromfile(path, dtype=np.asarray(arrays[name]).dtype).reshape(np.shape(arrays[name]))
        for name, path in files.items()
        if name != "error_host"
    }
    word = int(np.fromfile(files["error_host"], np.uint32)[0]) if "error_host" in files else 0
    return Emulated(out, word)


def host_values(func, target, seq_len: int) -> dict:
    """The scalars TVM's host code computes for a kernel: ``func`` (a PrimFunc) lowered as the build lowers it, and
    the values its host part binds (common subexpressions of the sequence length that TVM hoists out of a kernel
    and passes as arguments, ``cse_v1``...), for ``seq_len``."""
    from tvm.tirx.compilation_pipeline import get_tir_pipeline

    lower, _, _ = get_tir_pipeline("tirx")
    name = "emulated"
    lowered = lower(tvm.IRModule({name: func.with_attr("global_symbol", name).with_attr("target", target)}))
    bindings = []

    def walk(stmt):
        if isinstance(stmt, (tirx.Bind, tirx.LetStmt)):
            bindings.append((stmt.var, stmt.value))
        for field in ("seq", "body", "then_case", "else_case"):
            inner = getattr(stmt, field, None)
            for s in inner if field == "seq" and inner is not None else [inner]:
                if isinstance(s, tirx.Stmt):
                    walk(s)

    walk(lowered[name].body)
    return bounds.bound_values(bindings, seq_len)


def run_launch(
    source: str,
    launch: Launch,
    given: dict,
    seq_len: int,
    timeout_us: int = TIMEOUT_US,
    stall_step: int = -1,
    kernel=None,
    target=None,
) -> Emulated:
    """``launch`` of ``source`` emulated with the arrays ``given`` by argument name (NumPy, converted to each
    argument's dtype) over ``seq_len`` steps; of the others, ``lengths`` are the whole sequence, initial states,
    workspace and barrier state zero, and what the kernel writes has every bit set before the run (NaN in every
    float type: what it does not write stays NaN). ``kernel`` (its PrimFunc) and ``target``: for the scalars TVM's
    host code would pass (:func:`host_values`), where the kernel takes any."""
    arrays = launch_arrays(launch, given, seq_len)
    scalars = {"seq_len": seq_len, "timeout_us": timeout_us, "stall_step": stall_step}
    wanted = {name for ctype, name in kernel_parameters(source, launch.function) if not ctype.endswith("*")}
    if kernel is not None and wanted - set(scalars) - {"error_host"}:
        scalars.update(host_values(kernel, target, seq_len))
    return emulate(source, launch, arrays, scalars)


def launch_arrays(launch: Launch, given: dict, seq_len: int) -> dict:
    """Every buffer argument of ``launch`` over ``seq_len`` steps, as :func:`run_launch` describes them."""
    arrays = {}
    for arg in launch.args:
        shape = arg.concrete_shape(seq_len)
        if arg.role is ArgRole.SCALAR:
            continue
        if arg.name in given:
            arrays[arg.name] = np.asarray(given[arg.name], arg.dtype).reshape(shape)
        elif arg.role is ArgRole.LENGTHS:
            arrays[arg.name] = np.full(shape, seq_len, arg.dtype)
        elif arg.role in (ArgRole.STATE, ArgRole.WORKSPACE, ArgRole.SYNC):
            arrays[arg.name] = np.zeros(shape, arg.dtype)
        else:
            arrays[arg.name] = (
                np.full(math.prod(shape) * np.dtype(arg.dtype).itemsize, 0xFF, np.uint8).view(arg.dtype).reshape(shape)
            )
    return arrays


def run_recurrent(layer, inputs: dict, timeout_us: int = TIMEOUT_US, stall_step: int = -1) -> tuple:
    """A CUDA ``layer``'s recurrent launch emulated on ``inputs`` as a caller passes them (``x``, ``W_ih``,
    ``b_ih``, the recurrent weights and params; initial states and ``lengths`` optional; see :func:`run_launch`),
    the projection ``xp`` from NumPy. Returns ``(out, [finals in signature order], error word)``."""
    launch = layer.signature.launch("recurrent")
    seq_len = int(np.shape(inputs["x"])[0])
    run = run_launch(
        layer.cuda_source,
        launch,
        {**inputs, "xp": projection(inputs, launch.arg("xp").dtype)},
        seq_len,
        timeout_us,
        stall_step,
        layer.kernel.func,
        layer.target,
    )
    written = [a.name for a in launch.args if a.role in (ArgRole.OUTPUT, ArgRole.FINAL)]
    return run.buffers[written[0]], [run.buffers[name] for name in written[1:]], run.error_word


def projection(inputs: dict, dtype: str) -> np.ndarray:
    """The input projection ``x W_ih^T + b_ih`` of a caller's inputs, in float64 rounded to ``dtype``."""
    x, w, b = (np.asarray(inputs[n], np.float64) for n in ("x", "W_ih", "b_ih"))
    return (x @ w.T + b).astype(dtype)

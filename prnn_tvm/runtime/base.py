"""Running a compiled layer: argument checks, device buffers, the two launches, barrier checks.

Shared by the layer :func:`prnn_tvm.compile_cell` returns and the one :func:`prnn_tvm.load`
returns from an exported library. This module imports only TVM's runtime and NumPy, so it
works under TVM's runtime-only import (``TVM_USE_RUNTIME_LIB=1``).

Call order (positional or by keyword): ``x, W_ih, b_ih``, the cell's recurrent weights
and per-unit params in declaration order, then the initial states (``h0``, ``c0``, ...;
zeros when omitted). ``recurrent`` takes the precomputed projection ``xp`` in place of
``x, W_ih, b_ih``. Arrays may be NumPy (copied to the device; NumPy comes back) or
anything with ``__dlpack__`` on the layer's device (wrapped without a copy; TVM tensors,
which speak DLPack, come back).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import tvm

from ..errors import BarrierTimeout, InputError, LaunchError
from ..target import ctas_per_sm, gpu_spec

DEFAULT_TIMEOUT_US = 50_000  # per barrier wait: generous against preemption, short against a hang


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a call needs to know about a compiled layer, as plain (JSON-able) data.

    ``shapes`` maps each weight and param to its shape; ``states`` names the recurrent
    states in kernel order; ``workspace``/``sync_words`` describe the scratch arguments the
    recurrent kernel takes after its outputs (None when it takes none); ``launch`` holds the
    grid (``ctas``, ``threads``, ``smem_bytes``, ``cooperative``, ``phases``,
    ``sync_counts``), and ``registers``/``static_smem_bytes`` what one thread and one CTA
    use, for the co-residency check before a cooperative launch.
    """

    cell: str
    arg_names: tuple
    batch: int
    hidden: int
    input_size: int
    proj_width: int
    shapes: dict
    states: tuple
    dtype: str = "float32"
    workspace: tuple | None = None
    workspace_dtype: str = "float32"
    sync_words: int | None = None
    launch: dict = field(default_factory=dict)
    registers: int | None = None
    static_smem_bytes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LaunchSpec:
        data = dict(data)
        data["arg_names"] = tuple(data["arg_names"])
        data["states"] = tuple(data["states"])
        data["shapes"] = {k: tuple(v) for k, v in data["shapes"].items()}
        if data.get("workspace") is not None:
            data["workspace"] = tuple(data["workspace"])
        return cls(**data)


def take_timeout(sync, stale=()) -> int | None:
    """After a launch: what the barrier's error word recorded (a step or barrier ordinal), or None.

    On a timeout the launch left the state inconsistent: zero it, and the buffers in
    ``stale`` (which may hold tags of the failed launch), so that the next launch is clean.
    """
    state = sync.numpy()
    if not state[0]:
        return None
    for buf in (sync, *stale):
        buf.copyfrom(np.zeros(tuple(int(d) for d in buf.shape), str(buf.dtype)))
    return int(state[0]) - 1


class RuntimeLayer:
    """A compiled layer's run-time half: a TVM runtime module with ``projection`` and
    ``recurrent`` functions, and the :class:`LaunchSpec` that says how to call them.

    ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` returns ``(out, (h_n, c_n, ...))`` with
    ``out`` of shape (T, batch, hidden). ``barrier_timeout_us`` bounds every grid-barrier
    wait (a timeout raises :class:`~prnn_tvm.errors.BarrierTimeout`); ``debug_stall_step``
    (tests only) makes block 0 skip its arrival at that step, forcing the timeout path.
    """

    def __init__(self, spec: LaunchSpec, module, is_cuda: bool, barrier_timeout_us: int = DEFAULT_TIMEOUT_US):
        self.spec, self.module, self._is_cuda = spec, module, is_cuda
        self.arg_names = list(spec.arg_names)
        self.input_size = spec.input_size
        self.barrier_timeout_us = barrier_timeout_us
        self.debug_stall_step = -1
        self._workspace = None
        self._sync = None

    @property
    def is_cuda(self) -> bool:
        return self._is_cuda

    @property
    def device(self) -> tvm.runtime.Device:
        return tvm.cuda(0) if self.is_cuda else tvm.cpu(0)

    # ------------------------------------------------------------------ calls
    def __call__(self, *args, **kwargs):
        """Run projection + recurrence; returns ``(out, final_states)``."""
        return self._run(self._prepare(self.arg_names, args, kwargs))

    def recurrent(self, xp, *args, **kwargs):
        """Run the recurrence on a precomputed input projection ``xp`` of shape (T, batch, slices*hidden)."""
        return self._run(self._prepare(["xp", *self.arg_names[3:]], (xp, *args), kwargs))

    def time(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> dict[str, float]:
        """Seconds per launch of each kernel (minimum over ``repeat`` runs of ``number`` launches).

        Takes the same arguments as a call; inputs are placed on the device once, outside
        the timed region. Returns ``{"projection": s, "recurrent": s}``.
        """
        launches, (out, _), _ = self._prepare(self.arg_names, args, kwargs)
        self._check_coresidency()
        dev = self.device
        times = {name: min(self.module.time_evaluator(name, dev, number=number, repeat=repeat)(*a).results)
                 for name, a in launches}
        self._check_barrier(int(out.shape[0]))  # a timed-out run would make the figures meaningless
        return times

    # ------------------------------------------------------------------ internals
    def _prepare(self, names: list[str], args: tuple, kwargs: dict):
        """Check and place every argument; return (launches, (out, finals), all inputs were NumPy)."""
        spec, B, H = self.spec, self.spec.batch, self.spec.hidden
        n_required = len(names) - len(spec.states)
        values = _bind_arguments(names, args, kwargs, first_optional=n_required)
        dev = self.device
        first = names[0]
        T = _seq_len(values[first], first)
        shapes = {"x": (T, B, spec.input_size), "W_ih": (spec.proj_width, spec.input_size),
                  "b_ih": (spec.proj_width,), "xp": (T, B, spec.proj_width), **spec.shapes}
        tensors, numpy_all = {}, True
        for name in names:
            given = values.get(name)
            value = given if given is not None else np.zeros((B, H), spec.dtype)  # omitted initial state
            tensors[name], from_numpy = self._tensor(name, value, shapes.get(name, (B, H)), dev)
            numpy_all &= from_numpy
        launches = []
        if first == "x":
            tensors["xp"] = tvm.runtime.empty(shapes["xp"], spec.dtype, dev)
            launches.append(("projection", [tensors[n] for n in ("x", "W_ih", "b_ih", "xp")]))
        out = tvm.runtime.empty((T, B, H), spec.dtype, dev)
        finals = [tvm.runtime.empty((B, H), spec.dtype, dev) for _ in spec.states]
        tail = names[3:] if first == "x" else names[1:]
        rec = [tensors["xp"], *(tensors[n] for n in tail), out, *finals]
        if spec.workspace is not None:
            if self._workspace is None:
                self._workspace = tvm.runtime.tensor(np.zeros(spec.workspace, spec.workspace_dtype), dev)
            rec.append(self._workspace)
        if spec.sync_words is not None:
            if self._sync is None:
                self._sync = tvm.runtime.tensor(np.zeros(spec.sync_words, np.uint32), dev)
            rec += [self._sync, self.barrier_timeout_us, self.debug_stall_step]
        launches.append(("recurrent", rec))
        return launches, (out, finals), numpy_all

    def _run(self, prepared):
        launches, (out, finals), numpy_all = prepared
        self._check_coresidency()
        for name, args in launches:
            self._launch(name, args)
        self._check_barrier(int(out.shape[0]))
        if numpy_all:
            return out.numpy(), tuple(f.numpy() for f in finals)
        return out, tuple(finals)

    def _launch(self, name: str, args: list) -> None:
        try:
            self.module[name](*args)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise LaunchError(f"launching '{name}' of {self.spec.cell} failed: {err}") from err

    def _check_barrier(self, seq_len: int) -> None:
        """Raise if a barrier wait timed out in the last launch (and reset the barrier state)."""
        if self._sync is None:
            return
        recorded = take_timeout(self._sync, stale=[self._workspace])
        if recorded is not None:
            raise BarrierTimeout(
                f"{self.spec.cell}: the grid synchronization {self._where(recorded)} of {seq_len} "
                f"timed out ({self.barrier_timeout_us} us per wait): some thread block never arrived. The outputs "
                "of this call are invalid; the barrier state was reset and the next call starts clean.")

    def _where(self, recorded: int) -> str:
        """The error word records a step (``tags``) or a barrier ordinal, ``phases`` per step."""
        phases = self.spec.launch.get("phases", 1)
        if self.spec.launch.get("sync_counts") == "steps" or phases == 1:
            return f"after step {recorded}"
        step, phase = divmod(recorded, phases)
        return f"after phase {phase} of step {step}"

    def _check_coresidency(self) -> None:
        """Refuse a grid that cannot be co-resident on this GPU (a cooperative launch would fail or hang)."""
        launch = self.spec.launch
        if not self.is_cuda or not launch.get("cooperative"):
            return
        gpu = gpu_spec()
        regs = self.spec.registers
        smem = launch["smem_bytes"] + (self.spec.static_smem_bytes or 0)
        fit = ctas_per_sm(launch["threads"], regs, smem, gpu) * gpu.sms
        if launch["ctas"] > fit:
            raise LaunchError(f"the grid of {launch['ctas']} CTAs cannot be co-resident on this "
                              f"{gpu.device_name or gpu.arch}: {fit} fit ({gpu.sms} SMs at {launch['threads']} "
                              f"threads, {regs} registers, {smem} bytes of shared memory each); "
                              "recompile for this GPU")

    def _tensor(self, name: str, value, shape: tuple, dev) -> tuple:
        """(device tensor, came from NumPy) for one argument, after checking it."""
        dtype = self.spec.dtype
        if isinstance(value, np.ndarray):
            _check(name, tuple(value.shape), str(value.dtype), shape, dtype)
            return tvm.runtime.tensor(np.ascontiguousarray(value), dev), True
        if isinstance(value, tvm.runtime.Tensor):
            tensor = value
        elif hasattr(value, "__dlpack__"):
            try:
                tensor = tvm.runtime.from_dlpack(value)
            except Exception as err:
                raise InputError(f"{name}: cannot be wrapped through DLPack ({err}); pass a contiguous, "
                                 "64-byte aligned tensor") from err
        else:
            raise InputError(f"{name} must be a NumPy array or a DLPack tensor, got {type(value).__name__}")
        _check(name, tuple(int(d) for d in tensor.shape), str(tensor.dtype), shape, dtype)
        if not tensor.is_contiguous():
            raise InputError(f"{name} is not contiguous; pass a compact (row-major) tensor")
        if (tensor.device.dlpack_device_type(), tensor.device.index) != (dev.dlpack_device_type(), dev.index):
            raise InputError(f"{name} is on {tensor.device}, the layer runs on {dev}")
        return tensor, False


def _seq_len(value, name: str) -> int:
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) != 3:
        raise InputError(f"{name} must be a 3-d array (T, batch, features), got {type(value).__name__} "
                         f"of shape {shape}")
    T = int(shape[0])
    if T < 1:
        raise InputError(f"{name} has {T} timesteps; a sequence needs at least one")
    return T


def _check(name: str, got_shape: tuple, got_dtype: str, shape: tuple, dtype: str) -> None:
    if got_shape != tuple(shape):
        raise InputError(f"{name} has shape {got_shape}, expected {tuple(shape)}")
    if got_dtype != dtype:
        raise InputError(f"{name} has dtype {got_dtype}, expected {dtype}")


def _bind_arguments(names: list[str], args: tuple, kwargs: dict, first_optional: int) -> dict:
    """Map positional and keyword arguments onto ``names`` like a Python signature would."""
    if len(args) > len(names):
        raise InputError(f"takes at most {len(names)} arguments ({', '.join(names)}), got {len(args)}")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise InputError(f"unknown argument '{key}'; arguments are {', '.join(names)}")
        if key in values:
            raise InputError(f"argument '{key}' given twice")
        values[key] = value
    missing = [n for n in names[:first_optional] if values.get(n) is None]
    if missing:
        raise InputError(f"missing argument(s): {', '.join(missing)}")
    return values


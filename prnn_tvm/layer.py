"""A compiled layer at run time: argument checking, device buffers, the two launches.

Call order (positional or by keyword): ``x, W_ih, b_ih``, the cell's recurrent weights
and per-unit params in declaration order, then the initial states (``h0``, ``c0``, ...;
zeros when omitted). ``Layer.recurrent`` takes the precomputed projection ``xp`` in
place of ``x, W_ih, b_ih``. Arrays may be NumPy (copied to the device; NumPy comes back)
or anything with ``__dlpack__`` on the layer's device (wrapped without a copy; TVM
tensors, which speak DLPack, come back).
"""

from __future__ import annotations

import numpy as np
import tvm

from .barrier import DEFAULT_TIMEOUT_US, BarrierTimeout, take_timeout
from .errors import InputError, LaunchError, PrnnError
from .kernel import Kernel
from .plan import CellPlan
from .reference import layer_arg_names
from .report import CompileReport
from .target import GpuSpec, ctas_per_sm, gpu_spec, local_gpu


class Layer:
    """A recurrent layer compiled for one cell, batch, hidden size and target.

    Use :func:`prnn_tvm.compile_cell` to make one. ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)``
    returns ``(out, (h_n, c_n, ...))`` with ``out`` of shape (T, batch, hidden).

    ``barrier_timeout_us`` bounds every grid-barrier wait (a timeout raises
    :class:`~prnn_tvm.barrier.BarrierTimeout`); ``debug_stall_step`` (tests only) makes block 0
    skip its arrival at that step, forcing the timeout path.
    """

    def __init__(self, plan: CellPlan, kernel: Kernel, module, input_size: int, target: tvm.target.Target,
                 gpu: GpuSpec | None, report: CompileReport, source: str | None):
        self.plan, self.kernel, self.module = plan, kernel, module
        self.input_size, self.target, self.gpu = input_size, target, gpu
        self.report, self.cuda_source = report, source
        self.arg_names = layer_arg_names(plan)
        self.barrier_timeout_us = DEFAULT_TIMEOUT_US
        self.debug_stall_step = -1
        self._workspace = None
        self._sync = None

    @property
    def is_cuda(self) -> bool:
        return self.target.kind.name == "cuda"

    @property
    def device(self) -> tvm.runtime.Device:
        if not self.is_cuda:
            return tvm.cpu(0)
        if local_gpu() is None or not self.module.imports or self.module.imports[0].kind != "cuda":
            raise PrnnError("this layer was compiled for CUDA on a machine without a usable GPU, so it holds "
                            "CUDA source only; compile it where the GPU is (or use target='llvm' to run on the CPU)")
        return tvm.cuda(0)

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
    @property
    def _n_proj(self) -> int:
        return self.plan.input.slices * self.plan.hidden

    def _prepare(self, names: list[str], args: tuple, kwargs: dict):
        """Check and place every argument; return (launches, (out, finals), all inputs were NumPy)."""
        plan, B, H = self.plan, self.plan.batch, self.plan.hidden
        n_required = len(names) - len(plan.states)
        values = _bind_arguments(names, args, kwargs, first_optional=n_required)
        dev = self.device
        first = names[0]
        T = self._seq_len(values[first], first)
        shapes = {"x": (T, B, self.input_size), "W_ih": (self._n_proj, self.input_size), "b_ih": (self._n_proj,),
                  "xp": (T, B, self._n_proj)}
        shapes.update({w.name: (w.slices * H, H) for w in plan.weights})
        shapes.update({p.name: (p.slices * H,) for p in plan.params})
        tensors, numpy_all = {}, True
        for name in names:
            given = values.get(name)
            value = given if given is not None else np.zeros((B, H), plan.dtype)  # omitted initial state
            tensors[name], from_numpy = self._tensor(name, value, shapes.get(name, (B, H)), dev)
            numpy_all &= from_numpy
        launches = []
        if first == "x":
            tensors["xp"] = tvm.runtime.empty(shapes["xp"], plan.dtype, dev)
            launches.append(("projection", [tensors[n] for n in ("x", "W_ih", "b_ih", "xp")]))
        out = tvm.runtime.empty((T, B, H), plan.dtype, dev)
        finals = [tvm.runtime.empty((B, H), plan.dtype, dev) for _ in plan.states]
        tail = names[3:] if first == "x" else names[1:]
        rec = [tensors["xp"], *(tensors[n] for n in tail), out, *finals]
        if self.kernel.workspace is not None:
            if self._workspace is None:
                self._workspace = tvm.runtime.tensor(
                    np.zeros(self.kernel.workspace, self.kernel.workspace_dtype), dev)
            rec.append(self._workspace)
        if self.kernel.sync_words is not None:
            if self._sync is None:
                self._sync = tvm.runtime.tensor(np.zeros(self.kernel.sync_words, np.uint32), dev)
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
            raise LaunchError(f"launching '{name}' of {self.plan.cell.name} failed: {err}") from err

    def _check_barrier(self, seq_len: int) -> None:
        """Raise if a barrier wait timed out in the last launch (and reset the barrier state)."""
        if self._sync is None:
            return
        recorded = take_timeout(self._sync, stale=[self._workspace])
        if recorded is not None:
            raise BarrierTimeout(
                f"{self.plan.cell.name}: the grid synchronization {self._where(recorded)} of {seq_len} "
                f"timed out ({self.barrier_timeout_us} us per wait): some thread block never arrived. The outputs "
                "of this call are invalid; the barrier state was reset and the next call starts clean.")

    def _where(self, recorded: int) -> str:
        """The error word records a step (``tags``) or a barrier ordinal, ``phases`` per step."""
        phases = self.kernel.launch.get("phases", 1)
        if self.kernel.launch.get("sync_counts") == "steps" or phases == 1:
            return f"after step {recorded}"
        step, phase = divmod(recorded, phases)
        return f"after phase {phase} of step {step}"

    def _check_coresidency(self) -> None:
        """Refuse a grid that cannot be co-resident on this GPU (a cooperative launch would fail or hang)."""
        launch = self.kernel.launch
        if not self.is_cuda or not launch.get("cooperative"):
            return
        gpu = gpu_spec()
        regs = self.report.registers or launch["geometry"].regs_estimate
        smem = launch["smem_bytes"] + (self.report.static_smem_bytes or 0)
        fit = ctas_per_sm(launch["threads"], regs, smem, gpu) * gpu.sms
        if launch["ctas"] > fit:
            raise LaunchError(f"the grid of {launch['ctas']} CTAs cannot be co-resident on this "
                              f"{gpu.device_name or gpu.arch}: {fit} fit ({gpu.sms} SMs at {launch['threads']} "
                              f"threads, {regs} registers, {smem} bytes of shared memory each); "
                              "recompile for this GPU")

    def _seq_len(self, value, name: str) -> int:
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) != 3:
            raise InputError(f"{name} must be a 3-d array (T, batch, features), got {type(value).__name__} "
                             f"of shape {shape}")
        T = int(shape[0])
        if T < 1:
            raise InputError(f"{name} has {T} timesteps; a sequence needs at least one")
        return T

    def _tensor(self, name: str, value, shape: tuple, dev) -> tuple:
        """(device tensor, came from NumPy) for one argument, after checking it."""
        dtype = self.plan.dtype
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
        if (tensor.device.dlpack_device_type(), tensor.device.index) != (dev.dlpack_device_type(), dev.index):
            raise InputError(f"{name} is on {tensor.device}, the layer runs on {dev}")
        return tensor, False


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

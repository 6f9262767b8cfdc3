"""Running a compiled layer: bind the arguments, check the grid fits, launch, check the barrier.

Shared by the layer :func:`prnn_tvm.compile_cell` returns and the one :func:`prnn_tvm.load`
returns from an exported library. Both describe themselves with a
:class:`~prnn_tvm.signature.Signature` (a sequence of launches); this module runs one.
It imports only TVM's runtime and NumPy, so it works under TVM's runtime-only import
(``TVM_USE_RUNTIME_LIB=1``).

Call order (positional or by keyword): the signature's inputs, ``x, W_ih, b_ih``, the
cell's recurrent weights and per-unit params in declaration order, then the initial
states (``h0``, ``c0``, ...; zeros when omitted). ``recurrent`` enters the layer at its
recurrent launch: it takes the precomputed projection ``xp`` in place of ``x, W_ih, b_ih``.
Arrays may be NumPy (copied to the device; NumPy comes back) or anything with
``__dlpack__`` on the layer's device (wrapped without a copy; TVM tensors, which speak
DLPack, come back).
"""

from __future__ import annotations

import numpy as np
import tvm

from ..errors import BarrierTimeout, LaunchError
from ..signature import Arg, ArgRole, Signature
from ..target import ctas_per_sm, gpu_spec
from .binding import COPY, BoundCall, bind

DEFAULT_TIMEOUT_US = 50_000  # per barrier wait: generous against preemption, short against a hang


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
    """A compiled layer's run-time half: a TVM runtime module holding the signature's functions,
    and the :class:`~prnn_tvm.signature.Signature` that says how to call them.

    ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` returns ``(out, (h_n, c_n, ...))`` with
    ``out`` of shape (T, batch, hidden). ``barrier_timeout_us`` bounds every grid-barrier
    wait (a timeout raises :class:`~prnn_tvm.errors.BarrierTimeout`); ``debug_stall_step``
    (tests only) makes block 0 skip its arrival at that step, forcing the timeout path.
    """

    def __init__(self, signature: Signature, module, is_cuda: bool, barrier_timeout_us: int = DEFAULT_TIMEOUT_US):
        self.signature, self.module, self._is_cuda = signature, module, is_cuda
        self.arg_names = list(signature.arg_names)
        self.input_size = signature.input_size
        self.barrier_timeout_us = barrier_timeout_us
        self.debug_stall_step = -1
        self._owned: dict[str, tvm.runtime.Tensor] = {}  # workspace and barrier state, by argument name

    @property
    def is_cuda(self) -> bool:
        return self._is_cuda

    @property
    def device(self) -> tvm.runtime.Device:
        return tvm.cuda(0) if self.is_cuda else tvm.cpu(0)

    # ------------------------------------------------------------------ calls
    def __call__(self, *args, **kwargs):
        """Run every launch; returns ``(out, final_states)``."""
        return self._run(self.bind(*args, **kwargs))

    def recurrent(self, xp, *args, **kwargs):
        """Run the recurrence on a precomputed input projection ``xp`` of shape (T, batch, slices*hidden)."""
        return self._run(self._bind(self.signature.starting_at("recurrent"), (xp, *args), kwargs))

    def bind(self, *args, **kwargs) -> BoundCall:
        """Check and place a call's arguments without running it (``BoundCall.launches`` can then be
        launched again and again, e.g. to time the kernels alone)."""
        return self._bind(self.signature, args, kwargs)

    def time(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> dict[str, float]:
        """Seconds per launch of each kernel (minimum over ``repeat`` runs of ``number`` launches).

        Takes the same arguments as a call; inputs are placed on the device once, outside
        the timed region. Returns ``{function name: seconds}``, one entry per launch of the
        layer's signature.
        """
        call = self.bind(*args, **kwargs)
        self._check_coresidency()
        dev = self.device
        times: dict[str, float] = {}
        for name, a in call.launches:  # a sequence run in chunks: the sum over its chunks
            if name == COPY:
                continue
            timer = self.module.time_evaluator(name, dev, number=number, repeat=repeat)
            times[name] = times.get(name, 0.0) + min(timer(*a).results)
        self._check_barrier(call.seq_len)  # a timed-out run would make the figures meaningless
        return times

    # ------------------------------------------------------------------ internals
    def _bind(self, signature: Signature, args: tuple, kwargs: dict) -> BoundCall:
        scalars = {"timeout_us": self.barrier_timeout_us, "stall_step": self.debug_stall_step}
        return bind(signature, args, kwargs, self.device, self._owned_buffer, scalars)

    def _owned_buffer(self, arg: Arg) -> tvm.runtime.Tensor:
        """The layer's workspace or barrier state: zeros at first use, kept across calls."""
        if arg.name not in self._owned:
            self._owned[arg.name] = tvm.runtime.tensor(np.zeros(arg.shape, arg.dtype), self.device)
        return self._owned[arg.name]

    def _run(self, call: BoundCall):
        self._check_coresidency()
        for name, args in call.launches:
            if name == COPY:
                args[0].copyfrom(args[1])
            else:
                self._launch(name, args)
        self._check_barrier(call.seq_len, call.chunks)
        out, *finals = call.outputs
        if call.from_numpy:
            return out.numpy(), tuple(f.numpy() for f in finals)
        return out, tuple(finals)

    def _launch(self, name: str, args: list) -> None:
        try:
            self.module[name](*args)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise LaunchError(f"launching '{name}' of {self.signature.cell} failed: {err}") from err

    def _check_barrier(self, seq_len: int, chunks: int = 1) -> None:
        """Raise if a barrier wait timed out in the last call (and reset the barrier state)."""
        for launch in self.signature.launches:
            sync = next((a for a in launch.args if a.role is ArgRole.SYNC), None)
            if sync is None or sync.name not in self._owned:
                continue
            stale = [self._owned[a.name] for a in launch.args if a.role is ArgRole.WORKSPACE and a.name in self._owned]
            recorded = take_timeout(self._owned[sync.name], stale=stale)
            if recorded is not None:
                within = " (counted within its chunk of the sequence)" if chunks > 1 else ""
                raise BarrierTimeout(
                    f"{self.signature.cell}: the grid synchronization {launch.sync.where(recorded)} of {seq_len}"
                    f"{within} timed out ({self.barrier_timeout_us} us per wait): some thread block never arrived. "
                    "The outputs of this call are invalid; the barrier state was reset and the next call starts "
                    "clean.")

    def _check_coresidency(self) -> None:
        """Refuse a grid that cannot be co-resident on this GPU (a cooperative launch would fail or hang)."""
        if not self.is_cuda:
            return
        for launch in self.signature.launches:
            grid = launch.grid
            if grid is None or not grid.cooperative:
                continue
            gpu = gpu_spec()
            smem = grid.dynamic_smem_bytes + grid.static_smem_bytes
            fit = ctas_per_sm(grid.threads, grid.registers, smem, gpu) * gpu.sms
            if grid.ctas > fit:
                raise LaunchError(f"the grid of {grid.ctas} CTAs cannot be co-resident on this "
                                  f"{gpu.device_name or gpu.arch}: {fit} fit ({gpu.sms} SMs at {grid.threads} "
                                  f"threads, {grid.registers} registers, {smem} bytes of shared memory each); "
                                  "recompile for this GPU")

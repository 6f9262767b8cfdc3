"""Running a compiled layer: bind the arguments, check the grid fits, launch, report barrier timeouts.

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

Nothing in a call waits for the GPU unless the caller asked for NumPy: a barrier timeout
reaches the host through a word of page-locked memory that the kernel writes
(:class:`HostWord`), read at the start of every call and by :meth:`RuntimeLayer.check`.
"""

from __future__ import annotations

import ctypes

import numpy as np
import tvm
import tvm_ffi

from ..errors import BarrierTimeout, ConfigError, LaunchError, UnsupportedError
from ..signature import ArgRole, Signature
from ..target import gpu_spec, in_clusters, resident_ctas, smem_launch_problem
from .binding import COPY, BoundCall, bind
from .buffers import KeptBuffers

DEFAULT_TIMEOUT_US = 50_000  # per barrier wait: generous against preemption, short against a hang
CUDA_HOST = 3  # DLPack's device type of page-locked host memory (cudaMallocHost)


def take_timeout(sync, stale=()) -> int | None:
    """After a launch: what the barrier's error word recorded (a step or barrier ordinal), or None.

    A blocking read of device memory, for kernels without a host error word (the barrier
    probe, layers exported before it existed). On a timeout the launch left the state
    inconsistent: zero it, and the buffers in ``stale`` (which may hold tags of the failed
    launch), so that the next launch is clean.
    """
    state = sync.numpy()
    if not state[0]:
        return None
    for buf in (sync, *stale):
        buf.copyfrom(np.zeros(tuple(int(d) for d in buf.shape), str(buf.dtype)))
    return int(state[0]) - 1


class HostWord:
    """A uint32 of page-locked host memory that kernels write through its address (one address on
    both sides under CUDA's unified addressing) and the host reads without synchronizing."""

    def __init__(self, device: tvm.runtime.Device):
        self._memory = tvm.runtime.empty((1,), "uint32", tvm.runtime.device(CUDA_HOST, device.index))
        self.address = self._memory.data_ptr()
        self._word = ctypes.c_uint32.from_address(self.address)
        self._word.value = 0

    def read(self) -> int:
        return self._word.value

    def clear(self) -> None:
        self._word.value = 0


def host_array(shape: tuple, dtype: str, device: tvm.runtime.Device) -> tuple:
    """Page-locked host memory of ``shape`` and ``dtype``, zeroed, that kernels on ``device`` reach at the same
    address (unified addressing): ``(the TVM tensor that owns it: keep it, a NumPy view of it)``."""
    memory = tvm.runtime.empty(shape, dtype, tvm.runtime.device(CUDA_HOST, device.index))
    count = int(np.prod(shape))
    view = np.ctypeslib.as_array((ctypes.c_uint8 * (count * np.dtype(dtype).itemsize)).from_address(memory.data_ptr()))
    view = view.view(dtype).reshape(shape)
    view[...] = 0
    return memory, view


class RuntimeLayer:
    """A compiled layer's run-time half: a TVM runtime module holding the signature's functions,
    and the :class:`~prnn_tvm.signature.Signature` that says how to call them.

    ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` returns ``(out, (h_n, c_n, ...))`` with
    ``out`` of shape (T, batch, hidden). Kernels run on TVM's current stream of the device
    (``tvm_ffi.use_raw_stream``); a call with NumPy arrays waits for them, a call with device
    tensors does not.

    Barrier timeouts: ``barrier_timeout_us`` bounds every grid-barrier wait. A launch that
    timed out fills its outputs with NaN and sets the layer's host error word; the call that
    made it raises :class:`~prnn_tvm.errors.BarrierTimeout` when it waits for its results
    (NumPy), otherwise the next call or :meth:`check` does. ``debug_stall_step`` (tests only)
    makes block 0 skip its arrival at that step, forcing the timeout path.

    Concurrency: launches on different streams use different workspaces and barrier states
    (:meth:`launch_state`), so calls on several streams may be in flight at once. A call's own buffers (the
    input projection ``xp``, scratch sequences) are kept per host thread and stream and reused by the next
    call of the same length (:mod:`~prnn_tvm.runtime.buffers`): a :class:`BoundCall` of :meth:`bind` launches
    correctly as long as no other call of that thread and stream runs between its launches.
    """

    def __init__(self, signature: Signature, module, is_cuda: bool, barrier_timeout_us: int = DEFAULT_TIMEOUT_US):
        self.signature, self.module, self._is_cuda = signature, module, is_cuda
        self.arg_names = list(signature.arg_names)
        self.input_size = signature.input_size
        self._scalars: dict | None = None  # made at the first :meth:`scalars`, again after a value changes
        self.barrier_timeout_us = barrier_timeout_us
        self.debug_stall_step = -1
        self._states: dict[int, dict] = {}  # per stream: workspace and barrier state, by argument name
        self._kept = KeptBuffers()  # per host thread and stream: a call's intermediates, reused by the next
        self._error: HostWord | None = None
        self._coresident = False  # checked once: the GPU does not change under a process
        self._grids_that_fit: dict[str, int] = {}
        owned = [a for x in signature.launches for a in x.args if a.role.owned]
        self._owned_args = {a.name: a for a in owned}
        scalars = {a.name for x in signature.launches for a in x.args if a.role is ArgRole.SCALAR}
        # kernels that predate the host error word report a timeout only in device memory
        self._blocking_check = any(a.role is ArgRole.SYNC for a in owned) and "error_host" not in scalars

    @property
    def barrier_timeout_us(self) -> int:
        """Microseconds a grid-barrier wait gives up after (the kernels take it as a 32-bit integer)."""
        return self._barrier_timeout_us

    @barrier_timeout_us.setter
    def barrier_timeout_us(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 2**31 - 1:
            raise ConfigError(
                f"barrier_timeout_us must be a whole number of microseconds from 1 to {2**31 - 1}, got "
                f"{value!r} (the kernels read it as unsigned: a negative one would never time out)"
            )
        self._barrier_timeout_us = value
        self._scalars = None
        for follower in self._timeout_followers():
            follower.barrier_timeout_us = value

    def _timeout_followers(self) -> list:
        """The runtimes whose barrier timeout follows this one's when it is set (none here)."""
        return []

    @property
    def debug_stall_step(self) -> int:
        """Tests only: the step at which block 0 skips its arrival at the grid barrier (-1: none)."""
        return self._debug_stall_step

    @debug_stall_step.setter
    def debug_stall_step(self, value: int) -> None:
        self._debug_stall_step = value
        self._scalars = None

    def __reduce__(self):
        raise UnsupportedError(
            f"a compiled layer of '{self.signature.cell}' cannot be pickled or copied: it holds TVM "
            "modules, which do not serialize; write it with prnn_tvm.export(layer, 'layer.so') and "
            "read it with prnn_tvm.load, or keep the arguments of compile_cell and compile again"
        )

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
        return self._run(self.bind_recurrent(xp, *args, **kwargs))

    def bind(self, *args, **kwargs) -> BoundCall:
        """Check and place a call's arguments without running it (``BoundCall.launches`` can then be
        launched again and again, e.g. to time the kernels alone)."""
        return self._bind(self.signature, args, kwargs)

    def function(self, name: str):
        """The module's function ``name``, to be called with the arguments of its launch in the
        signature's order; the grid's co-residency on this GPU is checked first (once)."""
        self._check_coresidency()
        return self.module[name]

    def bind_recurrent(self, xp, *args, **kwargs) -> BoundCall:
        """:meth:`bind` for a call of :meth:`recurrent` (the recurrent kernel alone)."""
        return self._bind(self.signature.starting_at("recurrent"), (xp, *args), kwargs)

    def check(self, wait: bool = True) -> None:
        """Raise :class:`~prnn_tvm.errors.BarrierTimeout` if a launch of this layer timed out since the
        last check; ``wait``: first wait for the streams this layer launched on. After raising, the
        layer's workspaces and barrier states are fresh: the next call starts clean."""
        self._take_timeout(wait)

    def launch_state(self, stream: int = 0, zeros=None) -> dict:
        """The workspace and barrier state that launches on ``stream`` use: ``{argument name: buffer}``,
        zeros at first use, then kept (so that two streams never share one). ``zeros(arg)`` makes a zeroed
        buffer for an argument (default: a TVM tensor on the layer's device)."""
        state = self._states.get(stream)
        if state is None:
            state = self._states[stream] = self.new_launch_state(zeros)
        return state

    def new_launch_state(self, zeros=None) -> dict:
        """A fresh workspace and barrier state that belongs to the caller (e.g. one captured in a CUDA graph,
        which must outlive the graph): ``{argument name: buffer}``."""
        zeros = zeros or (lambda a: tvm.runtime.tensor(np.zeros(a.shape, a.dtype), self.device))
        return {name: zeros(arg) for name, arg in self._owned_args.items()}

    @property
    def error_address(self) -> int:
        """The address of the layer's host error word, which timed-out launches write (0 on the CPU)."""
        if not self.is_cuda or not self._owned_args or self._blocking_check:
            return 0
        if self._error is None:
            self._error = HostWord(self.device)
        return self._error.address

    def scalars(self) -> dict:
        """The scalar arguments the layer passes its kernels, by name: the same dict until one of them changes (a
        :class:`~prnn_tvm.runtime.launcher.Launcher` places them again only when it gets another); do not modify it."""
        found = self._scalars
        if found is None:
            found = self._scalars = {
                "timeout_us": self.barrier_timeout_us,
                "stall_step": self.debug_stall_step,
                "error_host": self.error_address,
            }
        return found

    def time(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> dict[str, float]:
        """Seconds per launch of each kernel (minimum over ``repeat`` runs of ``number`` launches).

        Takes the same arguments as a call; inputs are placed on the device once, outside
        the timed region. Returns ``{function name: seconds}``, one entry per launch of the
        layer's signature.
        """
        self.check(wait=False)
        call = self.bind(*args, **kwargs)
        self._check_coresidency()
        dev = self.device
        times: dict[str, float] = {}
        for name, a in call.launches:  # a sequence run in chunks: the sum over its chunks
            if name == COPY:
                continue
            timer = self.module.time_evaluator(name, dev, number=number, repeat=repeat)
            times[name] = times.get(name, 0.0) + min(timer(*a).results)
        self._after(call)  # a timed-out run would make the figures meaningless
        return times

    # ------------------------------------------------------------------ internals
    def _bind(self, signature: Signature, args: tuple, kwargs: dict) -> BoundCall:
        stream = tvm_ffi.get_raw_stream(self.device) if self.is_cuda else 0
        state = self.launch_state(stream)
        kept = self._kept.on(stream, self.device)
        return bind(signature, args, kwargs, self.device, lambda a: state[a.name], self.scalars(), kept)

    def _run(self, call: BoundCall):
        self.check(wait=False)  # an earlier launch's timeout is raised before this one starts
        self._check_coresidency()
        for name, args in call.launches:
            if name == COPY:
                args[0].copyfrom(args[1])
            else:
                self._launch(name, args)
        out, *finals = call.outputs
        if call.from_numpy:
            out, finals = out.numpy(), [f.numpy() for f in finals]
            self._after(call)
            return out, tuple(finals)
        if self._blocking_check:
            self._after(call)
        return out, tuple(finals)

    def _launch(self, name: str, args: list) -> None:
        try:
            self.module[name](*args)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise self.launch_error(name, err) from err

    def launch_error(self, name: str, err: Exception) -> LaunchError:
        """The error for a launch of ``name`` that TVM refused with ``err`` (its text kept)."""
        return LaunchError(f"launching '{name}' of {self.signature.cell} failed: {err}")

    def _take_timeout(self, wait: bool, call: BoundCall | None = None) -> None:
        """Raise (and reset every launch state) if the host error word is set; ``call``: the call whose
        launches just finished, for the message."""
        if self._error is None:
            return
        if wait:
            self._wait()
        recorded = self._error.read()
        if not recorded:
            return
        self._wait()  # nothing of this layer may still run on the states about to be dropped
        self._states.clear()
        self._error.clear()
        self._raise_timeout(recorded - 1, *((call.seq_len, call.chunks) if call else ()))

    def _after(self, call: BoundCall) -> None:
        """Once a call's launches have finished: raise if one timed out."""
        if not self._blocking_check:
            self._take_timeout(True, call)
            return
        for launch in self.signature.launches:  # an older kernel: its error word is in device memory
            sync = next((a for a in launch.args if a.role is ArgRole.SYNC), None)
            if sync is None:
                continue
            state = self._states.get(tvm_ffi.get_raw_stream(self.device), {})
            stale = [state[a.name] for a in launch.args if a.role is ArgRole.WORKSPACE]
            recorded = take_timeout(state[sync.name], stale=stale)
            if recorded is not None:
                self._raise_timeout(recorded, call.seq_len, call.chunks)

    def _wait(self) -> None:
        """Wait for every stream this layer launched on."""
        for stream in self._states:
            self.device.sync(stream)

    def _raise_timeout(self, recorded: int, seq_len: int | None = None, chunks: int = 1) -> None:
        launch = next(x for x in self.signature.launches if x.sync is not None)
        of = f" of {seq_len}" if seq_len else ""
        within = " (counted within its chunk of the sequence)" if chunks > 1 else ""
        outputs = "are invalid" if self._blocking_check else "were filled with NaN"  # older kernels do not fill
        raise BarrierTimeout(
            f"{self.signature.cell}: the grid synchronization {launch.sync.where(recorded)}{of}{within} timed out "
            f"({self.barrier_timeout_us} us per wait): some thread block never arrived. The outputs of that call "
            f"{outputs}; the barrier state was reset and the next call starts clean."
        )

    def grids_that_fit(self, function: str = "recurrent", gpu=None) -> int:
        """How many grids of launch ``function`` the GPU (default: this one) holds resident at once, each
        CTA with its registers and shared memory: two launches on two streams run side by side only where
        this is at least 2 (else the second waits for SMs)."""
        if gpu is None and function in self._grids_that_fit:
            return self._grids_that_fit[function]
        grid = self.signature.launch(function).grid
        fit = resident_ctas(grid, gpu or gpu_spec()) // grid.ctas
        if gpu is None:  # this GPU's: worked out once
            self._grids_that_fit[function] = fit
        return fit

    def _check_coresidency(self) -> None:
        """Refuse a grid that cannot be co-resident on this GPU (a cooperative launch would fail or hang)."""
        if not self.is_cuda or self._coresident:
            return
        for launch in self.signature.launches:
            grid = launch.grid
            problem = grid and smem_launch_problem(grid.dynamic_smem_bytes, grid.static_smem_bytes)
            if problem:  # templates size their memory to avoid this (target.launchable_smem): a template bug
                raise LaunchError(f"{launch.function} of {self.signature.cell} cannot launch: {problem}")
            if grid is None or not grid.cooperative:
                continue
            gpu = gpu_spec()
            fit = resident_ctas(grid, gpu)
            if grid.ctas > fit:
                raise LaunchError(
                    f"the grid of {grid.ctas} CTAs{in_clusters(grid)} cannot be co-resident on this "
                    f"{gpu.device_name or gpu.arch}: {fit} fit ({gpu.sms} SMs at {grid.threads} "
                    f"threads, {grid.registers} registers, {grid.smem_bytes} bytes of shared memory "
                    "each); recompile for this GPU"
                )
        self._coresident = True

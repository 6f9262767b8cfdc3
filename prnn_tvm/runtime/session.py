"""Resident sessions: a layer's persistent kernel launched once, serving one timestep per request.

A session (``layer.session()``, or ``prnn_tvm.torch`` modules' ``session()``) launches the layer's recurrent
kernel in session mode on a stream of its own (``schedules/session.py``). It keeps the weights in registers and the
states on chip between steps; each step it takes the step's raw input x_t, projects it itself (``W_ih`` and
``b_ih`` read from global memory) and stores every new state tagged. Two transports, one per launch (a step of the
other kind closes the running launch and relaunches in its own):

- host (:meth:`Session.step`, NumPy): no CUDA call per step. The host writes x_t as tagged 64-bit words into
  page-locked memory, CTA 0 of the resident kernel relays them into its device mailbox, the kernel stores the new
  states tagged into page-locked host memory, and the host spins (bounded) until every word carries the step's tag.
- device (:meth:`Session.post`, GPU tensors): two small launches on the caller's stream, no host synchronization:
  ``session_publish`` tags x_t into the mailbox; ``session_collect`` waits for the new states (bounded) and writes
  them to the caller's buffer. A step can therefore sit between other kernels of the caller's stream and inside a
  CUDA graph (each replay is the next step: the step count lives on the GPU).

The GPU stays shared: the resident grid holds at most the SMs the session leaves free (``free_sms``, counting
every open session of this process), and an idle session lets the GPU go. A background thread closes a session
``release_after`` seconds after its last step (the close is stream-ordered after that step's collect, or written
by the host after its last step); the next step relaunches the kernel from the final states the last launch wrote,
which the caller does not see. Every wait is bounded: the resident kernel's wait for a request (``idle_timeout_s``,
against a caller that went away or a host thread held in CUDA: the kernel took no request, so it leaves and the
next step relaunches, as after a release), its exchange between blocks (``barrier_timeout_us``) and the wait for
a step's states, the collect's or the host's (``collect_timeout_us``); a session whose exchange or wait for states
timed out raises :class:`~prnn_tvm.errors.SessionError` and is closed. Sessions still open
when the process exits are closed then.

Two facts of CUDA a session lives with (``bench/results/session-transport-h100.md``): under lazy module loading
(CUDA's default) the first launch of a kernel waits for every running kernel, so a session loads its own small
kernels before its resident kernel starts, and a kernel first launched elsewhere while it runs waits until the
resident kernel leaves (``idle_timeout_s``: the reaper's ``release_after`` cannot act while the host thread is
held in CUDA; or run the process with ``CUDA_MODULE_LOADING=EAGER``); and freeing device memory (``cudaFree``)
waits for the resident kernel likewise, which is why a session allocates nothing per step.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import weakref

import numpy as np
import tvm
import tvm_ffi

from ..errors import InputError, PrnnError, SessionError
from ..signature import FREE_SMS, REQUESTS, REQUESTS_HOST, RESPONSES, RESPONSES_HOST, ArgRole, SessionSignature
from ..signature import SESSION_IDLE as IDLE
from ..target import gpu_spec, resident_ctas
from .base import DEFAULT_TIMEOUT_US, HostWord, host_array
from .binding import ALIGNMENT, check, place
from .session_host import READY, HostRings

log = logging.getLogger(__name__)

DEPTH = 2  # request and response slots: step t + 2 is requested only after step t was collected (stream order)
CAPACITY = 2**31 - 1  # steps one launch of the resident kernel may serve
RELEASE_AFTER_S = 0.05
IDLE_TIMEOUT_S = 1.0
COLLECT_TIMEOUT_US = 1_000_000

HOST, DEVICE = "host", "device"  # a launch's transport (see the module's doc)
HOST_STEPS = ("native", "python")  # how the host transport's host side runs (session_host, session_native)

_OPEN: weakref.WeakSet = weakref.WeakSet()  # sessions of this process whose resident kernel runs


class Session:
    """A resident session of a CUDA layer; see the module's doc. Make one with ``layer.session()`` (a compiled
    layer's, or a loaded one's: :func:`open_session`).

    Parameters
    ----------
    signature : prnn_tvm.signature.SessionSignature
        The session's launches (``compile_session(layer).signature``, or an exported library's).
    module : tvm.runtime.Module
        The module holding them.
    weights : dict
        ``W_ih``, ``b_ih`` and the cell's recurrent weights and params by name: NumPy arrays (copied to the GPU
        once) or DLPack tensors on it (used in place: keep them unchanged while the session is open).
    initial : dict, optional
        Initial states by name (``h``, ``c``, ...; a stack's ``l0_h``...), (batch, hidden) each; zeros otherwise.
    host_step : {"native", "python"}
        How a host step's host side runs: ``"native"`` (the default) in one call of the native step
        (:mod:`.session_native`), which falls back to Python, with a warning, where it cannot be built; ``"python"``
        in Python (:mod:`.session_host`). The same words either way.
    release_after, idle_timeout_s, barrier_timeout_us, collect_timeout_us, free_sms
        See the module's doc. ``release_after=None``: never released while open (a session whose steps replay
        from a CUDA graph, which the host does not see, needs it, with an ``idle_timeout_s`` past the longest pause
        between replays: a release or an idle exit between replays would lose a step, which its collect then
        reports as a timeout).
    """

    def __init__(
        self,
        signature: SessionSignature,
        module,
        weights: dict,
        initial: dict | None = None,
        *,
        release_after: float = RELEASE_AFTER_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        barrier_timeout_us: int = DEFAULT_TIMEOUT_US,
        collect_timeout_us: int = COLLECT_TIMEOUT_US,
        free_sms: int = FREE_SMS,
        host_step: str = "native",
    ):
        if host_step not in HOST_STEPS:
            raise InputError(f"host_step must be one of {', '.join(map(repr, HOST_STEPS))}, got {host_step!r}")
        for name, value, low, whole in (
            ("release_after", release_after or 0, 0, False),
            ("idle_timeout_s", idle_timeout_s, 0, False),
            ("barrier_timeout_us", barrier_timeout_us, 1, True),
            ("collect_timeout_us", collect_timeout_us, 1, True),
            ("free_sms", free_sms, 0, True),
        ):
            _check_number(name, value, low, whole)
        if idle_timeout_s <= (release_after or 0) or idle_timeout_s * 1e6 > 2**31 - 1:
            raise InputError(
                f"idle_timeout_s must exceed release_after ({release_after} s) and be at most 2147 s, "
                f"got {idle_timeout_s!r}"
            )
        self.signature = sig = signature
        self.release_after = None if release_after is None else float(release_after)
        self.free_sms = int(free_sms)
        self._scalars = {
            "timeout_us": int(barrier_timeout_us),
            "stall_step": -1,
            "idle_us": int(idle_timeout_s * 1e6),
            "capacity": CAPACITY,
            REQUESTS_HOST: 0,
            RESPONSES_HOST: 0,
        }
        self._collect_timeout_us = int(collect_timeout_us)
        self._collect_timeout_ns = self._collect_timeout_us * 1000
        self.device = tvm.cuda(0)
        self._lock = threading.RLock()
        self._functions = {launch.function: module[launch.function] for launch in sig.launches}
        resident = sig.resident
        self.state_names = tuple(a.name[:-2] for a in resident.args if a.role is ArgRole.FINAL)
        self.output_index = self.state_names.index(sig.output)
        self._weights = {}
        for a in (*sig.publish.args, *resident.args):
            if a.role in (ArgRole.WEIGHT, ArgRole.PARAM):
                if a.name not in weights:
                    raise InputError(f"the session needs weight '{a.name}' ({' x '.join(map(str, a.shape))})")
                self._weights[a.name] = place(a, weights[a.name], 0, self.device)[0]
        self._owned = {
            a.name: self._zeros(a)
            for a in (*resident.args, sig.publish.arg("control"))
            if a.role in (ArgRole.WORKSPACE, ArgRole.SYNC)
        }
        self._running = self._closed = self._loaded = False
        shape = (sig.batch, sig.hidden)
        self._init = {n: tvm.runtime.tensor(np.zeros(shape, sig.dtype), self.device) for n in self.state_names}
        self._final = {n: tvm.runtime.tensor(np.zeros(shape, sig.dtype), self.device) for n in self.state_names}
        if initial:
            self.set_state(initial)
        self._x = self._zeros(sig.publish.arg("x"))
        self._error = HostWord(self.device)
        # the host transport's page-locked rings, shaped as the mailbox and the device responses
        self._requests, self._request_words = host_array(resident.arg(REQUESTS).concrete_shape(DEPTH), "uint64",
                                                         self.device)
        self._responses, self._response_words = host_array(resident.arg(RESPONSES).concrete_shape(DEPTH), "uint64",
                                                           self.device)
        x_arg = sig.publish.arg("x")
        self._host = HostRings(self._request_words, self._response_words, math.prod(x_arg.shape), x_arg.dtype,
                               sig.dtype, self._error.address, native=host_step == "native")
        self._states_shape = (len(self.state_names), sig.batch, sig.hidden)
        self._x_shape, self._x_dtype = tuple(x_arg.shape), None  # a step's input: the dtype once one was accepted
        self._transport: str | None = None  # the running launch's
        self._host_base = 0  # the tag base of the running host launch (its requests carry base + step + 1)
        self._host_steps = 0  # the requests the host posted to the running host launch
        self._stream = self.device.create_raw_stream()
        self._last_stream: int | None = None
        self._arguments = None  # the publish's and collect's argument lists (_prepared)
        self._last_step = 0.0
        self.steps = 0  # steps posted by this session's host calls
        self.launches = 0  # launches of the resident kernel (the first, and one per release)
        self.idle_exits = 0  # launches that ended idle (idle_timeout_s), resumed by the next step

    @property
    def debug_stall_step(self) -> int:
        """Tests only: block 0 of the resident kernel skips publishing its values at this step of a launch, which
        forces the exchange's timeout (-1: never)."""
        return self._scalars["stall_step"]

    @debug_stall_step.setter
    def debug_stall_step(self, step: int) -> None:
        self._scalars["stall_step"] = int(step)

    # ------------------------------------------------------------------ the caller's calls
    def post(self, x, out) -> None:
        """One step, stream-ordered on TVM's current stream (``tvm_ffi.use_raw_stream``), no host wait: ``x`` (batch,
        input) and ``out`` (states, batch, hidden: every new state in :attr:`state_names` order, the output at
        :attr:`output_index`) GPU tensors (TVM's, or torch's and others' through DLPack), used in place."""
        with self._lock:
            publish, collect = self._prepared()
            publish[self._x_at] = self._in_place("x", self.signature.publish, x)
            collect[self._out_at] = self._in_place("states", self.signature.collect, out)
            self._start(DEVICE)
            self._launch(self.signature.publish, publish)
            self._launch(self.signature.collect, collect)
            self._last_stream, self._last_step = tvm_ffi.get_raw_stream(self.device), time.monotonic()
            self.steps += 1

    def step(self, x: np.ndarray) -> tuple:
        """One step from the host, through the host transport (no CUDA call): ``x`` a NumPy array (batch, input).
        Returns ``(y, states)``: the output (batch, hidden) and every new state by name, NumPy arrays of their own
        (copies, the caller's to keep; ``y`` is ``states``' output). Waits for the step, up to
        ``collect_timeout_us``."""
        if type(x) is not np.ndarray or x.shape != self._x_shape or x.dtype is not self._x_dtype:
            self._check_step_input(x)
        states = np.empty(self._states_shape, self.signature.dtype)
        self.step_into(x, states)
        return states[self.output_index], dict(zip(self.state_names, states))

    @property
    def native(self) -> bool:
        """Whether a host step runs natively (``host_step="native"`` where the native step is built)."""
        return self._host.native

    def step_into(self, x, states) -> None:
        """:meth:`step` into the caller's memory: ``x`` (batch, input) in, every new state into ``states`` (states,
        batch, hidden) of the session's dtype, both C-contiguous NumPy arrays, checked by size alone. Where the step
        is :attr:`native`, each may also be the address of such memory (a CPU tensor's ``data_ptr()``), unchecked:
        the caller vouches for it."""
        with self._lock:
            if self._closed or not self._running or self._transport is not HOST or self._error.read():
                self._start(HOST)
            step = self._host_steps
            tag = (self._host_base + step + 1) & 0xFFFFFFFF
            ended = self._host.step(x, states, step, tag, self._collect_timeout_ns)  # nothing posted if it raises
            self._host_steps = step + 1
            self.steps += 1
            self._last_step = time.monotonic()
            if ended != READY:
                self._host_failed(step)

    def _check_step_input(self, x) -> None:
        """Refuse a step's input that is not a NumPy array of the input's shape and dtype, saying why; remember the
        dtype of one that is (the step's fast check)."""
        arg = self.signature.publish.arg("x")
        if not isinstance(x, np.ndarray):
            raise InputError(
                f"step takes a NumPy array (batch, input); for GPU tensors use post(x, out), got {type(x).__name__}"
            )
        check("x", tuple(x.shape), str(x.dtype), arg.shape, arg.dtype)
        self._x_dtype = x.dtype

    @property
    def state(self) -> dict:
        """The states after the last step, by name (NumPy). The resident kernel is closed to read them; the next
        step relaunches it."""
        with self._lock:
            self._stop()
            return {name: tensor.numpy() for name, tensor in self._init.items()}

    def set_state(self, states: dict) -> None:
        """Set the states the next step starts from, by name (NumPy, (batch, hidden) each; states not named keep
        their values)."""
        unknown = set(states) - set(self.state_names)
        if unknown:
            raise InputError(f"unknown state(s) {sorted(unknown)}; this session's: {', '.join(self.state_names)}")
        with self._lock:
            self._stop()
            sig = self.signature
            for name, value in states.items():
                value = np.asarray(value)
                check(name, tuple(value.shape), str(value.dtype), (sig.batch, sig.hidden), sig.dtype)
                self._copy_in(self._init[name], value)

    def reset(self, rows=None) -> None:
        """Zero every state of the batch rows ``rows`` (all rows when None): a new utterance or episode there."""
        self._edit(lambda value: _zero_rows(value, rows, self.signature.batch))

    def reorder(self, index) -> None:
        """Row ``b`` of every state becomes row ``index[b]``'s (beam search's reordering of hypotheses)."""
        index = np.asarray(index)
        if (
            index.shape != (self.signature.batch,)
            or index.dtype.kind not in "iu"
            or index.min(initial=0) < 0
            or index.max(initial=0) >= self.signature.batch
        ):
            raise InputError(
                f"index must hold {self.signature.batch} row numbers in [0, {self.signature.batch}), got {index!r}"
            )
        self._edit(lambda value: value[index])

    def close(self) -> None:
        """Let the resident kernel go and end the session (a later step raises)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._stop()
            finally:
                self._closed = True
                self.device.free_raw_stream(self._stream)

    def release(self) -> None:
        """Let the resident kernel go now; the next step relaunches it (what an idle session does by itself)."""
        with self._lock:
            self._stop()

    @property
    def running(self) -> bool:
        """Whether the resident kernel holds its SMs now."""
        return self._running

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        """A session dropped while its kernel runs is closed first: the kernel stops writing to the page-locked
        rings before they are freed with the session's other attributes."""
        if getattr(self, "_closed", True) or not hasattr(self, "_stream"):  # closed, or never fully made
            return
        try:
            self.close()
        except PrnnError as err:
            log.warning("closing a session dropped while open: %s", err)

    # ------------------------------------------------------------------ internals
    def _zeros(self, arg):
        return tvm.runtime.tensor(np.zeros(arg.concrete_shape(DEPTH), arg.dtype), self.device)

    def _in_place(self, name: str, launch, value):
        """``value`` as launch argument ``name``, checked and used as it is (a torch tensor goes to the kernel as
        itself): a session copies and allocates nothing per step (freeing device memory would wait for the resident
        kernel), so a misaligned tensor is refused."""
        arg = launch.arg(name)
        if isinstance(value, np.ndarray):
            raise InputError(f"{name} is a NumPy array: post takes GPU tensors (step takes NumPy)")
        if not isinstance(value, tvm.runtime.Tensor) and not hasattr(value, "data_ptr"):
            value = place(arg, value, 0, self.device)[0]  # any other DLPack tensor: wrapped
        dtype = value.dtype if isinstance(value, tvm.runtime.Tensor) else str(value.dtype).removeprefix("torch.")
        check(name, tuple(int(d) for d in value.shape), str(dtype), arg.shape, arg.dtype)
        device = getattr(value, "device", None)
        on_gpu = (
            device.dlpack_device_type() == self.device.dlpack_device_type()
            if isinstance(value, tvm.runtime.Tensor)
            else getattr(device, "type", None) == "cuda"
        )
        if not on_gpu or not value.is_contiguous():
            raise InputError(f"{name} must be a compact tensor on the GPU (step takes NumPy), got one on {device}")
        if value.data_ptr() % ALIGNMENT:
            raise InputError(
                f"{name} must start at a multiple of {ALIGNMENT} bytes (a session copies nothing per "
                "step): pass a tensor of its own, not a slice at an odd offset"
            )
        return value

    def _prepared(self) -> tuple:
        """The publish's and the collect's arguments, but for ``x`` and ``states`` (made once)."""
        if self._arguments is None:
            publish, collect = self.signature.publish, self.signature.collect
            self._x_at = [a.name for a in publish.args].index("x")
            self._out_at = [a.name for a in collect.args].index("states")
            self._arguments = (self._values(publish, {"x": None}), self._values(collect, {"states": None}))
        return self._arguments

    def _launch(self, launch, values: list) -> None:
        try:
            self._functions[launch.function](*values)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise SessionError(
                f"launching '{launch.function}' of a {self.signature.cell} session failed: {err}"
            ) from err

    def _values(self, launch, given: dict) -> list:
        scalars = {**self._scalars, "error_host": self._error.address}
        if launch is self.signature.collect:
            scalars["timeout_us"] = self._collect_timeout_us
        values = []
        for a in launch.args:
            if a.name in given:
                values.append(given[a.name])
            elif a.role is ArgRole.SCALAR:
                values.append(scalars[a.name])
            elif a.role in (ArgRole.WEIGHT, ArgRole.PARAM):
                values.append(self._weights[a.name])
            elif a.role is ArgRole.STATE:
                values.append(self._init[a.name[:-1]])
            elif a.role is ArgRole.FINAL:
                values.append(self._final[a.name[:-2]])
            else:
                values.append(self._owned[a.name])
        return values

    def _call(self, launch, given: dict) -> None:
        self._launch(launch, self._values(launch, given))

    def _host_failed(self, step: int) -> None:
        """Host step ``step``'s wait ended without its states: the kernel's error, or ``collect_timeout_us`` passed
        (the states are lost: the session is closed). The lock is held."""
        self._raise_on_error()
        self._closed = True
        raise SessionError(self._timeout_message(step))

    def _start(self, transport: str) -> None:
        """Launch the resident kernel for ``transport`` if it is not running so (the lock is held)."""
        if self._closed:
            raise SessionError("this session is closed; open a new one")
        self._let_go_if_idle()
        self._raise_on_error()
        if self._running and self._transport == transport:
            return
        if self._running:  # the other transport's launch: closed, and relaunched in this one
            self._stop()
        grid = self.signature.resident.grid
        gpu = gpu_spec()
        held = sum(s.signature.resident.grid.ctas for s in list(_OPEN) if s is not self and s._running)
        room = gpu.sms - self.free_sms - held
        fit = resident_ctas(grid, gpu)
        if grid.ctas > min(room, fit):
            raise SessionError(
                f"a {self.signature.cell} session needs {grid.ctas} SMs (a CTA each) and leaves {self.free_sms} free; "
                f"this {gpu.device_name or gpu.arch} has {gpu.sms} and open sessions of this process hold {held}: "
                f"{max(0, min(room, fit))} are left. Close a session, lower free_sms, or compile a layer over fewer "
                "CTAs (a config with more units per CTA)"
            )
        if not self._loaded:
            self._load_small_kernels()
        host = transport == HOST
        if host:  # the launch's requests are tagged from the base the last launch left (no kernel runs here)
            self._host_base, self._host_steps = int(self._owned["sync"].numpy()[2]), 0
        self._scalars[REQUESTS_HOST] = self._requests.data_ptr() if host else 0
        self._scalars[RESPONSES_HOST] = self._responses.data_ptr() if host else 0
        with tvm_ffi.use_raw_stream(self.device, self._stream):
            self._call(self.signature.resident, {})
        self._running, self._transport = True, transport
        self.launches += 1
        _OPEN.add(self)
        _Reaper.watch()

    def _load_small_kernels(self) -> None:
        """Launch each small kernel once on scratch words before the resident kernel starts: under CUDA's lazy
        module loading a kernel's first launch waits for every running kernel, the resident one included."""
        scratch = {
            name: tvm.runtime.tensor(np.zeros(t.shape, t.dtype), self.device)
            for name, t in self._owned.items()
            if name in (REQUESTS, RESPONSES, "control", "sync")
        }
        sync = np.zeros(scratch["sync"].shape, "uint32")
        sync[2] = 0xFFFFFFFF  # base + step 0 + 1 == 0: the zero response words carry the tag the collect wants
        self._copy_in(scratch["sync"], sync)
        states = self._zeros(self.signature.collect.arg("states"))
        for launch, given in (
            (self.signature.publish, {"x": self._x}),
            (self.signature.collect, {"states": states}),
            (self.signature.close, {}),
        ):
            mine = {a.name: scratch[a.name] for a in launch.args if a.name in scratch}
            self._call(launch, {**mine, **given})
        self.device.sync(tvm_ffi.get_raw_stream(self.device))  # not the device: other sessions may be running
        self._loaded = True

    def _stop(self) -> None:
        """Close the resident kernel, stream-ordered after the last step, and wait until it left (bounded by its
        own wait for requests); its final states become the next launch's initial ones (the lock is held)."""
        if not self._running or self._let_go_if_idle():
            return
        try:
            if self._transport == HOST:  # the close mark where the next request would go: CTA 0 relays it
                step = self._host_steps
                self._host.close(step, (self._host_base + step + 1) & 0xFFFFFFFF)
            else:
                with tvm_ffi.use_raw_stream(self.device, self._last_stream or 0):
                    self._call(self.signature.close, {})
            self.device.sync(self._stream)
        finally:
            self._running = False
            _OPEN.discard(self)
        self._init, self._final = self._final, self._init
        self._copy_in(self._owned["control"], np.zeros(self._owned["control"].shape, "uint32"))
        self._raise_on_error()

    def _let_go_if_idle(self) -> bool:
        """Whether the resident kernel left by itself, idle: it waited ``idle_timeout_s`` for the request of the
        step after the last one published to it, so it took none, and its final states are the last step's (the
        host was held meanwhile: see the module's doc). Then the session is released as :meth:`_stop` releases it,
        and the next step relaunches. An idle exit while a request was on its way lost that step: the error stays,
        for :meth:`_raise_on_error` (the lock is held)."""
        recorded = self._error.read()
        if not (self._running and recorded and (recorded - 1) & IDLE):
            return False
        self.device.sync(self._stream)  # the resident kernel has left: it wrote the error word at its end
        control = self._owned["control"].numpy()  # the legacy stream: after publishes still queued, if any
        # the requests posted to the launch: counted by the publishes, or by the host
        posted = self._host_steps if self._transport == HOST else int(control[1])
        if posted != (recorded - 1) & ~IDLE:
            return False
        self._running = False
        _OPEN.discard(self)
        if posted:  # the final states were written at least once by this launch
            self._init, self._final = self._final, self._init
        self._copy_in(self._owned["control"], np.zeros(control.shape, control.dtype))
        sync = self._owned["sync"].numpy()
        sync[0] = 0  # the error word
        self._copy_in(self._owned["sync"], sync)
        self._error.clear()
        self.idle_exits += 1
        return True

    def _copy_in(self, tensor, value: np.ndarray) -> None:
        """``value`` into the device ``tensor``, landed before anything launched after this returns: a copy from
        pageable memory returns once staged, and the session's kernels run on streams that do not wait for the
        copy's (the legacy default stream), so it is waited for."""
        tensor.copyfrom(np.ascontiguousarray(value))
        self.device.sync()  # the legacy default stream, where the copy ran: not other sessions' streams

    def _edit(self, change) -> None:
        with self._lock:
            self._stop()
            for tensor in self._init.values():
                self._copy_in(tensor, change(tensor.numpy()))

    def _raise_on_error(self) -> None:
        recorded = self._error.read()
        if not recorded:
            return
        self._closed = True  # the states are lost
        step = recorded - 1
        if step & IDLE:
            raise SessionError(
                f"a {self.signature.cell} session's resident kernel waited {self._scalars['idle_us'] / 1e6:g} s "
                f"(idle_timeout_s) for the request of step {step & ~IDLE} of its launch and left just as that request "
                "was on its way, so the step was lost. The host was held meanwhile: a kernel launched for the first "
                "time (CUDA loads modules lazily, and a load waits for every running kernel: launch what you need "
                "once before the session starts, or run with CUDA_MODULE_LOADING=EAGER), a device-wide "
                "synchronization or a free of device memory. The session is closed; open a new one"
            )
        raise SessionError(self._timeout_message(step))

    def _timeout_message(self, step: int) -> str:
        return (
            f"a {self.signature.cell} session timed out at step {step} of its launch: a block of the resident kernel "
            "or the collect waited longer than its bound (a block that never ran, or a resident kernel that could "
            "not start beside other kernels). That step's states are NaN and the session is closed; open a new one"
        )


def open_session(
    signature: SessionSignature,
    module,
    arrays: dict,
    *,
    release_after: float = RELEASE_AFTER_S,
    free_sms: int = FREE_SMS,
) -> Session:
    """A :class:`Session` of ``signature``'s launches in ``module`` (what ``layer.session(**arrays)`` opens, for a
    compiled layer and a loaded one alike). ``arrays``: ``W_ih``, ``b_ih`` and the cell's weights and params by the
    names a call takes, optionally the initial states by the names a call takes them (``h0``, ``c0``, ...), and
    :class:`Session`'s keyword options; any other name is refused, listing the accepted ones."""
    arrays = dict(arrays)
    options = {
        k: arrays.pop(k)
        for k in ("idle_timeout_s", "barrier_timeout_us", "collect_timeout_us", "host_step")
        if k in arrays
    }
    states = [a.name for a in signature.resident.args if a.role is ArgRole.STATE]
    initial = {name[:-1]: arrays.pop(name) for name in states if name in arrays}
    weights = [
        a.name for a in (*signature.publish.args, *signature.resident.args) if a.role in (ArgRole.WEIGHT, ArgRole.PARAM)
    ]
    unknown = sorted(set(arrays) - set(weights))
    if unknown:
        raise InputError(
            f"a {signature.cell} session takes no {', '.join(map(repr, unknown))}; it takes the weights "
            f"{', '.join(dict.fromkeys(weights))}, the initial states {', '.join(states)} and the options "
            "release_after, free_sms, idle_timeout_s, barrier_timeout_us, collect_timeout_us, host_step"
        )
    return Session(signature, module, arrays, initial, release_after=release_after, free_sms=free_sms, **options)


class _Reaper:
    """One daemon thread for the process: releases sessions idle for their ``release_after``."""

    _thread: threading.Thread | None = None
    _guard = threading.Lock()

    @classmethod
    def watch(cls) -> None:
        with cls._guard:
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="prnn-tvm-session-reaper", daemon=True)
                cls._thread.start()

    @staticmethod
    def _run() -> None:
        while True:
            sessions = [s for s in list(_OPEN) if s._running and s.release_after is not None]
            if not sessions:
                return
            now = time.monotonic()
            wait = min(s.release_after for s in sessions) / 2
            for s in sessions:
                if now - s._last_step >= s.release_after and s._lock.acquire(blocking=False):
                    try:
                        if s._running and time.monotonic() - s._last_step >= s.release_after:
                            s._stop()
                    except PrnnError as err:  # the session raises it again at its next step
                        log.warning("releasing an idle session: %s", err)
                    finally:
                        s._lock.release()
            time.sleep(max(wait, 0.0005))


@atexit.register
def _close_all() -> None:
    for s in list(_OPEN):
        try:
            s.close()
        except PrnnError as err:
            log.warning("closing a session at exit: %s", err)


def _check_number(name: str, value, low, whole: bool) -> None:
    if (
        not isinstance(value, int if whole else (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < low
    ):
        raise InputError(f"{name} must be {'an integer' if whole else 'a number'} of at least {low}, got {value!r}")


def _zero_rows(value: np.ndarray, rows, batch: int) -> np.ndarray:
    if rows is None:
        return np.zeros_like(value)
    rows = np.asarray(rows)
    if rows.dtype.kind not in "iu" or rows.ndim != 1 or rows.min(initial=0) < 0 or rows.max(initial=0) >= batch:
        raise InputError(f"rows must be row numbers in [0, {batch}), got {rows!r}")
    value = value.copy()
    value[rows] = 0
    return value

"""Running a layer split over several GPUs of one host (``compile_cell(..., devices=[0, 1])``).

One module holds the layer's functions; TVM's host code sets the device of a launch's arguments before launching
(``__tvm_set_device``) and its CUDA module keeps a kernel per device, so the same function runs on whichever GPU its
arrays are on. Each GPU is a :class:`DevicePart`: a :class:`~prnn_tvm.runtime.base.RuntimeLayer` on that device with
its own workspace, barrier state and host error word, whose recurrent launch also takes its run's first CTA
(``cta_offset``) and the addresses of the other GPUs' workspaces (``peer_workspace_<k>``). A call binds every
part's arrays first, then launches every part's projection, then every part's recurrent kernel (each on its device's
current stream, asynchronously: all are resident at once, on different GPUs), then makes every GPU's stream wait for
every other's (:class:`~prnn_tvm.runtime.peers.StreamJoin`: a GPU's next launch would otherwise overwrite, in a
slower peer's copy of the exchange, values that peer still polls), then waits for all of them.

Every array is whole on every GPU (NumPy inputs are copied to each) but the input projection's: GPU ``g`` gets the
rows of ``W_ih`` and ``b_ih`` of its own units (of every input slice, :meth:`SplitLayer.columns_of`), computes those
columns of the projection alone and its recurrent kernel reads them. It writes only its units of the output sequence
and final states, which :meth:`SplitLayer.__call__` gathers into whole NumPy arrays.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tvm
import tvm_ffi

from ..errors import BarrierTimeout, ConfigError, InputError, LaunchError
from ..signature import CTA_OFFSET, PEER_WORKSPACE, Signature
from ..target import local_gpu
from . import peers
from .base import DEFAULT_TIMEOUT_US, RuntimeLayer
from .binding import COPY, BoundCall
from .launcher import Arrays
from .split_launch import SplitLauncher

FIRST_TIMEOUT_US = 10_000_000  # a device's first launch loads the module there, while its peers already wait


class DevicePart(RuntimeLayer):
    """The GPU ``index``-th of a split layer's devices (``owner``): a runtime layer on that device."""

    def __init__(self, signature: Signature, module, owner: SplitLayer, index: int):
        super().__init__(signature, module, True, owner.barrier_timeout_us)
        self.owner, self.index, self.cuda = owner, index, owner.devices[index]
        self.launched = False

    @property
    def device(self) -> tvm.runtime.Device:
        return tvm.cuda(self.cuda)

    def workspace_address(self) -> int:
        """The address of this GPU's copy of the exchange, for the stream its calls run on."""
        return self.launch_state(self.stream)["workspace"].data_ptr()

    @property
    def stream(self) -> int:
        return tvm_ffi.get_raw_stream(self.device)

    def check(self, wait: bool = True) -> None:
        """The whole layer's check (:meth:`SplitLayer.check`): a timeout on one GPU resets every GPU's exchange."""
        self.owner.check(wait)

    def scalars(self) -> dict:
        found = dict(super().scalars())  # a new dict each call: the peers' workspaces follow the current stream
        if not self.launched:
            found["timeout_us"] = max(self.barrier_timeout_us, FIRST_TIMEOUT_US)
        found["stall_step"] = self.owner.debug_stall_step
        found[CTA_OFFSET] = self.index * self.owner.ctas_per_gpu
        others = [p for p in self.owner.parts if p is not self]
        found.update({PEER_WORKSPACE.format(k): p.workspace_address() for k, p in enumerate(others)})
        return found


class SplitLayer:
    """A recurrent layer split over ``devices`` (CUDA device indices): :func:`prnn_tvm.compile_cell` with
    ``devices`` makes one. ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)`` takes NumPy arrays (the order of
    :class:`~prnn_tvm.runtime.layer.Layer`) and returns ``(out, (h_n, c_n, ...))`` gathered from the GPUs as NumPy.
    ``recurrent(xp, ...)`` starts from the input projection. :meth:`bind` places a call on every GPU once, and
    :meth:`SplitCall.run` launches it again and again (to time it).

    ``barrier_timeout_us`` bounds every wait on every GPU: a GPU whose peer stalls or never started times out, fills
    its outputs with NaN, and the call raises :class:`~prnn_tvm.errors.BarrierTimeout`; every GPU's state is then
    reset. ``debug_stall_step`` (tests only) makes CTA 0 of GPU 0 skip its stores at that step.
    """

    @peers.keeps_current_device
    def __init__(self, signature: Signature, module, devices: tuple, kernel, report, cuda_source, plan, target):
        self.signature, self.module, self.devices = signature, module, tuple(devices)
        self.kernel, self.report, self.cuda_source, self.plan = kernel, report, cuda_source, plan
        self.target = target
        self.barrier_timeout_us = DEFAULT_TIMEOUT_US
        self.debug_stall_step = -1
        grid = signature.launch("recurrent").grid
        self.ctas_per_gpu, self.units_per_cta = grid.ctas, kernel.config.units_per_cta
        self.parts = [DevicePart(signature, module, self, i) for i in range(len(self.devices))]
        self._peers_enabled = False
        self.join = None  # peers.StreamJoin, once peer access is enabled

    def units_of(self, index: int) -> range:
        """The units the CTAs of the ``index``-th GPU own."""
        per = self.ctas_per_gpu * self.units_per_cta
        return range(index * per, min((index + 1) * per, self.signature.hidden))

    def _timeout_followers(self) -> list:
        return list(getattr(self, "parts", ()))  # none yet while RuntimeLayer.__init__ sets the timeout

    def __call__(self, *args, **kwargs):
        """Run the layer on every GPU; NumPy in, the gathered ``(out, final_states)`` NumPy out."""
        return self.bind(*args, **kwargs).result()

    def recurrent(self, xp, *args, **kwargs):
        """The recurrence alone, from a precomputed input projection ``xp`` (T, batch, slices * hidden)."""
        return self.bind_recurrent(xp, *args, **kwargs).result()

    def bind(self, *args, **kwargs) -> SplitCall:
        """Place a call's NumPy arrays on every GPU (:meth:`SplitCall.run` launches it)."""
        return self._bind(self.signature, args, kwargs)

    def bind_recurrent(self, xp, *args, **kwargs) -> SplitCall:
        return self._bind(self.signature.starting_at("recurrent"), (xp, *args), kwargs)

    def columns_of(self, index: int) -> np.ndarray:
        """The columns of the whole input projection (rows of ``W_ih``, entries of ``b_ih``) that the ``index``-th
        GPU computes and reads: its units of each input slice, in order; -1 past ``hidden`` (zero rows)."""
        H, units = self.signature.hidden, self.ctas_per_gpu * self.units_per_cta
        slices = self.signature.launch("recurrent").arg("xp").shape[2] // units
        own = np.arange(index * units, (index + 1) * units)
        return np.concatenate([np.where(own < H, s * H + own, -1) for s in range(slices)])

    def _bind(self, signature: Signature, args: tuple, kwargs: dict) -> SplitCall:
        names = signature.arg_names
        if len(args) > len(names):
            raise InputError(f"{len(args)} arguments given, the layer takes at most {len(names)}: {', '.join(names)}")
        named = {**dict(zip(names, args)), **kwargs}
        if not all(isinstance(a, np.ndarray) for a in named.values()):
            raise InputError("a layer split over GPUs takes NumPy arrays (copied to every GPU) and returns NumPy; "
                             "pass x.cpu().numpy() for a torch tensor (prnn_tvm.torch.LSTM(..., devices=[...]) "
                             "takes torch tensors)")
        return self._bind_parts(signature, [self.own_columns(named, i) for i in range(len(self.parts))])

    def bind_each(self, per_gpu: list, recurrent: bool = False) -> SplitCall:
        """Place a call whose arrays are given per GPU: ``per_gpu[g]`` the ``g``-th GPU's, by argument name, as
        :meth:`own_columns` makes them (of the input projection its own columns), each a DLPack tensor on that GPU
        (wrapped without a copy: torch's tensors). ``recurrent``: from the input projection ``xp``. The launches
        go on each device's current TVM stream (``tvm_ffi.use_raw_stream``), to be run there; each GPU's outputs
        (TVM tensors on it, its units written) are :attr:`SplitCall.outputs`."""
        if len(per_gpu) != len(self.parts):
            raise InputError(f"{len(per_gpu)} sets of arrays given for a layer split over {len(self.parts)} GPUs")
        signature = self.signature.starting_at("recurrent") if recurrent else self.signature
        return self._bind_parts(signature, per_gpu)

    def launcher(self, arrays: list[Arrays]) -> SplitLauncher:
        """The recurrent launch on every GPU, called again and again with arrays the caller's library makes
        (``arrays``: one :class:`~prnn_tvm.runtime.launcher.Arrays` per GPU): what ``prnn_tvm.torch`` runs, whose
        outputs come from torch's caching allocator (:meth:`bind_each`'s are TVM's, freed with ``cudaFree``, which
        waits for the GPU)."""
        return SplitLauncher(self, arrays)

    @peers.keeps_current_device
    def _bind_parts(self, signature: Signature, per_gpu: list) -> SplitCall:
        self._enable_peers()
        for part in self.parts:  # every workspace exists before any part's scalars name its peers'
            part._check_coresidency()
            part.launch_state(part.stream)
        calls = [part._bind(signature, (), named) for part, named in zip(self.parts, per_gpu)]
        if calls[0].chunks > 1:
            raise InputError(f"a sequence of {calls[0].seq_len} steps runs in chunks on one GPU, which a split layer "
                             "does not do yet: call it on shorter pieces, passing each piece's final states on")
        return SplitCall(self, calls)

    def own_columns(self, named: dict, index: int) -> dict:
        """A call's arrays as the ``index``-th GPU takes them: of the input projection's (``W_ih``, ``b_ih``, or a
        given ``xp``) its own columns (:meth:`columns_of`), the others whole."""
        columns = self.columns_of(index)
        inside = columns >= 0
        mine = dict(named)
        for name, axis in (("W_ih", 0), ("b_ih", 0), ("xp", 2)):
            if name in named:
                array = np.asarray(named[name])
                picked = np.take(array, np.where(inside, columns, 0), axis=axis)
                shape = [1] * array.ndim
                shape[axis] = len(columns)
                mine[name] = np.ascontiguousarray(np.where(inside.reshape(shape), picked, 0).astype(array.dtype))
        return mine

    def _enable_peers(self) -> None:
        if not self._peers_enabled:
            if local_gpu() is None or not self.module.imports or self.module.imports[0].kind != "cuda":
                raise LaunchError("this split layer was compiled on a machine without a usable GPU, so it holds CUDA "
                                  "source only: compile it where the GPUs are (its kernels can be emulated on the "
                                  "host: prnn_tvm.verify.split.run_split)")
            peers.enable_peer_access(self.devices)
            self.join = peers.StreamJoin(self.devices)
            self._peers_enabled = True

    @peers.keeps_current_device
    def check(self, wait: bool = True) -> None:
        """Raise BarrierTimeout (resetting every GPU's state) if a launch timed out; ``wait``: first wait for every
        GPU (else only what their host error words already say)."""
        if wait:
            for part in self.parts:
                part._wait()
        recorded = [part._error.read() if part._error is not None else 0 for part in self.parts]
        if not any(recorded):
            return
        for part in self.parts:  # nothing may still run on the states about to be dropped
            part._wait()
        for part in self.parts:  # the peers' copies hold the failed launch's tags: start every GPU clean
            part._states.clear()
            if part._error is not None:
                part._error.clear()
        which = [f"GPU {d} after step {r - 1}" for d, r in zip(self.devices, recorded) if r]
        raise BarrierTimeout(
            f"{self.signature.cell} split over GPUs {list(self.devices)}: a wait for a peer's values timed out "
            f"({self.barrier_timeout_us} us per wait): {', '.join(which)}. The outputs of that call were filled with "
            "NaN; every GPU's exchange was reset and the next call starts clean."
        )


class SplitCall:
    """A call placed on every GPU of a split layer: :meth:`run` launches it (no waiting), :meth:`result` runs it,
    waits and gathers the outputs."""

    def __init__(self, layer: SplitLayer, calls: list[BoundCall]):
        self.layer, self.calls = layer, calls

    @property
    def outputs(self) -> list:
        """Each GPU's ``(out, *finals)`` (TVM tensors on it; it wrote its own units of each)."""
        return [call.outputs for call in self.calls]

    def run(self) -> None:
        """Every GPU's launches, launch by launch across the GPUs (each GPU's projection before any recurrent
        kernel: a recurrent kernel waits for its peers' from its first step)."""
        layer = self.layer
        with peers.current_device_kept():
            self._launch_all()
        for part in layer.parts:
            part.launched = True

    def _launch_all(self) -> None:
        layer = self.layer
        try:
            for step in range(len(self.calls[0].launches)):
                for part, call in zip(layer.parts, self.calls):
                    name, args = call.launches[step]
                    if name == COPY:
                        raise ConfigError("a split layer does not run chunked sequences")
                    part._launch(name, args)
        except Exception:
            # the GPUs launched before this one wait for it until they time out: let them, and start clean
            with contextlib.suppress(BarrierTimeout):
                layer.check()
            raise
        layer.join.join([part.stream for part in layer.parts])  # the next launch anywhere after all of these

    def result(self):
        """Run, wait for every GPU (raising BarrierTimeout on a timeout), and gather ``(out, finals)``."""
        self.run()
        self.layer.check()
        return self.gather()

    @peers.keeps_current_device
    def gather(self) -> tuple:
        """The output sequence and final states as NumPy, each unit's values from the GPU that owns it."""
        layer = self.layer
        return gather([[t.numpy() for t in call.outputs] for call in self.calls],
                      [layer.units_of(i) for i in range(len(layer.devices))], layer.signature.hidden)


def gather(per_device: list, units: list, hidden: int) -> tuple:
    """``(out, finals)`` whole from each GPU's ``[out, *finals]`` (NumPy), GPU ``g`` giving the units ``units[g]``
    (a range): :func:`unit_columns` of the output and of each final state."""
    out, *finals = (np.array(a) for a in per_device[0])
    for (theirs_out, *theirs), mine in zip(per_device[1:], units[1:]):
        for cols in unit_columns(mine, hidden, out.shape[-1]):
            out[..., cols] = theirs_out[..., cols]
        for final, other in zip(finals, theirs):
            for cols in unit_columns(mine, hidden, final.shape[-1]):
                final[..., cols] = other[..., cols]
    return out, tuple(finals)


def unit_columns(units: range, hidden: int, width: int) -> list:
    """The columns (slices of the last axis) that hold ``units`` in an output of ``width`` columns: those of each
    output state (``k * hidden + unit``: an output sequence may hold several states side by side)."""
    return [slice(k * hidden + units.start, k * hidden + units.stop) for k in range(width // hidden)]

"""Which compiled layer serves a call, and how it runs: the layer cache (one per batch size, device, dtype and
input width, compiled on first use), a stack as one wavefront launch or layer by layer, a bidirectional
layer's directions as one launch or a launch each (side by side on the GPU), the CPU build or the CUDA
kernels, with or without autograd.

A CUDA launch goes through the runtime's :class:`~prnn_tvm.runtime.launcher.Launcher`, as any caller's: torch
tensors cross by DLPack, the kernel runs on torch's current stream with the layer's workspace and barrier state
for that stream (or, while a CUDA graph is captured, one the module keeps alive for the graph), outputs come
from torch's caching allocator, and nothing waits for the GPU. What is torch's own here: the current stream's
handle, torch's allocator, whether a graph is being captured.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING

import torch  # PyTorch itself: absolute import
import tvm_ffi

from prnn_tvm.deferred import compile_cell, compile_training
from prnn_tvm.dtypes import POLICIES
from prnn_tvm.errors import ConfigError, InputError
from prnn_tvm.runtime.limits import ALIGNMENT

if TYPE_CHECKING:
    from prnn_tvm.runtime.launcher import Arrays

from .arguments import parameter_suffix
from .autograd import CpuBackprop, CudaBackprop
from .buckets import BatchBuckets, Padding, rows_dropout
from .fallback import refusal, run_in_torch
from .projection import project, rounds
from .sequences import reversal_within

log = logging.getLogger(__name__)

# the parameter dtypes a module runs in -> the layer dtype it compiles
DTYPES = {getattr(torch, p.torch_type): name for name, p in POLICIES.items()}  # float64: the CPU build only

_NOTHING = contextlib.nullcontext()  # reusable
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's raw getter, where it has one
_UNSIGNED = {torch.uint32: torch.int32, torch.uint64: torch.int64}  # zeroed as the signed type of their width
# The device types on which a stack's launch writes its layers' final states into the tensors a call returns, rather
# than torch.stack after it: on the GPU each stack is a kernel launch (and its inputs two more allocations); on the CPU
# a stack is a copy of a few rows, and the views cost more (1.6 us more a call, LSTM 2x128 B=1, CPU thread time).
WRITTEN_IN_PLACE = ("cuda",)


def current_stream(device: torch.device) -> int:
    """The handle of torch's current stream on ``device`` (a stream object costs microseconds per call)."""
    return _RAW_STREAM(device.index) if _RAW_STREAM is not None else torch.cuda.current_stream(device).cuda_stream


def torch_arrays(device: torch.device) -> Arrays:
    """A launch's buffers from torch's caching allocator on ``device``; a launch state's unsigned words zeroed as
    signed ones (whose kernels torch has everywhere), then viewed."""
    from prnn_tvm.runtime.launcher import Arrays  # TVM's runtime, at the first launch

    def zeros(a):
        dtype = getattr(torch, a.dtype)
        return torch.zeros(a.shape, dtype=_UNSIGNED.get(dtype, dtype), device=device).view(dtype)

    return Arrays(
        empty=functools.partial(torch.empty, device=device),
        dtype=functools.partial(getattr, torch),
        zeros=zeros,
        adopt=torch.from_dlpack,
    )


class Whole(list):
    """One state's final states per layer ((B, H) views, as ``_run_rows`` gives them) that are the layers of one
    (layers, B, H) tensor, ``whole``: what a call returns as it is, rather than a stack of them."""

    def __init__(self, views, whole: torch.Tensor):
        super().__init__(views)
        self.whole = whole


def stacked_finals(finals: list) -> list:
    """Per state, the final states of every layer and direction ((B, H) each) as one (slots, B, H) tensor: the one
    they were written into where they are its layers (:class:`Whole`)."""
    return [f.whole if type(f) is Whole else f[0].unsqueeze(0) if len(f) == 1 else torch.stack(f) for f in finals]


def final_slots(wholes: list, layers: int) -> tuple:
    """``(views, into)``: per state, the (B, H) view of each layer's slot of ``wholes`` (the (layers, B, H) tensors
    a call returns), and those views in a stack launch's order of final states (layer-major, the cell's states in
    order within a layer), for the launch to write into."""
    views = [w.unbind(0) for w in wholes]
    return views, [v[layer] for layer in range(layers) for v in views]


class Dispatch(BatchBuckets):
    """The part of a prnn_tvm.torch module that picks and runs compiled layers. It keeps, on the module:
    ``_layers`` (``(batch, device type, index, dtype, input size or "stack" / "bidirectional")`` -> layer),
    ``_kept`` (the batch sizes whose layers are kept, :class:`~prnn_tvm.torch.buckets.KeptShapes`),
    ``_launch_notes``, ``stack_notes``, ``direction_notes``, ``_fallbacks``, ``fallback_notes``, ``_launchers``,
    ``_side_streams`` and ``_captured``; it reads the module's options (``cell``, ``hidden_size``, ``arch``,
    ``config``, ``num_layers``, ``bidirectional``, ``wavefront``, ``one_launch_directions``,
    ``concurrent_directions``, ``batch_buckets``, ``kept_batch_sizes``). A call pads its rows to the batch size
    of a bucket (:class:`~prnn_tvm.torch.buckets.BatchBuckets`); a layer that no config of prnn-tvm's places runs
    on torch.nn's kernels where the cell is one of torch.nn's (:mod:`~prnn_tvm.torch.fallback`)."""

    def layer_for(
        self, batch: int, device: torch.device, dtype: torch.dtype | None = None, input_size: int | None = None
    ):
        """The compiled layer for ``batch`` on ``device`` in ``dtype`` (the parameters'; compiled on
        first use, then kept), taking ``input_size`` features (the module's; a stack's later layers take
        hidden x directions)."""
        dtype = self.dtype if dtype is None else dtype
        input_size = self.input_size if input_size is None else input_size
        key = (batch, device.type, device.index, dtype, input_size)
        if key not in self._layers:
            target = "cuda" if device.type == "cuda" else "llvm"
            if device.type not in ("cuda", "cpu"):
                raise InputError(f"{type(self).__name__}: tensors on {device} are not supported; use cuda or cpu")
            if dtype not in DTYPES:
                raise ConfigError(
                    f"{type(self).__name__}: parameters of {dtype} are not supported; use one of "
                    f"{', '.join(map(str, DTYPES))}"
                )
            log.info(
                "compiling %s hidden=%d batch=%d %s for %s", self.cell, self.hidden_size, batch, DTYPES[dtype], target
            )
            self._keep(key[:4])
            self._layers[key] = compile_cell(
                self.cell,
                self.hidden_size,
                batch,
                input_size=input_size,
                dtype=DTYPES[dtype],
                target=target,
                arch=self.arch if target == "cuda" else None,
                config=self.config if target == "cuda" else None,
            )
        return self._layers[key]

    def stack_for(self, batch: int, device: torch.device, dtype: torch.dtype | None = None):
        """The module's layers compiled as one wavefront launch (``compile_cell(..., layers=num_layers)``) for
        ``batch`` on ``device``, or None where a call runs them layer by layer: one layer, both directions,
        :attr:`wavefront` off, or (CUDA) weights that do not fit on chip together (compiled on first use, then
        kept; ``stack_notes[(batch, device, dtype)]`` says which, and why)."""
        if not (self.wavefront and self.num_layers > 1 and not self.bidirectional):
            return None
        dtype = self.dtype if dtype is None else dtype
        key = (batch, device.type, device.index, dtype, "stack")
        compiled = self._layers.get(key)
        if compiled is not None:  # noted when it was compiled (and dropped with its note, :meth:`_forget`)
            return compiled
        return self._one_launch(
            key,
            self.stack_notes,
            (batch, str(device), dtype),
            batch,
            device,
            dtype,
            self.input_size,
            "one wavefront launch",
            "layer by layer",
            layers=self.num_layers,
        )

    def directions_for(self, batch: int, device: torch.device, dtype: torch.dtype, input_size: int):
        """A bidirectional layer's two directions compiled as one launch (``compile_cell(...,
        bidirectional=True)``: each direction on CTAs of its own) for ``batch`` on ``device`` taking
        ``input_size`` features, or None where a call runs a launch per direction: a one-directional
        module, :attr:`one_launch_directions` off, or weights that do not fit on chip together. Compiled on
        first use, then kept; ``direction_notes[(batch, device, dtype, input_size)]`` says which, and why."""
        if not (self.bidirectional and self.one_launch_directions):
            return None
        key, notes_key = (batch, device.type, device.index, dtype, input_size), (batch, str(device), dtype, input_size)
        return self._one_launch(
            (*key, "bidirectional"),
            self.direction_notes,
            notes_key,
            batch,
            device,
            dtype,
            input_size,
            "one launch",
            "a launch per direction",
            bidirectional=True,
        )

    def _one_launch(
        self,
        key: tuple,
        notes: dict,
        notes_key: tuple,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
        input_size: int,
        done: str,
        otherwise: str,
        **options,
    ):
        """The module's cell compiled with ``options`` (``layers``, ``bidirectional``) for ``batch`` on ``device``
        once, then kept as ``_layers[key]``; None where it does not fit (not tried again), or fits only with weights
        in shared memory (the weight tiers: apart, each layer or direction may keep its own in registers; which is
        faster is not measured). ``notes[notes_key]`` says which: ``done`` with the grid's figures, or ``otherwise``
        with the reason."""
        if key not in self._launch_notes:
            self._keep(key[:4])
            cuda = device.type == "cuda"
            try:
                layer = compile_cell(
                    self.cell,
                    self.hidden_size,
                    batch,
                    input_size=input_size,
                    dtype=DTYPES[dtype],
                    target="cuda" if cuda else "llvm",
                    arch=self.arch if cuda else None,
                    **options,
                )
            except ConfigError as err:
                self._launch_notes[key] = f"{otherwise}: {err}"
                log.info(
                    "%s of hidden %d at batch %d: %s",
                    type(self).__name__,
                    self.hidden_size,
                    batch,
                    self._launch_notes[key],
                )
            else:
                rep = layer.report
                if rep.weight_smem_bytes or rep.weight_l2_bytes:  # on chip together only with weight tiers: apart
                    self._launch_notes[key] = (
                        f"{otherwise}: together their weights fit on chip only with {rep.weight_smem_bytes} B per "
                        "CTA in shared memory (weight tiers); apart each keeps its own in registers where it can"
                    )
                else:
                    self._launch_notes[key] = done + (
                        f": {rep.ctas} CTAs x {rep.threads} threads, {rep.registers} registers, "
                        f"{rep.spill_store_bytes} B spills"
                        if cuda
                        else " (the CPU build)"
                    )
                    self._layers[key] = layer
        notes[notes_key] = self._launch_notes[key]
        return self._layers.get(key)

    def check(self) -> None:
        """Wait for this module's kernels and raise :class:`~prnn_tvm.errors.BarrierTimeout` if one timed
        out since the last check (a call raises an earlier one's by itself; a replayed CUDA graph's
        timeout surfaces here or at the next eager call)."""
        for (_, kind, index, *_), layer in self._layers.items():
            if kind == "cuda":
                torch.cuda.synchronize(index)
            layer.check(wait=False)
            if layer._training is not None:
                layer._training.forward.check(wait=False)
                layer._training.backward.check(wait=False)
        self._split.check()  # the layers split over GPUs (every GPU's)

    def _run_rows(
        self,
        x: torch.Tensor,
        initial: list,
        lengths: torch.Tensor | None,
        grad: bool,
        padding: Padding | None = None,
    ) -> tuple:
        """Every layer and direction on ``x`` (time-major, compact; the rows of its layers' batch) from ``initial``
        (per state, (slots, B, H), or [] for zeros): ``(out, finals)``, finals per state a list of (B, H) per layer
        and direction. ``padding``: where the rows were padded up to a bucket, the caller's rows and lengths."""
        states, directions = len(self._states), 2 if self.bidirectional else 1
        rows, device, dtype = x.shape[1], x.device, x.dtype  # read once: each is a new object per read
        out, finals = x, [[None] * (self.num_layers * directions) for _ in range(states)]
        # the reverse direction reads each row's steps backwards: the whole sequence, or its own length
        backwards = (
            None
            if directions == 1
            else (lambda s: s.flip(0))
            if lengths is None
            else reversal_within(lengths, x.shape[0])
        )
        # where a layer runs a launch per direction, an inference call on the GPU runs the reverse one on a stream
        # of its own, beside the forward one, where the two grids fit on the GPU together (measured: else the
        # second waits, and it costs 5-9%)
        concurrent = directions == 2 and self.concurrent_directions and device.type == "cuda" and not grad
        # a one-directional stack in inference: one wavefront launch, where it fits
        stack = None if grad or (self.training and self.dropout) else self.stack_for(rows, device, dtype)
        if stack is not None:
            layer_major = [t[layer] for layer in range(self.num_layers) for t in initial]
            args = self._launch_arguments(stack, x, None, layer_major, lengths)
            wholes = self._whole_finals(rows, device, dtype)
            if wholes is None:
                out, ends = self._run(stack, args)
            else:  # the kernel writes each layer's final states into its slot of the states returned
                views, into = final_slots(wholes, self.num_layers)
                out, ends = self._run(stack, args, into=[None, *into])
                if ends[0] is into[0]:  # else a sequence run in pieces, which writes arrays of its own (all of them)
                    return out, [Whole(v, w) for v, w in zip(views, wholes)]
            for i, end in enumerate(ends):  # layer-major, the cell's states in order within a layer
                finals[i % states][i // states] = end
        for layer in range(self.num_layers if stack is None else 0):  # else one launch per layer and direction
            width = out.shape[2]
            both = None if grad else self.directions_for(rows, device, dtype, width)
            if both is None and refusal(self, layer, rows, device, dtype, width, grad):
                out, ends = run_in_torch(self, layer, out, initial, lengths, padding)  # no prnn-tvm config fits
                for k, end in enumerate(ends):
                    for direction in range(directions):
                        finals[k][layer * directions + direction] = end[direction]
            elif both is not None:  # the layer's directions in one launch: its output in torch's order
                pairs = [t[layer * directions + direction] for direction in range(directions) for t in initial]
                out, ends = self._run(
                    both, self._launch_arguments(both, out, parameter_suffix(layer, 0), pairs, lengths)
                )
                for i, end in enumerate(ends):  # direction-major, the cell's states in order within one
                    finals[i % states][layer * directions + i // states] = end
            else:
                # every direction's inputs are made ready on the caller's stream (aligned copies, constants),
                # then the directions run: one after the other, or side by side (joined before the next layer)
                ready = [
                    self._inputs(
                        out if direction == 0 else backwards(out),
                        parameter_suffix(layer, direction),
                        [t[layer * directions + direction] for t in initial],
                        lengths,
                        grad,
                    )
                    for direction in range(directions)
                ]
                side = self._side_stream(device) if concurrent and ready[0][0].grids_that_fit() >= 2 else None
                if side is not None:
                    side.wait_stream(torch.cuda.current_stream(device))
                outs = []
                for direction, (compiled, args) in enumerate(ready):
                    with torch.cuda.stream(side) if side is not None and direction == 1 else _NOTHING:
                        y, ends = self._run(compiled, args, grad)
                        outs.append(y if direction == 0 else backwards(y))
                    for k, end in enumerate(ends):
                        finals[k][layer * directions + direction] = end
                if side is not None:
                    torch.cuda.current_stream(device).wait_stream(side)
                out = outs[0] if directions == 1 else torch.cat(outs, dim=2)  # PyTorch's order: forward, reverse
            if self.training and self.dropout and layer < self.num_layers - 1:  # between layers, as torch.nn
                out = rows_dropout(out, self.dropout, padding)
        return out, finals

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream a bidirectional layer's reverse direction runs on beside the caller's current stream (one
        per current stream: two callers' streams never share one). Two persistent kernels on two streams run
        at once where both grids fit on the GPU, else one after the other."""
        key = (device, current_stream(device))
        if key not in self._side_streams:
            self._side_streams[key] = torch.cuda.Stream(device)
        return self._side_streams[key]

    def _inputs(
        self, x: torch.Tensor, suffix: str, initial: list, lengths: torch.Tensor | None = None, grad: bool = False
    ) -> tuple:
        """One layer and direction's compiled layer and arguments: ``(layer, args)`` (:meth:`_launch_arguments`).
        ``x``: time-major; parameters ``*{suffix}``; ``initial``: its initial states, or [] for zeros."""
        layer = self.layer_for(x.shape[1], x.device, x.dtype, x.shape[2])
        return layer, self._launch_arguments(layer, x, suffix, initial, lengths, grad)

    def _whole_finals(self, rows: int, device: torch.device, dtype: torch.dtype) -> list | None:
        """Per state, an uninitialized (layers, rows, H) tensor that a stack's launch writes its layers' final states
        into (one view per layer, :meth:`_run_rows`): what the call returns, without stacking them afterwards (a
        kernel per state on the GPU). None where a view would not start on a 64-byte boundary, as kernels take them,
        and on devices not in :data:`WRITTEN_IN_PLACE`."""
        H = self.hidden_size
        if rows * H * dtype.itemsize % ALIGNMENT or device.type not in WRITTEN_IN_PLACE:
            return None
        return [torch.empty(self.num_layers, rows, H, device=device, dtype=dtype) for _ in self._states]

    def _run(self, layer, args: list, grad: bool = False, into: list | None = None) -> tuple:
        """Run one layer and direction on its arguments (:meth:`_launch_arguments`) on the current stream: ``(out,
        finals)``, finals of shape (B, H); an inference call writes into ``into`` where given (the launch's outputs in
        its order, None where made anew: :class:`~prnn_tvm.runtime.launcher.Launcher`)."""
        x = args[0]
        if grad and x.device.type == "cuda":  # the projection with the kernels: its GEMMs in the layer's type
            out, *finals = CudaBackprop.apply(self, self._training_kernels(layer), *args[:3], self._biased_weight,
                                              *args[3:])
            return out, finals
        if grad:  # the recurrent kernel's backward is compiled for the CPU
            out, *finals = CpuBackprop.apply(layer, project(*args[:3]), *args[3:])
            return out, finals
        # inference, on the GPU or the CPU build: the projection in torch, the recurrent launch by the runtime's
        # Launcher (the CPU build's call is then the GPU's, streams and stream capture apart)
        xp = project(*args[:3], biased_weight=self._biased_weight, rounded=rounds(layer))
        out, *finals = self._launch(layer, xp, args[3:], into=into)
        return out, finals

    def _launch(
        self, layer, xp: torch.Tensor, recurrent: list, function: str = "recurrent", into: list | None = None
    ) -> list:
        """Launch ``function`` of ``layer`` (on the GPU: on torch's current stream), into tensors from torch's
        allocator; no waiting. ``recurrent``: the launch's data arguments after ``xp``, in its order (for
        ``recurrent``: the recurrent weights, params, initial states and lengths); ``into``: where it writes, as the
        Launcher takes it. Returns what it writes, in its order."""
        device = xp.device
        launcher = self._launcher(layer, device, function)
        if device.type != "cuda":
            return launcher([xp, *recurrent], into=into)
        state = None
        if torch.cuda.is_current_stream_capturing():  # the graph's own state, zeroed at the start of every replay
            state = launcher.new_state()
            self._captured.append(state)
        return launcher([xp, *recurrent], current_stream(device), state, into)

    def _launcher(self, layer, device: torch.device, function: str = "recurrent"):
        """The runtime's :class:`~prnn_tvm.runtime.launcher.Launcher` of ``function`` of ``layer`` on ``device``
        with torch's allocator (made at the first launch, then kept with the layer)."""
        launcher = self._launchers.get((id(layer), function))
        if launcher is None:
            from prnn_tvm.runtime.launcher import Launcher  # TVM's runtime, at the first launch

            launcher = self._launchers[id(layer), function] = Launcher(
                layer, function, torch_arrays(device), tvm_ffi.device(device.type, device.index or 0)
            )
        return launcher

    def _training_kernels(self, layer):
        """The training kernels of a CUDA layer (compiled on first use); an InputError saying what to do
        where there are none."""
        try:
            return compile_training(layer)
        except ConfigError as err:
            raise InputError(
                f"{type(self).__name__}: gradients on the GPU: {err}; or call it under torch.no_grad() (inference)"
            ) from None

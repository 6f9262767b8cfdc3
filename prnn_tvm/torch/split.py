"""A module's layers split over the GPUs of one host (``prnn_tvm.torch.LSTM(..., devices=[0, 1])``,
``from_torch(m, devices=[...])``): each layer a :class:`~prnn_tvm.runtime.split.SplitLayer`, run on torch tensors.

For layers too big for one GPU (LSTM fp16 hidden 4096: 134 MB of recurrent weights, a quarter on each of four
H100s). Inference only: the parameters and a call's tensors live on the first device, and so do its outputs. Per
call and layer: the input goes to every other GPU (one copy each, over NVLink); each GPU computes its own columns of
the input projection with torch's GEMM (cuBLAS, :func:`~prnn_tvm.torch.projection.project`: its rows of ``W_ih``;
``b_ih`` is folded into the params that carry it as on one GPU, so that the projection is the GEMM alone); the
recurrent kernels run on every GPU's current torch stream through a
:class:`~prnn_tvm.runtime.split_launch.SplitLauncher` whose outputs come from torch's caching allocator (TVM's own
would be freed with ``cudaFree``, which waits for the GPU); torch's copies between GPUs synchronize with both GPUs'
current streams; each GPU's units of the output sequence and of the final states come back into the first GPU's,
one copy each. What a call derives from the parameters (the first GPU's arguments as on one GPU, their copies on
every other GPU, each GPU's rows of ``W_ih``) is made once and again only after a parameter changed (its version
counter moves with every in-place update). Nothing waits for the GPUs: a barrier timeout is raised by the next call
or by :meth:`SplitLayers.check`.

What the split does not do is refused with the reason (:func:`call_refusal`, :func:`module_refusal`): gradients
(training), both directions, torch.autocast's casts, CPU tensors or tensors off the first device. A layer is
compiled for each batch size the first time it is called with it (no batch buckets: a split layer's compile takes
tens of seconds) and kept.
"""

from __future__ import annotations

import logging

import torch  # PyTorch itself: absolute import

from prnn_tvm.deferred import compile_cell

from .arguments import parameter_suffix
from .dispatch import DTYPES, current_stream, torch_arrays
from .projection import biased, project, rounds

log = logging.getLogger(__name__)


def module_refusal(module) -> str | None:
    """Why ``module``'s configuration cannot run split over GPUs (None where it can)."""
    if module.bidirectional:
        return ("a module split over GPUs runs one direction (bidirectional=False): run each direction as a module "
                "of its own")
    if not module.bias:
        return "a module split over GPUs takes its biases as parameters (bias=True; zeros leave them out)"
    return None


def call_refusal(module, x: torch.Tensor, grad: bool, cast) -> str | None:
    """Why a call of ``module`` on ``x`` cannot run split over its GPUs (None where it can)."""
    first = gpu(module.devices[0])
    if grad:
        return ("a module split over GPUs runs inference only: call it under torch.no_grad() or "
                "torch.inference_mode() (or train a module on one GPU)")
    if cast is not None:
        return (f"a module split over GPUs runs in its parameters' dtype, not torch.autocast's {cast}: convert the "
                "module (.half()) or call it outside autocast")
    where = module._first_parameter().device
    if where != first:
        return (f"the parameters are on {where}; a module split over GPUs {list(module.devices)} keeps them on the "
                f"first, {first}: move it there (.to('{first}'))")
    if x.device != first:
        return f"the input is on {x.device}; a module split over GPUs takes it on its first device, {first}"
    return None


class SplitLayers:
    """The split layers of a module (one per layer and batch size, compiled on first use), each one's launcher with
    torch's allocator on every GPU, and what a call derives from the parameters on every GPU.

    ``phase`` (None, or a callable taking a phase's name: the benchmark's breakdown) is called after each phase of a
    layer's call: ``"arguments"`` (the module's own work, then the first GPU's arguments as a one-GPU call makes them),
    ``"inputs"`` (the input, initial states and lengths on every GPU), ``"projections"`` (each GPU's
    columns of the input projection), ``"recurrent"`` (every GPU's recurrent launch), ``"gather"`` (every GPU's units
    of the outputs into the first GPU's)."""

    def __init__(self):
        self.layers: dict = {}  # (layer, batch, dtype, input width) -> SplitLayer
        self.launchers: dict = {}  # id(SplitLayer) -> its SplitLauncher with torch's allocator on every GPU
        self.copies: dict = {}  # (layer, GPU index, what) -> (what it was made from and their versions, the copy)
        self.phase = None

    def run(self, module, x: torch.Tensor, initial: list, lengths) -> tuple:
        """``module``'s layers on ``x`` (time-major, on the first device) from ``initial`` (per state,
        (layers, B, H), or [] for zeros), each row stopping at ``lengths`` (None: the whole sequence):
        ``(out, finals)``, finals per state (layers, B, H)."""
        finals = []
        for index in range(module.num_layers):
            layer = self.layer(module, index, x)
            layer.check(wait=False)  # an earlier call's timeout, before this one starts
            states = [s[index] for s in initial]
            x, last = self._run_layer(module, layer, index, x, states, lengths)
            finals.append(last)
        return x, [torch.stack([f[k] for f in finals]) for k in range(len(module._states))]

    def check(self) -> None:
        """Wait for every GPU; raise :class:`~prnn_tvm.errors.BarrierTimeout` if a launch timed out."""
        for layer in self.layers.values():
            layer.check()

    def layer(self, module, index: int, x: torch.Tensor):
        """The split layer ``index`` of ``module`` for ``x``'s batch, dtype and width (compiled on first use)."""
        key = (index, x.shape[1], x.dtype, x.shape[2])
        found = self.layers.get(key)
        if found is None:
            found = compile_cell(module.cell, module.hidden_size, x.shape[1], input_size=x.shape[2],
                                 dtype=DTYPES[x.dtype], arch=module.arch, config=module.config,
                                 devices=list(module.devices))
            log.info("%s layer %d split over GPUs %s, batch %d: %s", type(module).__name__, index,
                     list(module.devices), x.shape[1], found.report.format().replace("\n", "; "))
            self.layers[key] = found
        return found

    def launcher(self, layer, devices: list):
        """``layer``'s :class:`~prnn_tvm.runtime.split_launch.SplitLauncher`, its buffers from torch's caching
        allocator on each GPU (made once per layer)."""
        found = self.launchers.get(id(layer))
        if found is None or found.layer is not layer:
            found = self.launchers[id(layer)] = layer.launcher([torch_arrays(d) for d in devices])
        return found

    def _run_layer(self, module, layer, index: int, x: torch.Tensor, states: list, lengths) -> tuple:
        devices = [gpu(d) for d in module.devices]
        suffix = parameter_suffix(index, 0)
        # the first GPU's arguments as a one-GPU call makes them (kept between calls while the parameters stay the
        # same; b_ih folded into the params that carry it, where some do: its projection is then the GEMM alone)
        named = dict(zip(layer.signature.arg_names, module._launch_arguments(layer, x, suffix, states, lengths)))
        self._mark("arguments")
        data = [k for k in named if k not in ("x", "W_ih", "b_ih")]  # the recurrent launch's, but its projection
        per_call = {f"{s}0" for s in module._states} if states else set()  # the caller's: copied at every call
        if lengths is not None:
            per_call.add("lengths")
        per_gpu, inputs = [], []
        for g, device in enumerate(devices):  # every GPU's copy of the input before any GPU's projection
            per_gpu.append({k: named[k] if g == 0 else named[k].to(device) if k in per_call else
                            self._on(index, g, k, named[k], device) for k in data})
            inputs.append(x if g == 0 else x.to(device))
        self._mark("inputs")
        for g, (device, here) in enumerate(zip(devices, per_gpu)):
            W_ih, b_ih = self._projection_rows(layer, index, g, named["W_ih"], named["b_ih"], device)

            def kept_biased(W, b, g=g):  # [W_ih | b_ih | 0] of this GPU's rows, made once per weight update
                return self._kept((index, g, "biased"), (W, b), lambda: biased(W, b))

            here["xp"] = project(inputs[g], W_ih, b_ih, biased_weight=kept_biased, rounded=rounds(layer))
        self._mark("projections")
        outputs = self.launcher(layer, devices)(per_gpu, [current_stream(d) for d in devices])
        self._mark("recurrent")
        out, *finals = outputs[0]
        for g, (theirs_out, *theirs) in enumerate(outputs[1:], start=1):
            units = layer.units_of(g)
            for target, other in ((out, theirs_out), *zip(finals, theirs)):
                for cols in _unit_columns(units, module.hidden_size, target.shape[-1]):
                    target[..., cols].copy_(other[..., cols])  # one kernel over NVLink where torch has P2P
        self._mark("gather")
        return out, finals

    def _mark(self, name: str) -> None:
        if self.phase is not None:
            self.phase(name)

    def _on(self, index: int, g: int, arg: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Argument ``arg`` of layer ``index`` (``t``, on the first GPU: a parameter, or what a call derives from
        the parameters) on GPU ``g``: a copy, kept while ``t`` is the same tensor at the same version."""
        return self._kept((index, g, arg), (t,), lambda: t.to(device).contiguous())

    def _projection_rows(self, layer, index: int, g: int, W: torch.Tensor, b, device: torch.device) -> tuple:
        """``(W_ih, b_ih)`` of GPU ``g``'s columns of the input projection (``SplitLayer.columns_of``: zero rows
        past hidden), on that GPU, from the first GPU's ``W`` and ``b`` (None: folded into the params, and so
        none here), kept while they stay the same."""

        def rows():
            columns = torch.as_tensor(layer.columns_of(g), device=W.device)
            inside, taken = columns >= 0, columns.clamp(min=0)
            return (torch.where(inside.unsqueeze(1), W[taken], 0).to(device).contiguous(),
                    None if b is None else torch.where(inside, b[taken], 0).to(device).contiguous())

        return self._kept((index, g, "projection", layer.ctas_per_gpu), (W, b), rows)

    def _kept(self, key: tuple, sources: tuple, make):
        """``make()``, kept under ``key`` while each of ``sources`` (tensors, or None) is the same tensor at the
        same address and version (an in-place update moves the version; a remade tensor is another object)."""
        found = self.copies.get(key)
        if found is not None and len(found[0]) == len(sources) and all(
            (t is None and s is None) or (s is not None and s[0] is t and s[1] == t.data_ptr() and s[2] == t._version)
            for s, t in zip(found[0], sources)
        ):
            return found[1]
        made = make()
        self.copies[key] = (tuple(None if t is None else (t, t.data_ptr(), t._version) for t in sources), made)
        return made


def gpu(index: int) -> torch.device:
    """The torch device of CUDA device ``index``."""
    return torch.device("cuda", index)


def _unit_columns(units, hidden: int, width: int) -> list:
    from prnn_tvm.runtime.split import unit_columns  # TVM's runtime: imported once a layer has run

    return unit_columns(units, hidden, width)

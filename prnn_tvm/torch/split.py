"""A module's layers split over the GPUs of one host (``prnn_tvm.torch.LSTM(..., devices=[0, 1])``,
``from_torch(m, devices=[...])``): each layer a :class:`~prnn_tvm.runtime.split.SplitLayer`, run on torch tensors.

For layers too big for one GPU (LSTM fp16 hidden 4096: 134 MB of recurrent weights, a quarter on each of four
H100s). Inference only: the parameters and a call's tensors live on the first device, and so do its outputs. Per
call and layer: the input goes to every other GPU (one copy each, over NVLink); each GPU computes its own columns of
the input projection with torch's GEMM (cuBLAS, :func:`~prnn_tvm.torch.projection.project`: its rows of ``W_ih``
and ``b_ih``); the recurrent kernels run on every GPU's current torch stream (``tvm_ffi.use_raw_stream``; torch's
copies between GPUs synchronize with both GPUs' current streams), their arrays crossing by DLPack without copies;
each GPU's units of the output sequence and of the final states come back into the first GPU's. The recurrent
weights and params are copied to every other GPU once, and again only after a parameter changed (its version
counter moves with every in-place update). Nothing waits for the GPUs: a barrier timeout is raised by the next call
or by :meth:`SplitLayers.check`.

What the split does not do is refused with the reason (:func:`call_refusal`, :func:`module_refusal`): gradients
(training), both directions, torch.autocast's casts, CPU tensors or tensors off the first device. A layer is
compiled for each batch size the first time it is called with it (no batch buckets: a split layer's compile takes
tens of seconds) and kept.
"""

from __future__ import annotations

import contextlib
import logging

import torch  # PyTorch itself: absolute import
import tvm_ffi

from prnn_tvm.deferred import compile_cell

from .arguments import parameter_suffix
from .dispatch import DTYPES, current_stream
from .projection import biased, project

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
    """The split layers of a module (one per layer and batch size, compiled on first use) and each layer's
    weights on every other GPU."""

    def __init__(self):
        self.layers: dict = {}  # (layer, batch, dtype, input width) -> SplitLayer
        self.copies: dict = {}  # (layer, GPU index, argument) -> (its parameters' memory and versions, the copy)

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

    def _run_layer(self, module, layer, index: int, x: torch.Tensor, states: list, lengths) -> tuple:
        devices = [gpu(d) for d in module.devices]
        per_gpu = []
        with contextlib.ExitStack() as streams:
            for g, device in enumerate(devices):
                streams.enter_context(tvm_ffi.use_raw_stream(layer.parts[g].device, current_stream(device)))
                here = x if g == 0 else x.to(device)
                W_ih, b_ih = self._projection_rows(module, layer, index, g, device)
                named = {"xp": project(here, W_ih, b_ih, biased_weight=biased)}
                for arg in layer.plan.weights + layer.plan.params:
                    named[arg.name] = self._copy(module, index, g, arg.name, device)
                for state, value in zip(module._states, states):
                    named[f"{state}0"] = value.contiguous().to(device)
                if lengths is not None:
                    named["lengths"] = lengths.to(device)
                per_gpu.append(named)
            call = layer.bind_each(per_gpu, recurrent=True)
            call.run()
        outputs = [[torch.from_dlpack(t) for t in own] for own in call.outputs]
        out, *finals = outputs[0]
        for g, (theirs_out, *theirs) in enumerate(outputs[1:], start=1):
            units = layer.units_of(g)
            for target, other in ((out, theirs_out), *zip(finals, theirs)):
                for cols in _unit_columns(units, module.hidden_size, target.shape[-1]):
                    target[..., cols] = other[..., cols].to(devices[0])
        return out, finals

    def _parameter(self, module, index: int, arg: str) -> torch.Tensor:
        return module._parameter(module._names[arg] + parameter_suffix(index, 0))

    def _copy(self, module, index: int, g: int, arg: str, device: torch.device) -> torch.Tensor:
        """Argument ``arg`` of layer ``index`` on GPU ``g``: the parameter itself on the first, else its copy."""
        p = self._parameter(module, index, arg)
        if g == 0:
            return p.detach().contiguous()
        return self._kept((index, g, arg), (p,), lambda: p.detach().to(device).contiguous())

    def _projection_rows(self, module, layer, index: int, g: int, device: torch.device) -> tuple:
        """``(W_ih, b_ih)`` of GPU ``g``'s columns of the input projection (``SplitLayer.columns_of``: zero rows
        past hidden), on that GPU."""
        W, b = self._parameter(module, index, "W_ih").detach(), self._parameter(module, index, "b_ih").detach()

        def rows():
            columns = torch.as_tensor(layer.columns_of(g), device=W.device)
            inside, taken = columns >= 0, columns.clamp(min=0)
            return (torch.where(inside.unsqueeze(1), W[taken], 0).to(device).contiguous(),
                    torch.where(inside, b[taken], 0).to(device).contiguous())

        return self._kept((index, g, "projection", layer.ctas_per_gpu), (W, b), rows)

    def _kept(self, key: tuple, sources: tuple, make):
        """``make()``, kept under ``key`` while each of ``sources`` (parameters) is the same tensor's memory at the
        same version (an in-place update moves it)."""
        stamp = tuple((t.data_ptr(), t._version) for t in sources)
        found = self.copies.get(key)
        if found is not None and found[0] == stamp:
            return found[1]
        made = make()
        self.copies[key] = (stamp, made)
        return made


def gpu(index: int) -> torch.device:
    """The torch device of CUDA device ``index``."""
    return torch.device("cuda", index)


def _unit_columns(units, hidden: int, width: int) -> list:
    from prnn_tvm.runtime.split import unit_columns  # TVM's runtime: imported once a layer has run

    return unit_columns(units, hidden, width)

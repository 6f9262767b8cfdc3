"""A module's layers as one torch operator, ``prnn_tvm::layers``, so that ``torch.compile`` (``fullgraph=True``)
and ``torch.export`` record a call instead of breaking the graph around it.

The operator takes tensors (the time-major input, every parameter in the module's order, the initial states, the
rows' lengths) and a few plain values that name the compiled layers' configuration (the cell, hidden size, layers,
directions, bias, parameter names, arch, the launch options); the dtype and input width come from the tensors.
Nothing is compiled while a graph is traced: the fake implementation gives the outputs' shapes and dtypes, and the
real one looks the configuration up at run time (:func:`layers_for`: a parameterless module of it, on the meta
device, made and kept on first use, whose compiled layers serve every module of that configuration) and runs its
layers on the given parameters. An exported program therefore runs in any process, compiling (or loading from the
layer cache) on its first call.

Gradients: ``prnn_tvm::layers_backward`` runs the layers again with autograd on, through the modules' own
differentiable path (the compiled backward), and returns the gradients of the input, parameters and initial
states. It is an operator too, so that AOTAutograd traces the backward graph without running kernels; the forward
is thus computed twice in a compiled training step (the eager path runs it once).

Needs ``torch.library.custom_op`` and ``register_autograd`` (torch 2.4 and later) and torch's dispatch key guard;
:data:`AVAILABLE` is the feature test. Where it is False a compiled call breaks the graph around the layers, as
before, and ``torch.export`` is refused.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

import torch  # PyTorch itself: absolute import

from .amp import autocast_dtype

AVAILABLE = all(
    (
        hasattr(torch.library, "custom_op"),
        hasattr(torch.library, "register_autograd"),
        hasattr(torch._C, "_ForceDispatchKeyGuard"),
    )
)

_RUNNERS: dict = {}  # configuration -> the parameterless module that runs it (layers_for)
_NOTHING = contextlib.nullcontext()  # reusable
_MAKING = threading.Lock()


_MAKE_RUNNER = None  # the modules' factory of a configuration's parameterless module (serve_with)


def serve_with(make) -> None:
    """How the operator makes the module that runs a configuration: ``make(cell, input_size, hidden_size,
    num_layers, bidirectional, bias, torch_names, arch, dtype)``, a module on the meta device. Called once by
    :mod:`prnn_tvm.torch.modules`, which imports this file (so this file imports nothing of it)."""
    global _MAKE_RUNNER
    _MAKE_RUNNER = make


def layers_for(
    cell: str,
    input_size: int,
    hidden_size: int,
    num_layers: int,
    bidirectional: bool,
    bias: bool,
    torch_names: bool,
    arch: Optional[str],
    dtype: torch.dtype,
    options: tuple,
):
    """The parameterless module that runs a configuration (made on the meta device on first use, then kept): its
    compiled layers, caches and launch options (``options``: ``wavefront``, ``one_launch_directions``,
    ``concurrent_directions``) are those of every module of the configuration called through the operator."""
    key = (cell, input_size, hidden_size, num_layers, bidirectional, bias, torch_names, arch, dtype, options)
    runner = _RUNNERS.get(key)
    if runner is None:
        with _MAKING:
            runner = _RUNNERS.get(key)
            if runner is None:
                runner = _MAKE_RUNNER(
                    cell, input_size, hidden_size, num_layers, bidirectional, bias, torch_names, arch, dtype
                ).eval()
                runner.wavefront, runner.one_launch_directions, runner.concurrent_directions = options
                _RUNNERS[key] = runner
    return runner


def _runner(x, params, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch, options):
    return layers_for(
        cell, x.shape[2], hidden_size, num_layers, bidirectional, bias, torch_names, arch, params[0].dtype, options
    )


if AVAILABLE:

    @torch.library.custom_op("prnn_tvm::layers", mutates_args=())
    def layers(
        x: torch.Tensor,
        params: list[torch.Tensor],
        initial: list[torch.Tensor],
        lengths: Optional[torch.Tensor],
        cell: str,
        hidden_size: int,
        num_layers: int,
        bidirectional: bool,
        bias: bool,
        torch_names: bool,
        arch: Optional[str],
        wavefront: bool,
        one_launch: bool,
        concurrent: bool,
        states: int,
    ) -> list[torch.Tensor]:
        """A module's layers on ``x`` (T, B, F), time-major and compact: ``[out, *finals]``, ``out`` (T, B, H x
        directions), each final state (layers x directions, B, H). ``params``: every parameter, in the
        module's order; ``initial``: per state (layers x directions, B, H), or none for zeros; ``lengths``: each
        row's steps (int32 on ``x``'s device) or None; ``states``: how many states the cell has."""
        options = (wavefront, one_launch, concurrent)
        runner = _runner(x, params, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch, options)
        with _autocast_off(x):
            out, finals = runner._run_given(x, params, initial, lengths, False)
        return [out, *finals]

    @layers.register_fake
    def _(x, params, initial, lengths, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch,
          wavefront, one_launch, concurrent, states):  # fmt: skip
        T, B, _ = x.shape
        directions = 2 if bidirectional else 1
        return [
            x.new_empty(T, B, hidden_size * directions),
            *(x.new_empty(num_layers * directions, B, hidden_size) for _ in range(states)),
        ]

    @torch.library.custom_op("prnn_tvm::layers_backward", mutates_args=())
    def layers_backward(
        x: torch.Tensor,
        params: list[torch.Tensor],
        initial: list[torch.Tensor],
        lengths: Optional[torch.Tensor],
        grads: list[torch.Tensor],
        cell: str,
        hidden_size: int,
        num_layers: int,
        bidirectional: bool,
        bias: bool,
        torch_names: bool,
        arch: Optional[str],
        wavefront: bool,
        one_launch: bool,
        concurrent: bool,
    ) -> list[torch.Tensor]:
        """The gradients of :func:`layers`' ``x``, ``params`` and ``initial`` (in that order, zeros where a
        tensor does not reach the outputs) given ``grads``, one per output: the layers run again, differentiable
        (the modules' own training path and compiled backward), with autograd let back in (an operator runs below
        it)."""
        options = (wavefront, one_launch, concurrent)
        runner = _runner(x, params, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch, options)
        inputs = [t.detach().requires_grad_() for t in (x, *params, *initial)]
        with _autograd_on(), torch.enable_grad(), _autocast_off(x):
            given = inputs[1 : 1 + len(params)]
            out, finals = runner._run_given(inputs[0], given, inputs[1 + len(params) :], lengths, True)
            found = torch.autograd.grad([out, *finals], inputs, grads, allow_unused=True)
        return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found)]

    @layers_backward.register_fake
    def _(x, params, initial, lengths, grads, *config):
        return [torch.empty_like(t) for t in (x, *params, *initial)]

    def _setup(ctx, inputs, output):
        x, params, initial, lengths, *config = inputs
        ctx.counts, ctx.config = (len(params), len(initial)), config[:-1]  # the backward needs no state count
        ctx.save_for_backward(x, lengths, *params, *initial)

    def _backward(ctx, grads):
        x, lengths, *rest = ctx.saved_tensors
        n_params, _ = ctx.counts
        params, initial = rest[:n_params], rest[n_params:]
        grads = [g.contiguous() for g in grads]
        found = layers_backward(x, list(params), list(initial), lengths, grads, *ctx.config)
        nothing = [None] * (len(ctx.config) + 2)  # lengths and the plain values (the state count too): none
        return (found[0], found[1 : 1 + n_params], found[1 + n_params :], *nothing)

    layers.register_autograd(_backward, setup_context=_setup)


def _autocast_off(x: torch.Tensor):
    """torch.autocast off while the layers run, as an eager call runs them: they pick their own dtypes (a half
    layer's projection into float32), and the parameters come cast already."""
    return torch.autocast(x.device.type, enabled=False) if autocast_dtype(x.device.type) else _NOTHING


def _autograd_on():
    """Autograd's dispatch keys let back in: an operator's implementation runs below autograd (they are
    excluded), so the differentiable path it calls would record nothing."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for name in torch._C.DispatchKey.__members__:
        if name.startswith("Autograd") or name == "ADInplaceOrView":
            excluded = excluded.remove(getattr(torch._C.DispatchKey, name))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded)

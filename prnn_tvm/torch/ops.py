"""A module's layers as torch operators, so that ``torch.compile`` (``fullgraph=True``) and ``torch.export``
record a call instead of breaking the graph around it: ``prnn_tvm::layers`` (inference, and what torch.export
records) and ``prnn_tvm::layers_train`` (a call that needs gradients, under torch.compile).

The operators take tensors (the time-major input, every parameter in the module's order, the initial states, the
rows' lengths) and a few plain values that name the compiled layers' configuration (the cell, hidden size, layers,
directions, bias, parameter names, arch, the launch options); the dtype and input width come from the tensors.
Nothing is compiled while a graph is traced: the fake implementation gives the outputs' shapes and dtypes, and the
real one looks the configuration up at run time (:func:`layers_for`: a parameterless module of it, on the meta
device, made and kept on first use, whose compiled layers serve every module of that configuration) and runs its
layers on the given parameters. An exported program therefore runs in any process, compiling (or loading from the
layer cache) on its first call.

Gradients: ``prnn_tvm::layers_train`` runs the modules' own differentiable path (the compiled backward) and keeps
the call's autograd graph, handing out a token for it (an extra output), and ``prnn_tvm::layers_backward`` takes
the token and the outputs' gradients and returns those of the input, parameters and initial states: the forward
runs once in a compiled training step, as eagerly. Both are operators, so that AOTAutograd traces the forward and
backward graphs without running kernels. ``prnn_tvm::layers`` differentiated (an exported program trained) runs
the layers again in its backward.

The operators are defined with ``torch.library.Library`` (CPU and CUDA kernels, fake kernels, and an autograd
kernel of their own): a call that needs no gradient costs a Python call beside the layers (torch.library's
``custom_op`` wrapper, tens of microseconds a call, would make a warm compiled call slower than an eager one). A
call repeated with tensors of the same shapes runs the plan an eager module's repeated call runs
(:mod:`~prnn_tvm.torch.repeat`: the runner's, made from the parameters it is given, checked against them at each
call): inside a compiled call every Python function call costs more than outside it (torch's frame evaluation hook
stays installed for the whole interpreter), so the fewer the better.
Needs ``torch.library.register_fake`` (torch 2.4 and later) and torch's dispatch key guards; :data:`AVAILABLE` is
the feature test. Where it is False a compiled call breaks the graph around the layers, as before, and
``torch.export`` is refused.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from typing import Optional

import numpy
import torch  # PyTorch itself: absolute import

from . import repeat
from .amp import autocast_dtype

AVAILABLE = all(
    (
        hasattr(torch.library, "register_fake"),
        hasattr(torch._C, "_ForceDispatchKeyGuard"),
        hasattr(torch._C, "_AutoDispatchBelowAutograd"),
        hasattr(torch._C, "_after_autograd_keyset"),
    )
)

_RUNNERS: dict = {}  # configuration -> the parameterless module that runs it (layers_for)
# the repeated calls' plans a configuration's module keeps (:mod:`~prnn_tvm.torch.repeat`; each holds the parameters it
# was made from, so few: a module let go is let go by the operator after this many new keys at most)
PLANS = 8
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


# The operators' schemas (ints as SymInt, as torch.library.custom_op declares them: programs exported before read alike)
_CONFIG = (
    "str cell, SymInt hidden_size, SymInt num_layers, bool bidirectional, bool bias, bool torch_names, str? arch, "
    "bool wavefront, bool one_launch, bool concurrent"
)
_TENSORS = "Tensor x, Tensor[] params, Tensor[] initial, Tensor? lengths"
SCHEMAS = {
    "layers": f"layers({_TENSORS}, {_CONFIG}, SymInt states) -> Tensor[]",
    "layers_train": f"layers_train({_TENSORS}, {_CONFIG}, SymInt states) -> Tensor[]",
    "layers_backward": f"layers_backward({_TENSORS}, Tensor[] grads, Tensor? saved, {_CONFIG}) -> Tensor[]",
}
_KEPT: dict = {}  # token -> (inputs, outputs): a training call's autograd graph, kept for its backward (_kept)
_TOKENS = itertools.count(1)
_NOTHING = contextlib.nullcontext()  # reusable


def _layers(x, params, initial, lengths, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch,
            wavefront, one_launch, concurrent, states):  # fmt: skip
    """``prnn_tvm::layers``: a module's layers on ``x`` (T, B, F), time-major and compact: ``[out, *finals]``,
    ``out`` (T, B, H x directions), each final state (layers x directions, B, H). ``params``: every parameter, in
    the module's order; ``initial``: per state (layers x directions, B, H), or none for zeros; ``lengths``: each
    row's steps (int32 on ``x``'s device) or None; ``states``: how many states the cell has."""
    options = (wavefront, one_launch, concurrent)
    runner = _runner(x, params, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch, options)
    hx = initial or None
    key = None if lengths is not None else repeat.call_key(runner, x, hx)
    if key is not None:  # a repeated call: its plan, as an eager module's (the runner's, made from these parameters)
        key = (*key, id(params[0]))  # modules of one configuration called in turn: a plan each (PLANS at most)
        given = dict(zip(runner._shapes, params))
        done = repeat.planned(runner, key, x, hx, given)
        if done is not None:
            out, finals = done
            return [out, *finals] if states > 1 else [out, finals]
    with _autocast_off(x):
        out, finals = runner._run_given(x, params, initial, lengths, False)
    if key is not None:
        repeat.note(runner, key, x, hx, given, PLANS)
    return [out, *finals]


def _layers_fake(x, params, initial, lengths, cell, hidden_size, num_layers, bidirectional, bias, torch_names, arch,
                 wavefront, one_launch, concurrent, states):  # fmt: skip
    T, B, _ = x.shape
    directions = 2 if bidirectional else 1
    return [
        x.new_empty(T, B, hidden_size * directions),
        *(x.new_empty(num_layers * directions, B, hidden_size) for _ in range(states)),
    ]


def _layers_train(x, params, initial, lengths, *config):
    """``prnn_tvm::layers_train``: :func:`_layers` on the training path (the modules' differentiable layers),
    the call's autograd graph kept for ``prnn_tvm::layers_backward``: ``[out, *finals, saved]``, ``saved`` the
    graph's token (:func:`_kept`), so that a compiled training step runs the forward once."""
    inputs, outputs = _differentiated(x, params, initial, lengths, config)
    return [*(t.detach() for t in outputs), _kept((inputs, outputs))]


def _differentiated(x, params, initial, lengths, config) -> tuple:
    """``(inputs, outputs)``: the layers run differentiable (autograd let back in: an operator runs below it) on
    ``x``, ``params`` and ``initial`` detached, as the leaves of their graph; ``config``: the plain values."""
    runner = _runner(x, params, *config[:7], tuple(config[7:10]))
    inputs = [t.detach().requires_grad_() for t in (x, *params, *initial)]
    with _autograd_on(), torch.enable_grad(), _autocast_off(x):
        given = inputs[1 : 1 + len(params)]
        out, finals = runner._run_given(inputs[0], given, inputs[1 + len(params) :], lengths, True)
    return inputs, [out, *finals]


def _layers_train_fake(x, params, initial, lengths, *config):
    return [*_layers_fake(x, params, initial, lengths, *config), torch.empty(1, dtype=torch.int64)]


def _layers_backward(x, params, initial, lengths, grads, saved, *config):
    """``prnn_tvm::layers_backward``: the gradients of ``x``, ``params`` and ``initial`` (in that order, zeros
    where a tensor does not reach the outputs) given ``grads``, one per output, through the autograd graph that
    ``prnn_tvm::layers_train`` kept (``saved``); without one (``prnn_tvm::layers`` differentiated) the layers run
    again, differentiable, with autograd let back in (an operator runs below it)."""
    graph = None if saved is None else _KEPT.get(int(saved[0]))
    inputs, outputs = graph or _differentiated(x, params, initial, lengths, config)
    with _autograd_on(), torch.enable_grad():
        found = torch.autograd.grad(outputs, inputs, grads, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found)]


def _layers_backward_fake(x, params, initial, lengths, grads, saved, *config):
    return [torch.empty_like(t) for t in (x, *params, *initial)]


def _kept(graph) -> torch.Tensor:
    """A token for ``graph`` (kept in :data:`_KEPT`): a one-element int64 tensor whose memory is a NumPy array's,
    so that the graph is let go with the last tensor sharing that memory (the compiled step's saved copy, freed
    after its backward, or with the step's graph if no backward runs)."""
    token = next(_TOKENS)
    holder = numpy.array([token], dtype=numpy.int64)
    _KEPT[token] = graph
    weakref.finalize(holder, _KEPT.pop, token, None)
    return torch.from_numpy(holder)


class _Differentiable(torch.autograd.Function):
    """``prnn_tvm::layers`` or ``layers_train`` where a gradient is wanted: the operator below autograd (what
    AOTAutograd records), and ``prnn_tvm::layers_backward`` for the backward (given ``layers_train``'s token).
    Arguments: the operator, the call's dispatch keys, the numbers of parameters and initial states, ``lengths``,
    the plain values, then the tensors flat (``x``, parameters, initial states: autograd differentiates only
    tensors given as arguments)."""

    @staticmethod
    def forward(ctx, op, keyset, counts, lengths, config, *tensors):
        x, params, initial = _split(tensors, counts)
        with torch._C._AutoDispatchBelowAutograd():
            result = op.redispatch(keyset & torch._C._after_autograd_keyset, x, params, initial, lengths, *config)
        saved = result[-1] if op is _OPS["layers_train"] else None
        if saved is not None:
            ctx.mark_non_differentiable(saved)
        ctx.counts, ctx.config = counts, config[:-1]  # the backward needs no state count
        ctx.save_for_backward(lengths, saved, *tensors)
        return tuple(result)

    @staticmethod
    def backward(ctx, *grads):
        lengths, saved, *tensors = ctx.saved_tensors
        x, params, initial = _split(tensors, ctx.counts)
        grads = [g.contiguous() for g in grads[: len(grads) - (saved is not None)]]  # none for the token
        found = _OPS["layers_backward"](x, params, initial, lengths, grads, saved, *ctx.config)
        return (None, None, None, None, None, *found)


def _split(tensors, counts):
    n_params, _ = counts
    return tensors[0], list(tensors[1 : 1 + n_params]), list(tensors[1 + n_params :])


_PLAIN = ()  # the dispatch keys of a call on plain tensors (no tracer below autograd), set with the operators


def _autograd_kernel(name, implementation):
    """The operator's autograd kernel: a call that needs no gradient on plain tensors runs ``implementation``
    at once (a microsecond, where redispatching costs tens), one that is traced (fake tensors, torch.export)
    goes on below autograd, and one that needs a gradient is :class:`_Differentiable`."""

    def kernel(keyset, x, params, initial, lengths, *config):
        op = _OPS[name]
        if torch.is_grad_enabled() and torch._C._any_requires_grad(x, params, initial):
            counts = (len(params), len(initial))
            return list(_Differentiable.apply(op, keyset, counts, lengths, config, x, *params, *initial))
        below = keyset & torch._C._after_autograd_keyset
        if below.highestPriorityTypeId() in _PLAIN:
            return implementation(x, params, initial, lengths, *config)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(below, x, params, initial, lengths, *config)

    return kernel


_OPS: dict = {}  # name -> the OpOverload
_LIBRARY = None  # the torch.library.Library that holds them (kept: dropping it would remove the operators)


def _register():
    """Define the operators in the ``prnn_tvm`` namespace: CPU and CUDA kernels, fake ones, autograd kernels."""
    global _PLAIN, _LIBRARY
    _LIBRARY = torch.library.Library("prnn_tvm", "DEF")
    kernels = {
        "layers": (_layers, _layers_fake),
        "layers_train": (_layers_train, _layers_train_fake),
        "layers_backward": (_layers_backward, _layers_backward_fake),
    }
    for name, (real, fake) in kernels.items():
        _LIBRARY.define(SCHEMAS[name], tags=(torch.Tag.pt2_compliant_tag,))
        for key in ("CPU", "CUDA"):
            _LIBRARY.impl(name, real, key)
        torch.library.register_fake(f"prnn_tvm::{name}", fake, lib=_LIBRARY)
        _OPS[name] = getattr(torch.ops.prnn_tvm, name).default
    for name in ("layers", "layers_train"):
        _LIBRARY.impl(name, _autograd_kernel(name, kernels[name][0]), "Autograd", with_keyset=True)
    _PLAIN = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


if AVAILABLE:
    _register()


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

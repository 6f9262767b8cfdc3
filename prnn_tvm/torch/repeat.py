"""The repeated call: a module called again and again with tensors of the same shapes (a decoder stepping one
timestep at a time, T=1, its states passed in and out) skips what depends only on those shapes and the parameters.

What a call decides from its input's shape, dtype and device, its initial states', the module's options and its
parameters (the compiled layers, wavefront stack or layer by layer, the launches' weights made from the parameters,
each layer's projection with its transposed weight, the constants, the launchers) is worked out by the module's
own call path (:mod:`~prnn_tvm.torch.dispatch`, :mod:`~prnn_tvm.torch.arguments`) and kept as a :class:`Plan` once
a key has been called twice; the next calls of that key run its launches alone. Per call, what could make the plan
wrong is checked, cheaply: the key itself, every parameter the same object at the same address and version, no
autograd (grad mode off, or nothing that requires gradients), no autocast, no tracing (``torch.jit``,
``torch.compile``, ``torch.export``) and, on the GPU, no stream capture (one ``is_current_stream_capturing``); any of
them, and every case a plan does not cover (packed sequences, both directions, rows padded up to a bucket, a layer on
torch.nn's kernels, dropout in training, parametrizations, layers split over GPUs), takes the module's own path.
Setting any attribute of the module (options, ``train()``/``eval()``, a replaced parameter) and dropping a batch
size's layers forget every plan. The operator ``prnn_tvm::layers`` (:mod:`~prnn_tvm.torch.ops`: torch.compile,
torch.export) plans its repeated calls the same way, on the parameters it is given rather than the module's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch  # PyTorch itself: absolute import
import tvm_ffi

from .amp import autocast_dtype
from .arguments import aligned_state, detached, parameter_suffix
from .dispatch import current_stream, final_slots, stacked_finals
from .fallback import refusal
from .projection import projector

_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)
_COMPILING = torch.compiler.is_compiling
_TRACING = torch._C._get_tracing_state
SEEN = "seen"  # a key called once: the next call of it makes its plan
UNPLANNED = "unplanned"  # a key whose calls plans do not cover
MOST_KEYS = 64  # keys a module remembers (seen, planned or not): past it, every key is forgotten and seen anew


class Step(NamedTuple):
    """One launch of a plan: its launcher, its projection (``x -> xp``), the weights and params it passes after
    ``xp`` (TVM tensors, converted once), the zeros it passes for omitted initial states, its row lengths, and
    the parameters they were made from (as :attr:`Plan.made_from`)."""

    launcher: object
    project: object
    weights: list
    zeros: list
    lengths: object
    made_from: tuple


class Plan(NamedTuple):
    """What the calls of one key run (:func:`plan_for`): ``steps`` (one per layer, or the wavefront stack's one),
    ``stack`` whether that one launch runs every layer, ``whole`` whether it writes the final states into
    (layers, B, H) tensors the call returns, ``made_from`` ``(name, parameter, address, version)`` of every parameter
    it was made from, ``group`` the batch size's group (:meth:`~prnn_tvm.torch.buckets.BatchBuckets._keep`)."""

    steps: list
    stack: bool
    whole: bool
    made_from: tuple
    group: tuple


def call_key(module, input, hx) -> tuple | None:
    """The key of a call that a plan may serve, or None where the module's own path runs it (see the module's doc).
    Its parts: the input's and the initial states' shapes, dtypes and devices."""
    if type(input) is not torch.Tensor or _TRACING() is not None or _COMPILING() or _EXPORTING():
        return None
    device = input.device
    if autocast_dtype(device.type) is not None or module._modules or module.devices is not None:
        return None
    if hx is None:
        return input.shape, input.dtype, device
    states = (hx,) if type(hx) is torch.Tensor else tuple(hx)
    if not all(type(t) is torch.Tensor for t in states):
        return None
    return input.shape, input.dtype, device, *((t.shape, t.dtype, t.device) for t in states)


def planned(module, key: tuple, input: torch.Tensor, hx, registered: dict | None = None) -> tuple | None:
    """The call of ``key`` (:func:`call_key`) through its plan (:func:`run`), or None where it has none or the plan
    no longer holds: the module's own path runs it, then :func:`note` is told."""
    plan = module._plans.get(key)
    return run(module, plan, input, hx, registered) if type(plan) is Plan else None


def note(module, key: tuple, input: torch.Tensor, hx, given: dict | None = None, most: int | None = None) -> None:
    """After the module's own path ran a call of ``key``: the key seen (planned at its next call), or its plan made
    (:func:`plan_for`; under ``torch.no_grad``, where what it keeps is made, and not inside a CUDA graph being
    captured). ``given``: the call's parameters where they are not the module's (the operator's, by name); ``most``:
    the keys kept, past which every one is forgotten (None: :data:`MOST_KEYS`)."""
    plans = module._plans
    plan = plans.get(key)
    if plan is None:  # called once: planned at the next call
        # shapes that keep changing (a sequence's length): start again
        if len(plans) >= (MOST_KEYS if most is None else most):
            plans.clear()
        plans[key] = SEEN
    elif (
        plan is not UNPLANNED
        and not torch.is_grad_enabled()
        and not (input.device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    ):
        previous = module._given.params
        module._given.params = given  # what plan_for reads the parameters through (the module's own where None)
        try:
            plans[key] = plan_for(module, input, hx) or UNPLANNED
        finally:
            module._given.params = previous


def run(module, plan: Plan, input: torch.Tensor, hx, registered: dict | None = None) -> tuple | None:
    """The call of ``input`` from ``hx`` through ``plan``, as the module's :meth:`forward` returns it; None where
    the plan no longer holds (a parameter changed, autograd tracks the call, a CUDA graph is being captured).
    ``registered``: the call's parameters by name where they are not the module's (the operator's)."""
    grad = torch.is_grad_enabled()
    if registered is None:
        registered = module._parameters
    for name, p, address, version in plan.made_from:
        q = registered.get(name)
        if q is not p or q._version != version or q.data_ptr() != address or (grad and q.requires_grad):
            return None
    hx = () if hx is None else (hx,) if type(hx) is torch.Tensor else hx
    if grad and (input.requires_grad or any(t.requires_grad for t in hx)):
        return None
    device = input.device
    stream = 0
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():  # the graph's own launch state: the module's own path
            return None
        stream = current_stream(device)
    batched, states = input.dim() == 3, len(module._states)
    x = input if batched else input.unsqueeze(1)
    if module.batch_first and batched:
        x = x.transpose(0, 1)
    x = x.contiguous()
    initial = [t if batched else t.unsqueeze(1) for t in hx]
    module._keep(plan.group)
    if plan.stack:
        out, finals = _stacked_run(module, plan, x, initial, stream)
    else:
        out, finals = x, [[] for _ in range(states)]
        for layer, step in enumerate(plan.steps):
            given = [aligned_state(t[layer]) for t in initial] or step.zeros
            out, *ends = step.launcher([step.project(out), *step.weights, *given, step.lengths], stream)
            for k, end in enumerate(ends):
                finals[k].append(end)
        finals = stacked_finals(finals)
    if not batched:
        out, finals = out.squeeze(1), [f.squeeze(1) for f in finals]
    elif module.batch_first:
        out = out.transpose(0, 1)
    return out, (tuple(finals) if states > 1 else finals[0])


def _stacked_run(module, plan: Plan, x: torch.Tensor, initial: list, stream: int) -> tuple:
    """A plan's wavefront stack on ``x``: ``(out, finals)``, finals per state (layers, B, H)."""
    (step,) = plan.steps
    layers = module.num_layers
    given = [aligned_state(t[layer]) for layer in range(layers) for t in initial] or step.zeros
    data = [step.project(x), *step.weights, *given, step.lengths]
    if plan.whole:  # the kernel writes each layer's final states into its slot of the states returned
        wholes = module._whole_finals(x.shape[1], x.device, x.dtype)
        _, into = final_slots(wholes, layers)
        out, *ends = step.launcher(data, stream, None, [None, *into])
        if ends[0] is into[0]:  # else a sequence run in pieces, which writes arrays of its own
            return out, wholes
    else:
        out, *ends = step.launcher(data, stream)
    states = len(module._states)
    finals = [[ends[layer * states + k] for layer in range(layers)] for k in range(states)]
    return out, stacked_finals(finals)


def plan_for(module, input: torch.Tensor, hx) -> Plan | None:
    """The plan of a call like this one (just run by the module's own path under ``torch.no_grad``, so its checks
    have passed), or None where the call is one that plans do not cover. Made by the module's own methods: the
    layers it compiled, the weights it keeps (:meth:`~prnn_tvm.torch.arguments.LaunchArguments._launch_arguments`)."""
    if module.bidirectional or (module.training and module.dropout):
        return None
    x = input if input.dim() == 3 else input.unsqueeze(1)
    if module.batch_first and input.dim() == 3:
        x = x.transpose(0, 1)
    B, device, dtype = x.shape[1], x.device, x.dtype
    rows = module.rows_for(B, device, dtype)
    if rows != B:
        return None  # padded up to a bucket
    given = hx is not None
    stack = module.stack_for(rows, device, dtype)
    if stack is not None:
        steps = [_step(module, stack, x, None, given)]
        whole = module._whole_finals(rows, device, dtype) is not None
    else:
        steps, width = [], x.shape[2]
        for layer in range(module.num_layers):
            if refusal(module, layer, rows, device, dtype, width, False):
                return None  # torch.nn's kernels run it
            compiled = module.layer_for(rows, device, dtype, width)
            steps.append(_step(module, compiled, x.new_empty(1, rows, width), parameter_suffix(layer, 0), given))
            width = module.hidden_size
        whole = False
    made_from = {entry[0]: entry for step in steps for entry in step.made_from}  # a stack's, each layer's
    return Plan(steps, stack is not None, whole, tuple(made_from.values()), (rows, device.type, device.index, dtype))


def _step(module, layer, x: torch.Tensor, suffix: str | None, given: bool) -> Step:
    """A plan's launch of ``layer`` (``suffix``: its layer's parameters, None for a stack) on inputs like ``x``."""
    entries = module._parameter_arguments(layer, suffix)
    args = module._launch_arguments(layer, detached(x, False), suffix, [], None)
    weights = args[1 : 1 + len(entries)]
    zeros = args[1 + len(entries) : -1]
    launcher = module._launcher(layer, x.device)
    convert = tvm_ffi.from_dlpack
    return Step(
        launcher,
        projector(weights[0], weights[1], module._biased_weight),
        [convert(w) for w in weights[2:]],
        [] if given else [convert(z) for z in zeros],
        convert(args[-1]),
        module._arguments[(id(layer), suffix, "weights")][0],  # kept by _launch_arguments with the weights
    )

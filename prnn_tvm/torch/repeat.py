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

import logging
import operator
from typing import NamedTuple

import torch  # PyTorch itself: absolute import

from prnn_tvm.deferred import compile_projected
from prnn_tvm.errors import ConfigError, LaunchError

from .amp import autocast_dtype
from .arguments import aligned_state, detached, parameter_suffix
from .dispatch import current_stream, stacked_finals
from .fallback import refusal
from .projection import projector, rounds
from .state_rows import StateRows

log = logging.getLogger(__name__)

_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)
_COMPILING = torch.compiler.is_compiling
_TRACING = torch._C._get_tracing_state
_CAPTURING = torch.cuda.is_current_stream_capturing
SEEN = "seen"  # a key called once: the next call of it makes its plan
UNPLANNED = "unplanned"  # a key whose calls plans do not cover
MOST_KEYS = 64  # keys a module remembers (seen, planned or not): past it, every key is forgotten and seen anew
# whether a plan of one timestep launches each layer once (a wavefront stack: the stack once), the input projected in
# the recurrent kernel (:func:`_projected_step`), where the layer's config leaves room for it; else the projection is a
# launch of its own (torch's GEMM)
ONE_LAUNCH = True


class Step(NamedTuple):
    """One launch of a plan: its launch with the weights, params and row lengths in place (and the zeros of omitted
    initial states: the runtime's :class:`~prnn_tvm.runtime.launcher.Bound`, made by its Launcher), its projection
    (``x -> xp``), and the parameters they were made from (as :attr:`Plan.made_from`)."""

    launch: object
    project: object
    made_from: tuple


class Plan(NamedTuple):
    """What the calls of one key run (:func:`plan_for`): ``steps`` (one per layer, or the wavefront stack's one),
    ``stack`` whether that one launch runs every layer, ``whole`` where the launches write the final states into
    (layers, B, H) tensors the call returns, what they write (:class:`Written`; else None), ``made_from`` ``(name,
    parameter, address, version)`` of every parameter it was made from, ``group`` the batch size's group
    (:meth:`~prnn_tvm.torch.buckets.BatchBuckets._keep`), ``device`` the key's, ``form`` how the input is laid out
    (:data:`TIME_MAJOR`, :data:`BATCH_FIRST` or :data:`UNBATCHED`), ``rows`` the rows of the states its calls were
    last given and last returned (:class:`~prnn_tvm.torch.state_rows.StateRows`)."""

    steps: list
    stack: bool
    whole: Written | None
    made_from: tuple
    group: tuple
    device: torch.device
    form: str
    rows: StateRows


TIME_MAJOR, BATCH_FIRST, UNBATCHED = "time-major", "batch_first", "unbatched"  # Plan.form


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
    if type(hx) is torch.Tensor:
        return input.shape, input.dtype, device, (hx.shape, hx.dtype, hx.device)
    key = [input.shape, input.dtype, device]  # a loop, not generators: a microsecond of every call
    for t in hx:
        if type(t) is not torch.Tensor:
            return None
        key.append((t.shape, t.dtype, t.device))
    return tuple(key)


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
    the plan no longer holds. What the key (shapes, dtypes, devices) does not say is checked here, each because a
    plan that ran past it would answer wrong: a parameter replaced, moved (``p.data = ...``, ``module.to``) or
    modified in place (the weights made from it would be stale), autograd tracking the call (the plan's launches
    are not differentiable), a CUDA graph being captured (a graph keeps a launch state of its own).
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
    device, form = plan.device, plan.form
    stream = 0
    if device.type == "cuda":
        if _CAPTURING():
            return None
        stream = current_stream(device)
    # time-major (T, B, F), compact; a batch_first input at T=1 is that already, its transpose a view
    x = input.unsqueeze(1) if form is UNBATCHED else input.transpose(0, 1) if form is BATCH_FIRST else input
    x = x.contiguous()
    module._keep(plan.group)
    layers, states = module.num_layers, len(module._states)
    # each layer's initial states, (B, H) (an unbatched (layers, H) state's row as (1, H)), aligned as kernels take
    # them, layer by layer: kept for the states last given and last returned (a decoder's next call passes either)
    given = plan.rows.rows(hx, layers, form is UNBATCHED) if hx else hx
    output, wholes, made = None, None, None
    if plan.whole is not None:  # the output and each state's (layers, B, H), and the rows the launches write
        output, wholes, made = plan.whole(x)
    if plan.stack:
        (step,) = plan.steps
        out, *ends = step.launch([step.project(x), *given], stream, None if made is None else [output, *made])
        if wholes is None:  # per layer, for stacking
            ends = [ends[layer * states : (layer + 1) * states] for layer in range(layers)]
    else:
        out, ends, last = x, [], len(plan.steps) - 1
        for layer, step in enumerate(plan.steps):
            at = slice(layer * states, (layer + 1) * states)
            into = None if made is None else [output if layer == last else None, *made[at]]
            out, *end = step.launch([step.project(out), *given[at]], stream, into)
            ends.append(end)
    finals = wholes if wholes is not None else stacked_finals([[end[k] for end in ends] for k in range(states)])
    if form is UNBATCHED:
        out, finals = out.squeeze(1), [f.squeeze(1) for f in finals]
    elif form is BATCH_FIRST:
        out = out.transpose(0, 1)
    if made is not None and x.shape[0] == 1:  # one step: the rows hold no more than the states (and a row of out)
        plan.rows.returning(finals, made)
    return out, (tuple(finals) if states > 1 else finals[0])


class Written:
    """What the launches of a plan whose final states are written in place (``Plan.whole``) write, made for each
    call as views of one uninitialized allocation (torch's allocator called once: measured 5.9 us against 10.0 for
    three allocations on the GPU): the call's output (steps, B, H), each state's final states (layers, B, H) that
    the call returns, and their (B, H) rows in the launches' order (layer by layer, the cell's states in order
    within a layer: ``dispatch.final_slots``'), taken by one ``unbind`` of the final states' part of the allocation
    rather than one per state (never of the output's steps: a view a step, ~1 ms a call at T=1024). Each row starts
    on a 64-byte boundary where a row of states does (``Dispatch._whole_finals``)."""

    __slots__ = ("shape", "sizes", "steps", "order")

    def __init__(self, steps: int, layers: int, states: int, batch: int, hidden: int):
        self.shape = (steps + states * layers, batch, hidden)
        self.sizes = [steps, *[layers] * states]
        self.steps = steps
        order = [state * layers + layer for layer in range(layers) for state in range(states)]  # past the steps
        self.order = operator.itemgetter(*order) if len(order) > 1 else lambda rows: (rows[order[0]],)

    def __call__(self, like: torch.Tensor) -> tuple:
        """``(output, finals, rows)`` in ``like``'s dtype and on its device: finals a list, rows a tuple."""
        one = like.new_empty(self.shape)
        output, *finals = one.split_with_sizes(self.sizes)
        return output, finals, self.order(one[self.steps :].unbind(0))


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
    given, T = hx is not None, x.shape[0]
    stack = module.stack_for(rows, device, dtype)
    if stack is not None:
        one = _projected_step(module, stack, x, None, given) if T == 1 and ONE_LAUNCH else None
        steps = [one or _step(module, stack, x, None, given)]
    else:
        steps, width = [], x.shape[2]
        for layer in range(module.num_layers):
            if refusal(module, layer, rows, device, dtype, width, False):
                return None  # torch.nn's kernels run it
            compiled = module.layer_for(rows, device, dtype, width)
            like, suffix = x.new_empty(T, rows, width), parameter_suffix(layer, 0)
            one = _projected_step(module, compiled, like, suffix, given) if T == 1 and ONE_LAUNCH else None
            steps.append(one or _step(module, compiled, like, suffix, given))
            width = module.hidden_size
    if any(step is None for step in steps):
        return None  # a sequence that runs in pieces
    made_from = {entry[0]: entry for step in steps for entry in step.made_from}  # a stack's, each layer's
    whole = None
    if module._whole_finals(rows, device, dtype) is not None:
        whole = Written(T, module.num_layers, len(module._states), rows, module.hidden_size)
    form = UNBATCHED if input.dim() != 3 else BATCH_FIRST if module.batch_first else TIME_MAJOR
    group = (rows, device.type, device.index, dtype)
    return Plan(steps, stack is not None, whole, tuple(made_from.values()), group, device, form, StateRows())


def _projected_step(module, layer, x: torch.Tensor, suffix: str | None, given: bool) -> Step | None:
    """A plan's launch of a CUDA ``layer`` (``suffix`` as :func:`_step`'s) that projects its own input
    (``recurrent_projected``: one launch where the projection and the recurrent kernel are two,
    :func:`~prnn_tvm.projected_build.compile_projected`, compiled here once per layer), on inputs like ``x``; its
    ``project`` only aligns the input as the kernel takes it. None where the layer has none (the reason logged once,
    when compiled) or its grid cannot be co-resident on this GPU (ptxas's registers): the two launches then."""
    if x.device.type != "cuda":
        return None
    try:
        kernel = compile_projected(layer)
        launcher = module._launcher(kernel.runtime, x.device, kernel.launch.function)  # co-residency checked here
    except (ConfigError, LaunchError):
        return None
    except Exception as err:  # a failed build of this optional kernel: the call must not fail for want of it
        log.warning("the projected kernel of %s failed to build (%s: %s); its projection stays a launch of its own",
                    layer.plan.cell.name, type(err).__name__, err)
        return None
    entries = module._parameter_arguments(layer, suffix)
    args = module._launch_arguments(layer, detached(x, False), suffix, [], None)
    weights = args[1 : 1 + len(entries)]
    zeros = args[1 + len(entries) : -1]
    W_ih, b_ih = weights[0], weights[1]
    if b_ih is None:  # carried by the recurrent params (folded)
        b_ih = module._constant((W_ih.shape[0],), x.device, W_ih.dtype)
    # kernel order: x, W_ih, b_ih, the recurrent weights and params, the initial states, the lengths
    launch = launcher.bound(
        [None, W_ih, b_ih, *weights[2:], *([None] * len(zeros) if given else zeros), args[-1]], x.shape[0]
    )
    if launch is None:
        return None
    return Step(launch, aligned_state, module._arguments[(id(layer), suffix, "weights")][0])


def _step(module, layer, x: torch.Tensor, suffix: str | None, given: bool) -> Step | None:
    """A plan's launch of ``layer`` (``suffix``: its layer's parameters, None for a stack) on inputs like ``x``; None
    where its sequence runs in pieces."""
    entries = module._parameter_arguments(layer, suffix)
    args = module._launch_arguments(layer, detached(x, False), suffix, [], None)
    weights = args[1 : 1 + len(entries)]
    zeros = args[1 + len(entries) : -1]
    # kernel order: xp, the recurrent weights and params, the initial states (given: a call's own), the lengths
    launch = module._launcher(layer, x.device).bound(
        [None, *weights[2:], *([None] * len(zeros) if given else zeros), args[-1]], x.shape[0]
    )
    if launch is None:
        return None
    return Step(
        launch,
        projector(weights[0], weights[1], module._biased_weight, rounds(layer)),
        module._arguments[(id(layer), suffix, "weights")][0],  # kept by _launch_arguments with the weights
    )

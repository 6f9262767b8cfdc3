"""A launch's arguments made from a module's parameters, and what a call derives from them and keeps.

Parameters reach the kernels through DLPack, detached, as they are where they start on a 64-byte boundary and
are compact, else as a copy kept until the parameter's storage or version counter changes. What a call derives
(aligned copies, both directions' ``W_ih`` joined for one GEMM, a half projection's ``[W_ih | b_ih]``, a param
carrying the input projection's bias) is made once per weight update, or, while a CUDA graph is captured, made
inside the graph and not kept (``fresh``), so that a replay follows in-place updates of the parameters.
"""

from __future__ import annotations

import weakref

import torch  # PyTorch itself: absolute import

from prnn_tvm.deferred import split_direction_name, split_layer_name
from prnn_tvm.errors import InputError
from prnn_tvm.runtime.limits import ALIGNMENT
from prnn_tvm.signature import ArgRole

from .projection import biased, summed

BIASES = ("b_ih", "b_hh")  # what bias=False leaves out (zeros)
ALL_STEPS = 2**31 - 1  # a row length that no sequence reaches: the kernels clamp lengths to the sequence's
REVERSE = "_reverse"  # torch.nn's suffix of the reverse direction's parameters, after the layer's


def parameter_suffix(layer: int, direction: int) -> str:
    """torch.nn's parameter suffix of a layer and direction: ``_l0``, ``_l1_reverse``."""
    return f"_l{layer}" + (REVERSE if direction else "")


def detached(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """``t`` as a call passes it on: as it is where autograd tracks the call, else detached (DLPack refuses
    tensors that require gradients; ``detach`` costs a microsecond, so only those)."""
    return t.detach() if t.requires_grad and not grad else t


def aligned_state(t: torch.Tensor) -> torch.Tensor:
    """An initial state as the kernel takes it: contiguous, starting on a 64-byte boundary (else a copy)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


class LaunchArguments:
    """The part of a prnn_tvm.torch module that makes a launch's arguments from its parameters. It keeps, on the
    module: ``_aligned_copies`` (parameter name -> ``(parameter, data_ptr, version or None, tensor)``),
    ``_constants``, ``_joined``, ``_derived`` and ``_arguments`` (a compiled layer's arguments as parameter
    names); it reads the parameters through :meth:`_parameter`, and ``_shapes``, ``_names``, ``_states``,
    ``hidden_size``, ``num_layers`` and ``bias``."""

    def _aligned(self, name: str, fresh: bool = False) -> torch.Tensor:
        """Parameter ``name`` detached (DLPack refuses tensors that track gradients), or an aligned copy of
        it when it does not start on a 64-byte boundary (cuDNN's flattened weights put biases anywhere).
        Kept while the parameter and its storage stay the same (a copy: and its version counter), so the
        copy is made once per weight update. ``fresh`` (a CUDA graph being captured): made anew and not
        kept, so that the graph makes it in every replay from the parameter as it is then."""
        p, cached = self._parameter(name), self._aligned_copies.get(name)
        if (
            not fresh
            and cached is not None
            and cached[0] is p
            and cached[1] == p.data_ptr()
            and cached[2] in (None, p._version)
        ):
            return cached[3]
        self._check_parameter(name, p)
        # torch's allocators align blocks; a strided parameter (torch.nn takes one) is copied compact, as is one
        # that does not start on an aligned address
        placed = p.data_ptr() % ALIGNMENT == 0 and p.is_contiguous()
        ready = p.detach() if placed else p.detach().clone(memory_format=torch.contiguous_format)
        if not fresh:
            self._aligned_copies[name] = (p, p.data_ptr(), None if placed else p._version, ready)
        return ready

    def _tracked(self, name: str) -> torch.Tensor:
        """Parameter ``name`` as a differentiable call passes it: checked, and compact (a strided one through
        ``contiguous``, which autograd differentiates)."""
        p = self._parameter(name)
        self._check_parameter(name, p)
        return p if p.is_contiguous() else p.contiguous()

    def _check_parameter(self, name: str, p: torch.Tensor) -> None:
        """InputError, naming the parameter as torch.nn does (``weight_hh_l0``), for one whose shape is not the
        one the module made or whose dtype or device is not the module's (its first parameter's)."""
        first, kind = self._first_parameter(), type(self).__name__
        made = getattr(self, "_shapes", {}).get(name)  # none in a module pickled before shapes were kept
        if made is not None and tuple(p.shape) != made:
            raise InputError(f"{kind}: parameter {name} has shape {tuple(p.shape)}, expected {made}")
        if p.dtype != first.dtype or p.device != first.device:
            raise InputError(
                f"{kind}: parameter {name} is {p.dtype} on {p.device}, the module's parameters are "
                f"{first.dtype} on {first.device} (its first, {next(iter(self._shapes))}); convert "
                "it (.to(dtype, device))"
            )

    def _constant(self, shape: tuple, device: torch.device, dtype: torch.dtype, value=0) -> torch.Tensor:
        """A constant the kernels only read (zeros for omitted initial states and absent biases, the
        lengths of rows that run every step): made once per shape and kept, except when first needed
        while a CUDA graph is being captured (memory made then belongs to the graph)."""
        key = (shape, device, dtype, value)
        constant = self._constants.get(key)
        if constant is None:
            constant = torch.full(shape, value, device=device, dtype=dtype)
            if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self._constants[key] = constant
        return constant

    def _joined_parameters(self, names: tuple, fresh: bool = False) -> torch.Tensor:
        """Parameters ``names`` stacked along their first dimension (both directions' ``W_ih``, for one GEMM):
        made once per weight update (kept while the parameters and their version counters stay the same;
        ``fresh``, as in :meth:`_aligned`: made anew, not kept)."""
        parts = [self._aligned(name, fresh) for name in names]
        if fresh:
            return torch.cat(parts)
        versions = tuple((p.data_ptr(), p._version) for p in parts)
        cached = self._joined.get(names)
        if cached is not None and cached[0] == versions and all(a is b for a, b in zip(cached[1], parts)):
            return cached[2]
        joined = torch.cat(parts)
        self._joined[names] = (versions, parts, joined)
        return joined

    def _biased_weight(self, W_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
        """``[W_ih | b_ih | 0]`` for a half projection on the GPU (:func:`~prnn_tvm.torch.projection.project`),
        made once per weight update (:meth:`_derived_from`)."""
        return self._derived_from("biased", biased, W_ih, b_ih, fresh=torch.cuda.is_current_stream_capturing())

    def _derived_from(self, what: str, make, *tensors: torch.Tensor, fresh: bool = False) -> torch.Tensor:
        """``make(*tensors)``, made once per weight update: kept while the same tensors (:meth:`_aligned` or
        :meth:`_joined_parameters` ones) keep their version counters, and dropped when any of them is (a
        replaced parameter or a remade joined one leaves nothing behind). ``fresh`` (a CUDA graph being
        captured): made anew and not kept, so that every replay makes it from the parameters as they are."""
        if fresh:
            return make(*tensors)
        key, versions = (what, *map(id, tensors)), tuple(t._version for t in tensors)
        cached = self._derived.get(key)
        if cached is not None and cached[1] == versions and all(r() is t for r, t in zip(cached[0], tensors)):
            return cached[2]
        made = make(*tensors)
        cache = self._derived  # not self: the callbacks keep no module alive

        def forget(_, key=key, cache=cache):  # the ids die with the tensors: so does their entry
            cache.pop(key, None)

        self._derived[key] = (tuple(weakref.ref(t, forget) for t in tensors), versions, made)
        return made

    def _folded_input_bias(
        self, layer, suffix: str | None, weights: list, fresh: bool = False, grad: bool = False
    ) -> list:
        """A launch's ``weights`` (:meth:`_parameter_arguments` order, ``layer`` and ``suffix`` as there) with the
        projection's bias moved into the params that carry it (the plan's
        :attr:`~prnn_tvm.frontend.plan.CellPlan.input_bias`): ``b_ih`` becomes None and each carrier becomes
        ``carrier + b_ih`` of the input slices it carries, summed in float32 and rounded once to the parameters'
        type (made once per weight update). A stack's upper layers keep theirs: the kernel projects them itself.
        As it is where the carriers do not line up with the parameters the projection's bias is made of. Which
        arguments change is worked out once per launch; ``fresh`` as in :meth:`_derived_from`. ``grad`` (a call that
        trains, ``weights`` tracked by autograd): each sum made anew from the tracked ``b_ih``, so that autograd gives
        both biases the carrier's gradient (the kernel's sum over steps and rows), not a sum over the projection's
        gradient in torch."""
        key = (id(layer), suffix, "folded")
        if key not in self._arguments:
            entries = self._parameter_arguments(layer, suffix)
            names = [arg for arg, _, _ in entries]
            at = names.index("b_ih")
            projected = entries[at][1] if isinstance(entries[at][1], tuple) else (entries[at][1],)
            share = layer.plan.input.slices // len(projected)  # input slices per parameter of the bias
            carriers = layer.plan.input_bias
            lined_up = carriers and all(c.slices == share and c.first % share == 0 for c in carriers)
            self._arguments[key] = (
                (at, [(names.index(c.param), projected[c.first // share]) for c in carriers]) if lined_up else None
            )
        plan = self._arguments[key]
        if plan is None:
            return weights
        at, pairs = plan
        folded = list(weights)
        folded[at] = None
        for i, partner in pairs:
            if grad:
                folded[i] = summed(weights[i], self._tracked(partner))
            else:
                folded[i] = self._derived_from("folded", summed, weights[i], self._aligned(partner, fresh), fresh=fresh)
        return folded

    def _launch_arguments(
        self,
        layer,
        x: torch.Tensor,
        suffix: str | None,
        initial: list,
        lengths: torch.Tensor | None = None,
        grad: bool = False,
    ) -> list:
        """``layer``'s arguments in its signature's order (``x``, weights, params, initial states, lengths), made
        ready on the current stream (aligned copies, constants). ``suffix``: the layer and direction of the
        parameters (None: ``layer`` is a wavefront stack of every layer, :meth:`stack_for`; for both directions
        in one launch, :meth:`directions_for`, the forward one's); ``initial``: the initial states in the
        launch's order (a stack's layer-major, both directions' direction-major), or [] for zeros;
        ``lengths``: each row's steps (int32 on ``x``'s device), or None for all; ``grad``: differentiable."""
        B, H, dtype, device = x.shape[1], self.hidden_size, x.dtype, x.device
        # what is derived from the parameters (aligned copies, joined and folded ones) is kept between calls,
        # but made inside a CUDA graph being captured: a replay then follows in-place parameter updates
        fresh = device.type == "cuda" and torch.cuda.is_current_stream_capturing()

        def param(name, shape):  # tracked by autograd when differentiable, else detached (and aligned) once
            if name is None:  # an absent bias
                return self._constant(shape, device, dtype)
            if isinstance(name, tuple):  # both directions' input projections, stacked
                return self._joined_parameters(name, fresh)
            return self._tracked(name) if grad else self._aligned(name, fresh)

        entries = self._parameter_arguments(layer, suffix)
        # what a call derives from the parameters is the same while they are: kept, with what it was made from (the
        # module's parameters or a call's own, :meth:`_run_given`: the operator's, checked against those it is given)
        reuse = not (grad or fresh)
        weights = self._kept_weights(layer, suffix, entries) if reuse else None
        if weights is None:
            weights = [param(name, shape) for _, name, shape in entries]
            # where params of the cell carry b_ih, a call on the GPU adds it to them (an inference call once per
            # weight update) and its projection is the GEMM alone: a half layer's GEMM into float32 has no bias
            # epilogue in torch (the bias is a kernel of its own, or a padded GEMM), nor has a float32 addmm of one
            # row (T=1 at B=1: torch copies the bias into the output first). A call that trains then takes b_ih's
            # gradient from the carrier's, which the backward kernel sums anyway, instead of a sum over the
            # projection's gradient (slstm_h12 bf16 768 x 16, T=1024, H100: the padded GEMM's copies 43 us and the
            # sum 87 us a step)
            if self.bias and device.type == "cuda" and layer.plan.input_bias:
                weights = self._folded_input_bias(layer, suffix, weights, fresh, grad)
            if reuse:
                self._keep_weights(layer, suffix, entries, weights)
        if initial:
            states = [aligned_state(t) for t in initial]
        else:
            zeros = len(self._states) * (self.num_layers if suffix is None else len(layer.plan.outputs))
            states = [self._constant((B, H), device, dtype)] * zeros
        # every row runs every step (any T: the most an int32 says); the CPU build's differentiable call binds by name,
        # and there an omitted argument is the layer's own
        if lengths is None and (device.type == "cuda" or not grad):
            lengths = self._constant((B,), device, torch.int32, ALL_STEPS)
        return [detached(x, grad), *weights, *states, lengths]

    def _kept_weights(self, layer, suffix: str | None, entries: list) -> list | None:
        """The weights an inference call of ``layer`` and ``suffix`` passed last time, if every parameter they were
        made from is still the same object at the same address and version (:meth:`_keep_weights`); else None.
        Reading each parameter is the whole cost: what :meth:`_aligned`, :meth:`_joined_parameters` and
        :meth:`_derived_from` would check one by one."""
        kept = self._arguments.get((id(layer), suffix, "weights"))
        if kept is None:
            return None
        made_from, weights = kept
        # :meth:`_parameter`'s reading, inline (a call of its own per parameter costs a third of a microsecond); only
        # inference calls reach here
        registered = self._given.params
        if registered is None:
            registered = self._parameters
        for name, p, address, version in made_from:
            q = registered.get(name)
            if q is None:  # a parametrized one: by attribute
                q = getattr(self, name)
            if q is not p or q._version != version or q.data_ptr() != address:
                return None
        return weights

    def _keep_weights(self, layer, suffix: str | None, entries: list, weights: list) -> None:
        """Keep ``weights`` (an inference call's, :meth:`_launch_arguments`) with the parameters they were made from
        (:meth:`_kept_weights` checks them); dropped with the layer's other entries (``_arguments``)."""
        names = [n for _, name, _ in entries if name is not None for n in (name if isinstance(name, tuple) else [name])]
        made_from = []  # every parameter of the launch (a param carrying b_ih is made from two of them)
        for name in dict.fromkeys(names):
            p = self._parameter(name)
            made_from.append((name, p, p.data_ptr(), p._version))
        self._arguments[(id(layer), suffix, "weights")] = (tuple(made_from), weights)

    def _parameter_arguments(self, layer, suffix: str | None) -> list:
        """``layer``'s weight and param inputs (``W_ih``, ``b_ih``, then the cell's), in its signature's order,
        for the layer and direction ``suffix`` (None: ``layer`` is a wavefront stack, whose arguments name
        their layers, ``l1_W_hh``): ``(argument, parameter name, shape)``, the name None for an absent bias
        (worked out once: a signature's inputs are derived on each use)."""
        key = (id(layer), suffix)
        if key not in self._arguments:
            found = []
            both = bool(layer.plan.reversed_states)  # both directions in one launch: names fwd_W_hh, rev_W_hh
            for a in layer.signature.inputs:
                if a.role not in (ArgRole.WEIGHT, ArgRole.PARAM):
                    continue
                if both and a.name in ("W_ih", "b_ih"):  # stacked: the forward direction's rows first
                    found.append(
                        (
                            a.name,
                            None
                            if not self.bias and a.name in BIASES
                            else tuple(self._names[a.name] + suffix + own for own in ("", REVERSE)),
                            a.concrete_shape(1),
                        )
                    )
                    continue
                if both:
                    direction, base = split_direction_name(a.name)
                    own = suffix + (REVERSE if direction else "")
                elif suffix is not None:
                    base, own = a.name, suffix
                elif a.name in ("W_ih", "b_ih"):  # a stack's layer 0 projection
                    base, own = a.name, parameter_suffix(0, 0)
                else:
                    index, base = split_layer_name(a.name)
                    own = parameter_suffix(index, 0)
                found.append(
                    (a.name, None if not self.bias and base in BIASES else self._names[base] + own, a.concrete_shape(1))
                )
            self._arguments[key] = found
        return self._arguments[key]

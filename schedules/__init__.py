"""Schedule templates: each places a cell plan on a target (``template.Template`` is the contract).

``TEMPLATES`` lists them in order of preference; :func:`templates_for` gives every one whose
``accepts(plan, target)`` holds (a compile considers them all: ``prnn_tvm.choice``), and the
reasons of the others where none does. Everything outside this package reaches a template
through :func:`templates_for`, :func:`template_for` or :func:`by_name`, never by importing it
(``tests/test_architecture.py`` checks).
"""

from __future__ import annotations

import dataclasses

from prnn_tvm.codegen.kernel import Kernel
from prnn_tvm.dtypes import POLICIES
from prnn_tvm.errors import ConfigError

from . import (
    backward_mma,
    backward_mma_config,
    cpu_backward,
    cpu_reference,
    persistent_backward,
    persistent_cuda,
    persistent_mma,
    projected,
    session,
    split,
)
from .template import Acceptance, Template, as_config, knob_text, short_names

TEMPLATES: tuple = (persistent_cuda.TEMPLATE, persistent_mma.TEMPLATE, cpu_reference.TEMPLATE)
split_knobs = split.split_knobs  # a config's split knobs (hop, words) beside the template's: what split_kernels reads
SPLIT_WORDS = split.WORDS  # the tagged words a split layer's states travel in (its report names them)

__all__ = ["SPLIT_WORDS", "TEMPLATES", "Acceptance", "Template", "as_config", "backward_configs", "backward_for",
           "backward_kernel", "by_name", "gpu_backward", "knob_short_names", "knob_text", "projected_kernel",
           "saving_forward", "session_kernel", "split_kernels", "split_knobs", "template_for", "templates_for"]


def templates_for(plan, target) -> list:
    """Every template that places ``plan`` (a CellPlan) on ``target`` (a ``tvm.target.Target``), in the order of
    ``TEMPLATES``; ConfigError with each template's reason where none does."""
    answers = [(template, template.accepts(plan, target)) for template in TEMPLATES]
    found = [template for template, answer in answers if answer]
    if found:
        return found
    takes = [d for d in POLICIES if any(t.accepts(dataclasses.replace(plan, dtype=d), target) for t in TEMPLATES)]
    cpu = f" ({plan.dtype} is for the CPU build: target='llvm')" if not plan.policy.gpu else ""
    reasons = "; ".join(f"{template.name}: {answer.reason}" for template, answer in answers)
    raise ConfigError(f"no schedule template places a {plan.dtype} '{plan.cell.name}' cell on target "
                      f"{target.kind.name}, which takes {', '.join(takes) or 'no dtype'}{cpu} ({reasons})")


def template_for(plan, target) -> Template:
    """The first template that places ``plan`` on ``target`` (:func:`templates_for`): the one a tuning run
    tunes."""
    return templates_for(plan, target)[0]


def backward_for(plan, target):
    """The backward of ``plan``'s recurrent kernel on the CPU (a ``Kernel``); a CUDA layer's backward is a
    pair, :func:`saving_forward` and :func:`gpu_backward`."""
    if target.kind.name != "llvm":
        raise ConfigError(f"this is the CPU build's backward (target 'llvm'), not {target.kind.name}'s: a CUDA "
                          "layer trains through prnn_tvm.compiler.compile_training (prnn_tvm.torch does)")
    if plan.untrainable:
        raise ConfigError(plan.untrainable)
    return cpu_backward.backward_kernel(plan)


def saving_forward(plan, target, gpu, config):
    """The forward kernel of ``config`` that also writes what the GPU backward reads (``recurrent_save``);
    ConfigError when no GPU backward places ``plan`` (the reason)."""
    reason = persistent_backward.refusal(plan)
    if reason:
        raise ConfigError(reason)
    template = next(t for t in templates_for(plan, target) if isinstance(config, t.config_type or ()))
    config = template.knobs.saving_config(config, plan, gpu)
    builder = template.builder(plan, config, template.knobs.validate(config, plan, gpu), save=True)
    return Kernel(builder.build(), template.name, builder.launch, config)


def session_kernel(plan, target, gpu, config, input_size: int, fallback: int = 0):
    """The resident kernel of a session of a layer built with ``config`` (``schedules.session``: the config made to
    run the ``tags`` exchange in the shared layout, or the best untuned one that does), for inputs of ``input_size``
    values a row; ConfigError with the reason where ``plan`` cannot run as a session. ``fallback`` k > 0: the k-th of
    that config's fallbacks holding fewer weights in registers (``session.offloaded``: what a build that spills takes
    next), ConfigError past the last."""
    template = _cuda_template(plan, target, config, session.session_problem(plan),
                              f"a session keeps a CUDA kernel resident; target {target.kind.name} has none: compile "
                              "the layer for target='cuda'")
    config = session.session_config(config, plan, gpu, template.knobs.validate, template.knobs.ranked_configs,
                                    input_size)
    if fallback:
        room = session.session_gpu(plan, gpu, input_size, config.units_per_cta)
        fallbacks = session.offloaded(config, plan, room, template.knobs.validate)
        if fallback > len(fallbacks):
            raise ConfigError(f"{config} has {len(fallbacks)} fallbacks with fewer weights in registers, not "
                              f"{fallback}")
        config = fallbacks[fallback - 1]
    geometry = template.knobs.validate(config, plan, gpu)
    builder = session.session_builder(template.builder, input_size)(plan, config, geometry)
    return Kernel(builder.build(), template.name, builder.launch, config)


def projected_kernel(plan, target, gpu, config, input_size: int):
    """The recurrent kernel of a layer built with ``config`` projecting its own input (``schedules.projected``), for
    inputs of ``input_size`` values a row: the same config, its shared memory less the step's input and projection;
    ConfigError with the reason where ``plan`` or that config cannot (the caller keeps the projection's launch)."""
    template = _cuda_template(plan, target, config, projected.projected_problem(plan),
                              f"a projected kernel is a CUDA kernel; target {target.kind.name} projects in a launch "
                              "of its own")
    room = projected.projected_gpu(plan, gpu, input_size, config.units_per_cta)
    geometry = template.knobs.validate(config, plan, room)
    builder = projected.projected_builder(template.builder, input_size)(plan, config, geometry)
    return Kernel(builder.build(), template.name, builder.launch, config)


def _cuda_template(plan, target, config, problem: str | None, not_cuda: str):
    """The CUDA template of ``config`` for a kernel made from a layer's (a session's, a projected one); ConfigError
    with ``problem`` where ``plan`` has one, with ``not_cuda`` where ``target`` is not CUDA."""
    if problem:
        raise ConfigError(problem)
    if target.kind.name != "cuda":
        raise ConfigError(not_cuda)
    return next(t for t in templates_for(plan, target) if isinstance(config, t.config_type or ()))


def split_kernels(plan, target, gpu, gpus: int, config=None):
    """The kernels of ``plan`` split over ``gpus`` GPUs like ``gpu`` (``schedules.split``), best first, each made when
    asked for: the caller's ``config`` (an object or a dict) made to run split, else the best few ranked untuned
    configs that run split (a build takes the first that ptxas reports without spills), each with how it takes the
    hop (``SplitMode.hop_note``): ``(kernel, note)``. A dict ``config`` may name the split's knobs ``hop`` and
    ``words`` (``split.SplitKnobs``; their defaults where it does not). ConfigError with the reason where none does."""
    config, knobs = split.split_knobs(config)
    problem = split.split_problem(plan, gpus)
    if problem:
        raise ConfigError(problem)
    if target.kind.name != "cuda":
        raise ConfigError(f"a split layer runs on several GPUs; target {target.kind.name} has none: compile for "
                          "target='cuda'")
    cuda = [t for t in templates_for(plan, target) if t.config_type is not None]
    if config is not None:
        chosen = next((t for t in cuda if isinstance(config, t.config_type)), None)
        template = chosen or cuda[0]
        config = config if chosen else as_config(template, config)
        placements = [(template, p) for p in split.split_configs(config, plan, gpu, gpus, template.knobs.validate,
                                                                 template.knobs.ranked_configs,
                                                                 words=knobs.words)]
    else:
        placements = [(t, p) for t in cuda
                      for p in split.split_configs(None, plan, gpu, gpus, t.knobs.validate, t.knobs.ranked_configs,
                                                   words=knobs.words)]
    for template, placed in placements:
        builder = split.split_builder(template.builder, gpus, placed.chunk_rows, knobs.hop, placed.words)(
            plan, placed.config, placed.geometry)
        yield Kernel(builder.build(), template.name, builder.launch, placed.config), builder.hop_note


def gpu_backward(plan, gpu):
    """The GPU backward kernels of ``plan`` (``recurrent_backward``) for its ranked default configs
    (:func:`backward_configs`), best first, each made when asked for: a build takes the first that ptxas reports
    without spills."""
    return (backward_kernel(plan, gpu, cfg) for cfg in backward_configs(plan, gpu))


def backward_configs(plan, gpu) -> list:
    """The ranked default configs of ``plan``'s GPU backward, best first: a half layer's from the tensor-core
    backward (``backward_mma``), then from the float32 one (its weights widened in registers), where each fits;
    ConfigError with every reason where none does."""
    choices, reasons = [], []
    tensor_cores = [backward_mma_config.ranked_configs] if plan.dtype in backward_mma_config.mc.DTYPES else []
    for ranked in [*tensor_cores, persistent_backward.ranked_configs]:
        try:
            choices += ranked(plan, gpu)
        except ConfigError as err:
            reasons.append(str(err))
    if not choices:
        raise ConfigError("; ".join(reasons))
    return choices


def backward_kernel(plan, gpu, config):
    """The GPU backward kernel of ``plan`` with ``config`` (one of :func:`backward_configs`' types; ConfigError
    where it does not fit)."""
    if isinstance(config, backward_mma_config.BackwardMmaConfig):
        return backward_mma.backward_kernel(plan, gpu, config)
    return persistent_backward.backward_kernel(plan, gpu, config)


def by_name(name: str) -> Template:
    """The template of that name (as tuning records and reports name it)."""
    for template in TEMPLATES:
        if template.name == name:
            return template
    raise ConfigError(f"no schedule template named '{name}'; templates: {', '.join(t.name for t in TEMPLATES)}")


def knob_short_names() -> dict:
    """Knob name -> short name over every template's knobs (for tables that show configs of any template)."""
    names: dict = {}
    for template in TEMPLATES:
        names.update(short_names(template.config_type))
    return names

"""Session mode of the persistent templates: the resident kernel of a session (``prnn_tvm.runtime.session``).

The kernel is the template's own (same products, pointwise math and ``tags`` exchange) with three changes, all
made here over the template's builder:

- each step's input comes from the request mailbox (``prnn_tvm.codegen.session``): every CTA waits for step
  ``t``'s whole input x_t (B x input values), the words ``base + t + 1`` tags, takes it into shared memory (CTA 0
  relays it from page-locked host memory first, under the host transport), and projects it for its own units with
  ``W_ih`` and ``b_ih`` read from global memory (float32 sums; for a stack, layer 0's units) into shared memory,
  whence its items' registers; the close mark ends the time loop there, after ``t`` steps (the base advances by
  ``t + 1``: the mark's tag is never a later launch's);
- each step's new states (its outputs among them) go out tagged into the response slot of the step, where the
  caller's collect finds them (under the host transport: into the page-locked host responses, where the host
  does), and the final states are written every step (a relaunch starts from them);
- the time loop runs up to ``capacity`` steps and the base advances by the steps it ran.

It runs the ``tags`` exchange (its words are the mailbox's format and its base the requests' tags), the shared
layout and one batch group: :func:`session_config` makes a layer's config so.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import session
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import (
    FREE_SMS,
    REQUESTS,
    REQUESTS_HOST,
    RESPONSES,
    RESPONSES_HOST,
    SESSION_IDLE,
    with_session,
)

from .ranking import TIER_STEPS, tier_knob

SESSION_BARRIER = "tags"


def session_problem(plan) -> str | None:
    """Why ``plan`` (a CellPlan) cannot run as a session, or None."""
    if plan.reversed_states:
        return (f"cell '{plan.cell.name}' runs both directions of a sequence: a session serves one step at a time "
                "in order, so only a forward layer can (run the reverse direction over the whole sequence)")
    if plan.lag:
        return (f"cell '{plan.cell.name}' is a wavefront stack, whose last layer answers a step's request "
                f"{plan.lag} steps later: a session runs the deep stack of the same layers (<cell>_d<layers>)")
    if plan.unit_sums:
        return (f"cell '{plan.cell.name}' sums over units, whose blocks' partial sums meet through the plain exchange, "
                f"and a session runs the '{SESSION_BARRIER}' exchange: run the layer over whole sequences")
    return None


def session_smem(plan, input_size: int, units: int) -> int:
    """Bytes of static shared memory a session kernel adds to its config's (:meth:`SessionMode.alloc_loop_state`):
    the step's input and a CTA's part of its projection, float32."""
    return 4 * plan.batch * (input_size + plan.input.slices * units)


def session_gpu(plan, gpu, input_size: int, units: int):
    """``gpu`` as a session kernel's config sees it: a CTA's shared memory less the session's own
    (:func:`session_smem`), which comes on top of the config's."""
    return dataclasses.replace(gpu, smem_per_block=gpu.smem_per_block - session_smem(plan, input_size, units))


def session_config(cfg, plan, gpu, validate, ranked_configs, input_size: int = 0):
    """``cfg`` as a session kernel runs it: the ``tags`` exchange, the shared layout, one batch group, a grid
    that leaves :data:`FREE_SMS` SMs to other kernels, and shared memory that leaves room for the session's own
    (:func:`session_gpu`, inputs of ``input_size`` values a row), raising its weight tiers where that fits
    (:func:`with_tiers_raised`); else the best untuned config that runs so; ConfigError when none does."""
    changes = {"barrier": SESSION_BARRIER, "layout": "shared", "batch_groups": 1, "poll_sleep": 0,
               "operand_path": "shared", "gate_layout": "by_gate",
               "batch_warps": 1}  # (in_warp, and its batch_warps, write the block's own tiles)

    def fitting(candidate):
        knobs = {f.name for f in dataclasses.fields(candidate)}
        candidate = dataclasses.replace(candidate, **{k: v for k, v in changes.items() if k in knobs})
        room = session_gpu(plan, gpu, input_size, candidate.units_per_cta)
        candidate, ctas = with_tiers_raised(candidate, plan, room, validate)
        if ctas > gpu.sms - FREE_SMS:
            raise ConfigError(f"{ctas} CTAs leave fewer than {FREE_SMS} of the {gpu.sms} SMs to other kernels")
        return candidate

    try:
        return fitting(cfg)
    except ConfigError as err:
        reason = err
    fewest = -(-plan.hidden // gpu.sms)  # units per CTA: the least any ranked config has
    try:
        ranked = ranked_configs(plan, session_gpu(plan, gpu, input_size, fewest), limit=64)
    except ConfigError:  # none fits beside the session's own shared memory
        ranked = []
    for other in ranked:
        try:
            return fitting(other)
        except ConfigError:
            continue
    raise ConfigError(f"no config of this layer runs as a session kernel (the '{SESSION_BARRIER}' exchange, the "
                      f"shared layout, {FREE_SMS} SMs left free, {session_smem(plan, input_size, fewest)} B or more of "
                      f"shared memory for the step's input of {plan.batch} x {input_size} values): {reason}")


def offloaded(cfg, plan, gpu, validate) -> list:
    """``cfg`` with 1 to ``TIER_STEPS`` more of each thread's weights off its registers, those that validate: more
    streamed from global memory where ``cfg`` streams some (``l2_chunks``: its shared memory is full), else more in
    shared memory where it keeps some there (its tier knob, ``ranking.tier_knob``); none for a config whose weights
    are all in registers. The fallbacks of a session kernel, whose ``tags`` exchange polls with registers that the
    layer's own exchange may not (LSTM 3x960: fp16 three more k tiles of fragments in shared memory, fp32 one more
    streamed chunk where ptxas spilled)."""
    knob = "l2_chunks" if getattr(cfg, "l2_chunks", 0) else tier_knob(cfg)
    held = getattr(cfg, knob) if knob else 0
    found = []
    for more in range(held + 1, held + TIER_STEPS + 1) if held else ():
        raised = dataclasses.replace(cfg, **{knob: more})
        try:
            validate(raised, plan, gpu)
        except ConfigError:
            continue
        found.append(raised)
    return found


def with_tiers_raised(cfg, plan, gpu, validate) -> tuple:
    """``(config, its CTAs)``: ``cfg`` where it validates, else the first of :func:`offloaded` (ConfigError, ``cfg``'s,
    where there is none)."""
    try:
        return cfg, validate(cfg, plan, gpu).ctas
    except ConfigError:
        raised = offloaded(cfg, plan, gpu, validate)
        if not raised:
            raise
        return raised[0], validate(raised[0], plan, gpu).ctas


def session_builder(builder: type, input_size: int) -> type:
    """The template's kernel builder in session mode, for inputs of ``input_size`` values a row."""
    return type(f"Session{builder.__name__}", (SessionMode, builder), {"input_size": int(input_size)})


class InputProjection:
    """What a kernel that projects its own input adds to a persistent template's builder (the session's and the
    projected mode's, ``schedules/projected.py``): a step's whole input x_t of its ``B`` rows and this CTA's part of
    its projection in shared memory (float32), the projection (``prnn_tvm.codegen.session.project``: ``W_ih`` and
    ``b_ih`` read from global memory) and each item's values of it into its registers. Uses the builder's ``B``,
    ``H``, ``p``, ``c``, ``a``, ``cta``, ``items()``, ``slots``, ``xreg`` and ``width``, and the mode's
    ``input_size``."""

    input_size: int

    def size_projection(self, plan, cfg, kernel: str, remedy: str) -> None:
        """The shared buffers' sizes; ConfigError where the step's input is past
        :data:`~prnn_tvm.codegen.session.MAX_INPUT_VALUES` (``kernel`` names the kernel, ``remedy`` what to do)."""
        self.input_values = self.B * self.input_size  # the step's input x_t, this CTA's batch rows
        if self.input_values > session.MAX_INPUT_VALUES:
            raise ConfigError(f"a {kernel} takes a step's whole input into each CTA's shared memory, at most "
                              f"{session.MAX_INPUT_VALUES} values; batch x input_size is {self.B} x "
                              f"{self.input_size}: {remedy}")
        self.projected_values = self.B * plan.input.slices * cfg.units_per_cta  # one CTA's part of the projection

    def alloc_projection(self) -> None:
        self.x_shared = T.alloc_buffer((self.input_values,), "float32", scope="shared")
        self.projected = T.alloc_buffer((self.projected_values,), "float32", scope="shared")

    def project_input(self) -> None:
        """The step's input in ``x_shared`` projected for this CTA's units, and each item's projection values into
        its registers. CTA-wide."""
        a, S, U = self.a, self.p.input.slices, self.c.units_per_cta
        T.evaluate(session.project(T.address_of(self.x_shared[0]), a.named["W_ih"], a.named["b_ih"],
                                   T.address_of(self.projected[0]), self.B, self.input_size, self.H, S, U, self.cta))
        for it, group, item in self.items():
            with item as (b, _unit, ul):
                for i, leaf in enumerate(self.slots[group].x):
                    T.buffer_store(self.xreg, self.projected[(b * S + leaf.slice) * U + ul], [it * self.width.x + i])


class SessionMode(InputProjection):
    """Mixin over a persistent template's builder (see the module's doc); ``input_size``: the layer's (set by
    :func:`session_builder`)."""

    def __init__(self, plan, cfg, g, save: bool = False):
        problem = session_problem(plan)
        if problem:
            raise ConfigError(problem)
        if save or cfg.barrier != SESSION_BARRIER or cfg.layout != "shared" or getattr(cfg, "batch_groups", 1) > 1:
            raise ConfigError(f"a session kernel runs the '{SESSION_BARRIER}' exchange, the shared layout and one "
                              f"batch group (session_config), not {cfg}")
        super().__init__(plan, cfg, g, save)
        self.size_projection(plan, cfg, "session kernel", "use a smaller batch or project the input before the session")

    def _launch(self):
        return with_session(super()._launch(), self.input_size, self.p.input.slices * self.H)

    @property
    def steps(self):
        return self.a.named["capacity"]

    @property
    def steps_run(self):
        return self.done[0]

    def alloc_loop_state(self):
        self.done = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(self.done, self.steps, [0])
        self.alloc_projection()

    def load_inputs(self, t):
        """Wait for step ``t``'s input; leave the time loop after ``t`` steps on the close mark (or a wait that timed
        out); else project it for this CTA's units and each item's projection values into its registers."""
        a = self.a
        src = T.address_of(a.named[REQUESTS][t % a.seq_len, 0])
        got = session.take(src, a.named[REQUESTS_HOST], t % a.seq_len, T.address_of(self.x_shared[0]),
                           self.input_values, self.p.dtype, self.g.threads, self.barrier_base + t + 1, t, self.sync,
                           a.named["idle_us"])
        with T.If(got != 0):
            with T.Then():
                # the close counts as a step: the next launch's first request is tagged past the close mark, which
                # stays in its slot (a base advanced by t alone would make that mark the next launch's step 0)
                T.buffer_store(self.done, t + 1, [0])
                with T.If(got == 1):
                    with T.Then():
                        T.buffer_store(self.aborted, 1, [0])
                T.Break()
        self.project_input()

    def states_lost(self, error):
        """An idle exit (no request within ``idle_us``, recorded with the IDLE bit) took no request: the final
        states are the last step's, and the host relaunches from them. Every other timeout loses them."""
        return tirx.all(error != 0, tirx.bitwise_and(error - 1, SESSION_IDLE) == 0)

    def write_outputs(self, t, timing, stored: dict, b, unit):
        """The step's new states (the outputs among them), tagged, into its response slot, and the final states
        (every step: a relaunch starts from them)."""
        resp, host = self.a.named[RESPONSES], self.a.named[RESPONSES_HOST]
        for k, name in enumerate(self.a.final):
            if name in stored:
                index = ((t % self.a.seq_len * len(self.a.final) + k) * self.B + b) * self.H + unit
                T.evaluate(session.respond(resp, host, index, stored[name], self.dt, self.barrier_base + t + 1))
        self.write_final(stored, b, unit)

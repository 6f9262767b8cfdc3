"""Session mode of the persistent templates: the resident kernel of a session (``prnn_tvm.runtime.session``).

The kernel is the template's own (same products, pointwise math and ``tags`` exchange) with three changes, all
made here over the template's builder:

- each step's input projection comes from the request mailbox (``prnn_tvm.codegen.session``): the CTA waits for
  its part of step ``t``'s request, the words ``base + t + 1`` tags, takes them into shared memory and its items'
  registers from there; the close mark ends the time loop there, after ``t`` steps (the base advances by
  ``t + 1``: the mark's tag is never a later launch's);
- each step's new states (its outputs among them) go out tagged into the response slot of the step, where the
  caller's collect finds them, and the final states are written every step (a relaunch starts from them);
- the time loop runs up to ``capacity`` steps and the base advances by the steps it ran.

It runs the ``tags`` exchange (its words are the mailbox's format and its base the requests' tags), the shared
layout and one batch group: :func:`session_config` makes a layer's config so.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import barriers, session
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import FREE_SMS, REQUESTS, RESPONSES, SESSION_IDLE, with_session

SESSION_BARRIER = "tags"


def session_problem(plan) -> str | None:
    """Why ``plan`` (a CellPlan) cannot run as a session, or None."""
    if plan.reversed_states:
        return (f"cell '{plan.cell.name}' runs both directions of a sequence: a session serves one step at a time "
                "in order, so only a forward layer can (run the reverse direction over the whole sequence)")
    if plan.lag:
        return (f"cell '{plan.cell.name}' is a wavefront stack, whose last layer answers a step's request "
                f"{plan.lag} steps later: a session runs the deep stack of the same layers (<cell>_d<layers>)")
    return None


def session_config(cfg, plan, gpu, validate, ranked_configs):
    """``cfg`` as a session kernel runs it: the ``tags`` exchange, the shared layout, one batch group, and a grid
    that leaves :data:`FREE_SMS` SMs to other kernels; else the best untuned config that runs so; ConfigError when
    none does."""
    changes = {"barrier": SESSION_BARRIER, "layout": "shared", "batch_groups": 1, "poll_sleep": 0,
               "operand_path": "shared"}

    def fitting(candidate):
        knobs = {f.name for f in dataclasses.fields(candidate)}
        candidate = dataclasses.replace(candidate, **{k: v for k, v in changes.items() if k in knobs})
        ctas = validate(candidate, plan, gpu).ctas
        if ctas > gpu.sms - FREE_SMS:
            raise ConfigError(f"{ctas} CTAs leave fewer than {FREE_SMS} of the {gpu.sms} SMs to other kernels")
        return candidate

    try:
        return fitting(cfg)
    except ConfigError as err:
        reason = err
    for other in ranked_configs(plan, gpu, limit=64):
        try:
            return fitting(other)
        except ConfigError:
            continue
    raise ConfigError(f"no config of this layer runs as a session kernel (the '{SESSION_BARRIER}' exchange, the "
                      f"shared layout, {FREE_SMS} SMs left free): {reason}")


def session_builder(builder: type) -> type:
    """The template's kernel builder in session mode."""
    return type(f"Session{builder.__name__}", (SessionMode, builder), {})


class SessionMode:
    """Mixin over a persistent template's builder (see the module's doc)."""

    def __init__(self, plan, cfg, g, save: bool = False):
        problem = session_problem(plan)
        if problem:
            raise ConfigError(problem)
        if save or cfg.barrier != SESSION_BARRIER or cfg.layout != "shared" or getattr(cfg, "batch_groups", 1) > 1:
            raise ConfigError(f"a session kernel runs the '{SESSION_BARRIER}' exchange, the shared layout and one "
                              f"batch group (session_config), not {cfg}")
        super().__init__(plan, cfg, g, save)
        self.request_words = self.B * plan.input.slices * cfg.units_per_cta  # one CTA's part of a request

    def _launch(self):
        return with_session(super()._launch(), self.g.ctas, self.c.units_per_cta, self.p.input.slices)

    @property
    def steps(self):
        return self.a.named["capacity"]

    @property
    def steps_run(self):
        return self.done[0]

    def alloc_loop_state(self):
        self.done = T.alloc_buffer((1,), "int32", scope="local")
        T.buffer_store(self.done, self.steps, [0])
        self.request = T.alloc_buffer((self.request_words,), "float32", scope="shared")

    def load_inputs(self, t):
        """Wait for this CTA's part of step ``t``'s request; leave the time loop after ``t`` steps on the close mark
        (or a wait that timed out); else each item's projection values from the request."""
        mailbox = self.a.named[REQUESTS]
        src = T.address_of(mailbox[t % self.a.seq_len, self.cta, 0, 0])
        got = session.take(src, T.address_of(self.request[0]), self.request_words, self.g.threads,
                           self.barrier_base + t + 1, t, self.sync, self.a.named["idle_us"])
        with T.If(got != 0):
            with T.Then():
                # the close counts as a step: the next launch's first request is tagged past the close mark, which
                # stays in its slot (a base advanced by t alone would make that mark the next launch's step 0)
                T.buffer_store(self.done, t + 1, [0])
                with T.If(got == 1):
                    with T.Then():
                        T.buffer_store(self.aborted, 1, [0])
                T.Break()
        S, U = self.p.input.slices, self.c.units_per_cta
        for it, group, item in self.items():
            with item as (b, _unit, ul):
                for i, leaf in enumerate(self.slots[group].x):
                    T.buffer_store(self.xreg, self.request[(b * S + leaf.slice) * U + ul], [it * self.width.x + i])

    def states_lost(self, error):
        """An idle exit (no request within ``idle_us``, recorded with the IDLE bit) took no request: the final
        states are the last step's, and the host relaunches from them. Every other timeout loses them."""
        return tirx.all(error != 0, tirx.bitwise_and(error - 1, SESSION_IDLE) == 0)

    def write_outputs(self, t, timing, stored: dict, b, unit):
        """The step's new states (the outputs among them), tagged, into its response slot, and the final states
        (every step: a relaunch starts from them)."""
        resp, tags = self.a.named[RESPONSES], barriers.by_name(SESSION_BARRIER)
        for k, name in enumerate(self.a.final):
            if name in stored:
                slot = T.address_of(resp[t % self.a.seq_len, k, b, unit])
                T.evaluate(tags.store(slot, stored[name], self.barrier_base, t))
        self.write_final(stored, b, unit)

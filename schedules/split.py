"""One layer split over the GPUs of one host: each GPU runs the persistent template's kernel over a slice of the units.

The G GPUs are planned as one GPU of G times the SMs: the template's config is chosen and validated for that
(:func:`split_config`), and its grid of ``ctas`` CTAs is cut into G runs of ``ctas / G``, one per GPU. GPU ``g``
launches the same kernel with ``cta_offset = g * ctas / G``: its blocks take the CTA indices ``cta_offset + blockIdx.x``
of the whole grid, so they own the units (weight rows, params, projection columns, outputs) that those CTAs own on
one GPU. Every array a call takes is whole on every GPU; a GPU reads and writes only its units' part of them, and
the initial states (every unit: the first step's products read them).

The exchange is ``tags`` (values that carry their step, polled until they do): every GPU holds a whole copy of the
workspace, which its own blocks poll, and a block publishes each new value into its own GPU's copy and, as the same
tagged word, into each peer's (``peer_workspace_<k>``: the base address of peer k's copy, a store over NVLink;
``peers.cuh``). No barrier crosses GPUs beyond the tags. A wait is bounded (``timeout_us``) on every GPU, each with
its own error word: a GPU whose peer stalls or never started times out and fills its outputs with NaN; its own
blocks then stop publishing, so the peers time out too, and every GPU's call ends.

It runs the ``tags`` exchange, the shared layout, one batch group and the shared operand path (direct fragments
poll a slot per step of the output sequence, which a peer does not hold): :func:`split_config` makes a config so.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.base import payload_type
from prnn_tvm.codegen.barriers.source import cuda_source
from prnn_tvm.codegen.pointwise import bind_value
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import Arg, ArgRole

SPLIT_BARRIER = "tags"
CTA_OFFSET = "cta_offset"  # the scalar argument: the first CTA index of the whole grid that this GPU runs


def peer_arg(k: int) -> str:
    """The name of the scalar argument holding peer ``k``'s workspace address (peers in device order, self left out)."""
    return f"peer_workspace_{k}"


def split_problem(plan, gpus: int) -> str | None:
    """Why ``plan`` (a CellPlan) cannot be split over ``gpus`` GPUs, or None."""
    if not isinstance(gpus, int) or gpus < 2:
        return f"a split layer runs on 2 GPUs or more, not {gpus!r}: compile without devices for one GPU"
    if plan.unit_sums:
        return (f"cell '{plan.cell.name}' sums over units, whose partial sums meet through a plain exchange on one "
                "GPU: it cannot be split over GPUs")
    if plan.hidden % 2:
        return (f"hidden={plan.hidden} is odd: a split layer polls its peers' tagged words two at a time (one "
                "system-scope vector load), which needs an even hidden size")
    return None


def split_config(cfg, plan, gpu, gpus: int, validate, ranked_configs):
    """``cfg`` as a split layer runs it on ``gpus`` GPUs like ``gpu``: the ``tags`` exchange, the shared layout, one
    batch group, shared operands, and a grid of a multiple of ``gpus`` CTAs that fits G GPUs (validated on
    :func:`combined`); else the best untuned config that runs so; ConfigError when none does. ``cfg`` None: the
    best untuned one."""
    changes = {"barrier": SPLIT_BARRIER, "layout": "shared", "batch_groups": 1, "operand_path": "shared"}
    whole = combined(gpu, gpus)

    def fitting(candidate):
        knobs = {f.name for f in dataclasses.fields(candidate)}
        candidate = dataclasses.replace(candidate, **{k: v for k, v in changes.items() if k in knobs})
        ctas = validate(candidate, plan, whole).ctas
        if ctas % gpus:
            raise ConfigError(f"its grid of {ctas} CTAs does not divide among {gpus} GPUs: take units_per_cta so that "
                              f"hidden / units_per_cta is a multiple of {gpus}")
        return candidate

    reason = None
    if cfg is not None:
        try:
            return fitting(cfg)
        except ConfigError as err:
            reason = err
    for other in ranked_configs(plan, whole, limit=64):
        try:
            return fitting(other)
        except ConfigError as err:
            reason = reason or err
            continue
    raise ConfigError(f"no config of this layer splits over {gpus} GPUs (the '{SPLIT_BARRIER}' exchange, the shared "
                      f"layout, a grid of a multiple of {gpus} CTAs): {reason}")


def combined(gpu, gpus: int):
    """``gpus`` GPUs like ``gpu`` as the config's validation sees them: one GPU of their SMs together (a CTA's
    limits are one SM's, as they are)."""
    return dataclasses.replace(gpu, sms=gpu.sms * gpus)


def split_builder(builder: type, gpus: int) -> type:
    """The template's kernel builder for a layer split over ``gpus`` GPUs."""
    return type(f"Split{gpus}{builder.__name__}", (SplitMode, builder), {"gpus": gpus})


class SplitMode:
    """Mixin over a persistent template's builder (see the module's doc)."""

    gpus = 2

    def __init__(self, plan, cfg, g, save: bool = False):
        problem = split_problem(plan, self.gpus)
        if problem:
            raise ConfigError(problem)
        if save or cfg.barrier != SPLIT_BARRIER or cfg.layout != "shared" or getattr(cfg, "batch_groups", 1) > 1 \
                or getattr(cfg, "direct", False):
            raise ConfigError(f"a split layer runs the '{SPLIT_BARRIER}' exchange, the shared layout, one batch "
                              f"group and shared operands, inference only (split_config), not {cfg}")
        if g.ctas % self.gpus:
            raise ConfigError(f"a grid of {g.ctas} CTAs does not divide among {self.gpus} GPUs (split_config)")
        super().__init__(plan, cfg, g, save)

    def _launch(self):
        """The template's launch on one GPU's run of CTAs, with the run's first CTA and the peers' workspaces."""
        launch = super()._launch()
        grid = dataclasses.replace(launch.grid, ctas=launch.grid.ctas // self.gpus)
        more = (Arg(CTA_OFFSET, ArgRole.SCALAR, (), "int32"),
                *(Arg(peer_arg(k), ArgRole.SCALAR, (), "int64") for k in range(self.gpus - 1)))
        return dataclasses.replace(launch, args=(*launch.args, *more), grid=grid)

    @property
    def bx(self):
        """This block's CTA index in the whole grid (the template's code indexes units by it)."""
        return self._block + self.a.named[CTA_OFFSET]

    @bx.setter
    def bx(self, value) -> None:
        self._block = value

    def publish(self, name: str, t, b, unit, value):
        """The template's tagged store into this GPU's copy, and the same word into each peer's; CTA 0 of the whole
        grid skips them all at ``stall_step`` (the test knob: every GPU then times out)."""
        value = bind_value(value, "published")  # once, for every copy
        super().publish(name, t, b, unit, value)
        sync = self.sync
        with T.If(tirx.Not(tirx.all(self.bx == 0, t == sync.stall_step))):
            with T.Then():
                slot = T.address_of(self.a.ws[self.ws_at(name, t % 2, b, unit)])
                first = T.address_of(self.a.ws[(0,) * len(self.a.ws.shape)])
                tag = T.Cast("uint32", self.barrier_base + t + 1)  # as the tags kind's own store
                for k in range(self.gpus - 1):
                    T.evaluate(T.cuda.func_call(
                        f"prnn_tag_store_peer<{payload_type(self.dt, SPLIT_BARRIER)}>",
                        slot, first, self.a.named[peer_arg(k)], value, tag,
                        source_code=cuda_source("peers.cuh"), return_type="void"))

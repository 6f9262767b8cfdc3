"""One layer split over the GPUs of one host: each GPU runs the persistent template's kernel over a slice of the units.

The G GPUs are planned as one GPU of G times the SMs: the template's config is chosen and validated for that
(:func:`split_configs`), and its grid of ``ctas`` CTAs is cut into G runs of ``ctas / G``, one per GPU. GPU ``g``
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
poll a slot per step of the output sequence, which a peer does not hold): :func:`split_configs` makes a config so.

The hop (``hop``, a split knob beside the template's, :data:`HOPS`): a GPU's own units' states come from its own
blocks, a peer's over NVLink, later. ``exposed`` (the default): the whole state polled before the product, as one
GPU's kernel does; the tagged words the blocks push to every peer hide the hop behind the polls. ``floor`` (timing
only: its outputs are wrong): ``exposed`` with each peer replaced by the GPU's own copy, every load and store kept: a
peer's columns polled from its own (``PeerTags``: fresh once its own blocks wrote them) and a store meant for a peer
into its own slot again, so that a GPU's step is its local work without the hop (two H200s, LSTM fp16 H=2048 B=8:
exposed 5.75 us a step against the floor's 5.90 in single words; in packed words 3.83 against 4.51: not a floor
there, its own copy taking every store twice). ``floor_own`` (timing only): the floor polling its own GPU's columns
alone (1/``gpus`` of the polled words), so that floor minus floor_own is what the peers' polled words cost.

The words (``words``, a split knob beside ``hop``, :data:`WORDS`): ``single``, one value and its 32-bit tag a word
(``PeerTags``); ``packed`` (the default where a config can run them: float16/bfloat16, the staging tile within
``packed_problem``'s limit), three values and a 16-bit tag a word (``PackedTags``: a third of the polled words, each
CTA's new states staged in shared memory and stored a word at a time after a block barrier). Every hop runs with
either. A config that names no words gets :data:`DEFAULT_WORDS` where it can run them over at most
:data:`DEFAULT_WORDS_GPUS` GPUs, else ``single`` (two H200s, LSTM fp16 H=2048 B=8: the recurrent step 3.83 us with
packed words, 5.72 with single; packed words have not run over four GPUs, where ``words="packed"`` asks for them).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from prnn_tvm.codegen.barriers.packed import PackedTags, packed_problem, words_of
from prnn_tvm.codegen.barriers.peers import PeerTags
from prnn_tvm.codegen.barriers.tags import Tags
from prnn_tvm.dtypes import itemsize
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import CTA_OFFSET, split_args
from prnn_tvm.target import max_regs_per_thread

from .head_columns import OperandColumns
from .ranking import tier_knob

log = logging.getLogger(__name__)

UNPOLLED = "counter"  # a kind whose geometry holds no polled values: the split kernel's is worked out from it

SPLIT_BARRIER = "tags"
HOPS = ("exposed", "floor", "floor_own")  # the split's own knob ``hop`` (module doc)
WORDS = ("single", "packed")  # the split's own knob ``words`` (module doc)
DEFAULT_WORDS = "packed"  # where a config names none: these where the config can run them, else single
DEFAULT_WORDS_GPUS = 2  # the most GPUs DEFAULT_WORDS is the default for: packed words have run on two GPUs, not four
SPILL_STEPS = 3  # tiered fallbacks of a placement (with_poll)
SPILL_STEP_REGS = 16  # estimated registers a thread each tiered fallback holds fewer of than the one before


def split_problem(plan, gpus: int) -> str | None:
    """Why ``plan`` (a CellPlan) cannot be split over ``gpus`` GPUs, or None."""
    if not isinstance(gpus, int) or gpus < 2:
        return f"a split layer runs on 2 GPUs or more, not {gpus!r}: compile without devices for one GPU"
    if plan.hidden % 2:
        return (f"hidden={plan.hidden} is odd: a split layer polls its peers' tagged words two at a time (one "
                "system-scope vector load), which needs an even hidden size")
    if plan.unit_sums:
        return (f"cell '{plan.cell.name}' sums over units, whose blocks' partial sums go to this GPU's workspace only, "
                "not to every peer's copy: compile it for one GPU")
    return Tags().problem(plan, "shared")


@dataclass(frozen=True)
class SplitPlacement:
    """A config as a split layer runs it: the template's ``config``, its ``geometry`` (on :func:`combined`), the
    batch rows a poll waits for at a time (``chunk_rows``) and the tagged words the states travel in (:data:`WORDS`)."""

    config: object
    geometry: object
    chunk_rows: int
    words: str = WORDS[0]


def split_configs(cfg, plan, gpu, gpus: int, validate, ranked_configs, limit: int = 4, words: str | None = None):
    """``cfg`` as a split layer runs it on ``gpus`` GPUs like ``gpu`` (a :class:`SplitPlacement`: the ``tags``
    exchange, the shared layout, one batch group, shared operands, a grid of a multiple of ``gpus`` CTAs that fits G
    GPUs, validated on :func:`combined`, its poll of ``words``: None, :data:`DEFAULT_WORDS` where the config can run
    them over at most :data:`DEFAULT_WORDS_GPUS` GPUs, else single), then up to ``limit`` of the best untuned configs
    that run so, best first (the fallbacks where ptxas spills); ``cfg`` None: those alone. ConfigError with the
    reason when none runs so."""
    changes = {"barrier": SPLIT_BARRIER, "layout": "shared", "batch_groups": 1, "operand_path": "shared",
               "gate_layout": "by_gate",
               "batch_warps": 1}  # (in_warp, and its batch_warps, write the block's own tiles)
    whole = combined(gpu, gpus)

    def fitting(candidate):
        knobs = {f.name for f in dataclasses.fields(candidate)}
        candidate = dataclasses.replace(candidate, **{k: v for k, v in changes.items() if k in knobs})
        # the geometry without the poll's registers (a kind that polls no values), then the chunk of rows that fits
        g = validate(dataclasses.replace(candidate, barrier=UNPOLLED), plan, whole)
        if g.ctas % gpus:
            raise ConfigError(f"its grid of {g.ctas} CTAs does not divide among {gpus} GPUs: take units_per_cta so "
                              f"that hidden / units_per_cta is a multiple of {gpus}")
        problem = Tags().placement_problem(plan, candidate.units_per_cta)
        if problem:
            raise ConfigError(problem)
        chosen = words or (DEFAULT_WORDS if gpus <= DEFAULT_WORDS_GPUS else "single")
        if chosen == "packed":
            cols = OperandColumns.of(plan.reductions, plan.hidden, candidate.units_per_cta)
            problem = packed_problem(plan, candidate.units_per_cta, cols.headed)
            if problem and words:
                raise ConfigError(problem)
            chosen = "single" if problem else chosen
        return with_poll(candidate, g, plan, whole, validate, chosen)

    found, reason = [], None
    if cfg is not None:
        try:
            return fitting(cfg)
        except ConfigError as err:
            raise ConfigError(f"config {cfg} cannot run split over {gpus} GPUs: {err}") from None
    try:
        candidates = ranked_configs(plan, whole, limit=64)
    except ConfigError as err:
        candidates, reason = [], err
    placed = 0
    for other in candidates:
        try:
            ladder = fitting(other)
        except ConfigError as err:
            reason = reason or err
            continue
        if ladder[0] not in found:
            found += [p for p in ladder if p not in found]
            placed += 1
        if placed == limit:
            break
    if not found:
        raise ConfigError(f"no config of this layer splits over {gpus} GPUs (the '{SPLIT_BARRIER}' exchange, the "
                          f"shared layout, a grid of a multiple of {gpus} CTAs): {reason}")
    return found


def with_poll(cfg, g, plan, gpu, validate, words: str = WORDS[0]) -> list[SplitPlacement]:
    """``cfg`` (of geometry ``g`` without the poll's registers) placed with the chunk of rows its poll of ``words``
    waits for (:func:`poll_chunk`). Where not even one row's loads fit beside the weights, more of the weights go to
    shared memory (the tiers: ``ranking.tier_knob``), one chunk of them at a time, until they do: a GPU's slice of a
    layer past its registers (LSTM fp16 hidden 4096 over four H100s: 254 KB of weights a CTA) keeps part of them
    there. A tiered placement is followed by up to ``SPILL_STEPS`` with more tiers, each estimated
    ``SPILL_STEP_REGS`` registers lighter than the one before (the fallbacks where ptxas spills: the estimate is
    rough, and at hidden 4096 over four GPUs the first tier count without spills was 9 k tiles past the estimate's).
    ConfigError with the reason where no tier makes room (or the template has none)."""
    tier = tier_knob(cfg)
    found, last, err = [], None, None
    while len(found) <= SPILL_STEPS:
        try:
            rows, regs = poll_chunk(g, cfg, plan, gpu, words)
        except ConfigError as why:
            err = err or why
        else:
            if last is None or g.regs_estimate + regs <= last - SPILL_STEP_REGS:
                found.append(SplitPlacement(cfg, dataclasses.replace(g, regs_estimate=g.regs_estimate + regs), rows,
                                            words))
                last = g.regs_estimate + regs
        if tier is None or not getattr(found[0].config if found else cfg, tier):
            if found:  # every weight in registers: no tiered fallbacks
                return found
            if tier is None:
                raise err
        more = dataclasses.replace(cfg, **{tier: getattr(cfg, tier) + 1})
        try:
            g = validate(dataclasses.replace(more, barrier=UNPOLLED), plan, gpu)
        except ConfigError as full:
            if found:
                return found
            raise ConfigError(f"{err}; more weights in shared memory do not fit either ({tier}={getattr(more, tier)}: "
                              f"{full})") from None
        cfg = more
    return found


def poll_chunk(g, cfg, plan, gpu, words: str = WORDS[0]) -> tuple[int, int]:
    """``(batch rows a poll waits for at a time, the registers it holds)``: the most rows of a tile whose tagged
    loads of ``words`` (at most 32, the poll's stale mask) take at most half the registers the geometry ``g`` leaves a
    thread, else one row where it fits them (the estimate is rough: LSTM fp16 hidden 2048 at k_groups 4 spilled with
    the three rows that fit the estimate, not with one)."""
    spare = max_regs_per_thread(g.threads, gpu) - g.regs_estimate
    cols = OperandColumns.of(plan.reductions, plan.hidden, cfg.units_per_cta)
    row = max((cols.span(op) for op in cols.sizes), default=plan.hidden)  # a tile row's values (its CTA's span)
    tags = Tags() if words != "packed" else PackedTags(2, 1, cfg.units_per_cta, g.ctas)  # (its loads alone asked)
    for rows in range(min(cfg.batch_tile, plan.batch), 0, -1):
        loads, per_load = tags.polled_loads(rows * row, g.threads, row, itemsize(plan.dtype))
        if loads <= 32 and loads * per_load <= spare // 2:
            return rows, loads * per_load
    loads, per_load = tags.polled_loads(row, g.threads, row, itemsize(plan.dtype))
    if loads <= 32 and loads * per_load <= spare:
        return 1, loads * per_load
    raise ConfigError(f"polling one batch row of {row} tagged values holds {loads * per_load} registers a thread, "
                      f"and the {g.threads}-thread CTA leaves {spare} beside its weights: raise units_per_cta's "
                      "threads (k_groups, k_split) or split over more GPUs")


def combined(gpu, gpus: int):
    """``gpus`` GPUs like ``gpu`` as the config's validation sees them: one GPU of their SMs together (a CTA's
    limits are one SM's, as they are)."""
    return dataclasses.replace(gpu, sms=gpu.sms * gpus)


@dataclass(frozen=True)
class SplitKnobs:
    """The split's own knobs beside the template's (module doc): how a step takes the hop (:data:`HOPS`) and the
    words the states travel in (:data:`WORDS`; None: :data:`DEFAULT_WORDS` where a config can run them)."""

    hop: str = HOPS[0]
    words: str | None = None

    def __post_init__(self):
        for name, choices in (("hop", HOPS), ("words", WORDS)):
            if getattr(self, name) not in choices and (name, getattr(self, name)) != ("words", None):
                raise ConfigError(f"{name}={getattr(self, name)!r}: one of {', '.join(choices)} (a split layer's "
                                  "knob beside the template's)")


def split_builder(builder: type, gpus: int, chunk_rows: int, hop: str = HOPS[0], words: str = WORDS[0]) -> type:
    """The template's kernel builder for a layer split over ``gpus`` GPUs, polling ``chunk_rows`` rows at a time, its
    hop run as ``hop``, its states in ``words``."""
    SplitKnobs(hop, words)  # the knobs' check
    return type(f"Split{gpus}{builder.__name__}", (SplitMode, builder),
                {"gpus": gpus, "chunk_rows": chunk_rows, "hop": hop, "words": words})


def split_knobs(config) -> tuple:
    """``(the template's config or None, SplitKnobs)``: a dict config may name the split's own knobs ``hop`` and
    ``words`` (their defaults where it does not)."""
    if not isinstance(config, dict):
        return config, SplitKnobs()
    own = {k: config[k] for k in ("hop", "words") if k in config}
    rest = {k: v for k, v in config.items() if k not in own}
    return (rest or None) if own else config, SplitKnobs(**own)


def floor_problem(builder) -> str | None:
    """Why a split kernel's builder cannot poll a GPU's units' columns at a time (the ``floor`` hops), or None: one
    product of the whole state, every column of a CTA's operand tile its own unit's, and every GPU's units whole
    (hidden a multiple of the GPUs' units)."""
    if len(builder.reductions) != 1 or builder.cols.headed:
        return "one product of the whole state, each operand tile every unit's column"
    if builder.gpu_units * builder.gpus != builder.H:
        return (f"hidden={builder.H} run as {builder.gpus} GPUs of {builder.gpu_units} units (the last GPU's run past "
                "it)")
    return None


class SplitMode:
    """Mixin over a persistent template's builder (see the module's doc)."""

    gpus, chunk_rows, hop, words = 2, 1, HOPS[0], WORDS[0]

    def __init__(self, plan, cfg, g, save: bool = False):
        problem = split_problem(plan, self.gpus)
        if problem:
            raise ConfigError(problem)
        if save or cfg.barrier != SPLIT_BARRIER or cfg.layout != "shared" or getattr(cfg, "batch_groups", 1) > 1 \
                or getattr(cfg, "direct", False):
            raise ConfigError(f"a split layer runs the '{SPLIT_BARRIER}' exchange, the shared layout, one batch "
                              f"group and shared operands, inference only (split_configs), not {cfg}")
        if g.ctas % self.gpus:
            raise ConfigError(f"a grid of {g.ctas} CTAs does not divide among {self.gpus} GPUs (split_configs)")
        super().__init__(plan, cfg, g, save)
        if self.hop != "exposed":
            problem = floor_problem(self)
            if problem:
                raise ConfigError(f"hop={self.hop!r} polls each peer's part from this GPU's own, which needs {problem}")
            log.warning("hop=%r: a timing probe whose outputs are wrong (no peer's values reach a GPU): for "
                        "measurements only", self.hop)
        if not plan.needs_grid_barrier:  # a step's packed words are stored before its (data-carried) barrier
            raise ConfigError(f"a split layer's blocks exchange states every step; {plan.cell.name} reads none")
        # tags, with the peers' copies and chunked polls (the floors: each peer's part this GPU's own)
        parts = None if self.hop == "exposed" else self.gpus if self.hop == "floor" else 1
        if self.words == "packed":
            problem = packed_problem(plan, cfg.units_per_cta, self.cols.headed)
            if problem:
                raise ConfigError(problem)
            self.barrier = PackedTags(self.gpus, self.chunk_rows, cfg.units_per_cta, g.ctas, floor_parts=parts)
        else:
            self.barrier = PeerTags(self.gpus, self.chunk_rows, floor_parts=parts)

    @property
    def hop_note(self) -> str:
        """How this kernel's steps take the hop, and in which words (the compile report's note)."""
        words = ("; words packed: three values and a 16-bit tag a word" if self.words == "packed"
                 else "; words single: a value and its 32-bit tag a word")
        if self.hop == "floor":
            return ("hop floor: each peer's part polled from and stored into this GPU's own (timing only, wrong "
                    "outputs)" + words)
        if self.hop == "floor_own":
            return ("hop floor_own: the floor polling its own GPU's part alone, each peer's store into its own (timing "
                    "only, wrong outputs)" + words)
        return "hop exposed: the whole state polled before the product" + words

    def workspace_shape(self) -> tuple:
        """With packed words: each row of an operand's slot ``ctas x W`` words (``PackedTags``) instead of ``hidden``
        values."""
        shape = super().workspace_shape()
        if self.words != "packed":
            return shape
        U = self.c.units_per_cta
        return (*shape[:2], self.p.batch, words_of(self.g.ctas * U, U))

    def before_wait(self):
        """With packed words: the step's staged states packed and stored (``PackedTags.flush``), first."""
        if self.words == "packed":
            for _ in self.each_part():
                self.barrier.flush(self, self.t)
        super().before_wait()

    @property
    def gpu_index(self):
        """This GPU's place among the split's GPUs (from its run's first CTA)."""
        return self.a.named[CTA_OFFSET] // (self.g.ctas // self.gpus)

    @property
    def gpu_units(self) -> int:
        """Units of one GPU's run of CTAs (the last GPU's may run past ``hidden``)."""
        return self.g.ctas // self.gpus * self.c.units_per_cta

    def _launch(self):
        """The template's launch on one GPU's run of CTAs, with the run's first CTA and the peers' workspaces; its
        input projection is this GPU's columns alone (``xp_column``)."""
        launch = super()._launch()
        grid = dataclasses.replace(launch.grid, ctas=launch.grid.ctas // self.gpus)
        width = self.p.input.slices * self.gpu_units
        args = tuple(dataclasses.replace(a, shape=(*a.shape[:2], width)) if a.name == "xp" else a for a in launch.args)
        return dataclasses.replace(launch, args=(*args, *split_args(self.gpus)), grid=grid)

    def xp_column(self, leaf, unit):
        """The GPU's projection holds, per input slice, its own units alone (``split_columns``)."""
        return leaf.slice * self.gpu_units + unit - self.a.named[CTA_OFFSET] * self.c.units_per_cta

    @property
    def bx(self):
        """This block's CTA index in the whole grid (the template's code indexes units by it)."""
        return self._block + self.a.named[CTA_OFFSET]

    @bx.setter
    def bx(self, value) -> None:
        self._block = value

"""Persistent CUDA template: one launch runs every timestep, weights stay in registers.

Per CTA (see ``persistent_config`` for the knobs):

    prologue   each thread loads its weight tile into registers through fully unrolled,
               constant indices (so it stays in registers), and its items' params and
               private states (LSTM's c) likewise
    each step  prefetch this step's input projection for the thread's items (where blocks synchronize
                 with themselves alone, ``block``: loaded during the step before, see ``inputs_early``;
                 elsewhere the tensor-core template also asks that of two steps on into L2, ``inputs_prefetched``)
               for each phase (``CellPlan.phases``; one for most cells):
                 for each batch tile: bring the phase's operands (h(t-1), or a stage of
                   this step) into shared memory (``persistent_exchange``), multiply with
                   the register weights, reduce across the k_split lanes with warp
                   shuffles, store the gate sums in shared memory
                 per (batch row, unit) item: the phase's pointwise math, fused; values
                   needed later stay in registers, operands of the next phase are
                   published for the other blocks, then a grid barrier
               write h(t) (workspace and output sequence) and the private states; a batch
                 row past its length (the ``lengths`` argument) keeps its states and writes 0
               grid barrier (``prnn_tvm.codegen.barriers``: the config's kind, which also moves the exchanged
                 values), unless this was the last step; a synchronization that timed out ends the time loop

With several products, each thread's rows belong to one of them, so in each phase only
the threads of that phase's products multiply.

The grid is one run of CTAs or, where a template's layout splits the step into parts
(``CellPlan.cta_parts``, a stack's layers or a layer's two directions), one run per part.
A stack's parts: each step branches on the block index (block-uniform) to its part's
code, and the grid barriers stay outside the branches, so every CTA meets them. Parts
that never read each other's values (the two directions) instead pick their part once
and run a time loop of their own (``part_loops``). With the branch inside each step,
ptxas -O1 and above miscompiled a bidirectional kernel with ``tags`` on the H100: the
reverse direction's stores of some steps never happened, a deterministic timeout;
``-O0`` of the same source ran.

With batch groups (the tensor-core template's ``batch_groups``) the grid is that many runs of CTAs, each
over all the units for its own rows of the batch: every per-row argument is seen through a view of the
group's rows (:meth:`PersistentBuilder.batch_group_views`), so the code indexes rows from 0 as for a smaller batch.

The kernel is built with TVM's IRBuilder and compiled with the ``tirx`` pipeline, which
keeps the placement as written (no automatic syncs or buffer compaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen import barriers
from prnn_tvm.codegen.kernel import Kernel, StepTiming, persistent_frame, recurrent_launch, row_view
from prnn_tvm.codegen.pointwise import (
    as_type,
    bind_value,
    emit_phase,
    gpu_math,
    new_state_values,
)
from prnn_tvm.codegen.prefetch import prefetch_l2
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import CellPlan, Leaf, PointwiseGroup
from prnn_tvm.signature import Grid, with_saved
from prnn_tvm.target import GpuSpec

from . import persistent_config as pc
from .head_columns import OperandColumns
from .persistent_config import Geometry, PersistentConfig, group_span
from .persistent_exchange import OperandExchange
from .persistent_sums import UnitSumExchange
from .persistent_weights import RegisterWeights
from .persistent_xp_sectors import SectorPrefetch
from .ranking import parts
from .template import ACCEPTED, Acceptance, config_from_dict, refused


class PersistentTemplate:
    """The template contract (``schedules.template.Template``) of a persistent CUDA template: its knobs
    and their validation live in a module ``knobs`` (``refusal``, ``ranked_configs``, ``space``,
    ``validate``, ``features``, ``saving_config``, ``carried``), its kernel is
    ``builder(plan, config, geometry).build()``. This module's ``TEMPLATE`` (float32) and
    ``persistent_mma``'s (half precision) are two of them."""

    def __init__(self, name: str, config_type: type, knobs, builder: type):
        self.name, self.config_type, self.knobs, self.builder = name, config_type, knobs, builder

    def accepts(self, plan: CellPlan, target) -> Acceptance:
        if target.kind.name != "cuda":
            return refused(f"places CUDA kernels, not {target.kind.name}")
        reason = self.knobs.refusal(plan, str(target.attrs.get("arch", "")))
        return refused(reason) if reason else ACCEPTED

    def apply(self, plan: CellPlan, target, gpu: GpuSpec, config=None) -> Kernel:
        cfg = config if config is not None else self.knobs.ranked_configs(plan, gpu, limit=1)[0]
        builder = self.builder(plan, cfg, self.knobs.validate(cfg, plan, gpu))
        return Kernel(builder.build(), self.name, builder.launch, cfg)

    def default_configs(self, plan: CellPlan, target, gpu: GpuSpec) -> list:
        return self.knobs.ranked_configs(plan, gpu)

    def space(self, plan: CellPlan, gpu: GpuSpec) -> list:
        return self.knobs.space(plan, gpu)

    def carried_over(self, config, plan: CellPlan, gpu: GpuSpec):
        return self.knobs.carried(config, plan, gpu)

    def validate(self, config, plan: CellPlan, gpu: GpuSpec) -> None:
        self.knobs.validate(config, plan, gpu)

    def geometry(self, config, plan: CellPlan):
        return self.knobs.geometry(config, plan)

    def features(self, config, plan: CellPlan, gpu: GpuSpec) -> dict:
        return self.knobs.features(config, plan, gpu)

    def config_from_dict(self, knobs: dict):
        return config_from_dict(self.config_type, knobs)


class PersistentBuilder(SectorPrefetch, OperandExchange, UnitSumExchange, RegisterWeights):
    """Builds the kernel of one config. The products (weights, their registers, the shared gate sums)
    come from a mixin: ``RegisterWeights`` here, ``FragmentWeights`` in the tensor-core template."""

    def __init__(self, plan: CellPlan, cfg: PersistentConfig, g: Geometry, save: bool = False):
        if save and cfg.layout != "shared":
            raise ConfigError(f"a training forward runs the shared layout (ranking.shared_layout), not {cfg}")
        self.p, self.c, self.g, self.save = plan, cfg, g, save
        self.direct = getattr(cfg, "direct", False)  # a tensor-core knob: each lane polls its own fragments
        self.batch_groups = getattr(cfg, "batch_groups", 1)  # a knob of the tensor-core template's only
        self.H, self.B = plan.hidden, plan.batch // self.batch_groups  # the rows a CTA runs
        policy = plan.policy
        self.dt, self.acc_dt, self.compute_dt = policy.storage, policy.accumulate, policy.compute
        self.ops = {name: i for i, name in enumerate(plan.operands)}  # each operand's workspace slot
        self.cols = OperandColumns.of(plan.reductions, self.H, cfg.units_per_cta)  # each operand's heads and span
        self.stride = g.stride  # elements between batch rows of a shared operand tile
        # batch rows of a shared operand tile: a pass's, or the batch where that is less (the tensor-core template's
        # passes are whole tiles of 8 rows: at batch 1 its tiles hold one row; gate_layout="in_warp" keeps whole
        # tiles, two sets of them)
        self.tile_rows = cfg.batch_tile if getattr(cfg, "in_warp", False) else min(cfg.batch_tile, self.B)
        # each pointwise group's (batch row, unit) items go to threads of their own (a stack's layers in
        # parallel); a training forward saves every leaf of a (row, unit) from one item: one group (on each batch
        # group's run of CTAs)
        whole = (PointwiseGroup.whole(plan),)
        self.parts = self.grid_parts() if not save else (
            GridPart(0, -(-self.H // cfg.units_per_cta), plan.reductions, plan.operands, whole),)
        self.groups = tuple(group for part in self.parts for group in part.groups)
        self.looping = self.parts  # the parts the time loop being emitted runs: one inside ``part_loops``
        # word offset of the float32 template's gate sums: after the operand tiles of the part with the most
        self.gs0 = max(len(part.operands) for part in self.parts) * self.tile_rows * g.stride
        self.ipt = max(-(-len(part.groups) * group_span(self.B * cfg.units_per_cta, len(part.groups)) // g.threads)
                       for part in self.parts)
        # an item's registers, numbered within its group (a thread holds one group's per item slot)
        self.slots = {group: ItemSlots(plan, group) for group in self.groups}
        self.enter(self.parts[0])
        self.width = ItemSlots.widest(self.slots.values())
        self.barrier = barriers.by_name(cfg.barrier)
        # states a thread keeps in registers as it published them (a kind that publishes them to a slot per step)
        self.own = {name: i for i, name in enumerate(self.barrier.kept_states(plan))}
        # the sequence each of those goes into, a slot per step of the state's own: the output sequence (its column
        # there) where it is an output, else the exchange sequence (its index there)
        others = [name for name in self.own if name not in plan.outputs]
        self.sequences = {name: ("out", plan.outputs.index(name)) if name in plan.outputs
                          else ("exchange", others.index(name)) for name in self.own}
        self.launch = self._launch()

    def _launch(self):
        """The kernel's arguments, grid and grid synchronization (what the runtime calls it with)."""
        p, g, bar = self.p, self.g, self.barrier
        # the exchange: one double-buffered slot per operand, of the kind's type (unused by a kind that publishes
        # to a slot per step)
        workspace = self.workspace_shape()  # every batch group's rows
        grid_wide = p.needs_grid_barrier and bar.grid_wide  # ``block``: each block synchronizes with itself
        sync = bar.grid_sync(p.phases) if grid_wide else None
        # the third tier: the L2 window (one per launch) over the streamed matrix, where the products have one
        weights = list(dict.fromkeys(r.weight for r in p.reductions))
        streamed = weights[0] if getattr(g, "l2_ws", 0) and len(weights) == 1 else ""
        grid = Grid(g.ctas, g.threads, g.smem_bytes, cooperative=grid_wide, registers=g.regs_estimate,
                    streamed=streamed)
        exchanged = sum(kind == "exchange" for kind, _ in self.sequences.values())
        xp_dtype = self.dt if getattr(self.c, "half_xp", False) else self.acc_dt  # the tensor-core knob ``xp``
        launch = recurrent_launch(p, workspace, bar.exchange_dtype(self.dt), grid, sync, exchanged, xp_dtype)
        if self.save:  # a training forward: the leaves the GPU backward reads, every step
            return with_saved(launch, len(p.saved_leaves()) * self.H, self.acc_dt)
        return launch

    @property
    def steps(self):
        """Steps the kernel runs: the sequence's, and a stack's lag (``CellPlan.lag``)."""
        return self.a.seq_len + self.p.lag if self.p.lag else self.a.seq_len

    def grid_parts(self) -> tuple:
        """The runs of the grid and what each runs (``ranking.parts``): the whole step, or one part each in the
        split layout."""
        per_part = -(-self.H // self.c.units_per_cta)
        return tuple(GridPart(i * per_part, per_part, reductions, operands, groups)
                     for i, (reductions, operands, groups) in enumerate(parts(self.c.layout, self.p)))

    def enter(self, part: "GridPart"):
        """Make ``part`` the one whose code is emitted next: its products, their rows, its operand tiles."""
        self.part, self.reductions = part, part.reductions
        self.row_lo = self.row_starts()
        self.slot = {name: i for i, name in enumerate(part.operands)}  # each operand's shared tile

    def each_part(self):
        """Enter each part the time loop runs in turn; what the loop body emits runs on that part's CTAs only
        (no branch where the grid is one run, or inside :meth:`part_loops`, where the part is already chosen)."""
        if len(self.looping) == 1:
            self.enter(self.looping[0])
            yield
            return
        for part in self.looping:
            with T.If(tirx.all(part.first_cta <= self.bx, self.bx < part.first_cta + part.ctas)):
                with T.Then():
                    self.enter(part)
                    yield

    def part_loops(self):
        """Where the parts never read each other's values (``CellPlan.independent_parts``: a bidirectional
        layer's directions), each part's CTAs choose their part once and run a time loop of their own, which
        passes the same grid barriers in the same order as the others'. Elsewhere one time loop, whose steps
        branch to each part (one loop per layer measured 160 bytes of spills in a split stack's default)."""
        if not self.p.independent_parts or len(self.parts) == 1:
            yield
            return
        for _ in self.each_part():
            self.looping = (self.part,)
            try:
                yield
            finally:
                self.looping = self.parts

    @property
    def cta(self):
        """This CTA's index within its part's run, or its batch group's (its units start at ``cta * units_per_cta``)."""
        if self.batch_groups > 1:  # the shared layout: one part
            return self.bx % self.part.ctas
        return self.bx - self.part.first_cta if self.part.first_cta else self.bx

    def batch_group_views(self, a: SimpleNamespace) -> SimpleNamespace:
        """The launch's arguments as this CTA's batch group sees them: every per-row argument (the input
        projection, the output sequence, the workspace, initial and final states, lengths, a training forward's
        ``saved``) a view whose row ``b`` is row ``group * B + b`` (``codegen.kernel.row_view``). A workspace laid
        out by span of heads (``head_columns``: one axis of ``[span][batch row][column]`` per slot) gives each group
        a run of its own, ``B x`` the padded hidden size, in which ``ws_at`` lays out the group's rows so."""
        first = bind_value(self.bx // self.part.ctas * self.B, "group_row0")

        def rows(buf, axis: int, row: int | None = None):
            return row_view(buf, axis, first, row)

        views = {} if a.xp is None else {"xp": rows(a.xp, 1)}  # none where the kernel projects its input itself
        views.update(init={k: rows(v, 0) for k, v in a.init.items()}, final={k: rows(v, 0) for k, v in a.final.items()})
        views.update({name: rows(getattr(a, name), axis)
                      for name, axis in (("out", 1), ("exchange", 2), ("lengths", 0))
                      if getattr(a, name) is not None})
        if getattr(a, "ws", None) is not None:  # values a batch row: the hidden size, or the padded one (by span)
            views["ws"] = rows(a.ws, 2, self.cols.padded_hidden() if self.cols.headed else None)
        if "saved" in a.named:  # (step, batch row, column), as the GPU backward reads it
            views["named"] = {**a.named, "saved": rows(a.named["saved"], 1)}
        return SimpleNamespace(**{**vars(a), **views})

    def row_starts(self) -> list[int]:
        """Rows of a CTA: reduction i owns rows [row_lo[i], row_lo[i] + slices_i * units)."""
        row_lo, lo = [], 0
        for r in self.reductions:
            row_lo.append(lo)
            lo += r.slices * self.c.units_per_cta
        return row_lo

    # ------------------------------------------------------------------ structure
    def build(self) -> tirx.PrimFunc:
        p, ipt = self.p, self.ipt
        with IRBuilder() as ib:
            # what other blocks write while this one reads it gets no __restrict__ (nor does the exchange sequence,
            # a scratch argument)
            with persistent_frame(self.launch, plain=self.barrier.plain_args) as (self.a, self.bx, self.tx):
                if self.batch_groups > 1:
                    self.a = self.batch_group_views(self.a)
                self.sync = self.a.sync
                self.alloc_product_buffers()
                self.alloc_unit_sums(max(1, len(p.operands)))
                w = self.width
                self.sreg = T.alloc_buffer((max(1, ipt * w.priv),), self.compute_dt, scope="local")
                # the projection's type (none where the kernel projects its input itself: float32), widened where read
                xp_dtype = p.policy.accumulate if self.a.xp is None else self.a.xp.dtype
                self.xreg = T.alloc_buffer((max(1, ipt * w.x),), xp_dtype, scope="local")
                self.preg = T.alloc_buffer((max(1, ipt * w.p),), self.dt, scope="local")
                self.lreg = T.alloc_buffer((max(1, ipt * w.live),), self.compute_dt, scope="local")
                self.lenreg = T.alloc_buffer((ipt,), "int32", scope="local")  # each item's row length
                # each item's states of own, as last published (its output may be a row's padding)
                self.oreg = T.alloc_buffer((ipt * len(self.own),), self.dt, scope="local") if self.own else None
                self.aborted = T.alloc_buffer((1,), "int32", scope="local")
                T.buffer_store(self.aborted, 0, [0])
                self.barrier_base = self.barrier.begin(self.sync)
                self.alloc_loop_state()
                if self.sync is not None:
                    self.barrier.start(self)
                for _ in self.part_loops():
                    for _ in self.each_part():
                        self.prologue()
                    self.time_loop()
                    self.after_steps()
                self.clear_sums()  # atomic sums: the last block out zeroes their accumulators for the next launch
                if self.sync is not None:  # the last step crosses no barrier
                    for _ in self.each_part():
                        self.report_timeout()
                    steps = self.steps_run
                    self.barrier.end(self.sync, self.barrier_base, steps, steps * p.phases - 1)
        return ib.get()

    def time_loop(self):
        """The steps, one after the other (``persistent_warp_gates`` emits two a turn where the projection's two
        register banks alternate)."""
        with T.serial(0, self.steps) as t:
            self.step(t)

    def alloc_loop_state(self):
        """Before the time loop: registers or shared memory the loop keeps besides the template's own (a session
        kernel's, ``schedules.session``)."""

    def after_steps(self):
        """After the time loop: what a template writes once the steps are done, entering each part itself
        (:meth:`each_part`; the final states, where it keeps them in registers: ``persistent_warp_gates``). Nothing
        here, so that the kernels of other templates are as they were."""

    @property
    def steps_run(self):
        """The steps the time loop ran, once it ended: all of them (a session kernel leaves it on request)."""
        return self.steps

    def prologue(self):
        self.load_weights()
        for it, group, item in self.items():
            with item as (b, unit, _ul):
                slots = self.slots[group]
                for name, i in slots.priv.items():
                    T.buffer_store(self.sreg, as_type(self.a.init[name][b, unit], self.compute_dt),
                                   [it * self.width.priv + i])
                for name, i in self.own.items():
                    if name in group.states:
                        T.buffer_store(self.oreg, self.a.init[name][b, unit], [it * len(self.own) + i])
                for i, leaf in enumerate(slots.p):
                    T.buffer_store(self.preg, self.a.param[leaf.name][leaf.slice * self.H + unit],
                                   [it * self.width.p + i])
                if self.a.lengths is not None:
                    T.buffer_store(self.lenreg, self.a.lengths[b], [it])
        self.zero_operand_padding()
        if self.inputs_early:
            with T.If(0 < self.steps):
                with T.Then():
                    self.load_inputs(0)

    @property
    def inputs_early(self) -> bool:
        """Whether each step's input projection is loaded during the step before (the first in the prologue), so
        that its DRAM latency is off the step's critical path: where blocks synchronize with themselves alone
        (``block``), whose step is short. Where they synchronize with each other the loads were already hidden
        (docs/findings.md, "Each step's `xp` loaded a step early")."""
        return not self.barrier.grid_wide and not self.tiles_in_turn

    def step(self, t):
        p = self.p
        self.t = t  # the time loop's variable, for what the products mixin indexes by step
        if not self.inputs_early:
            for _ in self.each_part():
                self.load_inputs(t)
        if self.tiles_in_turn:
            self.tile_by_tile(t)
            return
        for phase in range(p.phases):
            for _ in self.each_part():
                self.sum_totals(t, phase)  # sums over units read from this phase on (none: nothing emitted)
                self.products(t, phase)
                for it, group, item in self.items():
                    with item as (b, unit, ul):
                        self.pointwise(t, phase, it, group, b, unit, ul)
                self.sum_partials(t, phase)
            if phase < p.phases - 1:
                self.barrier.wait(t * p.phases + phase, self.barrier_base, self.sync, self.stall)
        for _ in self.each_part():
            for it, group, item in self.items():
                with item as (b, unit, ul):
                    if self.save:
                        self.save_leaves(t, it, group, b, unit, ul)
                    self.write_states(t, it, group, b, unit, ul)
        if self.inputs_early:  # the next step's, now that this step's are used
            self.next_inputs(t)
        if p.needs_grid_barrier:
            self.before_wait()
            last = None if self.waits_at_last_step else t < self.steps - 1
            self.barrier.wait(t * p.phases + p.phases - 1, self.barrier_base, self.sync, self.stall, when=last)
        self.after_barrier(t)

    def next_inputs(self, t):
        """Where :attr:`inputs_early`, at the end of step ``t``: the next step's input projection into the registers
        the step reads (two steps on, ``persistent_warp_gates``)."""
        with T.If(t + 1 < self.steps):
            with T.Then():
                for _ in self.each_part():
                    self.load_inputs(t + 1)

    def after_barrier(self, t):
        """At the end of step ``t``, after its barrier: what a template does once every value of the step is in place
        (the output sequence copied from the operand tile: ``persistent_warp_gates``); here, where
        :attr:`sectors_prefetched` with ``XP_PREFETCH_EARLY_AT="barrier"``, the projection that many steps on from the
        one loaded at the step's end (:meth:`prefetch_sectors`)."""
        if self.sectors_prefetched and self.XP_PREFETCH_EARLY_AT == "barrier":
            for _ in self.each_part():
                self.prefetch_sectors(t + self.inputs_ahead + self.sectors_prefetched)

    @property
    def waits_at_last_step(self) -> bool:
        """Whether the barrier at the end of a step is emitted unguarded, the last step's included (a block barrier
        there costs nothing): guarded, it would share the guard of the next step's loads of the projection
        (:attr:`inputs_early`), and nvcc merges the two and ptxas issues the loads after the barrier. No: a grid-wide
        kind counts its barriers, and the block kernels' by_gate step is left as the queued A/B changes know it
        (``persistent_warp_gates`` says yes)."""
        return False

    # Steps ahead whose input projection a step asks into L2 (0: none; :attr:`inputs_prefetched`), where a step loads
    # its own at its top (where it is loaded early: ``XP_PREFETCH_EARLY_*``, ``persistent_xp_sectors``)
    XP_PREFETCH_STEPS = 0

    @property
    def inputs_prefetched(self) -> int:
        """How many steps on from the step whose projection it loads a thread asks its items' projection into L2
        (``prefetch.global.L2``, one per word the thread will read: one per 64-byte line from hidden 16 up), or 0:
        so that the load of a projection too large for L2 meets it there rather than waiting on DRAM. Where the step
        loads its own at its top, ``XP_PREFETCH_STEPS`` (bench/results/exchange-probes-h100.md, "Two source changes
        timed and adopted"); where it is loaded early (:attr:`inputs_early`), ``XP_PREFETCH_EARLY_STEPS`` with
        ``XP_PREFETCH_EARLY_BY="word"`` (else :attr:`sectors_prefetched`)."""
        if not self.inputs_early:
            return self.XP_PREFETCH_STEPS
        return self.XP_PREFETCH_EARLY_STEPS if self.XP_PREFETCH_EARLY_BY == "word" else 0

    @property
    def inputs_ahead(self) -> int:
        """Where :attr:`inputs_early`, how many steps on from a step the projection loaded at its end is: the next."""
        return 1

    def load_inputs(self, t, regs=None):
        """Step ``t``'s input projection for the items of the part being emitted, into registers (``regs``, else the
        ones the step reads): issued now, consumed after the products (of this step, or the next where
        :attr:`inputs_early`); and, where :attr:`inputs_prefetched`, that of a later step asked into L2 (where
        :attr:`sectors_prefetched` with ``XP_PREFETCH_EARLY_AT="load"``, from one warp)."""
        ahead, regs = self.inputs_prefetched, self.xreg if regs is None else regs
        if self.sectors_prefetched and self.XP_PREFETCH_EARLY_AT == "load":
            self.prefetch_sectors(t + self.sectors_prefetched)
        for it, group, item in self.items():
            with item as (b, unit, _ul):
                if ahead:
                    with T.If(t + ahead < self.steps):
                        with T.Then():
                            later = self.timing(t + ahead, it)
                            for leaf in self.slots[group].x:
                                column = self.xp_column(leaf, unit)
                                xp = T.address_of(self.a.xp[later.input_step(leaf.slice), b, column])
                                T.evaluate(prefetch_l2(xp))
                timing = self.timing(t, it)
                for i, leaf in enumerate(self.slots[group].x):
                    T.buffer_store(regs, self.a.xp[timing.input_step(leaf.slice), b, self.xp_column(leaf, unit)],
                                   [it * self.width.x + i])

    def xp_column(self, leaf: Leaf, unit):
        """The column of the input projection that input ``leaf`` of ``unit`` reads (its slice's block of units)."""
        return leaf.slice * self.H + unit

    @property
    def tiles_in_turn(self) -> bool:
        """Whether a step runs its batch tiles one after another, each published before the next
        (:meth:`tile_by_tile`): with direct fragments (one phase, one part) over more than one tile."""
        return self.direct and self.g.batch_chunks > 1

    def tile_by_tile(self, t):
        """A step over more than one batch tile with direct fragments: each tile's products, pointwise math and
        publishing in turn, so that the tile published first travels to the other blocks while this block computes
        the next (cuDNN's persistent LSTM at batch 16 runs its two tiles of 8 rows so). A tile's partial sums are
        rows of their own in the step's set, so a block barrier per tile is all the tiles need."""
        BT = self.c.batch_tile
        for _ in self.each_part():
            with T.serial(0, self.g.batch_chunks) as bc:
                b0 = bind_value(bc * BT, "b0")
                self.load_operands(t, b0, 0)
                self.tile_products(b0, 0)
                self.end_products()
                for it, group, item in self.items():
                    with item as (b, unit, ul):
                        with T.If(tirx.all(b0 <= b, b < b0 + BT)):
                            with T.Then():
                                self.pointwise(t, 0, it, group, b, unit, ul)
                                self.write_states(t, it, group, b, unit, ul)
            with T.If(self.aborted[0] != 0):
                with T.Then():
                    T.Break()

    def own_slots(self):
        """``(b, unit, name)`` for each state of ``own`` this thread publishes, inside its item's guard."""
        for _ in self.each_part():
            for _it, group, item in self.items():
                with item as (b, unit, _ul):
                    for name in self.own:
                        if name in group.states:
                            yield b, unit, name

    def report_timeout(self):
        """After the time loop: when a wait of this launch (or of an earlier one on the same state) timed
        out, fill this block's outputs and final states with NaN, so that nothing read before the host
        checks looks valid, and copy the error word to the host's."""
        error = self.barrier.report(self.sync)
        nan = as_type(T.reinterpret("float32", tirx.const(0x7FC00000, "uint32")), self.dt)
        with T.If(self.states_lost(error)):
            with T.Then():
                for _it, group, item in self.items():
                    with item as (b, unit, _ul):
                        for k, name in enumerate(self.p.outputs if self.a.out is not None else ()):
                            if name in group.states:
                                with T.serial(0, self.a.seq_len) as t:
                                    T.buffer_store(self.a.out, nan, [t, b, k * self.H + unit])
                        for name, final in self.a.final.items():
                            if name in group.states:
                                T.buffer_store(final, nan, [b, unit])

    def states_lost(self, error):
        """Whether the launch's error word ``error`` means its outputs and final states cannot be trusted."""
        return error != 0

    def products(self, t, phase: int):
        """This phase's recurrent products, for every batch tile, into the shared gate sums."""
        if not any(r.phase == phase for r in self.reductions):
            return
        with T.serial(0, self.g.batch_chunks) as bc:
            b0 = bind_value(bc * self.c.batch_tile, "b0")
            self.load_operands(t, b0, phase)
            self.tile_products(b0, phase)
            self.end_products()
        self.barrier.after_products(self)

    def pointwise(self, t, phase: int, it, group, b, unit, ul):
        """The phase's stages of ``group`` for one item; keep what later phases need, publish next-phase
        operands."""
        slots = self.slots[group]
        sums = tuple(us for us in self.p.sums_of(phase) if Leaf("unit_sum", us.name, 0) in group.leaves)
        for leaf, value in emit_phase(self.p, phase, self.loader(t, it, group, b, unit, ul), self.bind_stage,
                                      group.live_outs(self.p, phase), sums).items():
            if leaf.kind == "share":  # of a sum over units
                self.add_share(leaf.name, b, ul, value)
                continue
            T.buffer_store(self.lreg, value, [it * self.width.live + slots.live[leaf]])
            if leaf.kind == "stage" and leaf.name in self.p.exchanged_stages:
                self.publish(leaf.name, t, b, unit, as_type(value, self.dt))

    def bind_stage(self, expr, name: str):
        """Bind a stage's value as the GPU computes it (``gpu_math``): its exp, sigmoid and tanh on the fast units
        where the dtype policy allows (sigmoid through tanh where :attr:`sigmoid_through_tanh`)."""
        return bind_value(gpu_math(expr, self.p.policy.fast_math, self.sigmoid_through_tanh), name)

    @property
    def sigmoid_through_tanh(self) -> bool:
        """Whether a fast-math kernel computes sigmoid on the tanh unit alone (one MUFU where 1 / (1 + e^-x) takes
        two): where blocks synchronize with themselves alone (``block``), whose few CTAs run every pointwise item of
        the layer, so that the tanh unit's throughput bounds the step (docs/findings.md, "Sigmoid through
        `tanh.approx`")."""
        return not self.barrier.grid_wide

    def timing(self, t, it) -> StepTiming:
        """Step ``t``'s timing of item ``it``'s row (its length in a register, where the launch has lengths)."""
        return StepTiming(self.p, self.a, t, None if self.a.lengths is None else self.lenreg[it])

    def write_states(self, t, it, group, b, unit, ul):
        """End of step: ``group``'s new states to the workspace or registers, the output (where the group
        makes it), the final states. A row past its length keeps its states and writes a zero output."""
        load = self.loader(t, it, group, b, unit, ul)
        priv = self.slots[group].priv
        timing = self.timing(t, it)
        new = {}
        for name, value in new_state_values(self.p, load, group.states).items():
            running = timing.running(name)
            new[name] = value if running is None else T.if_then_else(running, value, load(Leaf("state", name, 0)))
        stored = {name: as_type(value, self.dt) for name, value in new.items()}
        for name, value in new.items():
            if name in priv:  # private states stay in the compute type between steps
                T.buffer_store(self.sreg, value, [it * self.width.priv + priv[name]])
            elif name in self.own:  # published through its sequence, below
                T.buffer_store(self.oreg, stored[name], [it * len(self.own) + self.own[name]])
            else:
                self.publish(name, t, b, unit, stored[name])
        self.write_outputs(t, timing, stored, b, unit)

    def write_outputs(self, t, timing, stored: dict, b, unit):
        """End of step: the output sequence (and what the barrier kind publishes with it), and after the last step
        the final states."""
        self.barrier.write_outputs(self, t, timing, stored, b, unit)
        with T.If(t == self.steps - 1):
            with T.Then():
                self.write_final(stored, b, unit)

    def write_final(self, stored: dict, b, unit):
        """The final states: the new ``stored`` values (by state name) of row ``b``, unit ``unit``."""
        for name, value in stored.items():
            T.buffer_store(self.a.final[name], value, [b, unit])

    def save_leaves(self, t, it, group, b, unit, ul):
        """A training forward keeps, for this step and item, what ``CellPlan.saved_leaves`` lists; a stage as
        it was multiplied (rounded to storage)."""
        load, saved, H = self.loader(t, it, group, b, unit, ul), self.a.named["saved"], self.H
        for column, leaf in enumerate(self.p.saved_leaves()):
            value = as_type(load(leaf), self.dt) if leaf.kind == "stage" else load(leaf)
            T.buffer_store(saved, as_type(value, saved.dtype), [t, b, column * H + unit])

    def loader(self, t, it, group, b, unit, ul):
        """Where each leaf of item ``it`` (of pointwise ``group``) lives (registers, shared gate sums, the
        workspace), as a value of the compute type."""
        slots, w = self.slots[group], self.width
        red_lo = {r.name: self.row_lo[i] for i, r in enumerate(self.reductions)}

        def load(leaf: Leaf):
            if leaf.kind == "input":
                return as_type(self.xreg[it * w.x + slots.x.index(leaf)], self.compute_dt)
            if leaf.kind == "param":
                return as_type(self.preg[it * w.p + slots.p.index(leaf)], self.compute_dt)
            if leaf.kind == "stage":  # a live-out of an earlier phase
                return self.lreg[it * w.live + slots.live[leaf]]
            if leaf.kind == "reduction":
                return self.product_value(it, b, leaf, red_lo[leaf.name] + leaf.slice * self.c.units_per_cta + ul)
            if leaf.kind == "unit_sum":
                return self.unit_sum(leaf.name, b)
            if leaf.name in slots.priv:
                return self.sreg[it * w.priv + slots.priv[leaf.name]]
            if leaf.name in self.own:
                return as_type(self.oreg[it * len(self.own) + self.own[leaf.name]], self.compute_dt)
            return as_type(self.previous_state(leaf.name, t, b, unit), self.compute_dt)

        return load

    def product_value(self, it, b, leaf: Leaf, row):
        """Item ``it``'s value of product slice ``leaf`` (batch row ``b``, CTA row ``row``): the shared gate sums'."""
        return self.gate_sum(b, row)

    # ------------------------------------------------------------------ helpers
    def per_product(self, value_of):
        """A per-thread value that depends on the product the thread's rows belong to (the products
        mixin says where they start: ``first_row``)."""
        reds = self.reductions
        value = tirx.const(value_of(reds[0]), "int32")
        first_row = self.first_row
        for i, red in enumerate(reds[1:], start=1):
            if value_of(red) != value_of(reds[i - 1]):
                value = T.if_then_else(first_row >= self.row_lo[i], value_of(red), value)
        return value

    @property
    def operand_base(self):
        """Offset of the shared tile this thread's rows multiply (of their head in it, for a head-wise product)."""
        base = self.per_product(lambda r: self.slot[r.operand]) * (self.tile_rows * self.stride)
        if not self.cols.headed:
            return base
        U, first_row = self.c.units_per_cta, self.first_row
        offset = tirx.const(0, "int32")
        for i, red in enumerate(self.reductions):
            here = self.cols.head_offset(red.operand, red.head_size(self.H), self.cta, (first_row - self.row_lo[i]) % U)
            offset = here if i == 0 else T.if_then_else(first_row >= self.row_lo[i], here, offset)
        return base + offset

    @property
    def thread_phase(self):
        """The phase in which this thread's rows multiply."""
        return self.per_product(lambda r: r.phase)

    @property
    def stall(self):
        """The barrier ordinal the test knob stalls: the end-of-step barrier of ``stall_step``."""
        return self.sync.stall_step * self.p.phases + (self.p.phases - 1) if self.sync is not None else None


    def item(self, it: int, group: int | None = None):
        """Context for pointwise item ``it`` of this thread: yields (batch row, unit, unit in CTA). With
        ``group``, the items are (group, batch row, unit) triples and the body runs where item ``it`` is one
        of that pointwise group's (the group is block-uniform over runs of B x units_per_cta items)."""
        return Item(self, it, group)

    def items(self):
        """``(it, pointwise group, item context)`` for each of this thread's item slots and each group of the
        current part (one group: the plain items, as :meth:`item` gives them)."""
        groups = self.part.groups
        for it in range(self.ipt):
            for index, group in enumerate(groups):
                yield it, group, self.item(it, index if len(groups) > 1 else None)


@dataclass(frozen=True)
class GridPart:
    """A run of the grid, ``ctas`` CTAs from ``first_cta``, and what it runs: its products, the operands they
    multiply (each in a shared tile of its own, in this order) and its pointwise groups."""

    first_cta: int
    ctas: int
    reductions: tuple
    operands: tuple
    groups: tuple


class ItemSlots:
    """The registers of one pointwise item of ``group``, numbered within it: ``priv`` (private states by name),
    ``x`` and ``p`` (the input and param leaves the group reads once per step and once per launch), ``live``
    (live-outs by leaf). With one group the numbering is the plan's own."""

    def __init__(self, plan: CellPlan, group: PointwiseGroup):
        def read(kind: str) -> list:
            return sorted((lf for lf in group.leaves if lf.kind == kind and lf in plan.leaf_vars), key=_leaf_key)

        self.priv = {name: i for i, name in enumerate(n for n in plan.private_states if n in group.states)}
        self.x, self.p = read("input"), read("param")
        live = [leaf for phase in range(plan.phases) for leaf in group.live_outs(plan, phase)]
        self.live = {leaf: i for i, leaf in enumerate(live)}

    @staticmethod
    def widest(slots) -> SimpleNamespace:
        """Registers per item slot: the most any group needs of each kind."""
        slots = list(slots)
        return SimpleNamespace(**{kind: max(len(getattr(s, kind)) for s in slots)
                                  for kind in ("priv", "x", "p", "live")})


class Item:
    """``with Item(builder, it) as (b, unit, ul)``: the guarded body of a thread's pointwise item ``it`` (a
    (batch row, unit) pair; units_per_cta, threads, tx, bx, B and H come from the builder)."""

    def __init__(self, builder, it: int, group: int | None = None):
        self.b, self.it, self.group = builder, it, group

    def place(self) -> tuple:
        """``(batch row, unit in CTA, whether the thread holds the item)``: items ``it * threads + tx`` of the
        thread, ``U`` units per batch row."""
        bld, U = self.b, self.b.c.units_per_cta
        item = self.it * bld.g.threads + bld.tx
        if self.group is None:
            return item // U, item % U, item < bld.B * U
        # group g's items start at g * span (span: B * U up to whole warps, so groups share no warp)
        first = self.group * group_span(bld.B * U, len(bld.part.groups))
        return (item - first) // U, (item - first) % U, tirx.all(first <= item, item < first + bld.B * U)

    def __enter__(self):
        bld = self.b
        b, ul, inside = self.place()
        unit = bld.cta * bld.c.units_per_cta + ul
        self.frames = [T.If(tirx.all(inside, unit < bld.H)), T.Then()]
        for f in self.frames:
            f.__enter__()
        return b, unit, ul

    def __exit__(self, *exc):
        for f in reversed(self.frames):
            f.__exit__(*exc)



def _leaf_key(leaf: Leaf):
    return leaf.name, leaf.slice


TEMPLATE = PersistentTemplate("persistent_cuda", PersistentConfig, pc, PersistentBuilder)

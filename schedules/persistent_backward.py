"""Persistent CUDA backward: one launch walks time backwards, the transposed weights stay in registers.

The design is the README's (docs/architecture.md, "Training"). A training forward
(``persistent_cuda`` with ``save=True``) keeps, per step, every state at the step's start,
every product and every stage a later phase multiplies; from those the backward recomputes
the stages pointwise. Per CTA, which owns ``units_per_cta`` hidden units:

    prologue   each thread loads its rows of the *transposed* recurrent weights into registers:
               a row is (operand, unit), an operand being what a product multiplies (an exchanged
               state, or a stage of the step that a later phase multiplies), and runs over the
               gate rows of every product (``k``; zero for the products of other operands); the
               incoming state adjoints ``d_<s>_n`` into registers
    each step  t = T-1 .. 0, and within it each phase, the last first:
                 per (batch row, unit) item, the adjoints the compiler derived from the cell's plan
                   (``frontend.derivative.step_adjoints``, placed by ``codegen.pointwise.adjoint_values``):
                   the gate gradients of the phase's products (published for the other blocks and
                   written to ``d_gates``); in phase 0 also ``d_xp``, the params' (summed in
                   registers) and each state's own share of its adjoint at step t-1
                 grid barrier
                 per batch tile: the gate gradients into shared memory, times the register weights
                   of the rows that send back in this phase, reduced across the k_split lanes
                 per item: what was sent back: an operand stage's adjoint (read by the earlier
                   phases' adjoints), or in phase 0 the states' adjoints at step t-1 (a row past its
                   length passes them on)
    end        ``d_<s>0`` and each param's gradient per batch row

One barrier per phase, so a step of a cell of P phases waits P times, as its forward does (none between blocks with
barrier ``block``, whose blocks hold whole heads; there ``batch_groups`` runs each group of batch rows on a run of
CTAs of its own: ``backward_groups``). The
weights' gradients are GEMMs over ``d_gates`` and the saved operands that the caller makes
(``sum_t d_gates_t^T operand_t``, one per product). A half-precision layer trains on the tensor-core
backward (``backward_mma``: this step with the products on mma fragments); where that refuses it (head-wise
products) or nothing of it fits, this one reads its weights and params in their storage type and keeps and
computes everything in float32 (the weights widened in registers: the register budget of a float32 layer), but
writes ``d_gates`` in the storage type, which the weight gradients' GEMMs take (a half layer's: half the bytes, no
cast before them).
The thread layout of the products, the knobs and the cost model are the forward's
(``persistent_config``), over rows of the transposed weights.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers import BARRIERS, row_lanes
from prnn_tvm.codegen.barriers import by_name as barrier
from prnn_tvm.codegen.kernel import Kernel, persistent_frame, row_view, vec_index
from prnn_tvm.codegen.pointwise import adjoint_values, as_type, bind_kept, bind_value, gpu_math
from prnn_tvm.dtypes import GPU_DTYPES, itemsize
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.derivative import step_adjoints
from prnn_tvm.frontend.plan import CellPlan, Leaf
from prnn_tvm.signature import SEQ, ArgRole, Grid, Launch, gpu_backward_args
from prnn_tvm.target import GpuSpec

from . import persistent_config as pc
from .backward_groups import BackwardConfig, check_batch_groups, group_rows, groups_of, groups_offered
from .head_columns import fitting_units
from .persistent_config import Geometry, PersistentConfig
from .persistent_cuda import Item
from .persistent_exchange import ceil_div, sync_threads
from .persistent_weights import RegisterWeights
from .ranking import RANKED_WITH, check_resources, per_plan, ranked_defaults

DTYPES = GPU_DTYPES  # storage; the backward computes in its compute type, float32 (its registers too)
# the exchange is plain stores and loads between barriers: kinds that poll values instead do not order them
PLAIN = tuple(name for name, kind in BARRIERS.items() if not kind.polls_values)
# What a step costs beyond its products (``estimated_cycles``), fitted on the H100 to training steps of 14 backward
# configs of slstm_h12 bf16 at 768 x 16, T=1024 (bench/cell_backward_configs.py, fast math on): 12 blocks of whole
# heads over the whole batch (barrier ``block``), the same in 2, 4 and 8 batch groups (``backward_groups``) at k_split
# 16 and 32 and 2 and 4 rows a thread, and blocks of 8 to 32 units over the grid (``counter``). Least squares gave a
# step ~ 3.02 ms of the rest of the training step + per backward step 0.55 us per 1000 estimated cycles of products,
# 0.27 us per item a thread takes, 1.11 us where the grid meets: every config of whole heads within 0.07 ms of its
# figure, those over the grid within 0.67 ms, and the measured order of the four fastest kept. Fastest: 8 groups of 2
# rows, 96 x 256 (k_split 16, 4 rows a thread, batch tile 2), 4.042 ms; 4 groups of 4 rows 4.363; the grid's best,
# 96 x 256 of 8 units, 6.004; 12 blocks of whole heads over the whole batch 6.895.
ITEM_CYCLES = 500  # a (batch row, unit) item's recomputed stages and adjoints
GRID_BARRIER_CYCLES = 2000  # a barrier over the grid, per phase


def refusal(plan: CellPlan) -> str | None:
    """Why this template cannot place the backward of ``plan``, or None."""
    if plan.dtype not in DTYPES:
        return f"the GPU backward places {', '.join(DTYPES)} layers, not {plan.dtype}"
    if plan.untrainable:
        return plan.untrainable
    if plan.unit_sums:
        return (f"cell '{plan.cell.name}' sums over units, whose backward adds up across blocks too; the GPU backward "
                "does not (train it on the CPU build: target 'llvm')")
    if len({r.head_size(plan.hidden) for r in plan.reductions}) > 1:
        return (f"cell '{plan.cell.name}' has products of heads of different sizes; the GPU backward takes products of "
                "one head size (train it on the CPU build: target 'llvm')")
    return None


def gate_rows(plan: CellPlan) -> int:
    """Gate rows per unit over every product (the gate gradients' width is this times hidden)."""
    return sum(r.slices for r in plan.reductions)


def head_size(plan: CellPlan) -> int:
    """The products' head size (``refusal`` makes it one): ``hidden`` for dense products. A unit's transposed row
    runs over the gate rows of its head only, ``gate_rows * head_size`` of them."""
    return plan.reductions[0].head_size(plan.hidden) if plan.reductions else plan.hidden


def head_span(plan: CellPlan, units: int) -> int:
    """The units whose gate gradients a CTA multiplies: every one for dense products, else its heads' (whole
    heads: ``units``; a head shared by CTAs: the head)."""
    D = head_size(plan)
    return plan.hidden if D == plan.hidden else (units if units % D == 0 else D)


def geometry(cfg: PersistentConfig, plan: CellPlan) -> Geometry:
    """The forward's geometry (``persistent_config.geometry``) over the transposed weights: a CTA's rows
    are (operand, unit) for every operand a product multiplies (an exchanged state, or a stage of a later
    phase), each as long as every gate row (the rows of other operands' products hold zeros). With batch groups
    (``backward_groups``) a CTA runs its group's rows, and the grid is a run of CTAs per group."""
    H, B, U = plan.hidden, group_rows(cfg, plan), cfg.units_per_cta
    D = head_size(plan)
    k = gate_rows(plan) * D  # a row's gate rows: every one, or its head's
    rows = len(plan.operands) * U if plan.reductions else 0
    row_groups = max(1, math.ceil(rows / cfg.rows_per_thread))
    threads = pc._round_up(row_groups * cfg.k_split, 32)
    k_chunks = math.ceil(k / (cfg.vec * cfg.k_split)) if rows else 0
    weights = cfg.rows_per_thread * k_chunks * cfg.vec if rows else 0
    ipt = math.ceil(B * U / threads)
    item_regs = 2 * len(plan.states) + len(plan.exchanged_stages) + sum(p.slices for p in plan.params) + 1
    regs = weights + cfg.rows_per_thread * cfg.batch_tile + cfg.vec + ipt * item_regs + pc.REG_OVERHEAD
    k_pad = k_chunks * cfg.vec * cfg.k_split
    # head-wise: the tile holds the gate gradients of the CTA's heads, head by head, a row reading its head's k
    stride = 0 if D == H else pc._round_up(gate_rows(plan) * head_span(plan, U) + k_pad - k, 4)
    smem_hs = 4 * cfg.batch_tile * (stride or k_pad)
    return Geometry(groups_of(cfg) * math.ceil(H / U), threads, rows, row_groups, k_chunks, k_pad, weights,
                    math.ceil(B / cfg.batch_tile), ipt, 0, smem_hs, 4 * B * rows, regs, stride)


def validate(cfg: PersistentConfig, plan: CellPlan, gpu: GpuSpec) -> Geometry:
    """Check a config before building; ConfigError with the reason, else its geometry."""
    reason = refusal(plan)
    if reason:
        raise ConfigError(reason)
    if barrier(cfg.barrier).polls_values:
        raise ConfigError(f"the backward's barrier is one of {', '.join(PLAIN)}, not '{cfg.barrier}'")
    problem = barrier(cfg.barrier).placement_problem(plan, cfg.units_per_cta)  # ``block``: whole heads per CTA
    if problem:
        raise ConfigError(problem)
    if cfg.k_split not in (1, 2, 4, 8, 16, 32) or cfg.vec not in (1, 2, 4):
        raise ConfigError(f"k_split={cfg.k_split}, vec={cfg.vec}: k_split is a power of two up to 32, vec 1, 2 or 4")
    if not 1 <= cfg.units_per_cta <= plan.hidden or cfg.rows_per_thread < 1:
        raise ConfigError(f"units_per_cta={cfg.units_per_cta} must be in [1, hidden], rows_per_thread at least 1")
    check_batch_groups(cfg, plan)
    rows = group_rows(cfg, plan)
    if not 1 <= cfg.batch_tile <= rows:
        rows_of = f"a batch group's rows ({rows}: batch_groups={groups_of(cfg)})" if rows < plan.batch else \
            f"the batch ({rows})"
        raise ConfigError(f"batch_tile={cfg.batch_tile}: must be between 1 and {rows_of}")
    check_backward_heads(cfg, plan)
    g = geometry(cfg, plan)
    if g.rows and cfg.rows_per_thread > g.rows:
        raise ConfigError(f"rows_per_thread={cfg.rows_per_thread} exceeds the {g.rows} rows of a CTA")
    if plan.phases > 1 and cfg.units_per_cta % cfg.rows_per_thread:
        raise ConfigError(f"rows_per_thread={cfg.rows_per_thread} must divide units_per_cta={cfg.units_per_cta} "
                          "when products run in several phases: a thread's rows must all send back in one phase")
    if g.threads > 1024:
        raise ConfigError(f"{g.threads} threads per CTA; at most 1024: raise rows_per_thread or lower units_per_cta")
    check_resources(g, plan, gpu, f"{g.weights_per_thread} transposed weights", "raise k_split or lower "
                    "rows_per_thread", "lower batch_tile",
                    "raise units_per_cta" + (" or lower batch_groups" if groups_of(cfg) > 1 else ""))
    return g


def check_backward_heads(cfg: PersistentConfig, plan: CellPlan) -> None:
    """ConfigError where head-wise products do not fit the config: ``units_per_cta`` a multiple or a divisor of the
    head size, a thread's rows (operand, unit) in one head, ``vec`` dividing a head's gate rows."""
    D, U, H = head_size(plan), cfg.units_per_cta, plan.hidden
    if D == H:
        return
    if U % D and D % U:
        raise ConfigError(f"units_per_cta={U}: with heads of {D} units a CTA holds whole heads (a multiple of {D}) or "
                          f"a whole number of CTAs share a head (a divisor of {D})")
    rows = len(plan.operands) * U
    for first in range(0, rows, cfg.rows_per_thread):
        heads = {(row // U, row % U // D) for row in range(first, min(first + cfg.rows_per_thread, rows))}
        if len(heads) > 1:
            raise ConfigError(f"rows_per_thread={cfg.rows_per_thread}: a thread's rows share the gate gradients they "
                              f"multiply, so they must lie in one head of {D} units; take a divisor of {D}")
    if gate_rows(plan) * D % cfg.vec:
        raise ConfigError(f"vec={cfg.vec}: a row reads its head's {gate_rows(plan) * D} gate rows in loads of vec "
                          "values; vec must divide them")


def space(plan: CellPlan, gpu: GpuSpec, kind: str = RANKED_WITH) -> list[BackwardConfig]:
    """The configs the default is ranked from (with barrier ``kind``; where no block waits for another, in each of
    the batch groups ``backward_groups.groups_offered`` whose grid keeps to one CTA per SM, as the forward's groups
    do: two CTAs on an SM share its issue slots, which the estimate does not see)."""
    min_units = math.ceil(plan.hidden / gpu.sms)
    units = sorted({u for u in (min_units, min_units + 1, 2 * min_units) if u <= plan.hidden}
                   | fitting_units(plan, min_units))
    out = []
    for G in groups_offered(plan, kind):
        rows = plan.batch // G
        tiles = sorted({t for t in (1, 2, 4, 8, rows) if t <= rows})
        out += [BackwardConfig(u, ks, r, bt, vec, kind, batch_groups=G) for u in units
                if G == 1 or G * math.ceil(plan.hidden / u) <= gpu.sms
                for ks in (4, 8, 16, 32) for r in (1, 2, 4) for bt in tiles for vec in (4, 2, 1)]
    return out


def estimated_cycles(cfg: PersistentConfig, g: Geometry, plan: CellPlan) -> float:
    """The forward's estimate of the products (``persistent_config.estimated_cycles``) plus what the backward's step
    adds to it: each item's recomputed stages and adjoints (``ITEM_CYCLES`` per item a thread takes) and, where the
    blocks meet over the grid (any barrier but ``block``), a grid barrier per phase. A CTA of a batch group runs its
    group's rows: its items and batch tiles are the group's (``geometry``)."""
    grid = 0 if cfg.barrier == "block" else GRID_BARRIER_CYCLES * plan.phases
    return pc.estimated_cycles(cfg, g) + ITEM_CYCLES * g.items_per_thread + grid


@per_plan
def ranked_configs(plan: CellPlan, gpu: GpuSpec, limit: int = 4) -> list[BackwardConfig]:
    """The untuned choices, best first by :func:`estimated_cycles`, each later one holding fewer weights per thread:
    what a build falls back to when ptxas spills. Head-wise products whose heads a block holds whole (barrier
    ``block``, no grid barrier) rank with the grid's configs, not before them: a block of whole heads takes a
    head's every item of the batch, and the backward's items cost more than the barrier it saves (slstm_h12 above);
    in batch groups (``backward_groups``) it takes a group's, and ranks first where that makes a thread's items as
    few as the grid's configs' (slstm_h12 768 x 16: 8 groups of 2 rows)."""
    local = [] if plan.heads == 1 else [cfg for cfg in space(plan, gpu, "block") if plan.local_to(cfg.units_per_cta)]
    return ranked_defaults(plan, gpu, local + space(plan, gpu), validate,
                           lambda cfg, g: estimated_cycles(cfg, g, plan), limit, "persistent backward")


def backward_kernel(plan: CellPlan, gpu: GpuSpec, config: PersistentConfig) -> Kernel:
    """The GPU backward of ``plan`` with ``config`` (see :func:`ranked_configs`)."""
    builder = _Backward(plan, config, validate(config, plan, gpu))
    return Kernel(builder.build(), "persistent_backward", builder.launch, config)


class _Backward(RegisterWeights):
    """Builds the kernel of one config; the products over the register weights are the forward's
    (``RegisterWeights``), with the transposed weights loaded by :meth:`load_weights`."""

    HALF_TILES = False  # the weights and the gate gradients they multiply in the layer's storage type

    def __init__(self, plan: CellPlan, cfg: PersistentConfig, g: Geometry):
        self.p, self.c, self.g = plan, cfg, g
        self.H, self.U = plan.hidden, cfg.units_per_cta
        self.B = group_rows(cfg, plan)  # the rows a CTA runs: its batch group's (``backward_groups``)
        self.ctas_per_group = math.ceil(self.H / self.U)
        self.compute = self.acc_dt = plan.policy.compute  # the adjoints, the carried and the params' gradients
        # the register weights and the shared tile of gate gradients (published in it too): float32 here, the
        # weights widened in registers; the layer's half type on the tensor cores (``backward_mma``)
        self.dt = self.gates_dt = plan.dtype if self.HALF_TILES else self.compute
        self.storage = plan.dtype  # ``d_gates`` too: the weight gradients' GEMMs take the weights' type
        self.gs0 = cfg.batch_tile * g.stride  # word offset of the sums sent back, after the operand tile
        self.D, self.span = head_size(plan), head_span(plan, cfg.units_per_cta)  # hidden, hidden where dense
        self.si = {s.name: i for i, s in enumerate(plan.states)}
        self.ops = {name: i for i, name in enumerate(plan.operands)}  # a CTA's rows: (operand, unit)
        self.op_phase = {r.operand: r.phase for r in plan.reductions}  # the phase whose products read it
        self.stage_ops = {name: i for i, name in enumerate(plan.exchanged_stages)}
        self.red_lo, lo = {}, 0  # each product's first column in the gate gradients
        for r in plan.reductions:
            self.red_lo[r.name], lo = lo, lo + r.slices * plan.hidden
        self.K = lo
        self.p_leaves = [Leaf("param", p.name, i) for p in plan.params for i in range(p.slices)]
        self.saved_column = {leaf: i for i, leaf in enumerate(plan.saved_leaves())}
        self.adj = step_adjoints(plan)
        self.barrier = barrier(cfg.barrier)
        self.launch = self._launch()

    @property
    def cta(self):
        """This CTA's index in its run of the grid (:class:`~.persistent_cuda.Item` reads it; its units start at
        ``cta * units_per_cta``): a run per batch group."""
        return self.bx % self.ctas_per_group if groups_of(self.c) > 1 else self.bx

    def batch_group_views(self, a):
        """The launch's arguments as this CTA's batch group sees them: every per-row one (``xp``, ``lengths``,
        ``saved``, ``d_out``, the state adjoints in and out, ``d_xp``, ``d_gates``, the params' rows, the workspace)
        a view whose row ``b`` is row ``group * B + b`` (``codegen.kernel.row_view``); the weights and params as
        they are."""
        first = bind_value(self.bx // self.ctas_per_group * self.B, "group_row0")
        named = dict(a.named)
        for arg in self.launch.args:
            if arg.role in (ArgRole.WEIGHT, ArgRole.PARAM, ArgRole.SYNC, ArgRole.SCALAR):
                continue
            # (T, B, ...) sequences and the workspace's (parity, B, ...) have their rows second, the rest first
            axis = 1 if arg.shape[0] == SEQ or arg.role is ArgRole.WORKSPACE else 0
            named[arg.name] = row_view(named[arg.name], axis, first)
        return SimpleNamespace(**{**vars(a), "named": named, "xp": named["xp"], "lengths": named["lengths"],
                                  "ws": named["workspace"]})

    def _launch(self) -> Launch:
        p, g, H = self.p, self.g, self.H
        grid_wide = p.needs_grid_barrier and self.barrier.grid_wide  # ``block``: each block with itself
        sync = self.barrier.grid_sync(p.phases) if grid_wide else None
        args = gpu_backward_args(
            p.batch, H, p.input.slices * H, p.weight_shapes(),
            {q.name: (q.slices * H,) for q in p.params}, tuple(self.si),
            len(p.saved_leaves()) * H, max(1, self.K), self.compute,
            self.storage, (2, p.batch, max(1, self.K)), sync.state_words if sync is not None else None, self.storage,
            self.gates_dt)
        grid = Grid(g.ctas, g.threads, g.smem_bytes, cooperative=grid_wide, registers=g.regs_estimate)
        return Launch("recurrent_backward", args, grid, sync)

    # ------------------------------------------------------------------ structure
    def build(self) -> tirx.PrimFunc:
        p, g, S = self.p, self.g, len(self.si)
        ipt = g.items_per_thread
        with IRBuilder() as ib:
            with persistent_frame(self.launch) as (self.a, self.bx, self.tx):
                if groups_of(self.c) > 1:
                    self.a = self.batch_group_views(self.a)
                n = self.a.named
                self.saved, self.d_out, self.d_xp, self.d_gates = n["saved"], n["d_out"], n["d_xp"], n["d_gates"]
                self.d_final = {s: n[f"d_{s}_n"] for s in self.si}
                self.d_init = {s: n[f"d_{s}0"] for s in self.si}
                self.d_rows = {q.name: n[f"d_{q.name}_rows"] for q in p.params}
                self.alloc_product_buffers()
                self.carry = T.alloc_buffer((ipt * S,), self.compute, scope="local")   # dL/d state, end of step
                self.direct = T.alloc_buffer((ipt * S,), self.compute, scope="local")  # its pointwise share
                self.pgrad = T.alloc_buffer((max(1, ipt * len(self.p_leaves)),), self.compute, scope="local")
                self.lenreg = T.alloc_buffer((ipt,), "int32", scope="local")
                self.dstage = T.alloc_buffer((max(1, ipt * len(self.stage_ops)),), self.compute, scope="local")
                stateful = self.a.sync is not None
                self.base = self.barrier.begin(self.a.sync)
                self.prologue()
                with T.serial(0, self.a.seq_len) as back:
                    t = bind_value(self.a.seq_len - 1 - back, "t")
                    for phase in reversed(range(p.phases)):  # the last phase's products first
                        for it in range(ipt):
                            with self.item(it) as (b, unit, _ul):
                                self.gate_gradients(t, phase, it, b, unit)
                        if p.reductions:
                            ordinal = back * p.phases + (p.phases - 1 - phase)
                            stall = None if self.a.sync is None else self.a.sync.stall_step * p.phases
                            self.barrier.wait(ordinal, self.base, self.a.sync, stall)
                            self.products(t, phase)
                        for it in range(ipt):
                            with self.item(it) as (b, unit, ul):
                                self.received(t, phase, it, b, ul)
                self.epilogue()
                if stateful:
                    self.report_timeout()
                    self.barrier.end(self.a.sync, self.base, self.a.seq_len, self.a.seq_len * p.phases)
        return ib.get()

    def prologue(self):
        self.load_weights()
        for it in range(self.g.items_per_thread):
            with self.item(it) as (b, unit, _ul):
                for name, i in self.si.items():
                    T.buffer_store(self.carry, as_type(self.d_final[name][b, unit], self.compute),
                                   [it * len(self.si) + i])
                for i in range(len(self.p_leaves)):
                    T.buffer_store(self.pgrad, tirx.const(0.0, self.compute), [it * len(self.p_leaves) + i])
                T.buffer_store(self.lenreg, self.a.lengths[b], [it])
        pad = self.g.k_pad - self.K  # columns past the gate rows meet zero weights: keep them 0, not garbage
        if self.D != self.H:
            self.zero_head_padding()
        elif self.g.rows and pad:
            total = self.c.batch_tile * pad
            for i in range(ceil_div(total, self.g.threads)):
                idx = i * self.g.threads + self.tx
                with T.If(idx < total):
                    with T.Then():
                        T.buffer_store(self.smem, tirx.const(0.0, self.dt),
                                       [(idx // pad) * self.g.stride + self.K + idx % pad])

    def load_weights(self):
        """Row ``(e, ul)`` of the thread holds ``W[k, unit]`` for every gate row ``k`` of the products that
        read operand ``e`` (zero elsewhere), in the forward's lane layout (``persistent_weights``); for head-wise
        products, ``k`` runs over the gate rows of the unit's head only (:meth:`head_row`)."""
        c, H, U, D = self.c, self.H, self.U, self.D
        for r in range(c.rows_per_thread if self.g.rows else 0):
            row = bind_value(self.rg * c.rows_per_thread + r, f"row{r}")
            e, ul = row // U, row % U
            unit = self.cta * U + ul
            for q in range(self.g.k_chunks):
                for v in range(c.vec):
                    k = c.vec * (self.ks + c.k_split * q) + v
                    value = tirx.const(0.0, self.dt)
                    for red in reversed(self.p.reductions):
                        lo = self.red_lo[red.name] // H * D  # the product's first gate row (of a head: its own)
                        ok = tirx.all(row < self.g.rows, e == self.ops[red.operand], unit < H, k >= lo,
                                      k < lo + red.slices * D)
                        at = (k - lo, unit) if D == H else self.head_row(k - lo, unit)
                        value = T.if_then_else(ok, as_type(self.a.weight[red.weight][at], self.dt), value)
                    T.buffer_store(self.wreg, value, [self.wreg_index(r, q, v)])

    def head_row(self, k, unit) -> tuple:
        """The head-wise weight element of gate row ``k`` (over a product's slices of the head) of ``unit``'s head
        and ``unit`` itself: row ``s * hidden + head * D + d``, column ``unit % D``."""
        D = self.D
        return k // D * self.H + unit // D * D + k % D, unit % D

    @property
    def operand_base(self):
        """Where a thread's rows' gate gradients start in the shared tile: 0, or with head-wise products at its
        unit's head (the tile holds the CTA's heads one after another, ``gate_rows * D`` columns each)."""
        if self.D == self.H or self.span == self.D:
            return 0
        return (self.rg * self.c.rows_per_thread) % self.U // self.D * (gate_rows(self.p) * self.D)

    def zero_head_padding(self):
        """Columns of the shared tile that no copy loads, head-wise: past the CTA's heads (to the tile's stride)
        and the heads past ``hidden`` in the last CTA."""
        BT, stride, per_head = self.c.batch_tile, self.g.stride, gate_rows(self.p) * self.D
        col0 = self.cta * self.U // self.span * self.span
        total = BT * stride
        for i in range(ceil_div(total, self.g.threads)):
            idx = i * self.g.threads + self.tx
            k = idx % stride
            with T.If(tirx.all(idx < total, tirx.any(k >= gate_rows(self.p) * self.span,
                                                     col0 + k // per_head * self.D >= self.H))):
                with T.Then():
                    T.buffer_store(self.smem, tirx.const(0.0, self.dt), [idx])

    def epilogue(self):
        """``d_<s>0`` from the carried adjoints, and each param's gradient of this item's batch row."""
        S, P = len(self.si), len(self.p_leaves)
        for it in range(self.g.items_per_thread):
            with self.item(it) as (b, unit, _ul):
                for name, i in self.si.items():
                    T.buffer_store(self.d_init[name], self.carry[it * S + i], [b, unit])
                for i, leaf in enumerate(self.p_leaves):
                    T.buffer_store(self.d_rows[leaf.name], self.pgrad[it * P + i], [b, leaf.slice * self.H + unit])

    def report_timeout(self):
        """A timed-out launch fills this block's part of every output with NaN (the gate gradients too, so
        that the weights' gradients made from them do not look valid either) and copies the error word to
        the host's (``persistent_cuda.PersistentBuilder.report_timeout`` for the forward)."""
        error = self.barrier.report(self.a.sync)
        nan = T.reinterpret("float32", tirx.const(0x7FC00000, "uint32"))
        H = self.H
        with T.If(error != 0):
            with T.Then():
                for it in range(self.g.items_per_thread):
                    with self.item(it) as (b, unit, _ul):
                        for d in self.d_init.values():
                            T.buffer_store(d, nan, [b, unit])
                        for leaf in self.p_leaves:
                            T.buffer_store(self.d_rows[leaf.name], nan, [b, leaf.slice * H + unit])
                        with T.serial(0, self.a.seq_len) as t:
                            for s in range(self.p.input.slices):
                                T.buffer_store(self.d_xp, as_type(nan, self.storage), [t, b, s * H + unit])
                            for column in range(self.K // H):
                                T.buffer_store(self.d_gates, as_type(nan, self.storage), [t, b, column * H + unit])

    # ------------------------------------------------------------------ one step backwards
    def gate_gradients(self, t, phase: int, it, b, unit):
        """This item's adjoints at step t before ``phase``'s products go back: the gate gradients of that
        phase's products out (exchange and ``d_gates``); in phase 0 also ``d_xp``, the params' (summed)
        and the states' own shares, kept for :meth:`received`."""
        p, H, S = self.p, self.H, len(self.si)
        value = self.adjoints(t, it, b, unit)
        for r in (r for r in p.reductions if r.phase == phase):
            for s in range(r.slices):
                column = self.red_lo[r.name] + s * H + unit
                g = bind_value(as_type(value(Leaf("reduction", r.name, s)), self.gates_dt), f"d_{r.name}_{s}")
                T.buffer_store(self.a.ws, g, [t % 2, b, column])
                T.buffer_store(self.d_gates, as_type(g, self.storage), [t, b, column])
        if phase:
            return
        for s in range(p.input.slices):
            d_xp = as_type(value(Leaf("input", p.input.name, s)), self.storage)  # the projection's GEMMs' type
            T.buffer_store(self.d_xp, d_xp, [t, b, s * H + unit])
        P = len(self.p_leaves)
        for i, leaf in enumerate(self.p_leaves):
            T.buffer_store(self.pgrad, self.pgrad[it * P + i] + value(leaf), [it * P + i])
        for name, i in self.si.items():
            T.buffer_store(self.direct, value(Leaf("state", name, 0)), [it * S + i])

    def received(self, t, phase: int, it, b, ul):
        """What ``phase``'s transposed products sent back to this item: the adjoint of an operand stage (kept
        for the earlier phases), or, in phase 0, the states' adjoints at step t-1: their own share plus
        what was sent (a row past its length at step t passes its adjoints through unchanged)."""
        sent = {name: self.gate_sum(b, self.row_of(e, ul)) for name, e in self.ops.items()
                if self.op_phase[name] == phase}
        if phase:
            for name, value in sent.items():
                T.buffer_store(self.dstage, value, [it * len(self.stage_ops) + self.stage_ops[name]])
            return
        S = len(self.si)
        for name, i in self.si.items():
            d = self.direct[it * S + i] + sent[name] if name in sent else self.direct[it * S + i]
            T.buffer_store(self.carry, T.if_then_else(t < self.lenreg[it], d, self.carry[it * S + i]), [it * S + i])

    def adjoints(self, t, it, b, unit):
        """``value(leaf)`` at (t, b, unit): forward leaves from ``saved``, ``xp`` and the params; each state's
        incoming adjoint is the carried one (plus ``d_out`` for the output), zero past the row's length."""
        p, a, H, S = self.p, self.a, self.H, len(self.si)
        running = t < self.lenreg[it]

        def forward(leaf: Leaf):
            if leaf.kind == "input":
                return a.xp[t, b, leaf.slice * H + unit]
            if leaf.kind == "param":
                return as_type(a.param[leaf.name][leaf.slice * H + unit], self.compute)
            return self.saved[t, b, self.saved_column[leaf] * H + unit]

        def incoming(name: str):
            d = self.carry[it * S + self.si[name]]
            if name == p.output:
                d = d + as_type(self.d_out[t, b, unit], self.compute)  # in the layer's type, as torch gives it
            return T.if_then_else(running, d, tirx.const(0.0, self.compute))

        def operand(name: str):  # an operand stage's adjoint, received from a later phase's products
            return self.dstage[it * len(self.stage_ops) + self.stage_ops[name]]

        def bind(expr, name: str):  # the math as its forward's: rsqrtf, a half layer's approximate intrinsics
            return bind_kept(gpu_math(expr, p.policy.fast_math), name)

        return adjoint_values(p, self.adj, forward, incoming, operand, bind)

    def products(self, t, phase: int):
        """What ``phase``'s transposed products send back to this CTA's units, for every batch tile, into the
        shared sums (``gs0 + b * rows + row``: ``RegisterWeights.tile_products``). The tile holds every
        product's gate gradients; a row's weights are zero outside its own products."""
        c, g, K = self.c, self.g, self.K
        with T.serial(0, g.batch_chunks) as bc:
            b0 = bind_value(bc * c.batch_tile, "b0")
            if self.D != self.H:
                self.copy_heads(t, b0)
            else:
                lv = row_lanes(K, itemsize(self.gates_dt))  # 16-byte loads where the gate rows allow
                n = c.batch_tile * K // lv
                for i in range(ceil_div(n, g.threads)):
                    idx = i * g.threads + self.tx
                    bb, k = (idx * lv) // K, (idx * lv) % K
                    with T.If(tirx.all(idx < n, b0 + bb < self.B)):
                        with T.Then():
                            T.buffer_store(self.smem, self.a.ws[t % 2, b0 + bb, vec_index(k, lv)],
                                           [vec_index(bb * g.stride + k, lv)])
            sync_threads()
            self.tile_products(b0, phase)
            sync_threads()

    def copy_heads(self, t, b0):
        """The gate gradients of the CTA's heads into the shared tile, head by head: column ``h * gate_rows * D +
        ps * D + d`` of a batch row holds gate row ``ps`` (a product's slice, in order) of unit ``d`` of the CTA's
        head ``h``; heads past ``hidden`` are not loaded."""
        c, g, D = self.c, self.g, self.D
        per_head = gate_rows(self.p) * D
        width = gate_rows(self.p) * self.span
        col0 = self.cta * self.U // self.span * self.span
        lv = next(n for n in (4, 2, 1) if D % n == 0)  # 16-byte loads where a head allows
        n = c.batch_tile * width // lv
        for i in range(ceil_div(n, g.threads)):
            idx = i * g.threads + self.tx
            bb, k = (idx * lv) // width, (idx * lv) % width
            unit = col0 + k // per_head * D + k % D
            source = k % per_head // D * self.H + unit  # gate row ps of that unit
            with T.If(tirx.all(idx < n, b0 + bb < self.B, unit < self.H)):
                with T.Then():
                    T.buffer_store(self.smem, self.a.ws[t % 2, b0 + bb, vec_index(source, lv)],
                                   [vec_index(bb * g.stride + k, lv)])

    # what RegisterWeights asks of its builder: the phase in which the thread's rows send back (they all
    # belong to one operand's, see validate)

    @property
    def thread_phase(self):
        e = self.operand_of(self.first_row)
        value = tirx.const(0, "int32")
        for name, i in self.ops.items():
            if self.op_phase[name]:
                value = T.if_then_else(e == i, self.op_phase[name], value)
        return value

    def row_of(self, e: int, ul):
        """The CTA row of operand ``e``'s unit ``ul``: the operands' rows one after another."""
        return e * self.U + ul

    def operand_of(self, row):
        """The operand of CTA row ``row`` (:meth:`row_of`)."""
        return row // self.U

    def item(self, it: int):
        """Context for item ``it`` of this thread: yields (batch row, unit, unit in CTA)."""
        return Item(self, it)

"""Persistent CUDA template: one launch runs every timestep, weights stay in registers.

Per CTA (see ``persistent_config`` for the knobs):

    prologue   each thread loads its weight tile into registers through fully unrolled,
               constant indices (so it stays in registers), and its items' params and
               private states (LSTM's c) likewise
    each step  prefetch this step's input projection for the thread's items
               for each batch tile: copy the exchanged states h(t-1) into shared memory,
                 multiply with the register weights, reduce across the k_split lanes
                 with warp shuffles, store the gate sums in shared memory
               per (batch row, unit) item: the cell's pointwise math, fused, writing
                 h(t) to the workspace (ping-pong) and to the output sequence
               grid barrier (``prnn_tvm.barrier``), unless this was the last step; a
                 barrier that timed out ends the time loop

The kernel is built with TVM's IRBuilder and compiled with the ``tirx`` pipeline, which
keeps the placement as written (no automatic syncs or buffer compaction).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from prnn_tvm import barrier as grid_barrier
from prnn_tvm.analysis import CellPlan, Leaf
from prnn_tvm.kernel import Kernel, declare_args
from prnn_tvm.pointwise import emit_unit_math

from .persistent_config import Geometry, PersistentConfig, default_config, validate

NAME = "persistent_cuda"
FULL_MASK = 0xFFFFFFFF


def apply(plan: CellPlan, target, gpu, config: PersistentConfig | None = None) -> Kernel | None:
    """Build the persistent kernel for a ``cuda`` target; None for any other target."""
    if target.kind.name != "cuda":
        return None
    cfg = config if config is not None else default_config(plan, gpu)
    g = validate(cfg, plan, gpu)
    workspace = (max(1, len(plan.exchanged)), 2, plan.batch, plan.hidden)
    launch = {"ctas": g.ctas, "threads": g.threads, "smem_bytes": g.smem_bytes,
              "cooperative": plan.needs_grid_barrier, "geometry": g}
    builder = _Builder(plan, cfg, g)
    sync_words = grid_barrier.sync_words(g.ctas) if builder.barrier_state else None
    ws_dtype = "uint64" if builder.barrier.carries_data else "float32"
    return Kernel(builder.build(), NAME, cfg, launch, workspace, sync_words, ws_dtype)


class _Builder:
    def __init__(self, plan: CellPlan, cfg: PersistentConfig, g: Geometry):
        self.p, self.c, self.g = plan, cfg, g
        self.H, self.B, self.dt = plan.hidden, plan.batch, plan.dtype
        self.exch = {name: i for i, name in enumerate(plan.exchanged)}
        self.priv = {name: i for i, name in enumerate(plan.private_states)}
        self.KT = g.k_chunks * cfg.vec  # k elements per lane
        # rows of a CTA: reduction i owns rows [row_lo[i], row_lo[i] + slices_i * units)
        self.row_lo, lo = [], 0
        for r in plan.reductions:
            self.row_lo.append(lo)
            lo += r.slices * cfg.units_per_cta
        # leaves read once per step (inputs) or once per launch (params): kept in registers
        self.x_leaves = sorted({lf for lf in plan.leaf_vars if lf.kind == "input"}, key=_leaf_key)
        self.p_leaves = sorted({lf for lf in plan.leaf_vars if lf.kind == "param"}, key=_leaf_key)
        self.gs0 = len(plan.exchanged) * cfg.batch_tile * g.k_pad  # word offset of the gate sums
        self.barrier = grid_barrier.BARRIERS[cfg.barrier]
        self.barrier_state = plan.needs_grid_barrier and self.barrier.has_state

    # ------------------------------------------------------------------ structure
    def build(self) -> tirx.PrimFunc:
        p, c, g = self.p, self.c, self.g
        attrs = {"tirx.noalias": True, "prnn.hand_placed": True}
        if p.needs_grid_barrier:
            attrs["tirx.kernel_launch_params"] = ["tirx.use_cooperative_launch"]
        ipt = g.items_per_thread
        with IRBuilder() as ib:
            with T.prim_func():
                T.func_name("recurrent")
                T.func_attr(attrs)
                self.a = declare_args(p, (max(1, len(p.exchanged)), 2, self.B, self.H),
                                      "uint64" if self.barrier.carries_data else "float32")
                self.sync = grid_barrier.declare_sync_args(g.ctas) if self.barrier_state else None
                # __launch_bounds__(threads, 1): one CTA per SM is all a persistent grid needs; without
                # the bound ptxas trades registers for occupancy the kernel does not want, and spills.
                with T.launch_thread("blockIdx.x", g.ctas) as bx, T.launch_thread("threadIdx.x", g.threads) as tx, \
                        T.attr({"tirx.launch_bounds_min_blocks_per_sm": 1}):
                    self.bx, self.tx = bx, tx
                    self.wreg = T.alloc_buffer((max(1, g.weights_per_thread),), self.dt, scope="local")
                    self.acc = T.alloc_buffer((c.rows_per_thread * c.batch_tile,), self.dt, scope="local")
                    self.hv = T.alloc_buffer((c.vec,), self.dt, scope="local")
                    self.sreg = T.alloc_buffer((max(1, ipt * len(self.priv)),), self.dt, scope="local")
                    self.xreg = T.alloc_buffer((max(1, ipt * len(self.x_leaves)),), self.dt, scope="local")
                    self.preg = T.alloc_buffer((max(1, ipt * len(self.p_leaves)),), self.dt, scope="local")
                    self.smem = T.alloc_buffer((max(1, self.gs0 + g.smem_gs // 4),), self.dt, scope="shared.dyn")
                    self.aborted = T.alloc_buffer((1,), "int32", scope="local")
                    T.buffer_store(self.aborted, 0, [0])
                    self.ks = _bind(tx % c.k_split, "ks")
                    self.rg = _bind(tx // c.k_split, "rg")
                    self.barrier_base = grid_barrier.emit_begin(self.barrier, self.sync) if self.barrier_state else None
                    self.prologue()
                    with T.serial(0, self.a.seq_len) as t:
                        self.step(t)
                    if self.barrier_state:
                        grid_barrier.emit_end(self.barrier, self.sync, self.barrier_base, self.a.seq_len)
        return ib.get()

    def prologue(self):
        self.load_weights()
        for it in range(self.g.items_per_thread):
            with self.item(it) as (b, unit, _ul):
                for name, i in self.priv.items():
                    T.buffer_store(self.sreg, self.a.init[name][b, unit], [self.sreg_index(it, i)])
                for i, leaf in enumerate(self.p_leaves):
                    T.buffer_store(self.preg, self.a.param[leaf.name][leaf.slice * self.H + unit],
                                   [it * len(self.p_leaves) + i])
        self.zero_state_padding()

    def step(self, t):
        p, g = self.p, self.g
        for it in range(g.items_per_thread):  # issued now, consumed after the products
            with self.item(it) as (b, unit, _ul):
                for i, leaf in enumerate(self.x_leaves):
                    T.buffer_store(self.xreg, self.a.xp[t, b, leaf.slice * self.H + unit],
                                   [it * len(self.x_leaves) + i])
        if p.reductions:
            with T.serial(0, g.batch_chunks) as bc:
                b0 = _bind(bc * self.c.batch_tile, "b0")
                if self.barrier.carries_data:
                    self.exchange_tagged_states(t, b0)
                else:
                    self.load_states(t, b0)
                    _sync()
                self.partial_products()
                self.lane_reduce()
                self.store_gate_sums(b0)
                _sync()
            if self.barrier.carries_data:
                with T.If(self.aborted[0] != 0):
                    with T.Then():
                        T.Break()
        for it in range(g.items_per_thread):
            with self.item(it) as (b, unit, ul):
                self.pointwise(t, it, b, unit, ul)
        if p.needs_grid_barrier and not self.barrier.carries_data:
            with T.If(t < self.a.seq_len - 1):
                with T.Then():
                    grid_barrier.emit(self.barrier, t, self.barrier_base, self.sync)

    # ------------------------------------------------------------------ prologue pieces
    def load_weights(self):
        c, H, U = self.c, self.H, self.c.units_per_cta
        for r in range(c.rows_per_thread if self.p.reductions else 0):
            row = _bind(self.rg * c.rows_per_thread + r, f"row{r}")
            for q in range(self.g.k_chunks):
                for v in range(c.vec):
                    k = c.vec * (self.ks + c.k_split * q) + v
                    value = tirx.const(0.0, self.dt)
                    for i, red in reversed(list(enumerate(self.p.reductions))):
                        lo, hi = self.row_lo[i], self.row_lo[i] + red.slices * U
                        s, ul = (row - lo) // U, (row - lo) % U
                        unit = self.bx * U + ul
                        ok = tirx.all(row >= lo, row < hi, unit < H, k < H)
                        value = T.if_then_else(ok, self.a.weight[red.weight][s * H + unit, k], value)
                    T.buffer_store(self.wreg, value, [self.wreg_index(r, q, v)])

    def zero_state_padding(self):
        """Columns hidden..k_pad of the shared state tile are multiplied by zero weights; keep them 0."""
        pad = self.g.k_pad - self.H
        total = len(self.p.exchanged) * self.c.batch_tile * pad
        for i in range(_ceil(total, self.g.threads)):
            idx = i * self.g.threads + self.tx
            with T.If(idx < total):
                with T.Then():
                    T.buffer_store(self.smem, tirx.const(0.0, self.dt),
                                   [(idx // pad) * self.g.k_pad + self.H + idx % pad])

    # ------------------------------------------------------------------ step pieces
    def exchange_tagged_states(self, t, b0):
        """``tags``: at step 0 copy the initial states; later poll the tagged h(t-1) until current.

        A timeout (block-uniform) ends the batch-tile loop and, through ``aborted``, the time loop.
        """
        with T.If(t == 0):
            with T.Then():
                self.load_states(t, b0)
                _sync()
            with T.Else():
                BT, H = self.c.batch_tile, self.H
                rows = T.min(BT, self.B - b0)
                for e in self.exch.values():
                    abort = grid_barrier.tag_copy(
                        self.barrier, self.g.threads, T.address_of(self.a.ws[e, (t + 1) % 2, b0, 0]),
                        T.address_of(self.smem[e * BT * self.g.k_pad]), rows * H, BT * H, H, self.g.k_pad,
                        self.barrier_base, t, self.sync)
                    with T.If(abort != 0):
                        with T.Then():
                            T.buffer_store(self.aborted, 1, [0])
                            T.Break()

    def load_states(self, t, b0):
        """Copy rows b0..b0+batch_tile of every exchanged state h(t-1) into shared memory."""
        H, BT, threads = self.H, self.c.batch_tile, self.g.threads
        lv = 4 if H % 4 == 0 else (2 if H % 2 == 0 else 1)
        n = BT * H // lv
        for name, e in self.exch.items():
            for i in range(_ceil(n, threads)):
                idx = i * threads + self.tx
                bb, k = (idx * lv) // H, (idx * lv) % H
                b = b0 + bb
                dst = [_vec((e * BT + bb) * self.g.k_pad + k, lv)]
                with T.If(tirx.all(idx < n, b < self.B)):
                    with T.Then():
                        with T.If(t == 0):
                            with T.Then():
                                T.buffer_store(self.smem, self.a.init[name][b, _vec(k, lv)], dst)
                            with T.Else():
                                T.buffer_store(self.smem, self.a.ws[e, (t + 1) % 2, b, _vec(k, lv)], dst)

    def partial_products(self):
        c, BT = self.c, self.c.batch_tile
        for i in range(c.rows_per_thread * BT):
            T.buffer_store(self.acc, tirx.const(0.0, self.dt), [i])
        for q in range(self.g.k_chunks):
            for bb in range(BT):
                base = self.state_base + bb * self.g.k_pad + c.vec * (self.ks + c.k_split * q)
                T.buffer_store(self.hv, self.smem[_vec(base, c.vec)], [_vec(0, c.vec)])
                for r in range(c.rows_per_thread):
                    for v in range(c.vec):
                        a = r * BT + bb
                        T.buffer_store(self.acc, self.acc[a] + self.wreg[self.wreg_index(r, q, v)] * self.hv[v], [a])

    def lane_reduce(self):
        """Butterfly over the k_split lanes of a row: every lane ends with the full sum."""
        ks = self.c.k_split
        for i in range(self.c.rows_per_thread * self.c.batch_tile):
            offset = ks // 2
            while offset >= 1:
                other = T.call_extern(self.dt, "__shfl_xor_sync", T.uint32(FULL_MASK), self.acc[i], offset, ks)
                T.buffer_store(self.acc, self.acc[i] + other, [i])
                offset //= 2

    def store_gate_sums(self, b0):
        c, rows = self.c, self.g.rows
        with T.If(self.ks == 0):
            with T.Then():
                for r in range(c.rows_per_thread):
                    row = self.rg * c.rows_per_thread + r
                    for bb in range(c.batch_tile):
                        with T.If(tirx.all(row < rows, b0 + bb < self.B)):
                            with T.Then():
                                T.buffer_store(self.smem, self.acc[r * c.batch_tile + bb],
                                               [self.gs0 + (b0 + bb) * rows + row])

    def pointwise(self, t, it, b, unit, ul):
        p = self.p
        nx, npar = len(self.x_leaves), len(self.p_leaves)
        red_lo = {r.name: self.row_lo[i] for i, r in enumerate(p.reductions)}

        def load(leaf: Leaf):
            if leaf.kind == "input":
                return self.xreg[it * nx + self.x_leaves.index(leaf)]
            if leaf.kind == "param":
                return self.preg[it * npar + self.p_leaves.index(leaf)]
            if leaf.kind == "reduction":
                row = red_lo[leaf.name] + leaf.slice * self.c.units_per_cta + ul
                return self.smem[self.gs0 + b * self.g.rows + row]
            if leaf.name in self.priv:
                return self.sreg[self.sreg_index(it, self.priv[leaf.name])]
            e = self.exch[leaf.name]
            previous = self.a.ws[e, (t + 1) % 2, b, unit]
            if self.barrier.carries_data:  # this thread's own store of the step before: no polling
                previous = grid_barrier.tag_value(self.barrier, T.address_of(previous))
            return T.if_then_else(t == 0, self.a.init[leaf.name][b, unit], previous)

        new = emit_unit_math(p, load, _bind)
        for name, value in new.items():
            if name in self.exch and self.barrier.carries_data:
                with T.If(tirx.Not(tirx.all(self.bx == 0, t == self.sync.stall_step))):  # test knob
                    with T.Then():
                        slot = T.address_of(self.a.ws[self.exch[name], t % 2, b, unit])
                        T.evaluate(grid_barrier.tag_store(self.barrier, slot, value, self.barrier_base, t))
            elif name in self.exch:
                T.buffer_store(self.a.ws, value, [self.exch[name], t % 2, b, unit])
            else:
                T.buffer_store(self.sreg, value, [self.sreg_index(it, self.priv[name])])
        T.buffer_store(self.a.out, new[p.output], [t, b, unit])
        with T.If(t == self.a.seq_len - 1):
            with T.Then():
                for name, value in new.items():
                    T.buffer_store(self.a.final[name], value, [b, unit])

    # ------------------------------------------------------------------ helpers
    @property
    def state_base(self):
        """Offset of the state tile this thread's rows multiply (one product per thread, see validate)."""
        reds, tile = self.p.reductions, self.c.batch_tile * self.g.k_pad
        e = tirx.const(self.exch[reds[0].state], "int32")
        first_row = self.rg * self.c.rows_per_thread
        for i, red in enumerate(reds[1:], start=1):
            if red.state != reds[i - 1].state:
                e = T.if_then_else(first_row >= self.row_lo[i], self.exch[red.state], e)
        return e * tile

    def wreg_index(self, r: int, q: int, v: int) -> int:
        return (r * self.g.k_chunks + q) * self.c.vec + v

    def sreg_index(self, it: int, i: int) -> int:
        return it * len(self.priv) + i

    def item(self, it: int):
        """Context for pointwise item ``it`` of this thread: yields (batch row, unit, unit in CTA)."""
        return _Item(self, it)


class _Item:
    def __init__(self, builder: _Builder, it: int):
        self.b, self.it = builder, it

    def __enter__(self):
        bld, U = self.b, self.b.c.units_per_cta
        item = self.it * bld.g.threads + bld.tx
        b, ul = item // U, item % U
        unit = bld.bx * U + ul
        self.frames = [T.If(tirx.all(item < bld.B * U, unit < bld.H)), T.Then()]
        for f in self.frames:
            f.__enter__()
        return b, unit, ul

    def __exit__(self, *exc):
        for f in reversed(self.frames):
            f.__exit__(*exc)


def _bind(expr, name: str):
    return T.bind(expr, var=tirx.Var(name, expr.ty))


def _sync():
    T.evaluate(T.tvm_storage_sync("shared"))


def _vec(base, lanes: int):
    return T.ramp(base, 1, lanes) if lanes > 1 else base


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _leaf_key(leaf: Leaf):
    return leaf.name, leaf.slice

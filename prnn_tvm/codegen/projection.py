"""The input projection ``xp[t, n, j] = sum_i x[t, n, i] * W_ih[j, i] + b_ih[j]``.

Inputs are the layer's storage dtype; the products accumulate in the accumulation type (float32 for every dtype),
and ``xp`` is kept in the type the recurrent kernel reads: the accumulation type, so that a half-precision layer
rounds its inputs once, or the layer's half type (the tensor-core template's ``half_xp``: the float32 sum plus the
bias rounded once as it is stored, as cuDNN keeps it).

It has no recurrence, so it is one large matrix product over all timesteps (rows: every
step's batch rows), run before the persistent kernel. float32 on CUDA: built from TE and
scheduled by dlight's SIMT matmul rule with tiles measured for these shapes. float16 and
bfloat16 on CUDA: a hand-placed tensor-core GEMM (:func:`tensor_core_projection`; dlight's own
tensor-core rule does not schedule a symbolic sequence length in TVM 0.27). On the CPU: a
parallel loop nest.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.s_tir import dlight as dl
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..dtypes import M16N8K16, DtypePolicy
from ..errors import ConfigError
from ..frontend.plan import CellPlan
from .kernel import HAND_PLACED, SEQ_LEN, vec_index


def projection_func(
    plan: CellPlan, input_size: int, target: tvm.target.Target, xp_dtype: str | None = None
) -> tirx.PrimFunc:
    """The projection as a PrimFunc named ``projection``, scheduled for ``target``, writing ``xp`` in ``xp_dtype``
    (the recurrent launch's; by default the accumulation type).

    Made once per shape, dtype and target in a process (:data:`_MADE`): the layers of every cell, config and template
    at one batch, width and input size share it, and scheduling it (dlight on CUDA) took ~0.03 s of CPU a compile."""
    key = (plan.batch, input_size, plan.input.slices * plan.hidden, plan.dtype, xp_dtype, str(target))
    if key not in _MADE:
        if len(_MADE) >= MADE_KEPT:
            _MADE.clear()
        _MADE[key] = _projection_func(plan, input_size, target, xp_dtype)
    return _MADE[key]


MADE_KEPT = 1024  # projections kept by shape (a PrimFunc of a few KB each); past it, made again
_MADE: dict = {}


def _projection_func(plan: CellPlan, input_size: int, target: tvm.target.Target, xp_dtype: str | None):
    B, N, dt, acc = plan.batch, plan.input.slices * plan.hidden, plan.dtype, plan.policy.accumulate
    if target.kind.name == "cuda" and plan.policy.mma is not None:
        return tensor_core_projection(B, input_size, N, plan.policy, xp_dtype)
    if xp_dtype not in (None, acc):
        raise ConfigError(f"the {target.kind.name} projection of a {dt} layer writes xp in {acc}, not {xp_dtype}")
    seq_len = tirx.Var(SEQ_LEN, "int32")
    x = te.placeholder((seq_len, B, input_size), dt, name="x")
    w = te.placeholder((N, input_size), dt, name="W_ih")
    b = te.placeholder((N,), dt, name="b_ih")
    if input_size == 1:
        # No reduction for a single input feature: with one, dlight's fallback rule inlines the
        # bias into a reduction of extent 1 as its init *and* its update, adding it twice
        # (TVM 0.27; every cell at input_size=1 was wrong on the GPU through it).
        xp = te.compute(
            (seq_len, B, N), lambda t, n, j: x[t, n, 0].astype(acc) * w[j, 0].astype(acc) + b[j].astype(acc), name="xp"
        )
    else:
        k = te.reduce_axis((0, input_size), name="k")
        xw = te.compute(
            (seq_len, B, N), lambda t, n, j: te.sum(x[t, n, k].astype(acc) * w[j, k].astype(acc), axis=k), name="xw"
        )
        xp = te.compute((seq_len, B, N), lambda t, n, j: xw[t, n, j] + b[j].astype(acc), name="xp")
    func = te.create_prim_func([x, w, b, xp]).with_attr("global_symbol", "projection")
    mod = tvm.IRModule({"projection": func})
    if target.kind.name == "cuda":
        with target:
            mod = dl.ApplyDefaultSchedule(
                _ProjectionMatmul(B, small=B * N < LARGE_TILE_MIN_ROW_WORK), dl.gpu.GEMV(), dl.gpu.Fallback()
            )(mod)
    else:
        mod = _cpu_schedule(mod, "xp" if input_size == 1 else "xw")
    return mod["projection"]


# Batch x output width from which the larger tiles pay off (the sequence length is not known
# when the projection is built): below it, 64 x 64 tiles spread the small products over more CTAs.
LARGE_TILE_MIN_ROW_WORK = 4096


class _ProjectionMatmul(dl.gpu.Matmul):
    """dlight's SIMT matmul rule with tiles measured for the projections' shapes, held k-major in
    shared memory.

    dlight stores each shared tile as its global rows (row-major, k innermost), so in the inner
    product the threads of a warp read 16 floats apart: bank conflicts on every load. Here the
    tiles are transposed (``[k][row]``, rows padded by 4 floats), so a warp reads consecutive
    rows. A 16x16-thread block with 2x2 virtual threads of 4x4 elements (a 128x128 tile, 8 x 8
    outputs per thread, k steps of 8); at batch 1 (T x 1 rows: too few 128-row tiles to fill the
    GPU) 2x4 elements (64x128, k steps of 16). On the H100, T=256, against cuBLAS (``torch.addmm``,
    TF32 off) in one run (``bench/projection.py``): LSTM H=1024 B=1/4/16/64 1.31/1.23/1.22/1.26x,
    H=512 B=16 1.18x, GRU H=1024 B=4 1.29x (the row-major 64x128 tiles used before: 1.95x at
    H=1024 B=4, dlight's own 2.57x).

    Below :data:`LARGE_TILE_MIN_ROW_WORK` (``small``): one 4x4-element tile per thread, a 64x64 tile
    with k steps of 16, four times the CTAs of a 64x128 tile. Eight tilings measured against cuBLAS
    on the H100 (T=256, one run): LSTM H=512 B=1 1.36x (dlight's own tiles 2.05x, 64x128 2.17x),
    GRU H=512 B=1 0.88x (1.36x), GRU H=256 B=4 0.87x (1.13x), LSTM and GRU H=256 B=1 0.56x and 0.82x
    (dlight's 0.55x and 0.80x).
    """

    ROW_PAD = 4  # floats added to each k row of a shared tile (spreads the transposing stores over banks)

    def __init__(self, batch: int, small: bool):
        super().__init__()
        self.batch, self.small = batch, small

    def get_configs(self, target: tvm.target.Target) -> dl.gpu.Matmul.Config:
        vthreads, micro_x, micro_k = (1, 4, 16) if self.small else (2, 2, 16) if self.batch == 1 else (2, 4, 8)
        return dl.gpu.Matmul.Config(
            block_size_x=16,
            block_size_y=16,
            vthread_x=vthreads,
            vthread_y=vthreads,
            micro_size_x=micro_x,
            micro_size_y=4,
            micro_size_k=micro_k,
            vector_size=4,
            unroll=256,
            use_shared=True,
            storage_align=False,
            inner_x=False,
        )

    def apply(self, func, target, tunable):
        sch = super().apply(func, target, tunable)
        if sch is None:
            return None
        for block in sch.get_producers(sch.get_sblock("xw_update")):  # the two shared tiles (and the init)
            if sch.get(block).writes[0].source.scope() == "shared":
                sch.transform_layout(block, ("write", 0), lambda b, row, k: (b, k, row))
                sch.storage_align(block, 0, axis=1, factor=32, offset=self.ROW_PAD)
        return sch


def _cpu_schedule(mod: tvm.IRModule, main_block: str) -> tvm.IRModule:
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    block = sch.get_sblock(main_block, func_name="projection")
    t, n = sch.get_loops(block)[:2]
    sch.parallel(sch.fuse(t, n))
    return sch.mod


# The tensor-core projection: mma.sync of the dtype policy's operand (the fragment layouts of m16n8k16, PTX ISA,
# "Matrix Fragments for mma.m16n8k16"), half inputs, float32 accumulators. A CTA computes a TILE_ROWS x
# TILE_COLS tile of xp, each of its warps a (16 M_TILES) x (TILE_COLS / WARPS_N) piece of it (M_TILES x N_TILES
# instruction tiles); the k loop stages TILE_K columns of x's rows and of W_ih's rows in shared memory, each row
# SKEW elements longer than TILE_K (so the eight rows a fragment load touches fall on distinct banks). 64-row
# tiles on 4 warps beat 128-row tiles on 8 at 5 of the benchmark's 6 shapes on the H100
# (bench/results/projection-h100.md).
TILE_ROWS, TILE_COLS, TILE_K, SKEW = 64, 128, 32, 8
WARPS_N, M_TILES = 2, 2
WARPS_M = TILE_ROWS // (16 * M_TILES)
N_TILES = TILE_COLS // WARPS_N // 8
VECTOR = 8  # elements of one 16-byte global load


def tensor_core_projection(
    batch: int, input_size: int, width: int, policy: DtypePolicy, xp_dtype: str | None = None
) -> tirx.PrimFunc:
    """``xp[t, n, j] = sum_k x[t, n, k] W_ih[j, k] + b_ih[j]`` on tensor cores, for any sequence length, batch,
    input size and width (the tiles past the matrices are zero-filled, the stores past them skipped). ``xp`` is
    ``xp_dtype``: the accumulation type (the default), or the storage type, the float32 sum rounded once as stored.

    Fragments come from shared memory through ``ldmatrix`` (four 8 x 8 matrices per instruction, lane ``l``
    giving the address of row ``l % 8`` of matrix ``l // 8``): lane ``(grp, quad) = (lane // 4, lane % 4)`` then
    holds A element ``j`` of row ``grp + 8 * ((j // 2) % 2)``, column ``2 * quad + j % 2 + 8 * (j // 4)`` of its
    16 x 16 tile of x, B element ``j`` of row (of W_ih) ``grp``, column ``2 * quad + j % 2 + 8 * (j // 2)``, and
    accumulator ``i`` of row ``grp + 8 * (i // 2)``, column ``2 * quad + i % 2``."""
    dtype, acc, mma = policy.storage, policy.accumulate, policy.mma
    out = xp_dtype or acc
    if out not in (acc, dtype):
        raise ConfigError(f"the tensor-core projection writes xp in {acc} or {dtype}, not {out}")
    if mma.shape != M16N8K16:  # its fragments, tiles and ldmatrix addressing are that shape's
        raise ConfigError(
            f"the tensor-core projection is laid out for mma.sync {M16N8K16}, not {mma.shape} ({policy.storage})"
        )
    K, stride = input_size, TILE_K + SKEW
    lanes = next(v for v in (VECTOR, 4, 2, 1) if K % v == 0)  # a vector never straddles a row's end
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("projection")
            T.func_attr({"tirx.noalias": True, HAND_PLACED: True})
            seq_len = tirx.Var(SEQ_LEN, "int32")
            x = T.arg("x", T.buffer((seq_len, batch, K), dtype, buffer_name="x"))
            w = T.arg("W_ih", T.buffer((width, K), dtype, buffer_name="W_ih"))
            b = T.arg("b_ih", T.buffer((width,), dtype, buffer_name="b_ih"))
            xp = T.arg("xp", T.buffer((seq_len, batch, width), out, buffer_name="xp"))
            rows = seq_len * batch
            xf = T.decl_buffer((rows * K,), dtype, data=x.data)
            wf = T.decl_buffer((width * K,), dtype, data=w.data)
            xpf = T.decl_buffer((rows * width,), out, data=xp.data)
            threads = 32 * WARPS_M * WARPS_N
            with (
                T.launch_thread("blockIdx.x", tirx.floordiv(rows + TILE_ROWS - 1, TILE_ROWS)) as bx,
                T.launch_thread("blockIdx.y", -(-width // TILE_COLS)) as by,
                T.launch_thread("threadIdx.x", threads) as tx,
            ):
                # two k blocks of each tile: block kb + 1 is fetched into registers while kb multiplies
                a_tile = T.alloc_buffer((2 * TILE_ROWS * stride,), dtype, scope="shared")
                b_tile = T.alloc_buffer((2 * TILE_COLS * stride,), dtype, scope="shared")
                a_next = T.alloc_buffer((TILE_ROWS * TILE_K // threads,), dtype, scope="local")
                b_next = T.alloc_buffer((TILE_COLS * TILE_K // threads,), dtype, scope="local")
                c = T.alloc_buffer((M_TILES * N_TILES * 4,), acc, scope="local")
                afrag = T.alloc_buffer((M_TILES * 8,), dtype, scope="local")
                bfrag = T.alloc_buffer((N_TILES * 4,), dtype, scope="local")
                warp, lane = tx // 32, tx % 32
                wm, wn, grp, quad = warp // WARPS_N, warp % WARPS_N, lane // 4, lane % 4
                for i in range(M_TILES * N_TILES * 4):
                    T.buffer_store(c, tirx.const(0.0, acc), [i])
                blocks = -(-K // TILE_K)
                staged = ((a_tile, a_next, xf, bx * TILE_ROWS, rows), (b_tile, b_next, wf, by * TILE_COLS, width))

                def fetch(kb):
                    for _, regs, src, first, count in staged:
                        _fetch(regs, src, first, count, kb * TILE_K, K, lanes, tx, threads)

                def put(buf):
                    for tile, regs, *_ in staged:
                        _put(tile, regs, buf * (int(tile.shape[0]) // 2), tx, threads, stride)

                fetch(0)
                put(0)
                T.evaluate(T.tvm_storage_sync("shared"))
                with T.serial(0, blocks) as kb:
                    with T.If(kb + 1 < blocks):
                        with T.Then():
                            fetch(kb + 1)
                    a0, b0 = (kb % 2) * TILE_ROWS * stride, (kb % 2) * TILE_COLS * stride
                    for ks in range(TILE_K // 16):
                        for m in range(M_TILES):  # one 16 x 16 A tile: four 8 x 8 matrices, lane // 8 picks one
                            row = (wm * M_TILES + m) * 16 + lane % 8 + 8 * (lane // 8 % 2)
                            _ldmatrix_x4(afrag, m * 8, a_tile, a0 + row * stride + ks * 16 + 8 * (lane // 16))
                        for n in range(0, N_TILES, 2):  # two B tiles (n, n + 1), two 8 x 8 matrices each
                            col = (wn * N_TILES + n + lane // 16) * 8 + lane % 8
                            _ldmatrix_x4(bfrag, n * 4, b_tile, b0 + col * stride + ks * 16 + 8 * (lane // 8 % 2))
                        for m in range(M_TILES):
                            for n in range(N_TILES):
                                T.evaluate(
                                    T.ptx_legacy.mma(
                                        mma.shape,
                                        "row",
                                        "col",
                                        mma.ptx,
                                        mma.ptx,
                                        mma.accumulator,
                                        afrag.data,
                                        m * 8,
                                        bfrag.data,
                                        n * 4,
                                        c.data,
                                        (m * N_TILES + n) * 4,
                                        False,
                                    )
                                )
                    with T.If(kb + 1 < blocks):  # the other buffer: last read before the previous sync
                        with T.Then():
                            put((kb + 1) % 2)
                    T.evaluate(T.tvm_storage_sync("shared"))
                for m in range(M_TILES):
                    for n in range(N_TILES):
                        for half in range(2):  # accumulators 2 * half, + 1: row grp + 8 * half, columns 2 * quad, + 1
                            row = bx * TILE_ROWS + (wm * M_TILES + m) * 16 + grp + 8 * half
                            col = by * TILE_COLS + (wn * N_TILES + n) * 8 + 2 * quad
                            _store_pair(xpf, c, (m * N_TILES + n) * 4 + 2 * half, b, row, col, rows, width, acc)
    return ib.get()


def _store_pair(xpf, c, at, b, row, col, rows, width: int, acc: str):
    """Accumulators ``at``, ``at + 1`` (columns ``col``, ``col + 1`` of ``row``) plus the bias into ``xp`` (in its
    type: the sum rounded once where that is the half type). Where the width is even, one store of the pair (8
    bytes in float32): a warp's stores then fill whole 32-byte sectors (four lanes' pairs of a row side by side),
    where 4-byte stores wrote each sector in two halves. The store-bound large projections measured 11-21% faster so
    on the H100 (bench/results/projection-h100.md). An odd width keeps a store per value (a pair's address is not
    aligned to the pair)."""
    out = xpf.dtype
    if width % 2 == 0:  # col is even, so is width: col < width means both columns are inside
        with T.If(tirx.all(row < rows, col < width)):
            with T.Then():
                pair = c[T.ramp(at, 1, 2)] + b[T.ramp(col, 1, 2)].astype(f"{acc}x2")
                T.buffer_store(xpf, pair if out == acc else pair.astype(f"{out}x2"), [T.ramp(row * width + col, 1, 2)])
        return
    for i in range(2):
        with T.If(tirx.all(row < rows, col + i < width)):
            with T.Then():
                T.buffer_store(xpf, (c[at + i] + b[col + i].astype(acc)).astype(out), [row * width + col + i])


def _ldmatrix_x4(frag, first, tile, at):
    """Four 8 x 8 matrices of ``tile`` into ``frag[first:first + 8]`` (this lane's row address: ``at``)."""
    T.evaluate(T.ptx_legacy.ldmatrix(False, 4, ".b16", frag.data, first, tile.access_ptr("r"), at, dtype=tile.dtype))


def _fetch(regs, src, first_row, rows, k0, K: int, lanes: int, tx, threads: int):
    """This thread's share of rows ``first_row..`` of ``src`` (``K`` columns each), columns ``k0 .. k0 + TILE_K``,
    into ``regs``: VECTOR elements per row piece, as ``lanes``-wide loads; zeros past the last row and column."""
    per_row = TILE_K // VECTOR
    zero = tirx.const(0.0, src.dtype) if lanes == 1 else T.broadcast(tirx.const(0.0, src.dtype), lanes)
    for i in range(int(regs.shape[0]) // VECTOR):
        v = tx + threads * i
        r, k = v // per_row, (v % per_row) * VECTOR
        for j in range(0, VECTOR, lanes):
            ok = tirx.all(first_row + r < rows, k0 + k + j < K)
            at = (first_row + r) * K + k0 + k + j
            value = T.if_then_else(ok, src[vec_index(at, lanes)], zero)
            T.buffer_store(regs, value, [vec_index(i * VECTOR + j, lanes)])


def _put(tile, regs, base, tx, threads: int, stride: int):
    """What :func:`_fetch` loaded into the shared tile starting at ``base`` (16-byte stores)."""
    per_row = TILE_K // VECTOR
    for i in range(int(regs.shape[0]) // VECTOR):
        v = tx + threads * i
        r, k = v // per_row, (v % per_row) * VECTOR
        T.buffer_store(tile, regs[T.ramp(i * VECTOR, 1, VECTOR)], [T.ramp(base + r * stride + k, 1, VECTOR)])

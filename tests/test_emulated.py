"""The CUDA source the compiler emits, run on the host CPU as written (``prnn_tvm.verify.emulator``): its lane
reductions, operand exchanges, shared gate sums, barriers and timeout path, block against block, and the training
kernels (the saving forward, the GPU backward), against the float64 NumPy reference. Nothing here models the
kernel: a bug in what a template emits gives wrong numbers here, and an access past any buffer (a block's shared
memory, a kernel argument) stops the run naming the buffer.

What only the GPU shows (its weaker memory order, ptxas and nvcc, timing and co-residency, the tensor-core
template's instructions) is in the ``gpu`` tests: ``test_gpu_barrier.py``, ``test_gpu_sentinel.py``,
``test_gpu_numerics.py``, ``test_gpu_cells.py``, ``test_gpu_half.py``, ``test_gpu_direct.py``,
``test_gpu_batch_groups.py``, ``test_gpu_robust.py``, ``test_gpu_streams.py``."""

import tempfile

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error, relative_error, worst
from prnn_tvm.codegen.build import build_functions
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import PrnnError
from prnn_tvm.frontend.heads import diagonal_blocks
from prnn_tvm.reference import plan_gradients, random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import gpu_backward, saving_forward
from prnn_tvm.signature import Arg, ArgRole, Grid, Launch
from prnn_tvm.verify import emulator

from .two_state_cell import TWO_STATE

pytestmark = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")

T = 5  # steps: every step's exchange, and parities both ways


def emulated(cell, hidden: int, batch: int, config: dict | None, seq_len: int = T, seed: int = 0, **options):
    """A CUDA layer's recurrent kernel emulated on random inputs with ragged lengths (a length-1 row, a full
    one): ``(its max abs error to the float64 reference, the layer)``."""
    layer = prnn_tvm.compile_cell(
        cell, hidden, batch, input_size=3, target="cuda", arch="sm_90", tuning_logs=[], config=config, **options
    )
    inputs = random_inputs(layer.plan, seq_len, 3, seed=seed)
    inputs["lengths"] = random_lengths(batch, seq_len, seed=seed + 1)
    out, finals, word = emulator.run_recurrent(layer, inputs)
    assert word == 0, f"the kernel reported a barrier timeout ({word})"
    return max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs)), layer


def knobs(units, k_split, rows, tile, vec=2, barrier="counter", **more) -> dict:
    return dict(
        units_per_cta=units, k_split=k_split, rows_per_thread=rows, batch_tile=tile, vec=vec, barrier=barrier, **more
    )


@pytest.mark.parametrize("barrier", ["counter", "tags", "sentinel", "grid_sync"])
def test_every_exchange_and_barrier_as_emitted(barrier):
    """Hidden 10 over blocks of 4 units (the last block half empty), 3 rows per thread (odd halving), batch
    tiles of 2 over 3 rows (a short last tile)."""
    err, _ = emulated("lstm", 10, 3, knobs(4, 4, 3, 2, barrier=barrier))
    assert err <= tolerance("float32", T), err


@pytest.mark.parametrize(
    "k_split, rows, tile, vec",
    [
        (32, 1, 1, 1),  # one value: an all-reduce over 32 lanes
        (32, 4, 4, 4),  # 16 values, halved to one per lane
        (8, 3, 2, 2),  # 6 values over 8 lanes: a level with an odd count
        (2, 5, 1, 4),  # 5 values, 2 lanes: a lane keeps 3
        (16, 2, 3, 1),  # 6 values over 16 lanes
        (1, 3, 2, 4),  # no reduction
    ],
)
def test_every_lane_reduction_as_emitted(k_split, rows, tile, vec):
    """The halving lane reduction (``RegisterWeights.lane_reduce``) and the lanes that store each total
    (``held_value``), as the kernel's shuffles run them."""
    err, layer = emulated("rnn_tanh", 12, 4, knobs(6, k_split, rows, tile, vec))
    assert err <= tolerance("float32", T), (err, layer.report.config)


@pytest.mark.parametrize(
    "cell, config, options",
    [
        ("gru_cho", knobs(4, 8, 2, 2), {}),  # two phases: a stage exchanged between them
        (TWO_STATE, knobs(3, 4, 3, 3, barrier="tags"), {}),  # two exchanged states, two products
        ("lstm_peephole", knobs(5, 4, 4, 1, barrier="sentinel"), {}),
        (
            "lstm",
            knobs(4, 4, 2, 2, barrier="sentinel"),
            {"layers": 3},
        ),  # a stack: delayed states, the exchange sequence
        ("gru", knobs(4, 8, 3, 2, layout="split"), {"layers": 2}),  # each layer on blocks of its own
        ("lstm", knobs(4, 4, 2, 2, barrier="tags"), {"bidirectional": True}),  # two parts, their own time loops
    ],
)
def test_cells_stacks_and_directions_as_emitted(cell, config, options):
    err, layer = emulated(cell, 8, 3, config, **options)
    assert err <= tolerance("float32", T * options.get("layers", 1)), (err, layer.report.config)


def emulated_gradients(layer, seq_len: int = T, seed: int = 0) -> dict:
    """``layer``'s training kernels as emitted (the saving forward, then the GPU backward) emulated on random
    inputs, ragged lengths and random output gradients, and every argument's gradient assembled from theirs as
    ``prnn_tvm.torch`` does (the weights' from ``d_gates`` and the saved operands); with the plan's float64
    gradients: ``(got, want)``."""
    plan, H, B = layer.plan, layer.plan.hidden, layer.plan.batch
    save = saving_forward(plan, layer.target, layer.gpu, layer.kernel.config)
    backward = next(iter(gpu_backward(plan, layer.gpu)))
    source = build_functions(
        {"recurrent_save": save.func, "recurrent_backward": backward.func}, layer.target, layer.gpu
    ).source
    inputs = random_inputs(plan, seq_len, layer.input_size, seed=seed)
    inputs["lengths"] = random_lengths(B, seq_len, seed=seed + 1)
    rng = np.random.default_rng(seed + 2)
    given = backward.launch.arg("d_out").dtype  # the outputs' gradients in the layer's type: their values as rounded
    d_out = rng.standard_normal((seq_len, B, H)).astype(given).astype(np.float64)
    d_finals = {s.name: rng.standard_normal((B, H)).astype(given).astype(np.float64) for s in plan.states}
    xp = emulator.projection(inputs, "float32")
    saved = (
        emulator.run_launch(source, save.launch, {**inputs, "xp": xp}, seq_len, kernel=save.func, target=layer.target)
        .buffers["saved"]
        .astype(np.float64)
    )
    d = emulator.run_launch(
        source,
        backward.launch,
        {**inputs, "xp": xp, "saved": saved, "d_out": d_out, **{f"d_{s}_n": v for s, v in d_finals.items()}},
        seq_len,
        kernel=backward.func,
        target=layer.target,
    ).buffers
    return gradients_from(plan, inputs, d, saved, layer.input_size), plan_gradients(plan, inputs, d_out, d_finals)


def gradients_from(plan, inputs: dict, d: dict, saved, input_size: int) -> dict:
    """Every argument's gradient (float64) from what the training kernels wrote (``d``: the backward's outputs by
    name; ``saved``: the training forward's), assembled as ``prnn_tvm.torch`` does: the projection's from
    ``d_xp``, each product's weights from ``d_gates`` and the saved operands (a head-wise one's, its heads)."""
    H, B = plan.hidden, plan.batch
    saved = np.asarray(saved, np.float64)
    seq_len = saved.shape[0]
    d_xp = np.asarray(d["d_xp"], np.float64)
    got = {
        "x": d_xp @ inputs["W_ih"],
        "b_ih": d_xp.sum((0, 1)),
        "W_ih": d_xp.reshape(-1, d_xp.shape[-1]).T @ inputs["x"].reshape(-1, input_size),
    }
    got.update({f"{s.name}0": np.asarray(d[f"d_{s.name}0"]) for s in plan.states})
    got.update({q.name: np.asarray(d[f"d_{q.name}_rows"]).sum(0) for q in plan.params})
    where = {leaf.name: i for i, leaf in enumerate(plan.saved_leaves()) if leaf.kind in ("state", "stage")}
    column = 0
    for r in plan.reductions:  # each product's weights: d_gates^T operand over steps and rows (a head-wise one's heads)
        gates = np.asarray(d["d_gates"], np.float64)[:, :, column : column + r.slices * H].reshape(seq_len * B, -1)
        i = where[r.operand]
        dense = gates.T @ saved[:, :, i * H : (i + 1) * H].reshape(seq_len * B, H)
        got[r.weight] = got.get(r.weight, 0) + diagonal_blocks(dense, r.heads)
        column += r.slices * H
    return got


@pytest.mark.parametrize(
    "cell, config",
    [
        ("lstm", knobs(4, 4, 2, 2)),
        ("gru_cho", knobs(4, 8, 2, 2, barrier="tags")),  # two phases backwards: a stage's adjoint through its product
        (TWO_STATE, knobs(3, 4, 3, 3)),
    ],
)
def test_the_training_forward_and_the_gpu_backward_as_emitted(cell, config):
    """Every argument's gradient, against backpropagation through time in float64 NumPy."""
    layer = prnn_tvm.compile_cell(cell, 8, 3, input_size=3, target="cuda", arch="sm_90", tuning_logs=[], config=config)
    got, want = emulated_gradients(layer)
    assert set(got) == set(want)
    assert worst(relative_error(got[n], want[n]) for n in want) <= 1e-5, {
        n: relative_error(got[n], want[n]) for n in want
    }


@pytest.mark.parametrize("barrier", ["counter", "tags", "sentinel"])
def test_a_stalled_block_times_out_and_every_output_is_nan(barrier):
    """Block 0 skips its part of step 2 (the ``stall_step`` knob): every waiter gives up after the kernel's own
    timeout, the error word records the step, every output and final state is NaN."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        8,
        2,
        input_size=3,
        target="cuda",
        arch="sm_90",
        tuning_logs=[],
        config=knobs(4, 4, 2, 2, barrier=barrier),
    )
    inputs = random_inputs(layer.plan, T, 3)
    out, finals, word = emulator.run_recurrent(layer, inputs, timeout_us=100_000, stall_step=2)
    assert layer.signature.launch("recurrent").sync.where(word - 1) == "after step 2", word
    assert np.isnan(out).all() and all(np.isnan(f).all() for f in finals)


def test_a_kernel_the_host_cannot_run_is_refused_naming_what():
    layer = prnn_tvm.compile_cell("lstm", 16, 8, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])
    with pytest.raises(PrnnError, match=r"no host translation of the PTX '(mma|ldmatrix|tanh)"):
        emulator.run_recurrent(layer, random_inputs(layer.plan, 2, 16))


# ---------------------------------------------------------------- the emulator itself, on kernels written here
PREAMBLE = "#include <cstdint>\n"


def tiny(body: str, threads: int = 64, blocks: int = 1, n: int = 64) -> np.ndarray:
    """Run ``body`` as a kernel over ``out`` (``n`` floats, NaN before) on ``blocks`` x ``threads``."""
    source = (
        PREAMBLE + 'extern "C" __global__ void __launch_bounds__(64) probe_kernel(float* __restrict__ out_ptr, '
        f"int seq_len) {{\n{body}\n}}\n"
    )
    launch = Launch("probe", (Arg("out", ArgRole.OUTPUT, (n,), "float32"),), Grid(blocks, threads, 16, False))
    out = np.full(n, np.nan, np.float32)
    return emulator.emulate(source, launch, {"out": out}, {"seq_len": 1}).buffers["out"]


def test_shuffles_block_barriers_and_shared_memory_behave_as_cuda_says():
    got = tiny("""
  extern __shared__ __align__(16) float tile[];
  int tx = (int)threadIdx.x;
  float mine = (float)tx;
  float across = __shfl_xor_sync(0xffffffffu, mine, 1, 32);   // the neighbour's
  float within = __shfl_xor_sync(0xffffffffu, mine, 4, 4);    // past a group of 4: its own value
  if (tx < 4) tile[tx] = across + 100.0f * within;
  __syncthreads();
  out_ptr[tx] = tile[tx % 4] + (__syncthreads_or(tx == 37) ? 1000.0f : 0.0f);""")
    lanes = np.arange(64)
    tile = (lanes[:4] ^ 1) + 100.0 * lanes[:4]
    np.testing.assert_array_equal(got, tile[lanes % 4] + 1000.0)


def test_a_barrier_that_not_every_thread_reaches_is_a_deadlock_not_a_hang():
    """Half a warp shuffles (with the whole warp's mask) while the rest of the block waits at a block barrier."""
    with pytest.raises(emulator.EmulationError, match="barriers that cannot complete"):
        tiny(
            "if (threadIdx.x < 16) out_ptr[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1, 32);\n"
            "__syncthreads();\nout_ptr[threadIdx.x] = 0.0f;"
        )


def test_an_access_past_a_buffer_names_it():
    with pytest.raises(emulator.EmulationError, match=r"access 0 bytes past the end of argument out \(256 bytes\)"):
        tiny("out_ptr[threadIdx.x + 1] = 0.0f;")
    with pytest.raises(emulator.EmulationError, match=r"past the end of the dynamic shared memory of block 1 \(16"):
        tiny(
            "extern __shared__ __align__(16) float tile[];\nif (blockIdx.x == 1) tile[threadIdx.x] = 0.0f;",
            blocks=2,
            n=128,
        )


def test_kernels_link_one_runtime_built_once(tmp_path, monkeypatch):
    """Every kernel's program is its own translation unit linked with the runtime (the grid, the fibers, ``main``),
    which is compiled once; a shuffle moves a lane's 8 bytes whole."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a cache of this test's own
    lanes = np.arange(64)
    got = tiny("double mine = 0.5 * (int)threadIdx.x + 1e-9;\n"
               "out_ptr[threadIdx.x] = (float)(__shfl_xor_sync(0xffffffffu, mine, 2, 32) - 1e-9);")
    np.testing.assert_array_equal(got, 0.5 * (lanes ^ 2))
    runtime = emulator.runtime_object()
    built = runtime.stat().st_mtime_ns
    np.testing.assert_array_equal(tiny("out_ptr[threadIdx.x] = (float)blockDim.x;"), np.full(64, 64.0))
    folders = sorted(path.name for path in (tmp_path / "prnn_emulator").iterdir())
    assert len(folders) == 3 and [name for name in folders if name.startswith("runtime-")] == [runtime.parent.name]
    assert runtime.stat().st_mtime_ns == built

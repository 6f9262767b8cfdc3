"""Head-wise products on the CUDA templates (``schedules/head_columns.py``): the float32 kernels as emitted, run on
the host (``prnn_tvm.verify.emulator``) against float64, the training kernels too; ptxas and launchability of the
float32 and tensor-core kernels; what a block holds; the ``block`` barrier; refusals; the tuning space. The GPU
runs (half precision, timing): ``test_gpu_heads.py``."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import persistent_backward as pb
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import saving_forward
from prnn_tvm.schedules.backward_groups import BackwardConfig
from prnn_tvm.target import gpu_spec, max_regs_per_thread
from prnn_tvm.tune.space import ConfigSpace
from prnn_tvm.verify import emulator

from . import test_emulated
from .test_emulated import T, emulated, knobs
from .test_ptxas import assert_launchable, kernel_source, loop_steps, time_loops

GPU = gpu_spec("sm_90")
emulates = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def plan(cell, batch, hidden, dtype="float32"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, config",
    [
        ("lstm_h4", 16, 3, knobs(8, 4, 2, 2)),  # a CTA holds two heads
        ("lstm_h2", 16, 4, knobs(4, 4, 2, 3, vec=4)),  # two CTAs share a head
        ("lstm_h4", 16, 3, knobs(4, 2, 4, 3, barrier="block")),  # one head a CTA: no grid barrier
        ("rnn_tanh_h7", 7, 2, knobs(1, 1, 1, 2, vec=1)),  # heads of one unit (hidden 7, prime)
        ("rnn_tanh_h7", 7, 2, knobs(7, 2, 1, 1, vec=1, barrier="block")),  # one CTA holds every head
        ("lstm_h3", 9, 3, knobs(6, 2, 3, 2, vec=1)),  # odd heads; the last CTA half past hidden
        ("lstm_h3", 9, 3, knobs(3, 8, 3, 3, vec=1, barrier="tags")),  # more lanes than a head has units
        ("lstm_h2", 16, 4, knobs(4, 4, 2, 3, vec=4, barrier="tags")),  # tags wait for the head's CTAs only
        ("gru_cho_h2", 12, 3, knobs(6, 2, 3, 2, barrier="block")),  # a stage exchanged between phases, in-block
        ("gru_cho_h2", 12, 3, knobs(6, 2, 3, 3, barrier="block")),  # the same in its shared tile (one batch pass)
        ("rnn_tanh_h7", 7, 2, knobs(7, 2, 1, 2, vec=1, barrier="block")),  # every head in one block's tile
        ("gru_cho_h2", 12, 3, knobs(3, 2, 3, 2, vec=1, barrier="tags")),
        ("lstm_h4_x2", 8, 3, knobs(2, 2, 2, 2, layout="split")),  # layer 1: a dense W_ih beside a head-wise W_hh
        ("lstm_h4_x2", 8, 3, knobs(2, 2, 2, 2, barrier="tags")),
        ("gru_h2_bi", 8, 2, knobs(4, 2, 2, 2, barrier="block")),  # both directions, each head in its block
        ("lstm_peephole_h4", 16, 5, knobs(8, 4, 4, 2, vec=4, barrier="block")),
    ],
)
def test_head_wise_kernels_as_emitted(cell, hidden, batch, config):
    err, layer = emulated(cell, hidden, batch, config)
    assert err <= tolerance("float32", T * (2 if "_x2" in cell else 1)), (err, layer.report.config)
    launch = layer.kernel.launch
    if config["barrier"] == "block":
        body = kernel_source(layer)
        assert launch.sync is None and not launch.grid.cooperative
        assert "prnn_barrier" not in body and "grid_sync" not in body and "__syncthreads()" in body
    else:
        assert launch.sync is not None and launch.grid.cooperative


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, backward",
    [
        ("lstm_h4", 8, 3, pc.PersistentConfig(4, 4, 2, 2, 2, "block")),  # a CTA per head, no grid barrier
        ("lstm_h4", 16, 3, pc.PersistentConfig(8, 2, 2, 3, 2, "counter")),  # two heads a CTA
        ("lstm_h2", 8, 3, pc.PersistentConfig(2, 4, 1, 2, 4, "counter")),  # CTAs sharing a head
        ("gru_cho_h2", 6, 3, pc.PersistentConfig(6, 2, 3, 2, 1, "counter")),  # two phases backwards
        ("lstm_h3", 9, 3, pc.PersistentConfig(6, 2, 3, 2, 1, "grid_sync")),  # heads past hidden in the last CTA
    ],
)
def test_the_training_kernels_of_head_wise_products_as_emitted(cell, hidden, batch, backward, monkeypatch):
    """The saving forward and the GPU backward (its transposed rows over the gate rows of their head), every
    argument's gradient against the plan's in float64 (a head-wise weight's from its dense gradient's blocks)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, target="cuda", arch="sm_90", tuning_logs=[])
    monkeypatch.setattr(test_emulated, "gpu_backward", lambda p, gpu: iter([pb.backward_kernel(p, gpu, backward)]))
    got, want = test_emulated.emulated_gradients(layer)
    assert set(got) == set(want)
    assert worst(relative_error(got[n], want[n]) for n in want) <= 1e-5


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, config, in_tiles",
    [
        ("lstm_h12", 768, 16, "bfloat16", None, True),  # the default: a head a block, batch 16 in one pass
        ("lstm_h4", 16, 3, "float32", knobs(4, 2, 4, 3, barrier="block"), True),
        ("gru_cho_h2", 12, 3, "float32", knobs(6, 2, 3, 3, barrier="block"), True),  # a stage between phases too
        ("lstm_h4", 16, 3, "float32", knobs(4, 2, 4, 2, barrier="block"), False),  # two batch passes a step
    ],
)
def test_a_block_exchanges_its_values_in_its_operand_tiles(cell, hidden, batch, dtype, config, in_tiles):
    """With ``block`` and one batch pass a step, the time loop never touches the global workspace: a step is its
    products, one block barrier (none with ``gate_layout="in_warp"``, the default here), the pointwise math writing
    the tiles, one block barrier (and one more at step 0, after the initial states' copy, which ``in_warp`` makes
    before the loop); the next step's input projection is loaded during this one."""
    layer = prnn_tvm.compile_cell(
        cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[], config=config
    )
    body = kernel_source(layer)
    ((start, end),) = time_loops(body)
    loop = body[start:end]
    assert ("workspace_ptr[" not in loop) == in_tiles
    if in_tiles:
        # a phase's products and the barrier after its pointwise math, and the copy at step 0 (the barrier after the
        # pointwise math alone where a unit's gates are in one warp: test_gate_layout.py)
        in_warp = getattr(layer.kernel.config, "in_warp", False)
        expected = layer.plan.phases if in_warp else 2 * layer.plan.phases + 1
        steps = loop_steps(loop)  # one a turn, or two where the projection's register banks take turns
        assert [s.count("__syncthreads()") for s in steps] == [expected] * len(steps), loop.count("__syncthreads()")
        assert "xp_ptr[" in body[:start]  # step 0's, in the prologue
        # a later step's, after the math: the next one's, or (banks taking turns) the one after
        guard = "if ((v + 1) < seq_len)" if len(steps) == 1 else "if (((v * 2) + 2) < seq_len)"
        assert steps[0].index("xp_ptr[") > steps[0].index(guard) > steps[0].rfind("mma.sync")  # (tensor cores')


def test_a_block_holds_only_its_heads_weights_and_state():
    """Registers of weights per thread shrink by the heads; a block's operand tile holds its heads' units."""
    cfg = pc.PersistentConfig(64, 4, 4, 4, 4, "counter")
    dense, heads = pc.geometry(cfg, plan("lstm", 4, 256)), pc.validate(cfg, plan("lstm_h4", 4, 256), GPU)
    assert heads.weights_per_thread * 4 == dense.weights_per_thread
    assert (dense.stride, heads.stride) == (256, 64) and heads.smem_hs * 4 == dense.smem_hs
    half = mc.MmaConfig(64, 1, 2, "counter")
    dense, heads = (
        mc.geometry(half, plan("lstm", 16, 768, "float16")),
        mc.validate(half, plan("lstm_h12", 16, 768, "float16"), GPU),
    )
    assert (dense.k_tiles_per_warp, heads.k_tiles_per_warp) == (48, 4)
    assert heads.weights_per_thread * 12 == dense.weights_per_thread and heads.stride == 64 + mc.ROW_SKEW


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, block",
    [
        # FlashRNN's shapes: hidden 768, batch 16, heads of 16 to 256 units
        ("lstm_h48", 768, 16, "bfloat16", True),
        ("lstm_h24", 768, 16, "bfloat16", True),
        ("lstm_h12", 768, 16, "bfloat16", True),
        ("lstm_h6", 768, 16, "bfloat16", True),
        ("lstm_h3", 768, 16, "bfloat16", False),  # heads of 256 do not fit a CTA: CTAs share one
        ("lstm_h12", 768, 16, "float32", True),
        ("lstm_h4", 256, 4, "float16", True),
        ("gru_h4", 1024, 4, "float32", False),
        ("lstm_h7", 7, 3, "float16", True),
        ("gru_cho_h2", 130, 5, "float32", True),
    ],
)
def test_head_wise_defaults_build_without_spills(cell, hidden, batch, dtype, block):
    """Where whole heads fit a block, the default takes the ``block`` barrier (no grid barrier)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    rep = layer.report
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0, rep.format()
    assert rep.registers <= max_regs_per_thread(rep.threads, GPU)
    assert_launchable(layer)
    assert (rep.config["barrier"] == "block") == block, rep.config
    assert layer.plan.local_to(rep.config["units_per_cta"]) == block


HALF_TANH = "0x1p-1f/*5.000000e-01*/ * prnn_tanh_approx("  # sigmoid(x) = 1/2 + tanh(x/2) / 2


@pytest.mark.parametrize(
    "cell, dtype, barrier, through_tanh",
    [
        ("lstm_h12", "bfloat16", "block", True),  # a head a block: the layer's pointwise on 12 SMs
        ("lstm_h48", "float16", "block", True),
        ("gru_h12", "bfloat16", "block", True),
        ("lstm_h12", "float16", "tags", False),
        ("lstm_h12", "bfloat16", "tags", False),  # grid-wide: the pointwise spread, exp2 and reciprocal kept
        ("lstm_h12", "float32", "block", False),  # float32: the exact functions
    ],
)
def test_half_block_kernels_take_sigmoid_through_tanh(cell, dtype, barrier, through_tanh):
    """Where a block synchronizes with itself alone, a half layer's sigmoid is one tanh.approx (its error, 2^-12 at
    most: half a float16 ulp at 0.5), no exp2 or reciprocal left; elsewhere 1 / (1 + e^-x)."""
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    config = dataclasses.replace(layer.kernel.config, barrier=barrier)
    if barrier != "block":  # (a unit's gates in a warp, and batch groups of heads, take block alone)
        config = dataclasses.replace(config, gate_layout="by_gate", batch_warps=1, batch_groups=1)
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[],
                                  config=config)
    body = kernel_source(layer)
    if dtype == "float32":
        assert "prnn_tanh_approx(" not in body and "expf(" in body
    elif through_tanh:
        assert HALF_TANH in body and "__expf(" not in body and "__fdividef(" not in body
    else:
        assert HALF_TANH not in body and "__fdividef(" in body
    assert layer.report.spill_bytes == 0, layer.report.format()


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, config, message",
    [
        (
            "lstm_h4",
            16,
            2,
            "float32",
            pc.PersistentConfig(3, 4, 1, 2, 1),
            "units_per_cta=3: with heads of 4 units a CTA holds whole heads",
        ),
        ("lstm_h4", 16, 2, "float32", pc.PersistentConfig(8, 4, 8, 2, 1), "a thread's rows .* must lie in one head"),
        ("lstm_h8", 8, 2, "float32", pc.PersistentConfig(1, 4, 1, 2, 2), "vec=2: a head-wise product's rows read"),
        (
            "lstm_h2",
            16,
            2,
            "float32",
            pc.PersistentConfig(4, 4, 2, 2, 4, "block"),
            "units_per_cta=4 must be a multiple of the head size of every product",
        ),
        ("lstm", 16, 2, "float32", pc.PersistentConfig(8, 4, 2, 2, 4, "block"), r"the hidden size for a dense one"),
        ("lstm_h2", 16, 2, "float32", pc.PersistentConfig(8, 4, 2, 2, 4, "sentinel"), "has head-wise products"),
        (
            "lstm_h3",
            9,
            2,
            "float32",
            pc.PersistentConfig(6, 2, 3, 2, 1, "tags"),
            "the last block's span runs past hidden=9",
        ),
        (
            "lstm_h4",
            64,
            8,
            "float16",
            mc.MmaConfig(16, 1, 1, "tags", batch_groups=2),
            "head-wise products exchange by span",
        ),
        (
            "lstm_h8",
            16,
            8,
            "float16",
            mc.MmaConfig(4, 1, 1, "counter"),
            "a warp's row tiles of 16 rows .* must lie in one head",
        ),
        (
            "lstm_h4",
            64,
            8,
            "float16",
            mc.MmaConfig(32, 1, 1, "counter", m_tiles_per_warp=2),
            r"a warp's row tiles of 16 rows \(32 rows\) .* must lie in one head",
        ),
        (
            "lstm_h4_x2",
            48,
            8,
            "float16",
            mc.MmaConfig(4, 1, 1, "counter"),
            "heads of 12 units .* of 'l0_h', which a dense product reads whole too",
        ),
    ],
)
def test_configs_that_do_not_fit_the_heads_are_refused(cell, hidden, batch, dtype, config, message):
    with pytest.raises(ConfigError, match=message):
        prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config)


def test_the_gpu_backward_takes_products_of_one_head_size():
    layer = prnn_tvm.compile_cell("lstm_h4_x2", 8, 2, target="cuda", arch="sm_90", tuning_logs=[])
    with pytest.raises(ConfigError, match="is a wavefront stack"):  # stacks have no backward at all
        saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)
    mixed = plan("lstm_h4_d2", 2, 8)  # a deep stack: layer 1's dense input product beside head-wise ones
    assert {r.heads for r in mixed.reductions} == {1, 4}
    assert "products of heads of different sizes" in pb.refusal(mixed)


@pytest.mark.parametrize(
    "cell, batch, first",
    [
        # 12 heads of 64: whole heads in 8 batch groups of 2 rows (96 blocks, one item a thread, no grid barrier),
        # the fastest of 14 configs on the H100 (persistent_backward's ITEM_CYCLES)
        ("slstm_h12", 16, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=8)),
        ("lstm_h12", 16, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=8)),
        ("slstm_h12", 8, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=4)),
        # heads of 16: four heads a block in 8 groups (96 blocks: within one block per SM)
        ("slstm_h48", 16, BackwardConfig(64, 8, 2, 2, 4, "block", batch_groups=8)),
    ],
)
def test_the_gpu_backward_ranks_blocks_of_whole_heads_by_their_cost(cell, batch, first):
    """The float32 backward's default (head-wise products, every dtype: ``schedules.backward_configs``) is its
    cheapest estimate over blocks of whole heads (barrier ``block``) and blocks over the grid alike. A block of whole
    heads over the whole batch takes every item of its heads, whose recomputed stages and adjoints cost more than the
    grid barrier it saves at batch 16 (H100, slstm_h12 bf16 768 x 16, a training step: 12 such blocks 6.895 ms, 96
    blocks of an eighth of a head over the grid 6.004); in batch groups (``backward_groups``) it takes a group's rows'
    items alone (8 groups of 2 rows: 4.042)."""
    p = plan(cell, batch, 768, "bfloat16")
    ranked = prnn_tvm.schedules.backward_configs(p, GPU)
    assert ranked[0] == first, ranked
    whole = BackwardConfig(64, 16, 4, batch, 4, "block")  # a head's items of the whole batch
    grid = BackwardConfig(8, 32, 1, batch, 4, "counter")
    g = {cfg: pb.validate(cfg, p, GPU) for cfg in (first, whole, grid)}
    cycles = {cfg: pb.estimated_cycles(cfg, g[cfg], p) for cfg in g}
    assert cycles[first] < min(cycles[grid], cycles[whole])
    assert batch != 16 or cycles[grid] < cycles[whole]  # as measured at batch 16
    assert g[whole].items_per_thread > g[grid].items_per_thread == g[first].items_per_thread == 1
    weights = [pb.validate(cfg, p, GPU).weights_per_thread for cfg in ranked]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == len(weights)  # fallbacks hold fewer


def test_the_tuning_space_places_heads_and_records_key_the_placement():
    """Whole heads per block (one, two, four) with the ``block`` barrier, and divisors of a head shared by blocks,
    beside the usual units; a config's knobs (what records store) say where the heads went."""
    p = plan("lstm_h12", 16, 768, "float16")
    space = ConfigSpace(p, GPU, prnn_tvm.schedules.by_name("persistent_mma"))
    units = {cfg.units_per_cta for cfg in space.configs}
    assert {64, 128} <= units and {8, 16} <= units  # 768 / 132 SMs: 6 units, not a divisor of 64
    local = [cfg for cfg in space.configs if cfg.barrier == "block"]
    assert local and all(cfg.units_per_cta % 64 == 0 for cfg in local)
    assert {"barrier=block", "units_per_cta"} <= set(space.feature_names)
    first = space.configs[space.defaults()[0]]
    assert first.barrier == "block" and first.as_dict()["barrier"] == "block"
    assert first.in_warp  # a unit's gates in one warp (test_gate_layout.py), which only ``block`` takes
    synchronized = dataclasses.replace(first, barrier="counter", gate_layout="by_gate", batch_warps=1, batch_groups=1)
    assert synchronized in space.configs  # the same placement, synchronized


def test_a_head_wise_exchange_lays_the_workspace_out_by_span():
    """A block's part of a tile is one contiguous run per batch row: span-major, then batch rows."""
    layer = prnn_tvm.compile_cell(
        "lstm_h2", 16, 3, target="cuda", arch="sm_90", tuning_logs=[], config=pc.PersistentConfig(4, 4, 2, 3, 4, "tags")
    )
    assert layer.kernel.launch.arg("workspace").shape == (1, 2, 3 * 16)
    dense = prnn_tvm.compile_cell(
        "lstm", 16, 3, target="cuda", arch="sm_90", tuning_logs=[], config=pc.PersistentConfig(4, 4, 2, 3, 4, "tags")
    )
    assert dense.kernel.launch.arg("workspace").shape == (1, 2, 3, 16)
    assert np.prod(layer.kernel.launch.arg("workspace").shape) == np.prod(dense.kernel.launch.arg("workspace").shape)

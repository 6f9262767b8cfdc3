"""Stacked layers in one launch (``compile_cell(..., layers=)``, ``prnn_tvm.frontend.stack``): the wavefront
against the same layers run one after another, in float64; the CUDA kernels on the GPU (``-m gpu``)."""

import dataclasses

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import CellError, ConfigError
from prnn_tvm.checks import check_against_reference, max_abs_error, max_error
from prnn_tvm.compiler import compile_backward
from prnn_tvm.dtypes import tolerance
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.cell import Cell
from prnn_tvm.frontend.registry import builtin_cells, resolve
from prnn_tvm.frontend.stack import MAX_LAYERS, split_layer_name, stacked
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer, reference_stack
from prnn_tvm.runtime import binding, limits
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec

from .test_ptxas import assert_launchable

CELLS = list(builtin_cells())
SM90 = gpu_spec("sm_90")


def one_by_one(base_cell, inputs: dict, layers: int, lengths=None):
    """The stack's arguments (``inputs``, by the stacked layer's names) run as ``layers`` separate layers of
    ``base_cell``, one after the other, in float64: (output, {state: (layers, B, H) final states})."""
    x = inputs["x"]
    base = analyze(base_cell, x.shape[1], inputs["l0_" + next(iter(_states(base_cell))) + "0"].shape[1])
    per_layer = []
    for layer in range(layers):
        args = (
            {"W_ih": inputs["W_ih"], "b_ih": inputs["b_ih"]}
            if layer == 0
            else {"W_ih": inputs[f"l{layer}_W_ih"], "b_ih": inputs[f"l{layer}_b_ih"]}
        )
        args.update({s.name: inputs[f"l{layer}_{s.name}"] for s in (*base.weights, *base.params)})
        args.update({f"{s.name}0": inputs[f"l{layer}_{s.name}0"] for s in base.states})
        per_layer.append([args])
    return reference_stack(base, x, per_layer, lengths)


def _states(cell):
    return [s.name for s in analyze(cell, 1, 1).states]


def finals_of(layer, finals) -> dict:
    """A layer call's final states by name (``<state>_n`` in signature order)."""
    names = [a.name[:-2] for a in layer.signature.outputs[1:]]
    return dict(zip(names, finals))


def compare_with_one_by_one(layer, cell, layers, seq_len, lengths=None, seed=0):
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    out, finals = layer(*[inputs.get(n) for n in layer.arg_names])
    want_out, want_finals = one_by_one(resolve(cell), inputs, layers, lengths)
    got = finals_of(layer, finals)
    pairs = [(out, want_out)]
    for name, value in got.items():
        index, base = split_layer_name(name)
        pairs.append((value, want_finals[base][index]))
    if lengths is not None:  # zeros past each row's length, as torch.nn's padded output
        assert all(not np.asarray(out)[n:, b].any() for b, n in enumerate(lengths))
    return max_error(pairs)


@pytest.mark.parametrize("cell", CELLS)
def test_every_cell_stacked_in_one_launch_equals_its_layers_one_by_one(cell):
    """Three layers, ragged lengths in no order (a full-length and a length-1 row), input size != hidden."""
    layers, hidden, batch, seq_len = 3, 5, 4, 7
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, target="llvm", layers=layers)
    lengths = random_lengths(batch, seq_len, seed=2)
    assert compare_with_one_by_one(layer, cell, layers, seq_len, lengths) < 1e-5
    assert compare_with_one_by_one(layer, cell, layers, seq_len) < 1e-5


@pytest.mark.parametrize(
    "layers, hidden, batch, seq_len, input_size",
    [
        (2, 1, 1, 1, 1),  # the smallest everything; T=1: the stack runs one step more than the sequence
        (4, 3, 2, 2, 5),  # more layers than steps: the last layer starts after the input has ended
        (2, 7, 3, 11, 2),  # odd and prime sizes
    ],
)
def test_awkward_stacks_equal_their_layers_one_by_one(layers, hidden, batch, seq_len, input_size):
    layer = prnn_tvm.compile_cell("lstm", hidden, batch, input_size=input_size, target="llvm", layers=layers)
    assert compare_with_one_by_one(layer, "lstm", layers, seq_len) < 1e-5
    lengths = random_lengths(batch, seq_len, seed=3)
    assert compare_with_one_by_one(layer, "lstm", layers, seq_len, lengths) < 1e-5


@pytest.mark.parametrize("cell", CELLS)
def test_every_cell_in_a_deep_stack_equals_its_layers_one_by_one(cell):
    """The deep stack (``<cell>_d<layers>``: each layer reads the layer below's new output in the same step) is
    the layers run one after another with no lag: same comparison, ragged lengths, input size != hidden."""
    layers, hidden, batch, seq_len = 3, 5, 4, 7
    layer = prnn_tvm.compile_cell(f"{cell}_d{layers}", hidden, batch, input_size=3, target="llvm")
    assert layer.plan.lag == 0 and layer.plan.phases == layers * analyze(resolve(cell), batch, hidden).phases
    lengths = random_lengths(batch, seq_len, seed=2)
    assert compare_with_one_by_one(layer, cell, layers, seq_len, lengths) < 1e-5
    assert compare_with_one_by_one(layer, cell, layers, seq_len) < 1e-5


@pytest.mark.parametrize("layers, hidden, batch, seq_len, input_size", [(2, 1, 1, 1, 1), (3, 7, 3, 11, 2)])
def test_awkward_deep_stacks_equal_their_layers_one_by_one(layers, hidden, batch, seq_len, input_size):
    layer = prnn_tvm.compile_cell(f"lstm_d{layers}", hidden, batch, input_size=input_size, target="llvm")
    assert compare_with_one_by_one(layer, "lstm", layers, seq_len) < 1e-5


def test_a_deep_stack_differs_from_the_wavefront_only_by_the_lag():
    """Same arguments, same names; the wavefront's output is the deep stack's, ``layers - 1`` steps late."""
    deep, wave = stacked(resolve("gru"), 3, wavefront=False), stacked(resolve("gru"), 3)
    assert (deep.name, wave.name, deep.delays) == ("gru_d3", "gru_x3", ())
    assert [s.name for s in deep.trace(2, 4).slots] == [s.name for s in wave.trace(2, 4).slots]
    with pytest.raises(CellError, match="wavefront must be True or False"):
        stacked(resolve("gru"), 2, wavefront="no")


@pytest.mark.parametrize("cell, dtype", [("lstm", "float32"), ("gru", "float16")])
def test_deep_stack_cuda_kernels_build_without_spills(cell, dtype):
    layer = prnn_tvm.compile_cell(f"{cell}_d2", 128, 4, target="cuda", arch="sm_90", dtype=dtype)
    assert layer.report.spill_bytes == 0, layer.report.format()
    assert_launchable(layer)


def test_the_wavefront_reference_is_the_layers_one_by_one():
    """``reference_layer`` of the stacked plan (the wavefront step by step, delays applied) against the layers
    run one after another: two NumPy computations of the same thing; dropping the delays breaks it."""
    plan = analyze(stacked(resolve("gru"), 3), 3, 6)
    inputs = random_inputs(plan, 9, 4, seed=5)
    inputs["lengths"] = random_lengths(3, 9, seed=5)
    out, finals = reference_layer(plan, inputs)
    want_out, want_finals = one_by_one(resolve("gru"), inputs, 3, inputs["lengths"])
    assert np.abs(out - want_out).max() < 1e-12
    assert all(np.abs(finals[f"l{i}_h"] - want_finals["h"][i]).max() < 1e-12 for i in range(3))
    undelayed = analyze(Cell("gru_x3", plan.cell.step, plan.cell.reference, plan.cell.output), 3, 6)
    assert np.abs(reference_layer(undelayed, inputs)[0] - want_out).max() > 1e-3


def test_lengths_past_the_sequence_mean_all_of_it(monkeypatch):
    """A GPU tensor's lengths are not read on the host; the kernels clamp them to the sequence before adding
    a layer's delay (prnn_tvm.torch passes 2^31 - 1 for rows that run every step: unclamped, it overflows). A host
    tensor's are checked, so the check is bypassed here to run the CPU kernel on what the GPU kernel gets."""
    layer = prnn_tvm.compile_cell("lstm", 4, 2, target="llvm", layers=3)
    inputs = random_inputs(layer.plan, 6, 4, seed=4)
    whole = layer(**inputs)
    huge = tvm.runtime.tensor(np.full(2, 2**31 - 1, np.int32))
    monkeypatch.setattr(binding, "_on_host", lambda value: False)  # as a GPU tensor is placed
    out, finals = layer(**inputs, lengths=huge)
    assert np.array_equal(out.numpy(), whole[0])
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(finals, whole[1]))


def test_a_stack_in_chunks_equals_it_in_one_launch(monkeypatch):
    """A sequence too long for one launch runs in consecutive chunks, each from the states the one before ended
    with: each layer's final states are its own, so the wavefront restarts cleanly."""
    layer = prnn_tvm.compile_cell("lstm", 4, 2, target="llvm", layers=3)
    inputs = random_inputs(layer.plan, 10, 4, seed=1)
    inputs["lengths"] = np.array([10, 6], np.int32)
    whole = layer(**inputs)
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2 * 4 * 4 * 3)  # the widest step (4 gates) x 3 steps
    assert layer.bind(**inputs).chunks == 4
    chunked = layer(**inputs)
    assert max_abs_error(layer.plan, chunked, (np.asarray(whole[0]), finals_of(layer, whole[1]))) < 1e-6


def test_a_stack_is_a_cell_with_each_layer_named():
    cell = stacked(resolve("lstm"), 3)
    assert cell.name == "lstm_x3" and cell.output == "l2_h"
    assert dict(cell.delays) == {"l0_h": 0, "l0_c": 0, "l1_h": 1, "l1_c": 1, "l2_h": 2, "l2_c": 2}
    plan = analyze(cell, 2, 8)
    assert [w.name for w in plan.weights] == ["l0_W_hh", "l1_W_ih", "l1_W_hh", "l2_W_ih", "l2_W_hh"]
    assert [p.name for p in plan.params] == ["l0_b_hh", "l1_b_ih", "l1_b_hh", "l2_b_ih", "l2_b_hh"]
    assert plan.phases == 1 and plan.lag == 2  # every product multiplies a value the step starts with
    assert plan.fingerprint() != analyze(Cell("lstm_x3", cell.step, cell.reference, cell.output), 2, 8).fingerprint()
    assert resolve("lstm_x3").delays == cell.delays  # the name a record or an export carries resolves back
    assert stacked(cell := resolve("gru"), 1) is cell
    assert split_layer_name("l12_W_hh") == (12, "W_hh")


def test_a_stacks_pointwise_work_splits_by_layer():
    """Each layer's (batch row, unit) items are independent pointwise work (``CellPlan.pointwise_groups``):
    the CUDA templates give each layer's items warps of their own; a cell's own math stays one group unless
    it splits too (Cho's GRU: the reset-gated operand of its second phase, and the new state)."""
    plan = analyze(stacked(resolve("lstm"), 3), 2, 8)
    assert [g.states for g in plan.pointwise_groups] == [("l0_h", "l0_c"), ("l1_h", "l1_c"), ("l2_h", "l2_c")]
    assert all(
        all(leaf.name.startswith(f"l{i}_") for leaf in g.leaves if leaf.kind != "input")
        for i, g in enumerate(plan.pointwise_groups)
    )
    assert plan.item_values == analyze(resolve("lstm"), 2, 8).item_values  # an item holds one layer's values
    assert len(analyze(resolve("lstm"), 2, 8).pointwise_groups) == 1
    cho = analyze(resolve("gru_cho"), 2, 8).pointwise_groups
    assert [(g.states, g.exchanged_stages) for g in cho] == [(("h",), ()), ((), ("r_times_h",))]


def test_a_stack_splits_into_parts_that_ctas_of_their_own_can_run():
    """``CellPlan.cta_parts``: a layer's products read only its own state and the layer below's output, so each
    layer is a part (the tensor-core template's ``split`` layout gives each its CTAs); groups that read the same
    product share a part (Cho's GRU: one part per layer, not two); one part is no split."""
    plan = analyze(stacked(resolve("lstm"), 3), 2, 8)
    parts = plan.cta_parts
    assert [[r.name for r in part.reductions] for part in parts] == [
        ["l0_hw"],
        ["l1_input_product", "l1_hw"],
        ["l2_input_product", "l2_hw"],
    ]
    assert [part.operands for part in parts] == [("l0_h",), ("l0_h", "l1_h"), ("l1_h", "l2_h")]
    assert [part.groups for part in parts] == [(g,) for g in plan.pointwise_groups]
    cho = analyze(stacked(resolve("gru_cho"), 2), 2, 8)
    assert [len(part.groups) for part in cho.cta_parts] == [2, 2]
    assert [part.operands for part in cho.cta_parts] == [("l0_h", "l0_r_times_h"), ("l0_h", "l1_h", "l1_r_times_h")]
    assert analyze(resolve("gru_cho"), 2, 8).cta_parts == ()  # its two groups read one product
    assert analyze(resolve("lstm"), 2, 8).cta_parts == ()
    two_phase = analyze(resolve("stacked_rnn"), 2, 8).cta_parts  # a cell's own layers split too
    assert [part.operands for part in two_phase] == [("h1",), ("h2", "h1_new")]


def test_bad_stacks_are_refused():
    with pytest.raises(CellError, match="layers must be a positive integer"):
        stacked(resolve("lstm"), 0)
    with pytest.raises(CellError, match="already a stack"):
        stacked(resolve("lstm_x2"), 2)
    with pytest.raises(CellError, match="unknown cell 'nope'"):
        resolve("nope_x2")

    def step(c):  # a cell whose own weight takes the name a stack gives layer l's input weight
        x, h = c.input(), c.state("h")
        return {"h": c.pointwise(lambda n, j: x[n, j] + c.matvec(h, c.weight("W_ih"), "hw")[n, j], "h_new")}

    with pytest.raises(CellError, match="weight 'W_ih' has the name of the layer's own argument 'W_ih'"):
        analyze(stacked(Cell("own_w_ih", step, None), 2), 1, 4)
    with pytest.raises(CellError, match="runs both directions of a layer; a bidirectional stack cannot run as one"):
        resolve("lstm_bi_x2")  # what `prnn-tvm compile lstm_bi --layers 2` asks for
    with pytest.raises(ConfigError, match=f"one launch runs at most {MAX_LAYERS}"):
        resolve(f"lstm_x{MAX_LAYERS + 1}")
    assert len(resolve(f"lstm_x{MAX_LAYERS}").delays) == 2 * MAX_LAYERS


def test_a_stack_trains_layer_by_layer_only():
    layer = prnn_tvm.compile_cell("gru", 4, 2, target="llvm", layers=2)
    with pytest.raises(ConfigError, match="wavefront stack, which has no backward"):
        compile_backward(layer)
    cuda = prnn_tvm.compile_cell("gru", 64, 2, arch="sm_90", layers=2)
    with pytest.raises(ConfigError, match="wavefront stack"):
        prnn_tvm.compiler.compile_training(cuda)


@pytest.mark.parametrize(
    "cell, hidden, batch, layers, dtype",
    [
        ("lstm", 256, 4, 2, "float32"),
        ("gru", 512, 4, 2, "float16"),
        ("lstm", 512, 8, 3, "float16"),
        ("rnn_tanh", 100, 3, 3, "float32"),
    ],
)
def test_stacked_cuda_kernels_build_without_spills(cell, hidden, batch, layers, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, arch="sm_90", layers=layers, tuning_logs=[])
    assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report.format()
    assert_launchable(layer)


def split_configs(cell: str, hidden: int, batch: int, layers: int, dtype: str) -> list:
    """The valid configs of the ``split`` layout (each layer on CTAs of its own) in the tuning space of a stack,
    of the template its dtype takes (tensor cores for half precision)."""
    plan = analyze(stacked(resolve(cell), layers), batch, hidden, dtype)
    knobs = pc if dtype == "float32" else mc
    found = []
    for cfg in knobs.space(plan, SM90):
        try:
            knobs.validate(cfg, plan, SM90)
        except ConfigError:
            continue
        if cfg.layout == "split":
            found.append(cfg)
    return found


SPLIT_CASES = [
    ("lstm", 512, 8, 4, "float16"),
    ("gru", 256, 16, 2, "bfloat16"),
    ("gru_cho", 96, 4, 2, "float16"),
    ("rnn_tanh", 129, 1, 3, "float16"),
    ("lstm", 64, 33, 5, "float16"),
    ("lstm", 512, 4, 2, "float32"),
    ("gru_cho", 96, 3, 2, "float32"),
    ("rnn_tanh", 129, 1, 3, "float32"),
]


@pytest.mark.parametrize("cell, hidden, batch, layers, dtype", SPLIT_CASES)
def test_split_layout_kernels_build(cell, hidden, batch, layers, dtype):
    """The first split config of the space with the counter barrier (without spills) and a random one (seeded;
    it may spill, which the tuner records as such): each layer's CTAs hold only its own products' rows, the grid
    is the layers' runs side by side."""
    configs = split_configs(cell, hidden, batch, layers, dtype)
    first = next(cfg for cfg in configs if cfg.barrier == "counter")
    for cfg in (first, configs[np.random.default_rng(layers).integers(len(configs))]):
        layer = prnn_tvm.compile_cell(
            cell, hidden, batch, dtype=dtype, arch="sm_90", layers=layers, tuning_logs=[], config=cfg
        )
        if cfg == first:
            assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report.format()
        assert layer.kernel.launch.grid.ctas == layers * -(-hidden // cfg.units_per_cta)
        assert_launchable(layer)


def test_split_layout_is_for_plans_with_parts_and_trains_on_the_shared_one():
    single = analyze(resolve("lstm"), 8, 256, "float16")
    with pytest.raises(ConfigError, match="cell 'lstm' has one part: use 'shared'"):
        mc.validate(mc.MmaConfig(8, 4, 1, "counter", "split"), single, SM90)
    with pytest.raises(ConfigError, match="layout 'diagonal' unknown"):
        mc.validate(mc.MmaConfig(8, 4, 1, "counter", "diagonal"), single, SM90)
    stack = analyze(stacked(resolve("lstm"), 4), 8, 512, "float16")
    split = mc.MmaConfig(16, 2, 1, "counter", "split")
    # data-carried synchronization is a barrier only where every block waits for every other (on the H100 the
    # lower layers ran ahead and the kernel timed out)
    with pytest.raises(ConfigError, match="barrier 'tags' synchronizes only blocks that read each other's values"):
        mc.validate(dataclasses.replace(split, barrier="tags"), stack, SM90)
    assert not any(cfg.layout == "split" and cfg.barrier == "tags" for cfg in mc.space(stack, SM90))
    g = mc.validate(split, stack, SM90)
    # 32 CTAs per layer; a CTA of layers 1.. holds W_ih and W_hh rows of its 16 units (8 tiles), reads 2 states
    assert (g.ctas, g.m_tiles, g.threads) == (128, 8, 512)
    assert g.smem_ops == 2 * 2 * 8 * g.stride
    shared = mc.geometry(dataclasses.replace(split, layout="shared"), stack)
    assert (shared.ctas, shared.m_tiles, shared.smem_ops) == (32, 28, 4 * 2 * 8 * shared.stride)
    assert split.as_dict()["layout"] == "split" and "layout" not in shared_config().as_dict()
    assert prnn_tvm.schedules.by_name("persistent_mma").config_from_dict(split.as_dict()) == split
    # the float32 template splits the same way
    pair = analyze(stacked(resolve("lstm"), 2), 4, 512)
    f32 = pc.PersistentConfig(8, 16, 4, 4, 4, "counter", "split")
    g32 = pc.validate(f32, pair, SM90)
    assert (g32.ctas, g32.rows) == (128, 64)  # 64 CTAs per layer; layer 1's: W_ih and W_hh rows of 8 units
    assert g32.smem_hs == 4 * 2 * 4 * 512  # two operand tiles of batch_tile rows: its state, the layer below's
    with pytest.raises(ConfigError, match="barrier 'tags' synchronizes only"):
        pc.validate(dataclasses.replace(f32, barrier="tags"), pair, SM90)
    with pytest.raises(ConfigError, match="has one part"):
        pc.validate(f32, analyze(resolve("lstm"), 4, 512), SM90)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_split_layer_trains_with_the_shared_layout(dtype):
    """The training forward writes a (batch row, unit)'s saved columns from one item of the whole step: a layer
    built split (the stacked RNN cell's two layers) trains with the same config in the shared layout."""
    cfg = split_configs("stacked_rnn", 96, 4, 1, dtype)[0]
    layer = prnn_tvm.compile_cell("stacked_rnn", 96, 4, dtype=dtype, target="cuda", arch="sm_90", config=cfg)
    assert layer.kernel.config.layout == "split" and layer.kernel.launch.grid.ctas == 2 * -(-96 // cfg.units_per_cta)
    saving = prnn_tvm.compiler.compile_training(layer).forward.signature.launches[0].grid
    assert saving.ctas == -(-96 // cfg.units_per_cta)  # one run of the grid
    knobs = pc if dtype == "float32" else mc
    assert knobs.saving_config(cfg, layer.plan, SM90) == dataclasses.replace(cfg, layout="shared")


def shared_config():
    return mc.MmaConfig(8, 4, 1)


def test_a_stack_that_does_not_fit_on_chip_says_so():
    """Two float32 LSTM layers at hidden 1536 hold 113 MB of weights: more than the H100's registers and shared
    memory together (about 63 MB). The wavefront stack is not streamed from L2 (past the chip a launch per layer
    holds each on chip); the deep stack of the same layers, one step at a time, is."""
    with pytest.raises(ConfigError, match="no persistent config fits cell 'lstm_x2'"):
        prnn_tvm.compile_cell("lstm", 1536, 4, arch="sm_90", layers=2, tuning_logs=[])
    with pytest.raises(ConfigError, match="is a wavefront stack or runs both directions"):
        pc.validate(pc.PersistentConfig(24, 8, 4, 4, 4, l2_chunks=1), analyze(stacked(resolve("lstm"), 2), 4, 1536),
                    gpu_spec("sm_90"))
    deep = analyze(stacked(resolve("lstm"), 2, wavefront=False), 4, 1536)
    ranked = pc.ranked_configs(deep, gpu_spec("sm_90"))
    assert ranked and all(pc.validate(cfg, deep, gpu_spec("sm_90")).l2_ws > 0 for cfg in ranked)


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cell, hidden, batch, layers, dtype, seq_len",
    [
        ("lstm", 512, 8, 4, "float16", 256),
        ("lstm", 256, 4, 2, "float32", 256),
        ("gru", 512, 16, 2, "bfloat16", 64),
        ("rnn_tanh", 129, 1, 3, "float32", 7),
        ("lstm", 64, 33, 5, "float16", 1),
        ("gru_cho", 96, 4, 2, "float32", 30),  # a two-phase cell: two barriers per wavefront step
    ],
)
def test_stacked_cuda_kernels_match_the_float64_reference(cell, hidden, batch, layers, dtype, seq_len):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", layers=layers)
    bound = tolerance(dtype, seq_len)
    assert compare_with_one_by_one(layer, cell, layers, seq_len) < bound
    lengths = random_lengths(batch, seq_len, seed=1)
    assert compare_with_one_by_one(layer, cell, layers, seq_len, lengths, seed=1) < bound


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cell, hidden, batch, layers, dtype, seq_len",
    [(*case, seq_len) for case, seq_len in zip(SPLIT_CASES, (256, 64, 30, 7, 1, 256, 30, 7))],
)
def test_split_layout_kernels_match_the_float64_reference(cell, hidden, batch, layers, dtype, seq_len):
    """Each layer on CTAs of its own: the first split config with the counter barrier, one with grid_sync, a
    random one (seeded), the first with sentinel (one-phase cells) and, in half precision, the first with four
    accumulator chains, against the layers one by one in float64, with and without ragged lengths."""
    configs = split_configs(cell, hidden, batch, layers, dtype)
    picks = {
        next(cfg for cfg in configs if cfg.barrier == "counter"),
        next(cfg for cfg in configs if cfg.barrier == "grid_sync"),
        configs[np.random.default_rng(hidden).integers(len(configs))],
    }
    picks |= set([cfg for cfg in configs if getattr(cfg, "k_chains", 1) == 4][:1])  # tensor cores: four chains
    picks |= set([cfg for cfg in configs if cfg.barrier == "sentinel"][:1])  # one-phase stacks: sentinel
    bound = tolerance(dtype, seq_len)
    for cfg in sorted(picks, key=repr):
        layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", layers=layers, config=cfg)
        assert compare_with_one_by_one(layer, cell, layers, seq_len) < bound, cfg
        lengths = random_lengths(batch, seq_len, seed=1)
        assert compare_with_one_by_one(layer, cell, layers, seq_len, lengths, seed=1) < bound, cfg


@pytest.mark.gpu
def test_a_two_phase_cells_own_layers_split_too():
    """Cho-style stacked RNN (one cell, two phases): its second layer's product reads the first's new state in
    the same step, across the parts' CTAs, after the phase barrier."""
    for cfg in split_configs("stacked_rnn", 96, 4, 1, "float16")[:3]:
        layer = prnn_tvm.compile_cell("stacked_rnn", 96, 4, dtype="float16", target="cuda", config=cfg)
        for lengths in (None, random_lengths(4, 30, seed=2)):
            result = check_against_reference(layer, 30, tolerance("float16", 30), lengths=lengths)
            assert result.ok, (cfg, result)

"""Both directions of a layer in one launch (``compile_cell(..., bidirectional=True)``,
``prnn_tvm.frontend.directions``): against the directions run as two layers of the base cell (the reverse one
on each row's steps backwards), in float64; the CUDA kernels on the GPU (``-m gpu``)."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm import CellError, ConfigError, InputError
from prnn_tvm.checks import max_error
from prnn_tvm.compiler import compile_backward, compile_training
from prnn_tvm.dtypes import tolerance
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.cell import Cell
from prnn_tvm.frontend.directions import bidirectional, split_direction_name
from prnn_tvm.frontend.registry import builtin_cells, resolve
from prnn_tvm.frontend.stack import stacked
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer, reference_stack
from prnn_tvm.runtime import limits
from prnn_tvm.runtime.loading import read_metadata, signature_of
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.signature import SEQ, Signature

from .test_export import RUNTIME_ONLY
from .test_ptxas import assert_launchable, kernel_source, time_loops
from .test_stack import SM90, split_configs

CELLS = list(builtin_cells())


def as_two_layers(cell: str, inputs: dict, lengths=None):
    """The layer's arguments (``inputs``, by the bidirectional layer's names) run as the base cell's two
    directions, each a layer of its own (``reference_stack``: the reverse one reads each row backwards within
    its length), in float64: (output (T, B, 2H), {state: (2, B, H) final states})."""
    x = inputs["x"]
    base = analyze(resolve(cell), x.shape[1], inputs["fwd_" + next(iter(_states(cell))) + "0"].shape[1])
    rows = base.input.slices * base.hidden
    directions = []
    for d, prefix in enumerate(("fwd_", "rev_")):
        args = {"W_ih": inputs["W_ih"][d * rows : (d + 1) * rows], "b_ih": inputs["b_ih"][d * rows : (d + 1) * rows]}
        args.update({name[len(prefix) :]: value for name, value in inputs.items() if name.startswith(prefix)})
        directions.append(args)
    return reference_stack(base, x, [directions], lengths)


def _states(cell: str):
    return [s.name for s in analyze(resolve(cell), 1, 1).states]


def compare_with_two_layers(layer, cell: str, seq_len: int, lengths=None, seed=0) -> float:
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    out, finals = layer(*[inputs.get(n) for n in layer.arg_names])
    out = np.asarray(out, np.float64)
    want_out, want_finals = as_two_layers(cell, inputs, lengths)
    pairs = [(out, want_out)]
    for a, value in zip(layer.signature.outputs[1:], finals):
        direction, base = split_direction_name(a.name[:-2])
        pairs.append((value, want_finals[base][direction]))
    if lengths is not None:  # zeros past each row's length in both halves, as torch.nn's padded output
        assert all(not out[n:, b].any() for b, n in enumerate(lengths))
    return max_error(pairs)


@pytest.mark.parametrize("cell", CELLS)
def test_every_cell_both_directions_in_one_launch_equal_two_layers(cell):
    """Ragged lengths in no order (a full-length and a length-1 row), input size != hidden, odd sizes."""
    layer = prnn_tvm.compile_cell(cell, 5, 4, input_size=3, target="llvm", bidirectional=True)
    assert layer.signature.whole_sequence and layer.signature.outputs[0].concrete_shape(7) == (7, 4, 10)
    assert compare_with_two_layers(layer, cell, 7, random_lengths(4, 7, seed=2)) < 1e-5
    assert compare_with_two_layers(layer, cell, 7) < 1e-5


@pytest.mark.parametrize("hidden, batch, seq_len, input_size", [(1, 1, 1, 1), (7, 3, 11, 2), (4, 2, 2, 9)])
def test_awkward_sizes_in_both_directions(hidden, batch, seq_len, input_size):
    layer = prnn_tvm.compile_cell("gru", hidden, batch, input_size=input_size, target="llvm", bidirectional=True)
    assert compare_with_two_layers(layer, "gru", seq_len) < 1e-5
    assert compare_with_two_layers(layer, "gru", seq_len, random_lengths(batch, seq_len, seed=3)) < 1e-5


def test_the_reversed_reference_is_the_directions_as_layers():
    """``reference_layer`` of the bidirectional plan (both directions step by step, the reverse one's reads and
    writes at n - 1 - t) against the directions as two layers: two NumPy computations of the same thing;
    dropping the reversal breaks it."""
    plan = analyze(bidirectional(resolve("lstm")), 3, 6)
    inputs = random_inputs(plan, 9, 4, seed=5)
    inputs["lengths"] = random_lengths(3, 9, seed=5)
    out, finals = reference_layer(plan, inputs)
    want_out, want_finals = as_two_layers("lstm", inputs, inputs["lengths"])
    assert np.abs(out - want_out).max() < 1e-12
    assert all(np.abs(finals[f"{p}_c"] - want_finals["c"][d]).max() < 1e-12 for d, p in enumerate(("fwd", "rev")))
    cell = plan.cell
    forward_only = analyze(Cell(cell.name, cell.step, cell.reference, cell.output), 3, 6)
    assert np.abs(reference_layer(forward_only, inputs)[0] - want_out).max() > 1e-3


def test_lengths_past_the_sequence_mean_all_of_it(monkeypatch):
    """prnn_tvm.torch passes 2^31 - 1 for rows that run every step (a GPU tensor: placed as given, not read): the
    reverse direction starts at the sequence's last step, not at the length's. A host tensor's lengths are
    checked, so the check is bypassed here to run the CPU kernel on what the GPU kernel gets."""
    from prnn_tvm.runtime import binding

    layer = prnn_tvm.compile_cell("lstm", 4, 2, target="llvm", bidirectional=True)
    inputs = random_inputs(layer.plan, 6, 4, seed=4)
    whole = layer(**inputs)
    huge = tvm.runtime.tensor(np.array([6, 2**31 - 1], np.int32))
    with pytest.raises(prnn_tvm.InputError, match="lengths must lie in"):
        layer(**inputs, lengths=huge)
    monkeypatch.setattr(binding, "_on_host", lambda value: False)  # as a GPU tensor is placed
    out, finals = layer(**inputs, lengths=huge)
    assert np.array_equal(out.numpy(), whole[0])
    assert all(np.array_equal(a.numpy(), b) for a, b in zip(finals, whole[1]))


def test_a_bidirectional_cell_is_named_per_direction():
    cell = bidirectional(resolve("gru"))
    assert cell.name == "gru_bi" and cell.outputs == ("fwd_h", "rev_h") and cell.reversed_states == ("rev_h",)
    assert cell.reversed_slices == (3, 4, 5) and resolve("gru_bi").name == "gru_bi"
    plan = analyze(cell, 2, 8)
    assert [s.name for s in plan.weights] == ["fwd_W_hh", "rev_W_hh"] and plan.input.slices == 6
    assert len(plan.cta_parts) == 2  # the directions read nothing of each other's: CTAs of their own
    assert plan.fingerprint() != analyze(resolve("gru"), 2, 8).fingerprint()
    assert split_direction_name("rev_W_hh") == (1, "W_hh")
    with pytest.raises(ValueError, match="not a direction's name"):
        split_direction_name("l1_W_hh")


def test_what_a_bidirectional_layer_refuses():
    with pytest.raises(CellError, match="already a stack or has two directions"):
        bidirectional(stacked(resolve("lstm"), 2))
    with pytest.raises(CellError, match="already a stack or has two directions"):
        bidirectional(bidirectional(resolve("lstm")))
    with pytest.raises(ConfigError, match="cannot run as one wavefront"):
        prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", layers=2, bidirectional=True)
    layer = prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", bidirectional=True)
    with pytest.raises(ConfigError, match="both directions of a layer in one launch, which has no backward"):
        compile_backward(layer)
    cuda = prnn_tvm.compile_cell("lstm", 8, 2, arch="sm_90", bidirectional=True, tuning_logs=[])
    with pytest.raises(ConfigError, match="which has no backward"):
        compile_training(cuda)
    with pytest.raises(CellError, match="reversed state 'z' is not a declared state"):
        base = resolve("lstm")
        analyze(Cell("odd", base.step, base.reference, reversed_states=("z",)), 1, 4)


def test_a_sequence_too_long_for_one_launch_is_refused(monkeypatch):
    """Past 2^31 elements a layer runs its sequence in consecutive launches; the reverse direction starts at each
    row's end, so a bidirectional layer cannot, and says so."""
    layer = prnn_tvm.compile_cell("lstm", 4, 2, target="llvm", bidirectional=True)
    inputs = random_inputs(layer.plan, 10, 4, seed=1)
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2 * 16 * 3)
    with pytest.raises(InputError, match="reads each row from its last step, so it cannot"):
        layer(**inputs)


def test_the_signature_keeps_its_width_and_whole_sequence_through_a_file():
    layer = prnn_tvm.compile_cell("gru", 6, 2, input_size=3, target="llvm", bidirectional=True)
    again = Signature.from_dict(layer.signature.as_dict())
    assert again == layer.signature and again.whole_sequence
    assert again.outputs[0].shape == (SEQ, 2, 12)
    one = prnn_tvm.compile_cell("gru", 6, 2, target="llvm").signature
    assert "whole_sequence" not in one.as_dict()  # files of one-directional layers are as before


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("lstm", 512, 4, "float32"),
        ("gru", 512, 8, "float32"),
        ("lstm", 1024, 16, "float16"),
        ("gru_cho", 256, 4, "bfloat16"),
        ("rnn_tanh", 1024, 64, "float16"),
    ],
)
def test_default_bidirectional_kernels_split_the_grid_without_spills(cell, hidden, batch, dtype):
    """ptxas's figures (no GPU needed): the default config gives each direction CTAs of its own."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, arch="sm_90", bidirectional=True, tuning_logs=[])
    rep, cfg = layer.report, layer.kernel.config
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0, rep.format()
    assert cfg.layout == "split" and rep.ctas == 2 * -(-hidden // cfg.units_per_cta)
    assert_launchable(layer)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_directions_may_synchronize_by_their_values(dtype):
    """Data-carried synchronization (``tags``) orders only blocks that read each other's values: a barrier
    within each direction, which reads only its own state, but not between a stack's layers (the lower ones
    would run ahead)."""
    knobs = pc if dtype == "float32" else mc
    both = analyze(bidirectional(resolve("lstm")), 4, 256, dtype)
    assert both.independent_parts and not analyze(stacked(resolve("lstm"), 2), 4, 256, dtype).independent_parts
    tagged = [cfg for cfg in split_configs("lstm_bi", 256, 4, 1, dtype) if cfg.barrier == "tags"]
    assert tagged and knobs.validate(tagged[0], both, SM90).ctas == 2 * -(-256 // tagged[0].units_per_cta)
    assert not any(cfg.barrier == "tags" for cfg in split_configs("lstm", 256, 4, 2, dtype))
    two = analyze(stacked(resolve("lstm"), 2), 4, 256, dtype)
    with pytest.raises(ConfigError, match="barrier 'tags' synchronizes only blocks that read each other's values"):
        knobs.validate(tagged[0], two, SM90)
    layer = prnn_tvm.compile_cell("lstm", 256, 4, dtype=dtype, arch="sm_90", bidirectional=True, tuning_logs=[])
    assert layer.kernel.config.barrier == "tags"  # the default where it fits, as for one direction


def test_each_part_of_a_split_grid_runs_a_time_loop_of_its_own():
    """The part is chosen once per CTA, outside the time loop (``PersistentBuilder.part_loops``): with the
    branch inside every step ptxas miscompiled a bidirectional kernel (see ``test_the_config_ptxas_miscompiled``).
    The CUDA source: one time loop per direction, each inside its direction's branch (block 57 on: reverse)."""
    cfg = pc.PersistentConfig(
        units_per_cta=9, k_split=32, rows_per_thread=4, batch_tile=4, vec=4, barrier="tags", layout="split"
    )
    body = kernel_source(prnn_tvm.compile_cell("lstm", 512, 4, arch="sm_90", bidirectional=True, config=cfg))
    branches = [body.index("if (((int)blockIdx.x) < 57) {"), body.index("if (57 <= ((int)blockIdx.x)) {")]
    loops = [start for start, _ in time_loops(body)]
    assert len(loops) == 2 and branches[0] < loops[0] < branches[1] < loops[1], (branches, loops)


def test_a_layer_whose_directions_do_not_fit_together_says_so():
    """Two float32 LSTM directions at hidden 1536 hold 75 MB of recurrent weights: more than the H100's registers
    and shared memory together (about 63 MB)."""
    with pytest.raises(ConfigError, match="no persistent config fits cell 'lstm_bi'"):
        prnn_tvm.compile_cell("lstm", 1536, 4, arch="sm_90", bidirectional=True, tuning_logs=[])


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, seq_len",
    [
        ("lstm", 512, 4, "float32", 256),
        ("gru", 129, 1, "float32", 7),
        ("gru_cho", 96, 33, "float32", 30),
        ("lstm", 1024, 16, "float16", 256),
        ("gru", 256, 8, "bfloat16", 64),
        ("rnn_tanh", 64, 3, "float16", 1),
    ],
)
def test_bidirectional_cuda_kernels_match_the_float64_reference(cell, hidden, batch, dtype, seq_len):
    """The default config, the first split config of each barrier (``tags`` included where it fits: the
    directions never read each other's values) and a random one (seeded), with and without ragged lengths."""
    configs = split_configs(f"{cell}_bi", hidden, batch, 1, dtype)
    first = {}
    for cfg in configs:
        first.setdefault(cfg.barrier, cfg)
    picks = [None, *first.values(), configs[np.random.default_rng(hidden).integers(len(configs))]]
    bound = tolerance(dtype, seq_len)
    for cfg in picks:
        layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", bidirectional=True, config=cfg)
        assert compare_with_two_layers(layer, cell, seq_len) < bound, cfg
        lengths = random_lengths(batch, seq_len, seed=1)
        assert compare_with_two_layers(layer, cell, seq_len, lengths, seed=1) < bound, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [2, 3, 64])
def test_the_config_ptxas_miscompiled(seq_len):
    """With the part chosen inside every step, ptxas -O1 and above built this kernel so that the reverse
    direction's stores of step 1 never happened: every run timed out at the third step (H100)."""
    cfg = pc.PersistentConfig(
        units_per_cta=9, k_split=32, rows_per_thread=4, batch_tile=4, vec=4, barrier="tags", layout="split"
    )
    layer = prnn_tvm.compile_cell("lstm", 512, 4, target="cuda", bidirectional=True, config=cfg)
    assert compare_with_two_layers(layer, "lstm", seq_len) < tolerance("float32", seq_len)


@pytest.mark.gpu
def test_a_bidirectional_kernel_with_the_shared_layout_matches_too():
    """The tuner may also pick the shared layout (both directions' units in every CTA)."""
    configs = [cfg for cfg in split_configs("lstm_bi", 256, 4, 1, "float16")]
    cfg = dataclasses.replace(configs[0], layout="shared")
    layer = prnn_tvm.compile_cell("lstm", 256, 4, dtype="float16", target="cuda", bidirectional=True, config=cfg)
    assert compare_with_two_layers(layer, "lstm", 64, random_lengths(4, 64, seed=4)) < tolerance("float16", 64)


def test_a_bidirectional_layer_exports_and_loads_with_the_runtime_only(tmp_path):
    """Its library runs in a runtime-only process (the reversal lives in the kernel; ``whole_sequence`` in
    the metadata), and its metadata names it as ``resolve`` takes it back."""
    layer = prnn_tvm.compile_cell("lstm", 6, 3, input_size=4, target="llvm", bidirectional=True)
    library = prnn_tvm.export(layer, tmp_path / "both.so")
    metadata = read_metadata(library)
    assert metadata["cell"] == "lstm_bi" and signature_of(metadata).whole_sequence
    inputs = random_inputs(layer.plan, 9, 4, seed=2) | {"lengths": np.int32([9, 4, 1])}
    out, finals = layer(**inputs)
    np.savez(tmp_path / "io.npz", out=out, c_n=finals[1], **inputs)  # finals[1]: the forward direction's c
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    r = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, str(library), str(tmp_path / "io.npz")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and "runtime-only ok" in r.stdout, r.stderr[-2000:]

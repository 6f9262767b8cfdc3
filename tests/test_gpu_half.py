"""Half-precision layers on tensor cores (``pytest -m gpu``): float16 and bfloat16 against the
float64 reference on the same rounded inputs, every built-in cell and barrier, torch modules.
Random tuning configs of every dtype: ``test_gpu_robust``'s fuzz."""

import dataclasses

import ml_dtypes  # noqa: F401  (NumPy's 'bfloat16')
import numpy as np
import pytest
import tvm

import prnn_tvm
from prnn_tvm.checks import max_abs_error, plan_tolerance
from prnn_tvm.dtypes import TENSOR_CORE_DTYPES, tolerance
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer

pytestmark = pytest.mark.gpu
CELLS = sorted(prnn_tvm.builtin_cells())
_LAYERS = {}


def layer_for(cell, hidden, batch, dtype, config=None):
    key = (cell, hidden, batch, dtype, repr(config))
    if key not in _LAYERS:
        _LAYERS[key] = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", config=config)
    return _LAYERS[key]


def error_of(layer, seq_len, seed=0, lengths=None):
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    result = layer(**inputs)
    if lengths is not None:  # zeros past each row's length
        assert all(not result[0][n:, b].any() for b, n in enumerate(lengths))
    return max_abs_error(layer.plan, result, reference_layer(layer.plan, inputs))


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("hidden", [128, 512, 1024])
@pytest.mark.parametrize("batch", [1, 4, 16, 33])
def test_half_matches_reference(dtype, cell, hidden, batch):
    layer = layer_for(cell, hidden, batch, dtype)
    assert layer.report.template == "persistent_mma"
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 256):
        err = error_of(layer, seq_len, seed=seq_len)
        assert err <= plan_tolerance(layer.plan, seq_len), (
            f"T={seq_len}: max abs error {err:.2e}\n{layer.report.format()}"
        )


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("barrier", ["counter", "tags", "grid_sync"])
@pytest.mark.parametrize("cell", ["lstm", "gru_cho"])
def test_every_barrier_odd_sizes(dtype, barrier, cell):
    """Partial CTAs, a k range that ends inside a k tile, a partial last batch tile, two passes."""
    cfg = {"units_per_cta": 3, "k_groups": 2, "n_tiles": 1, "barrier": barrier}
    layer = layer_for(cell, 133, 11, dtype, cfg)
    assert error_of(layer, 9) <= plan_tolerance(layer.plan, 9)
    assert error_of(layer, 9, lengths=random_lengths(11, 9, seed=1)) <= plan_tolerance(layer.plan, 9)


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("barrier", ["counter", "tags", "grid_sync"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_two_row_tiles_per_warp_odd_sizes(dtype, barrier, cell):
    """``m_tiles_per_warp=2``: each warp multiplies two row tiles (the second partly padding for GRU's 24 rows)
    by one B fragment; partial CTAs, a partial last k tile, a partial batch tile, two passes."""
    cfg = {"units_per_cta": 8, "k_groups": 2, "n_tiles": 1, "barrier": barrier, "m_tiles_per_warp": 2}
    layer = layer_for(cell, 133, 11, dtype, cfg)
    assert layer.report.config["m_tiles_per_warp"] == 2
    assert error_of(layer, 9) <= plan_tolerance(layer.plan, 9)
    assert error_of(layer, 9, lengths=random_lengths(11, 9, seed=1)) <= plan_tolerance(layer.plan, 9)


@pytest.mark.parametrize("barrier", ["counter", "tags", "grid_sync"])
def test_two_items_per_thread_in_a_two_phase_cell(barrier):
    """Cho's GRU (two phases, two pointwise groups) with 8 units per CTA on 64 threads: 88 (batch row, unit)
    items per group, three item slots per thread, the stage r * h exchanged between the phases; a partial last
    CTA, a partial k tile, two passes of the batch. Regression: with ``counter`` the last CTA's outputs were
    wrong (0.16 max abs error): ptxas let a warp reach a block barrier diverged (see
    ``persistent_fragments._weight_or``)."""
    for dtype in TENSOR_CORE_DTYPES:
        layer = layer_for(
            "gru_cho", 133, 11, dtype, {"units_per_cta": 8, "k_groups": 1, "n_tiles": 1, "barrier": barrier}
        )
        assert error_of(layer, 9) <= plan_tolerance(layer.plan, 9)
        assert error_of(layer, 9, lengths=random_lengths(11, 9, seed=1)) <= plan_tolerance(layer.plan, 9)


@pytest.mark.parametrize("chains", [2, 4])
@pytest.mark.parametrize("barrier", ["counter", "tags", "grid_sync"])
@pytest.mark.parametrize("cell, units", [("lstm", 8), ("gru_cho", 3), ("gru_cho", 8)])
def test_accumulator_chains_odd_sizes(chains, barrier, cell, units):
    """``k_chains``: a warp's 9 k tiles taken in turn by 2 or 4 accumulator sets (unevenly), then added up;
    partial CTAs, a partial last k tile, a partial batch tile, two passes, both half types. (Three LSTM units
    per CTA would leave `tags` 34 polls per thread, past its 32.)"""
    for dtype in TENSOR_CORE_DTYPES:
        cfg = {"units_per_cta": units, "k_groups": 1, "n_tiles": 1, "barrier": barrier, "k_chains": chains}
        layer = layer_for(cell, 133, 11, dtype, cfg)
        assert layer.report.config["k_chains"] == chains
        assert error_of(layer, 9) <= plan_tolerance(layer.plan, 9)
        assert error_of(layer, 9, lengths=random_lengths(11, 9, seed=1)) <= plan_tolerance(layer.plan, 9)


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_half_rows_stop_at_their_lengths(dtype, cell):
    layer = layer_for(cell, 512, 33, dtype)
    assert error_of(layer, 64, lengths=random_lengths(33, 64, seed=4)) <= plan_tolerance(layer.plan, 64)


# the heads' block kernels (gate_layout="in_warp", batch groups: lstm_h48 bfloat16 768 x 16's tuned config)
HEADS = dict(units_per_cta=16, k_groups=1, n_tiles=1, barrier="block", m_tiles_per_warp=2, batch_groups=2,
             gate_layout="in_warp", xp="half")


@pytest.mark.parametrize(
    "cell, hidden, batch, config",
    [
        # LSTM float16 1024x16's tuned config, where the prefetch was measured
        ("lstm", 1024, 16, dict(units_per_cta=16, k_groups=4, n_tiles=1, barrier="sentinel", m_tiles_per_warp=2,
                                batch_groups=2)),
        ("lstm_bi", 512, 8, None),  # the reverse direction prefetches the row's step n - 3 - t
        ("lstm_x2", 512, 8, None),  # a stack's lag: steps past the sequence read its last step
        # block kernels, from warp 0 (``persistent_xp_sectors``): a sector a lane, the projection two steps ahead
        ("lstm_h48", 768, 16, HEADS),
        ("lstm_h12", 768, 16, dict(HEADS, units_per_cta=64, batch_groups=16)),  # a row a group
        ("slstm_h12", 768, 16, dict(HEADS, units_per_cta=64)),  # 128 sectors: four turns of the warp
        ("lstm_h12", 768, 5, None),  # rows past the batch in a warp's tiles
        ("lstm_h12_bi", 768, 16, None),  # two parts; the reverse direction's at each row's n - 1 - t
        ("lstm_h12", 240, 16, None),  # a head of 20 units: 40-byte segments off the sectors
        ("lstm_h15", 120, 16, HEADS),  # the last CTA's 8 units: its second sectors clamped to its last unit
        ("gru_h12", 768, 16, None),  # the block kernel without in_warp
    ],
)
def test_kernels_that_prefetch_their_projection(cell, hidden, batch, config):
    """The input projection asked into L2 ahead of its loads (``inputs_prefetched``, ``prefetch_sectors``): the same
    numbers, at the sequence's first steps and its end, with rows of their own lengths."""
    layer = layer_for(cell, hidden, batch, "float16", config)
    assert "prnn_prefetch_l2(" in layer.cuda_source and layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 2, 3, 300):
        err = error_of(layer, seq_len, seed=seq_len, lengths=random_lengths(batch, seq_len, seed=seq_len))
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("at, nbytes", [("barrier", 32), ("load", 128)])
@pytest.mark.parametrize("cell, batch", [("lstm_h48", 16), ("lstm_h12_bi", 16), ("slstm_h12", 5)])
def test_the_block_kernels_prefetch_changes_no_value(monkeypatch, cell, batch, at, nbytes):
    """A block kernel with its projection asked into L2 from one warp (after the barrier by sector, or with the loads
    by line) and the same kernel without: outputs and final states bitwise equal, rows of their own lengths."""
    from prnn_tvm.schedules.persistent_mma import _MmaBuilder

    def build():  # not the layer cache's: its key knows nothing of the class's settings
        return prnn_tvm.compile_cell(cell, 768, batch, dtype="bfloat16", target="cuda", cache=False)

    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_AT", at)
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BYTES", nbytes)
    with_it = build()
    assert "prnn_prefetch_l2(" in with_it.cuda_source
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_STEPS", 0)
    without = build()
    assert "prnn_prefetch_l2(" not in without.cuda_source
    for seq_len in (3, 300):
        inputs = random_inputs(with_it.plan, seq_len, with_it.input_size, seed=seq_len)
        inputs["lengths"] = random_lengths(batch, seq_len, seed=seq_len)
        (out_a, finals_a), (out_b, finals_b) = with_it(**inputs), without(**inputs)
        for a, b in zip((out_a, *finals_a), (out_b, *finals_b)):
            assert np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), f"T={seq_len}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_torch_half_modules_against_cudnn(dtype, kind):
    """``from_torch`` of a half module: error against float64 at most 1.5x cuDNN's own (or the bound)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    T = 64
    ctor = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}[kind]
    ours_err, cudnn_err = errors_against_float64(ctor, 96, 256, T, 8, dtype, pt.from_torch)
    assert ours_err <= max(1.5 * cudnn_err, tolerance(dtype, T)), f"ours {ours_err:.2e}, cuDNN {cudnn_err:.2e}"


def errors_against_float64(ctor, n_in: int, hidden: int, seq_len: int, batch: int, dtype: str, from_torch) -> tuple:
    """A ``torch.nn`` module of ``ctor`` in ``dtype`` run by ``from_torch`` and by cuDNN on random inputs: the max
    abs error of each against the same module in float64 (ours, cuDNN's)."""
    import torch

    torch.manual_seed(0)
    module = ctor(n_in, hidden).cuda().to(getattr(torch, dtype)).eval()
    exact = ctor(n_in, hidden).cuda().double().eval()
    exact.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    x = torch.randn(seq_len, batch, n_in, device="cuda", dtype=getattr(torch, dtype))
    with torch.no_grad():
        want, _ = exact(x.double())
        cudnn, _ = module(x)
        ours, _ = from_torch(module)(x)
    assert ours.dtype == x.dtype
    return (ours.double() - want).abs().max().item(), (cudnn.double() - want).abs().max().item()


def test_half_back_to_back_launches_are_bitwise_identical():
    layer = layer_for("lstm", 512, 16, "float16")
    inputs = random_inputs(layer.plan, 32, layer.input_size, seed=3)
    runs = [layer(**inputs) for _ in range(3)]
    for out, finals in runs[1:]:
        assert np.array_equal(out, runs[0][0])
        assert all(np.array_equal(a, b) for a, b in zip(finals, runs[0][1]))


@pytest.mark.parametrize("xp", ["float32", "half"])
@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, seq_len",
    [
        ("lstm", 1024, 16, 1024, 256),  # whole tiles
        ("gru", 33, 3, 5, 7),  # every dimension short of a tile; K of 5: one-element loads
        ("rnn_tanh", 1, 1, 1, 1),
        ("lstm", 64, 4, 6, 33),  # two-element loads
        ("gru", 512, 33, 300, 50),  # four-element loads, 1650 rows: a part tile of rows
        ("lstm", 129, 7, 200, 301),
    ],
)  # a width of 516: a part tile of columns
def test_tensor_core_projection_matches_float64(xp, dtype, cell, hidden, batch, input_size, seq_len):
    """The input projection of a compiled half layer (``codegen.projection.tensor_core_projection``) against
    float64 on the same half inputs: it accumulates in float32, so only float32 rounding of the sums remains, and
    where it writes the half type (the knob ``xp``) that one rounding of each value (an odd width stores a value at a
    time)."""
    default = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="cuda")
    config = dataclasses.replace(default.kernel.config, xp=xp)
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="cuda", config=config)
    written = layer.signature.launch("projection").arg("xp").dtype
    assert written == ("float32" if xp == "float32" else dtype)
    inputs = random_inputs(layer.plan, seq_len, input_size, seed=1)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((seq_len, batch, inputs["W_ih"].shape[0]), np.nan, written), dev)
    layer.module["projection"](*(tvm.runtime.tensor(inputs[k], dev) for k in ("x", "W_ih", "b_ih")), out)
    x, w, b = (inputs[k].astype(np.float64) for k in ("x", "W_ih", "b_ih"))
    ref = x @ w.T + b
    unit = 0.0 if xp == "float32" else {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]  # half an ulp, relative
    slack = 1e-6 * np.sqrt(input_size) * max(1.0, np.abs(ref).max())
    err = np.abs(out.numpy().astype(np.float64) - ref)
    assert np.all(err <= unit * np.abs(ref) + slack), err.max()  # NaN (an element never written) fails too

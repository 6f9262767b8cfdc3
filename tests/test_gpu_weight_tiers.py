"""The weight tiers on a real GPU (``pytest -m gpu``): layers past the register file, part of each CTA's weights in
shared memory (``smem_chunks`` of the float32 template, ``smem_k_tiles`` of the tensor-core one), against the
float64 NumPy reference, and forced splits at small sizes. The float32 kernels also run on the host in
``tests/test_weight_tiers.py``; the tensor-core ones (``mma``) only here."""

import pytest

import prnn_tvm
from prnn_tvm.checks import plan_tolerance
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_lengths
from prnn_tvm.schedules.persistent_config import PersistentConfig
from prnn_tvm.schedules.persistent_mma_config import MmaConfig
from prnn_tvm.target import gpu_spec

from .test_gpu_half import errors_against_float64
from .test_gpu_numerics import run_and_compare

pytestmark = pytest.mark.gpu
SEQ = 64


@pytest.mark.parametrize("batch", [4, 16])
@pytest.mark.parametrize("cell, hidden", [("lstm", 1536), ("lstm", 1792), ("gru", 1792), ("rnn_tanh", 3072)])
def test_past_registers_matches_reference(cell, hidden, batch):
    """The untuned choice keeps part of the weights in shared memory, builds without spills and is right."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda", tuning_logs=[])
    report = layer.report
    assert report.spill_bytes == 0 and report.weight_smem_bytes > 0, report.format()
    err = run_and_compare(layer, SEQ, seed=hidden, lengths=random_lengths(batch, SEQ, seed=batch))
    assert err <= tolerance("float32", SEQ), f"max abs error {err:.2e}\n{report.format()}"


@pytest.mark.parametrize("smem_chunks", [1, 3, 8])  # 8: every chunk of the row in shared memory
@pytest.mark.parametrize("cell", ["lstm", "gru_cho"])
def test_forced_splits(cell, smem_chunks):
    """Hidden 250 over CTAs of 4 units (a partial last one), k_split 8 x vec 4: 8 chunks per lane's row."""
    cfg = PersistentConfig(4, 8, 2, 3, 4, smem_chunks=smem_chunks)
    layer = prnn_tvm.compile_cell(cell, 250, 5, target="cuda", arch=gpu_spec().arch, config=cfg)
    assert layer.report.weight_smem_bytes > 0
    assert run_and_compare(layer, 33) <= tolerance("float32", 33), layer.report.format()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("batch", [4, 16])
@pytest.mark.parametrize("cell, hidden", [("lstm", 2048), ("gru", 2560)])
def test_half_past_registers_matches_reference(cell, hidden, batch, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", tuning_logs=[])
    report = layer.report
    assert report.spill_bytes == 0 and report.weight_smem_bytes > 0, report.format()
    err = run_and_compare(layer, SEQ, seed=hidden, lengths=random_lengths(batch, SEQ, seed=batch))
    assert err <= plan_tolerance(layer.plan, SEQ), f"max abs error {err:.2e}\n{report.format()}"


@pytest.mark.parametrize(
    "cell, config",
    [
        ("lstm", MmaConfig(16, 2, 1, smem_k_tiles=1)),
        ("lstm", MmaConfig(8, 1, 2, m_tiles_per_warp=2, smem_k_tiles=5)),
        ("lstm", MmaConfig(8, 2, 2, smem_k_tiles=8)),  # every k tile of the warp in shared memory
        ("lstm", MmaConfig(16, 2, 1, barrier="sentinel", operand_path="direct", smem_k_tiles=3)),
        ("gru_cho", MmaConfig(16, 2, 1, smem_k_tiles=1)),  # two phases of products
        ("gru_cho", MmaConfig(8, 2, 2, smem_k_tiles=8)),
    ],
)
def test_half_forced_splits(cell, config):
    """Hidden 256, batch 12 (a partial batch tile), float16: the shared fragments against the float64 reference."""
    layer = prnn_tvm.compile_cell(cell, 256, 12, dtype="float16", target="cuda", arch=gpu_spec().arch,
                                  config=config)
    assert layer.report.weight_smem_bytes > 0
    assert run_and_compare(layer, 33) <= plan_tolerance(layer.plan, 33), layer.report.format()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_deep_stack_3x960_at_batch_1_matches_reference(dtype):
    """Issue 47's three LSTM layers of 960 at batch 1 (five products a unit): fp16 (37 MB) in registers and shared
    memory, fp32 (74 MB) streaming the rest from L2 too."""
    layer = prnn_tvm.compile_cell("lstm_d3", 960, 1, dtype=dtype, target="cuda", tuning_logs=[])
    report = layer.report
    assert report.spill_bytes == 0 and report.weight_smem_bytes > 0, report.format()
    assert (report.weight_l2_bytes > 0) == (dtype == "float32"), report.format()
    err = run_and_compare(layer, 16, seed=960)
    assert err <= plan_tolerance(layer.plan, 16), f"max abs error {err:.2e}\n{report.format()}"


@pytest.mark.parametrize("kind, hidden, dtype", [("LSTM", 1792, "float32"), ("LSTM", 2048, "float16"),
                                                 ("GRU", 1792, "float32")])
def test_torch_modules_past_registers(kind, hidden, dtype):
    """``from_torch`` of a layer the register file alone refused before the tiers: error against float64 at most
    1.5x cuDNN's own (or the bound)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    T = 32
    ours_err, cudnn_err = errors_against_float64(getattr(torch.nn, kind), hidden, hidden, T, 4, dtype, pt.from_torch)
    assert ours_err <= max(1.5 * cudnn_err, tolerance(dtype, T)), f"ours {ours_err:.2e}, cuDNN {cudnn_err:.2e}"

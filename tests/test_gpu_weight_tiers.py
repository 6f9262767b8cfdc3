"""The weight tiers on a real GPU (``pytest -m gpu``): layers past the register file, part of each CTA's weights in
shared memory (``smem_chunks``), against the float64 NumPy reference, and forced splits at a small size. The same
kernels run on the host in ``tests/test_weight_tiers.py``."""

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_lengths
from prnn_tvm.schedules.persistent_config import PersistentConfig
from prnn_tvm.target import gpu_spec

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

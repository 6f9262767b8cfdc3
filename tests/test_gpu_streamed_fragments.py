"""The tensor-core template's third weight tier on a real GPU (``pytest -m gpu``): part of each warp's A fragments read
from global memory every pass (``l2_k_tiles``), against the float64 NumPy reference at the dtype's bound: forced on
small layers (every code path: 16- and 8-byte loads, load groups past the depth, ldmatrix and direct operands, two row
tiles a warp), the defaults past the chip (LSTM fp16/bf16 4096, GRU fp16 3072) with and without the L2 window
(``from_torch(nn.LSTM(4096, 4096).half())``: ``tests/test_gpu_streamed_weights.py``). The builds are checked without
a GPU in ``tests/test_streamed_fragments.py``."""

import pytest

import prnn_tvm
from prnn_tvm.checks import plan_tolerance
from prnn_tvm.reference import random_lengths
from prnn_tvm.runtime import l2
from prnn_tvm.target import gpu_spec

from .test_gpu_numerics import run_and_compare
from .test_streamed_fragments import FORCED

pytestmark = pytest.mark.gpu
SEQ = 64


@pytest.mark.parametrize("cell, hidden, batch, dtype, config", FORCED)
def test_forced_streaming_matches_reference(cell, hidden, batch, dtype, config):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch=gpu_spec().arch,
                                  config=config)
    assert layer.report.weight_l2_bytes > 0
    err = run_and_compare(layer, 33, seed=hidden, lengths=random_lengths(batch, 33, seed=batch))
    assert err <= plan_tolerance(layer.plan, 33), f"max abs error {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("cell, hidden, dtype", [("lstm", 4096, "float16"), ("lstm", 4096, "bfloat16"),
                                                 ("gru", 3072, "float16")])
def test_past_the_chip_matches_reference(cell, hidden, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, 4, dtype=dtype, target="cuda", tuning_logs=[])
    report = layer.report
    assert report.spill_bytes == 0 and report.weight_l2_bytes > 0, report.format()
    err = run_and_compare(layer, SEQ, seed=hidden, lengths=random_lengths(4, SEQ, seed=4))
    assert err <= plan_tolerance(layer.plan, SEQ), f"max abs error {err:.2e}\n{report.format()}"


def test_with_the_window_same_numbers():
    """The L2 persistence window (off by default) changes where lines live, never a value."""
    layer = prnn_tvm.compile_cell("lstm", 4096, 4, dtype="float16", target="cuda", tuning_logs=[])
    l2.use_window(True)
    try:
        err = run_and_compare(layer, 16, seed=3)
    finally:
        l2.use_window(False)
    assert err <= plan_tolerance(layer.plan, 16)


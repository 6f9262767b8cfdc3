"""Sums over units on a real GPU (``pytest -m gpu``): the layer-normalized LSTM's partials added up by lane groups
after each phase's grid barrier, or by atomics into replicas (``atomic_sums``), under each grid-wide kind and at the
geometries its default is picked among, against the float64 reference under the GPU's own memory order. Build-only
twins: ``test_lane_totals.py``, ``test_atomic_sums.py``; the defaults of every dtype:
``test_gpu_heads.py::test_defaults_match_the_reference``."""

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_lengths

from .test_gpu_heads import error_of

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "hidden, batch, dtype, config",
    [
        (1024, 8, "float16", {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "grid_sync"}),
        (1024, 8, "float16", {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "counter"}),
        (1024, 8, "float16", {"units_per_cta": 16, "k_groups": 4, "n_tiles": 1, "barrier": "grid_sync"}),
        (1024, 8, "float16", {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "barrier": "grid_sync"}),
        (1024, 8, "bfloat16", {"units_per_cta": 8, "k_groups": 8, "n_tiles": 1, "barrier": "grid_sync"}),
        (33, 3, "float16", {"units_per_cta": 1, "k_groups": 3, "n_tiles": 1, "barrier": "grid_sync"}),  # 33 blocks
        (1024, 8, "float32", None),  # the float32 template's default: counter
    ],
)
def test_every_kind_and_geometry_of_sums_matches_the_reference(hidden, batch, dtype, config):
    layer = prnn_tvm.compile_cell("lstm_layernorm", hidden, batch, dtype=dtype, target="cuda", config=config)
    assert_matches_launch_after_launch(layer, batch, dtype)


def assert_matches_launch_after_launch(layer, batch: int, dtype: str):
    """No spills, and three launches on the layer's one workspace (T=1, 7, 256, ragged lengths) each against the
    float64 reference at the dtype's tolerance."""
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 256):
        err = error_of(layer, seq_len, seed=seq_len, lengths=random_lengths(batch, seq_len, seed=seq_len))
        assert err <= tolerance(dtype, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


DEFAULT = {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "grid_sync"}  # lstm_layernorm 1024 x 8 fp16's


@pytest.mark.parametrize(
    "hidden, batch, dtype, config, replicas",
    [
        *((1024, 8, "float16", DEFAULT, R) for R in (1, 2, 4, 8)),
        (1024, 8, "float16", {**DEFAULT, "barrier": "counter"}, 4),
        (256, 1, "bfloat16", {"units_per_cta": 2, "k_groups": 4, "n_tiles": 1, "barrier": "grid_sync"}, 2),  # batch 1
        (37, 3, "float16", {"units_per_cta": 1, "k_groups": 3, "n_tiles": 1, "barrier": "grid_sync"}, 8),  # a prime H
        (1, 2, "float32", {"units_per_cta": 1, "k_split": 1, "rows_per_thread": 1, "batch_tile": 2, "vec": 1,
                           "barrier": "counter"}, 1),  # hidden 1: one block
        (131, 5, "float32", None, 4),  # the float32 template's default geometry, a prime hidden size
    ],
)
def test_atomic_sums_match_the_reference_launch_after_launch(hidden, batch, dtype, config, replicas):
    """``atomic_sums``: three launches on one layer's workspace (T=1, 7, 256, ragged lengths, an input 5 wide), each
    against the float64 reference at the dtype's tolerance: a launch that left an accumulator unzeroed would spoil the
    next one's sums."""
    if config is None:
        base = prnn_tvm.compile_cell("lstm_layernorm", hidden, batch, dtype=dtype, target="cuda", tuning_logs=[])
        config = dict(base.report.config)
    config = {**config, "atomic_sums": replicas}
    layer = prnn_tvm.compile_cell("lstm_layernorm", hidden, batch, input_size=5, dtype=dtype, target="cuda",
                                  config=config, tuning_logs=[])
    assert_matches_launch_after_launch(layer, batch, dtype)

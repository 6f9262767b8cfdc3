"""Sums over units on a real GPU (``pytest -m gpu``): the layer-normalized LSTM's partials added up by lane groups
after each phase's grid barrier, under each grid-wide kind and at the geometries its default is picked among, against
the float64 reference under the GPU's own memory order. Build-only twins: ``test_lane_totals.py``; the defaults of
every dtype: ``test_gpu_heads.py::test_defaults_match_the_reference``."""

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
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 256):
        err = error_of(layer, seq_len, seed=seq_len, lengths=random_lengths(batch, seq_len, seed=seq_len))
        assert err <= tolerance(dtype, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"

"""Sums over units with tagged partials on a real GPU (``pytest -m gpu``): the layer-normalized LSTM under each kind
(``counter`` and ``tags`` poll the blocks' partials, ``grid_sync`` reads them after a barrier) against the float64
reference under the GPU's own memory order, and launch after launch on the same workspace and barrier state (a stale
partial taken for a fresh one would show as an error). Emulated twins: ``test_tagged_sums.py``."""

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_lengths

from .test_gpu_heads import error_of

pytestmark = pytest.mark.gpu

LN_1024x8 = {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1}


@pytest.mark.parametrize(
    "hidden, batch, dtype, config",
    [
        (1024, 8, "float16", {**LN_1024x8, "barrier": "counter"}),
        (1024, 8, "float16", {**LN_1024x8, "barrier": "grid_sync"}),
        (1024, 8, "float16", {"units_per_cta": 16, "k_groups": 4, "n_tiles": 1, "barrier": "counter"}),
        (1024, 8, "bfloat16", {**LN_1024x8, "barrier": "counter"}),
        (256, 4, "float16", {"units_per_cta": 2, "k_groups": 8, "n_tiles": 1, "barrier": "tags"}),
        (33, 3, "float16", {"units_per_cta": 1, "k_groups": 3, "n_tiles": 1, "barrier": "tags"}),
        (256, 4, "float32", None),  # the float32 template's default: tags
        (1024, 8, "float32", None),  # counter
    ],
)
def test_every_kind_of_partials_matches_the_reference(hidden, batch, dtype, config):
    layer = prnn_tvm.compile_cell("lstm_layernorm", hidden, batch, dtype=dtype, target="cuda", config=config)
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 256):
        err = error_of(layer, seq_len, seed=seq_len, lengths=random_lengths(batch, seq_len, seed=seq_len))
        assert err <= tolerance(dtype, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("barrier", ["counter", "tags"])
def test_launch_after_launch_never_takes_an_earlier_launchs_partials(barrier):
    """Odd sequence lengths, called again and again: a launch's last step leaves its partials in the slot the next
    launch's first step polls, tagged with what an earlier launch would have expected."""
    config = {"units_per_cta": 2, "k_groups": 8, "n_tiles": 1, "barrier": barrier}
    layer = prnn_tvm.compile_cell("lstm_layernorm", 256, 4, dtype="float16", target="cuda", config=config)
    for call, seq_len in enumerate((7, 7, 1, 5, 7, 3)):
        err = error_of(layer, seq_len, seed=100 + call)
        assert err <= tolerance("float16", seq_len), (call, seq_len, err)

"""Batch groups on the GPU (``pytest -m gpu``): each group of rows runs on CTAs of its own, and the outputs are
those of the same config on one group, bit for bit. Refusals and generated code: ``test_batch_groups.py``."""

import pytest

from prnn_tvm.dtypes import tolerance

from .test_gpu_half import error_of
from .test_gpu_sentinel import assert_same_bits, module_matches_float64
from .test_sentinel import sentinel_layer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "lstm_peephole"])
@pytest.mark.parametrize("barrier", ["sentinel", "tags"])
@pytest.mark.parametrize(
    "hidden, batch, knobs",
    [
        (133, 2, {"units_per_cta": 8, "k_groups": 2, "batch_groups": 2}),  # groups of one row, partial CTAs, odd rows
        (256, 16, {"units_per_cta": 16, "k_groups": 2, "k_chains": 4, "batch_groups": 4}),  # groups of 4 rows
        (64, 24, {"units_per_cta": 4, "batch_groups": 2}),
    ],
)  # groups of 12: two passes, the second of 4 rows
def test_batch_groups_change_no_bit(dtype, cell, barrier, hidden, batch, knobs):
    """Rows never read each other, so a group's rows get exactly the values the whole batch's launch gives
    them: at T=1, 7 and 64, with rows stopping at their own lengths; and within the float64 bound."""
    layer = sentinel_layer(cell, hidden, batch, dtype, barrier=barrier, **knobs)
    whole = sentinel_layer(cell, hidden, batch, dtype, barrier=barrier, **dict(knobs, batch_groups=1))
    assert layer.report.ctas == knobs["batch_groups"] * whole.report.ctas
    assert_same_bits(layer, whole, batch)
    assert error_of(layer, 64, seed=1) <= tolerance(dtype, 64)


def test_a_torch_module_with_batch_groups():
    """The grouped kernel through ``from_torch``: against float64 torch.nn, at two lengths, replayed from a
    CUDA graph."""
    torch = pytest.importorskip("torch")
    import copy

    import prnn_tvm.torch as pt

    torch.manual_seed(5)
    half = torch.nn.GRU(80, 256).cuda().half().eval()
    exact = copy.deepcopy(half).double()
    fast = pt.from_torch(
        half, config={"units_per_cta": 16, "k_groups": 1, "n_tiles": 1, "barrier": "sentinel", "batch_groups": 2}
    )
    x = torch.randn(48, 16, 80, device="cuda").half()
    module_matches_float64(fast, exact, x, 3)
    assert fast.layer_for(16, x.device).report.config["batch_groups"] == 2

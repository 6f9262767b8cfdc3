"""``poll_sleep`` on the GPU (``pytest -m gpu``): a thread that sleeps between its polls gets the same values, bit
for bit, and a wait that never ends still gives up in time. Refusals and generated code: ``test_poll_sleep.py``."""

import pytest

from prnn_tvm.dtypes import tolerance

from .test_gpu_barrier import assert_a_stall_gives_up
from .test_gpu_half import error_of
from .test_gpu_sentinel import assert_same_bits
from .test_sentinel import sentinel_layer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("barrier", ["sentinel", "tags"])
@pytest.mark.parametrize(
    "hidden, batch, knobs",
    [
        (256, 16, {"units_per_cta": 16, "k_groups": 2, "batch_groups": 2, "poll_sleep": 512}),
        (133, 9, {"units_per_cta": 8, "k_groups": 2, "poll_sleep": 256}),
    ],
)  # odd rows, partial CTAs
def test_a_poll_sleep_changes_no_bit(dtype, cell, barrier, hidden, batch, knobs):
    layer = sentinel_layer(cell, hidden, batch, dtype, barrier=barrier, **knobs)
    awake = sentinel_layer(cell, hidden, batch, dtype, barrier=barrier, **dict(knobs, poll_sleep=0))
    assert_same_bits(layer, awake, batch)
    assert error_of(layer, 64, seed=1) <= tolerance(dtype, 64)


@pytest.mark.parametrize("barrier", ["sentinel", "tags"])
def test_a_sleeping_wait_still_gives_up_in_time(barrier):
    """Block 0 never publishes step 3: every sleeping waiter gives up within the 20 ms bound, the timeout is
    raised, and the next call is right."""
    layer = sentinel_layer("lstm", 256, 16, "float16", barrier=barrier, units_per_cta=16, k_groups=2, poll_sleep=512)
    assert_a_stall_gives_up(layer)
    assert error_of(layer, 16) <= tolerance("float16", 16)

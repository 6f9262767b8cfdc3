"""The cells beyond RNN/LSTM/GRU on the GPU: numerics, and timeouts inside a two-phase step."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import BarrierTimeout
from prnn_tvm.reference import random_inputs
from prnn_tvm.schedules.persistent_config import default_config
from prnn_tvm.target import gpu_spec

from .test_gpu_numerics import run_and_compare

pytestmark = pytest.mark.gpu
NEW_CELLS = ["lstm_peephole", "mgu", "gru_cho", "indrnn", "stacked_rnn"]
_LAYERS = {}


def layer_for(cell, hidden, batch):
    if (cell, hidden, batch) not in _LAYERS:
        _LAYERS[cell, hidden, batch] = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda")
    return _LAYERS[cell, hidden, batch]


@pytest.mark.parametrize("cell", NEW_CELLS)
@pytest.mark.parametrize("hidden", [128, 1024])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("seq_len", [1, 64])
def test_new_cell_matches_reference(cell, hidden, batch, seq_len):
    layer = layer_for(cell, hidden, batch)
    assert layer.report.spill_bytes == 0, layer.report.format()
    err = run_and_compare(layer, seq_len, seed=seq_len + batch)
    assert err <= tolerance("float32", seq_len), f"max abs error {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("barrier", ["tags", "counter", "grid_sync"])
def test_two_phase_cell_under_every_barrier(barrier):
    plan = prnn_tvm.analyze(prnn_tvm.resolve("gru_cho"), 4, 256)
    cfg = dataclasses.replace(default_config(plan, gpu_spec()), barrier=barrier)
    layer = prnn_tvm.compile_cell("gru_cho", 256, 4, target="cuda", config=cfg)
    assert run_and_compare(layer, 33) <= tolerance("float32", 33)


@pytest.mark.parametrize("barrier, layout", [("tags", "shared"), ("counter", "shared"), ("counter", "split")])
def test_timeout_inside_a_two_phase_step(barrier, layout):
    """A block stalls in the phase barrier of step 5 (the split layout: the stacked RNN's two layers on CTAs of
    their own, which its default takes; tags only shares)."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("stacked_rnn"), 4, 256)
    cfg = dataclasses.replace(default_config(plan, gpu_spec()), barrier=barrier, layout=layout)
    layer = prnn_tvm.compile_cell("stacked_rnn", 256, 4, target="cuda", config=cfg)
    layer.barrier_timeout_us, layer.debug_stall_step = 20_000, 5
    with pytest.raises(BarrierTimeout, match="step 5"):
        layer(**random_inputs(layer.plan, 12, layer.input_size))
    layer.debug_stall_step = -1
    assert run_and_compare(layer, 12) <= tolerance("float32", 12)

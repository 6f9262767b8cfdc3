"""Grid barriers on the GPU: all-to-all stress, forced timeouts, identical answers (``pytest -m gpu``)."""

import dataclasses
import time

import numpy as np
import pytest
import tvm_ffi

import prnn_tvm
from prnn_tvm.bench.barrier_probe import Probe
from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import BarrierTimeout
from prnn_tvm.reference import random_inputs
from prnn_tvm.schedules.persistent_config import default_config
from prnn_tvm.target import gpu_spec

from .test_gpu_numerics import run_and_compare

pytestmark = pytest.mark.gpu
STATEFUL = sorted(name for name, b in BARRIERS.items() if b.state_words is not None)
PROBED = sorted(name for name, b in BARRIERS.items() if b.probe_problem(all_to_all=True) is None)  # not sentinel


def lstm_with(barrier, hidden=512, batch=4):
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), batch, hidden)
    cfg = dataclasses.replace(default_config(plan, gpu_spec()), barrier=barrier)
    return prnn_tvm.compile_cell("lstm", hidden, batch, target="cuda", config=cfg)


@pytest.mark.parametrize("barrier", PROBED)
@pytest.mark.parametrize("blocks_per_sm", [1, 2])
def test_stress_every_block_reads_every_other_block(barrier, blocks_per_sm):
    probe = Probe(barrier, blocks_per_sm * gpu_spec().sms, 128, all_to_all=True)
    assert probe.run(steps=2000, launches=10) == 0


def assert_a_stall_gives_up(layer, match: str = "after step 3 of 16"):
    """Block 0 never publishes step 3 of a 16-step call: every waiter gives up within the 20 ms bound, so the
    call raises within seconds (no hang); then the stall is switched off for the caller's next call."""
    inputs = random_inputs(layer.plan, 16, layer.input_size)
    layer.barrier_timeout_us, layer.debug_stall_step = 20_000, 3
    start = time.perf_counter()
    with pytest.raises(BarrierTimeout, match=match):
        layer(**inputs)
    assert time.perf_counter() - start < 5.0
    layer.debug_stall_step = -1


@pytest.mark.parametrize("barrier", STATEFUL)
def test_forced_timeout_raises_then_next_call_is_correct(barrier):
    layer = lstm_with(barrier, hidden=256)
    assert_a_stall_gives_up(layer)
    assert run_and_compare(layer, 16) <= tolerance("float32", 16)


@pytest.mark.parametrize("barrier", [b for b in STATEFUL if b in PROBED])
def test_forced_timeout_in_the_probe(barrier):
    probe = Probe(barrier, gpu_spec().sms, 128, all_to_all=True)
    probe.timeout_us, probe.stall_step = 10_000, 100
    with pytest.raises(BarrierTimeout, match="after step 100"):
        probe.run(steps=500)
    probe.stall_step = -1
    assert probe.run(steps=500, launches=3) == 0


def test_all_barriers_give_bitwise_identical_results():
    outputs = {}
    for barrier in sorted(name for name, b in BARRIERS.items() if b.grid_wide):  # block: test_gpu_heads.py
        layer = lstm_with(barrier)
        inputs = random_inputs(layer.plan, 64, layer.input_size, seed=7)
        outputs[barrier] = layer(**inputs)
        assert run_and_compare(layer, 64, seed=7) <= tolerance("float32", 64)
    first = next(iter(outputs.values()))
    for out, finals in outputs.values():
        assert np.array_equal(out, first[0]) and all(np.array_equal(a, b) for a, b in zip(finals, first[1]))


@pytest.mark.parametrize("barrier", STATEFUL)
def test_many_launches_need_no_reset(barrier):
    """The barrier state carries over from launch to launch (device-side base), including T=1 and T=2."""
    layer = lstm_with(barrier, hidden=256)
    for seq_len in (33, 1, 2, 33, 7) * 4:
        assert run_and_compare(layer, seq_len, seed=seq_len) <= tolerance("float32", seq_len)


@pytest.mark.parametrize(
    "barrier, bidirectional", [(b, both) for b in STATEFUL for both in (False, True) if not (both and b == "sentinel")]
)
def test_the_last_block_out_advances_the_base(barrier, bidirectional):
    """After each launch the state reads: no error, the base advanced by the launch's barriers (``counter``; one
    for ``sentinel``) or steps (``tags``), no block counted out (the last one reset the count). A bidirectional
    layer's directions with ``tags`` never wait for each other's blocks, so block 0 may leave first: the base
    must still move once."""
    layer = lstm_with(barrier, hidden=256)
    if bidirectional:
        cfg = dataclasses.replace(layer.kernel.config, layout="split", units_per_cta=4)
        layer = prnn_tvm.compile_cell("lstm", 256, 4, target="cuda", bidirectional=True, config=cfg)
    base = 0
    for seq_len in (5, 1, 2, 17):
        inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seq_len)
        layer(*[inputs.get(n) for n in layer.arg_names])
        sync = layer.launch_state(tvm_ffi.get_raw_stream(layer.device))["sync"].numpy()
        base += {"tags": seq_len, "sentinel": 1}.get(barrier, seq_len - 1)
        assert sync[0] == 0 and sync[2] == base and sync[3] == 0, (seq_len, sync)

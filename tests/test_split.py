"""One layer split over the GPUs of one host (``compile_cell(..., devices=...)``, ``schedules/split.py``), on the CPU:
every GPU's recurrent launch emulated at once in one address space, each polling its own copy of the exchange while
the others store into it (``prnn_tvm.verify.split``), against the float64 reference; the timeout path (a stalled
block, a peer that never runs); the refusals; the generated code of the layers the split is for (ptxas: 0 spills).
What only GPUs joined by NVLink show (peer access, system-scope stores, the timings) is in ``test_gpu_split.py``."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError, InputError, LaunchError
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import split
from prnn_tvm.verify import emulator
from prnn_tvm.verify.split import run_split

emulated_only = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def knobs(units: int, tile: int = 2) -> dict:
    return dict(units_per_cta=units, k_split=4, rows_per_thread=2, batch_tile=tile, vec=2, barrier="tags")


def split_layer(cell: str, hidden: int, batch: int, gpus: int, units: int, tile: int = 2):
    return prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, arch="sm_90", tuning_logs=[],
                                 config=knobs(units, min(tile, batch)), devices=list(range(gpus)), cache=False)


@emulated_only
@pytest.mark.parametrize(
    "cell, hidden, batch, gpus, units, steps",
    [
        ("lstm", 12, 3, 2, 3, 5),  # 4 CTAs, 2 a GPU; batch tiles of 2 over 3 rows
        ("lstm", 12, 1, 4, 3, 4),  # a CTA a GPU, batch 1
        ("lstm", 16, 5, 4, 2, 1),  # one step: the initial states alone
        ("lstm", 10, 3, 2, 1, 4),  # units 5 and 5
        ("lstm", 10, 3, 2, 3, 3),  # units 6 and 4: the second GPU's last CTA half past hidden
        ("gru", 12, 3, 2, 3, 4),  # torch's GRU: r * (W h + b) inside the step
    ],
)
def test_every_gpu_computes_its_units_from_the_peers_states(cell, hidden, batch, gpus, units, steps):
    layer = split_layer(cell, hidden, batch, gpus, units)
    assert layer.ctas_per_gpu * gpus * units >= hidden
    inputs = random_inputs(layer.plan, steps, 3)
    inputs["lengths"] = random_lengths(batch, steps, seed=1)
    out, finals, words = run_split(layer, inputs)
    assert words == [0] * gpus
    err = max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs))
    assert err <= tolerance("float32", steps), err


@emulated_only
def test_a_tile_polled_a_row_at_a_time(monkeypatch):
    """A wide layer polls its tile in chunks of batch rows (``PeerTags``): forced to one row per poll here."""
    monkeypatch.setattr(split, "poll_chunk", lambda g, cfg, plan, gpu: (1, 0))
    layer = split_layer("lstm", 12, 5, 2, 3, tile=3)
    assert layer.kernel.config.batch_tile == 3
    inputs = random_inputs(layer.plan, 4, 3)
    out, finals, words = run_split(layer, inputs)
    assert words == [0, 0]
    err = max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs))
    assert err <= tolerance("float32", 4), err


@emulated_only
def test_a_stalled_block_times_every_gpu_out():
    """CTA 0 of GPU 0 publishes nothing at step 2: GPU 0 and its peer each record step 2 and fill their outputs with
    NaN (no GPU waits forever for another)."""
    layer = split_layer("lstm", 12, 2, 2, 3)
    out, finals, words = run_split(layer, random_inputs(layer.plan, 5, 3), timeout_us=100_000, stall_step=2)
    assert words == [3, 3], words
    assert np.isnan(out).all() and all(np.isnan(f).all() for f in finals)


@emulated_only
def test_a_peer_that_never_runs_times_the_others_out():
    layer = split_layer("lstm", 12, 2, 2, 3)
    out, finals, words = run_split(layer, random_inputs(layer.plan, 3, 3), timeout_us=100_000, absent=1)
    assert words[0] != 0 and words[1] == 0, words
    mine = layer.units_of(0)
    assert np.isnan(out[..., mine.start:mine.stop]).all()
    assert all(np.isnan(f[..., mine.start:mine.stop]).all() for f in finals)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(devices=[0]), "2 GPUs or more"),
        (dict(devices=[1, 1]), "names a GPU twice"),
        (dict(devices=3), "list of CUDA device indices"),
        (dict(devices=[0, -1]), "whole numbers from 0"),
        (dict(devices=[0, 1], target="llvm"), "target='cuda'"),
        (dict(devices=[0, 1, 2], config=knobs(3)), "does not divide among 3 GPUs"),
    ],
)
def test_what_cannot_be_split_is_refused_naming_the_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        prnn_tvm.compile_cell("lstm", 12, 2, input_size=3, cache=False, tuning_logs=[],
                              **({"arch": "sm_90"} if options.get("target") != "llvm" else {}), **options)


def test_an_odd_hidden_size_is_refused():
    with pytest.raises(ConfigError, match="odd"):
        prnn_tvm.compile_cell("lstm", 13, 2, arch="sm_90", devices=[0, 1], cache=False)


def test_a_cell_that_sums_over_units_is_refused():
    with pytest.raises(ConfigError, match="sums over units"):
        prnn_tvm.compile_cell("lstm_layernorm", 16, 2, arch="sm_90", devices=[0, 1], cache=False)


def test_a_layer_that_fits_one_gpu_may_be_split_all_the_same():
    layer = split_layer("lstm", 12, 2, 2, 3)
    assert isinstance(layer, prnn_tvm.runtime.split.SplitLayer) and layer.devices == (0, 1)


def test_each_gpu_projects_its_own_units_of_every_slice():
    layer = split_layer("lstm", 10, 3, 2, 3)
    first, second = layer.columns_of(0), layer.columns_of(1)
    assert list(first) == [u + 10 * s for s in range(4) for u in range(6)]
    assert list(second) == [u + 10 * s if u < 10 else -1 for s in range(4) for u in range(6, 12)]
    w = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    mine = layer.own_columns({"W_ih": w, "b_ih": w[:, 0], "x": w}, 1)
    np.testing.assert_array_equal(mine["W_ih"][:4], w[6:10])
    assert not mine["W_ih"][4:6].any() and not mine["b_ih"][4:6].any()  # the units past hidden: zero rows
    assert mine["x"] is w
    assert layer.signature.launch("projection").arg("W_ih").shape == (24, 3)


def test_without_gpus_a_call_says_so_and_only_numpy_crosses():
    layer = split_layer("lstm", 12, 2, 2, 3)
    inputs = random_inputs(layer.plan, 2, 3)
    with pytest.raises(InputError, match="NumPy"):
        layer(*[list(v) for v in inputs.values()])
    if prnn_tvm.target.local_gpu() is None:
        with pytest.raises(LaunchError, match="without a usable GPU"):
            layer(**inputs)


@pytest.mark.slow
@pytest.mark.parametrize("hidden, batch", [(2048, 8), (1024, 8)])
def test_the_half_layers_it_is_for_build_without_spills(hidden, batch):
    """LSTM fp16 hidden 2048 batch 8 does not fit one H100's registers (one GPU runs it with part of its weights in
    shared memory); split over two it builds with every weight in registers, each GPU a run of CTAs that ptxas
    reports without spills."""
    layer = prnn_tvm.compile_cell("lstm", hidden, batch, dtype="float16", arch="sm_90", devices=[0, 1], cache=False)
    if layer.report.registers is None:
        pytest.skip(f"no ptxas report here: {layer.report.ptxas_note}")
    assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report.format()
    assert layer.ctas_per_gpu * 2 * layer.units_per_cta == hidden
    assert "prnn_tag_store_peer<half>(" in layer.cuda_source  # every new state also goes to the peer

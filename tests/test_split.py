"""One layer split over the GPUs of one host (``compile_cell(..., devices=...)``, ``schedules/split.py``), on the CPU:
every GPU's recurrent launch emulated at once in one address space, each polling its own copy of the exchange while
the others store into it (``prnn_tvm.verify.split``), against the float64 reference; the timeout path (a stalled
block, a peer that never runs); the refusals; the generated code of the layers the split is for (ptxas: 0 spills).
What only GPUs joined by NVLink show (peer access, system-scope stores, the timings) is in ``test_gpu_split.py``."""

import contextlib
import dataclasses
import types

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError, InputError, LaunchError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import by_name, split
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import STATIC_SMEM_RESERVE, gpu_spec, max_regs_per_thread
from prnn_tvm.verify import emulator
from prnn_tvm.verify.split import run_split, shared_problems

H100 = gpu_spec("sm_90")
emulated_only = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def knobs(units: int, tile: int = 2, **more) -> dict:
    return dict(units_per_cta=units, k_split=4, rows_per_thread=2, batch_tile=tile, vec=2, barrier="tags", **more)


def split_layer(cell: str, hidden: int, batch: int, gpus: int, units: int, tile: int = 2, **more):
    return prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, arch="sm_90", tuning_logs=[],
                                 config=knobs(units, min(tile, batch), **more), devices=list(range(gpus)), cache=False)


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
@pytest.mark.parametrize(
    "cell, hidden, batch, gpus, units, chunks",
    [
        ("lstm", 12, 3, 2, 3, 1),  # one of a lane's two weight chunks in shared memory
        ("lstm", 12, 2, 4, 3, 2),  # every weight in shared memory, four GPUs
        ("gru", 10, 3, 2, 3, 1),  # the second GPU's last CTA half past hidden
    ],
)
def test_a_gpus_slice_with_weights_in_shared_memory(cell, hidden, batch, gpus, units, chunks):
    """The weight tiers (``smem_chunks``) in each GPU's run of CTAs: loaded once from the CTA's own rows (whose
    index counts from the run's ``cta_offset``), read every step, against the reference."""
    layer = split_layer(cell, hidden, batch, gpus, units, smem_chunks=chunks)
    assert layer.kernel.config.smem_chunks == chunks and layer.report.weight_smem_bytes > 0
    inputs = random_inputs(layer.plan, 4, 3)
    out, finals, words = run_split(layer, inputs)
    assert words == [0] * gpus
    err = max_abs_error(layer.plan, (out, finals), reference_layer(layer.plan, inputs))
    assert err <= tolerance("float32", 4), err


@emulated_only
def test_a_tile_polled_a_row_at_a_time(monkeypatch):
    """A wide layer polls its tile in chunks of batch rows (``PeerTags``): forced to one row per poll here."""
    monkeypatch.setattr(split, "poll_chunk", lambda g, cfg, plan, gpu, words: (1, 0))
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


def half_plan(hidden: int, batch: int):
    return analyze(resolve("lstm"), batch, hidden, "float16")


def test_a_slice_past_registers_keeps_weights_in_shared_memory():
    """LSTM fp16 hidden 4096 over four H100s: 254 KB of weights a CTA, past its registers. Each placement keeps part
    of them in shared memory, enough that a poll's row fits beside the rest, within the block's shared memory; the
    tiered fallbacks hold fewer registers each (ptxas decides which builds without spills)."""
    template = by_name("persistent_mma")
    placements = split.split_configs(None, half_plan(4096, 4), H100, 4, template.knobs.validate,
                                     template.knobs.ranked_configs)
    assert placements and all(p.config.smem_k_tiles > 0 and p.chunk_rows >= 1 for p in placements)
    whole = split.combined(H100, 4)
    for p in placements:
        g = template.knobs.validate(dataclasses.replace(p.config, barrier=split.UNPOLLED), half_plan(4096, 4), whole)
        assert g.smem_ws > 0 and g.smem_bytes + STATIC_SMEM_RESERVE <= H100.smem_per_block
        assert p.geometry.regs_estimate <= max_regs_per_thread(p.geometry.threads, H100)
    same = [p for p in placements if p.config.k_groups == placements[0].config.k_groups]
    assert len(same) > 1  # the fallbacks of the first config: more tiers, each lighter by SPILL_STEP_REGS or more
    for a, b in zip(same, same[1:]):
        assert b.config.smem_k_tiles > a.config.smem_k_tiles
        assert b.geometry.regs_estimate <= a.geometry.regs_estimate - split.SPILL_STEP_REGS


def test_a_slice_that_fits_registers_keeps_them_there():
    """LSTM fp16 hidden 2048 over two GPUs fits their registers: its first placement keeps every weight there (the
    tiers only where the poll does not fit beside them); a caller's config past registers gets the tiers it needs."""
    template = by_name("persistent_mma")
    plan = half_plan(2048, 8)
    first = split.split_configs(None, plan, H100, 2, template.knobs.validate, template.knobs.ranked_configs)[0]
    assert first.config.smem_k_tiles == 0
    given = mc.MmaConfig(8, 4, 1, smem_k_tiles=20)  # hidden 4096: the weights fit, a poll of single words finds no
    raised = split.split_configs(given, half_plan(4096, 4), H100, 4, template.knobs.validate,  # room beside them
                                 template.knobs.ranked_configs, words="single")
    assert raised[0].config.smem_k_tiles > 20 and raised[0].config.k_groups == 4
    packed = split.split_configs(given, half_plan(4096, 4), H100, 4, template.knobs.validate,
                                 template.knobs.ranked_configs, words="packed")
    assert packed[0].config.smem_k_tiles == 20  # a third of the words: its poll fits beside them


def test_a_layer_past_registers_and_shared_memory_is_refused():
    """LSTM fp16 8192 x 4 over two GPUs with single words: no poll of a row fits beside the weights any tier leaves
    (packed words' third of the registers does: their placement streams most weights from L2)."""
    with pytest.raises(ConfigError, match="no config of this layer splits over 2 GPUs"):
        prnn_tvm.compile_cell("lstm", 8192, 4, dtype="float16", arch="sm_90", devices=[0, 1], cache=False,
                              config={"words": "single"})


def test_tiered_half_split_stays_inside_its_shared_memory():
    """The tensor-core tiers (``smem_k_tiles``) in a GPU's run of CTAs, which the emulator does not run: every shared
    access of every thread inside the launch's allocation."""
    layer = prnn_tvm.compile_cell("lstm", 64, 4, dtype="float16", arch="sm_90", tuning_logs=[], devices=[0, 1],
                                  config=dict(units_per_cta=16, k_groups=2, n_tiles=1, smem_k_tiles=1), cache=False)
    assert layer.report.weight_smem_bytes > 0 and layer.kernel.config.smem_k_tiles == 1
    assert shared_problems(layer) == [], layer.report.format()


@pytest.mark.slow
@pytest.mark.parametrize("hidden, batch, gpus", [(2048, 8, 2), (1024, 8, 2), (4096, 4, 4)])
def test_the_half_layers_it_is_for_build_without_spills(hidden, batch, gpus):
    """LSTM fp16 hidden 2048 batch 8 does not fit one H100's registers (one GPU runs it with part of its weights in
    shared memory); split over two it builds with every weight in registers, each GPU a run of CTAs that ptxas
    reports without spills. Hidden 4096 over four keeps part of each CTA's weights in shared memory."""
    layer = prnn_tvm.compile_cell("lstm", hidden, batch, dtype="float16", arch="sm_90", devices=list(range(gpus)),
                                  cache=False)
    if layer.report.registers is None:
        pytest.skip(f"no ptxas report here: {layer.report.ptxas_note}")
    assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report.format()
    assert layer.ctas_per_gpu * gpus * layer.units_per_cta == hidden
    assert (layer.report.weight_smem_bytes > 0) == (hidden == 4096), layer.report.format()
    # every new state also goes to the peer, in the default words of that many GPUs
    packed = split.DEFAULT_WORDS == "packed" and gpus <= split.DEFAULT_WORDS_GPUS
    assert f"prnn_{'packed_store_peer' if packed else 'tag_store_peer<half>'}(" in layer.cuda_source


class _Launches:
    """Stands in for each GPU's ``Launcher`` (and TVM's streams) under a ``SplitLauncher``: records what happens."""

    def __init__(self, monkeypatch, layer, fail: int | None = None):
        from prnn_tvm.runtime import split_launch

        self.log = log = []

        class Launcher:
            max_steps = 100

            def __init__(self, part, function, arrays, device):
                self.part, self.arrays = part, arrays

            def __call__(self, data, stream):
                log.append(("launch", self.part.index, stream, len(data)))
                if self.part.index == fail:
                    raise LaunchError("refused")
                return [f"out of GPU {self.part.index}"]

        class Streams:
            get_raw_stream = staticmethod(lambda device: -1)
            use_raw_stream = staticmethod(lambda device, stream: contextlib.nullcontext())

        class Join:
            def join(self, streams):
                log.append(("join", tuple(streams)))

        def launch_state(part, stream, zeros=None):
            log.append(("state", part.index, stream))
            return {}

        monkeypatch.setattr(split_launch, "Launcher", Launcher)
        monkeypatch.setattr(split_launch, "tvm_ffi", Streams)
        monkeypatch.setattr(layer, "_enable_peers", lambda: setattr(layer, "join", Join()))
        monkeypatch.setattr(layer, "check", lambda wait=True: log.append(("check", wait)))
        for part in layer.parts:
            monkeypatch.setattr(part, "launch_state", launch_state.__get__(part))


def test_a_split_launcher_makes_every_workspace_then_launches_every_gpu_then_joins(monkeypatch):
    """``SplitLayer.launcher`` (what ``prnn_tvm.torch`` runs): an earlier timeout raised first, every GPU's workspace
    for its stream before any launch names its peers', every GPU launched with its arguments in the kernel's order
    before the streams are joined, nothing waited for; a chunked sequence and a refused launch say so (the GPUs
    launched before it left to time out, and the layer reset)."""
    layer = split_layer("lstm", 12, 3, 3, 2)
    launches = _Launches(monkeypatch, layer)
    arrays = [types.SimpleNamespace(zeros=None)] * 3  # the caller's array library (unused by the stand-ins)
    launcher = layer.launcher(arrays)
    assert launcher.names == ["xp", "W_hh", "b_hh", "h0", "c0", "lengths"]
    per_gpu = [{name: np.zeros((5, 3, 8)) for name in launcher.names} for _ in range(3)]
    outputs = launcher(per_gpu, [10, 11, 12])
    assert outputs == [[f"out of GPU {g}"] for g in range(3)]
    assert launches.log == [("check", False), *(("state", g, 10 + g) for g in range(3)),
                            *(("launch", g, 10 + g, 6) for g in range(3)), ("join", (10, 11, 12))]
    assert all(part.launched for part in layer.parts)
    with pytest.raises(InputError, match="shorter pieces"):
        launcher([{"xp": np.zeros((101, 3, 8))}] * 3, [10, 11, 12])
    with pytest.raises(InputError, match="2 array libraries given for a layer split over 3 GPUs"):
        layer.launcher(arrays[:2])
    failing = _Launches(monkeypatch, layer, fail=1)
    with pytest.raises(LaunchError, match="refused"):
        layer.launcher(arrays)(per_gpu, [10, 11, 12])
    assert [e for e in failing.log if e[0] in ("launch", "check", "join")] == [
        ("check", False), ("launch", 0, 10, 6), ("launch", 1, 11, 6), ("check", True)]


@pytest.mark.parametrize("k_groups, tiers", [(2, 15), (4, 16)])
def test_fewer_bigger_ctas_a_gpu_with_the_one_gpu_layers_weight_tiers_are_accepted(k_groups, tiers):
    """LSTM fp16 2048 x 8 over two GPUs with the one-GPU layer's 16 units a CTA (64 CTAs a GPU, each polling the
    state: half the default's 128) and part of the weights in shared memory, as ``bench/split.py --config`` passes
    it: placed, its tiers raised until a poll's batch row fits beside the weights in registers."""
    plan, template = half_plan(2048, 8), by_name("persistent_mma")
    ladder = split.split_configs(mc.MmaConfig(16, k_groups, smem_k_tiles=tiers), plan, H100, 2,
                                 template.knobs.validate, template.knobs.ranked_configs)
    first = ladder[0]
    assert first.config.units_per_cta == 16 and first.geometry.ctas == 2 * 64
    assert first.config.barrier == "tags" and first.config.smem_k_tiles >= tiers and first.chunk_rows >= 1
    assert first.geometry.regs_estimate <= max_regs_per_thread(first.geometry.threads, H100)

"""Sums over units exchanged by atomics (the templates' knob ``atomic_sums``, ``schedules/persistent_sums.py``): the
blocks add their partials into R accumulators before each sums barrier, a total is R loads after it, block 0 zeroes
the next step's parity and the last block out of a launch zeroes them all. The float32 kernels as emitted, run on the
host (``prnn_tvm.verify.emulator``) against the float64 reference; the knob's validation, space, records and
features; the tensor-core kernel through ptxas. GPU runs: ``test_gpu_unit_sums.py``."""

import dataclasses
import math
import random

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules.persistent_sums import ATOMIC_SUMS, accumulator_words
from prnn_tvm.signature import ArgRole
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify import emulator

from .test_emulated import knobs

SM90 = gpu_spec("sm_90")
needs_emulator = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def launched(layer, inputs: dict, state: dict | None = None) -> emulator.Emulated:
    """``layer``'s recurrent launch emulated on ``inputs``, on the workspace and barrier state ``state`` (by argument
    name; default: zeros, as the runtime makes them)."""
    launch = layer.signature.launch("recurrent")
    seq_len = int(np.shape(inputs["x"])[0])
    given = {**inputs, "xp": emulator.projection(inputs, launch.arg("xp").dtype), **(state or {})}
    arrays = emulator.launch_arrays(launch, given, seq_len)
    scalars = {"seq_len": seq_len, "timeout_us": emulator.TIMEOUT_US, "stall_step": -1}
    return emulator.emulate(layer.cuda_source, launch, arrays, scalars)


def error(layer, run, inputs) -> float:
    launch = layer.signature.launch("recurrent")
    written = [a.name for a in launch.args if a.role in (ArgRole.OUTPUT, ArgRole.FINAL)]
    got = (run.buffers[written[0]], [run.buffers[name] for name in written[1:]])
    return max_abs_error(layer.plan, got, reference_layer(layer.plan, inputs))


def accumulators(layer, workspace: np.ndarray) -> np.ndarray:
    """The words of ``workspace`` (float32 bits) the atomic sums use: after the operands' slots, the accumulators of
    both parities and the count of blocks that left."""
    plan = layer.plan
    words = workspace.reshape(-1).view(np.uint32)
    first = max(1, len(plan.operands)) * math.prod(workspace.shape[1:])
    return words[first : first + accumulator_words(plan, plan.batch, layer.report.config["atomic_sums"])]


def build(hidden, batch, config, cell="lstm_layernorm", arch="sm_90", **options):
    return prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, target="cuda", arch=arch, tuning_logs=[],
                                 config=config, **options)


@needs_emulator
@pytest.mark.parametrize(
    "hidden, batch, seq_len, config",
    [
        (10, 3, 5, knobs(4, 4, 3, 2, atomic_sums=1)),  # a half-empty last block; every step's parity both ways
        (10, 3, 5, knobs(4, 4, 3, 2, barrier="grid_sync", atomic_sums=2)),
        (13, 1, 5, knobs(4, 4, 2, 1, atomic_sums=4)),  # a prime hidden size (a block of one unit), batch 1
        (13, 2, 1, knobs(3, 8, 2, 2, barrier="grid_sync", atomic_sums=8)),  # one step; more replicas than blocks
        (1, 2, 4, knobs(1, 1, 1, 2, vec=1, atomic_sums=2)),  # hidden 1: one block, one unit
        (7, 4, 6, knobs(2, 2, 4, 4, vec=1, barrier="grid_sync", atomic_sums=4)),  # 4 blocks over 4 replicas
    ],
)
def test_atomic_sums_match_the_reference_and_leave_the_accumulators_zero(hidden, batch, seq_len, config):
    """The kernel as emitted against the float64 reference (input 3 wide, ragged lengths), and after the launch every
    accumulator and the count zero again, so that a second launch on the same workspace gives the same outputs."""
    layer = build(hidden, batch, config)
    inputs = random_inputs(layer.plan, seq_len, 3, seed=hidden)
    inputs["lengths"] = random_lengths(batch, seq_len, seed=hidden + 1)
    first = launched(layer, inputs)
    assert first.error_word == 0
    assert error(layer, first, inputs) <= tolerance("float32", seq_len)
    assert not accumulators(layer, first.buffers["workspace"]).any()
    kept = {name: first.buffers[name] for name in ("workspace", "sync") if name in first.buffers}  # grid_sync: no sync
    again = launched(layer, inputs, kept)
    assert error(layer, again, inputs) <= tolerance("float32", seq_len)


@needs_emulator
def test_a_second_cell_that_sums_over_units_and_the_space_at_random():
    """Random valid configs of the float32 space that take atomic sums, for the layer-normalized LSTM and for a
    cell whose sums meet in one phase (the RMS-normalized RNN of ``test_unit_sums``)."""
    from .test_unit_sums import RMS

    rng = random.Random(49)
    for cell, hidden, batch in (("lstm_layernorm", 11, 2), (RMS, 9, 3)):
        plan = prnn_tvm.analyze(prnn_tvm.resolve(cell) if isinstance(cell, str) else cell, batch, hidden)
        valid = []
        for cfg in pc.space(plan, SM90):
            if cfg.atomic_sums and cfg.barrier in ("counter", "grid_sync"):
                try:
                    pc.validate(cfg, plan, SM90)
                except ConfigError:
                    continue
                valid.append(cfg)
        for cfg in rng.sample(valid, 2):
            layer = build(hidden, batch, cfg.as_dict(), cell=cell)
            inputs = random_inputs(layer.plan, 4, 3, seed=batch)
            run = launched(layer, inputs)
            assert error(layer, run, inputs) <= tolerance("float32", 4), cfg
            assert not accumulators(layer, run.buffers["workspace"]).any(), cfg


def test_the_kernel_adds_by_atomics_only_with_the_knob():
    """``atomic_sums=0`` (the config's field default) emits the blocks' partials as before; R > 0 an atomic add a sum
    and the clear at the launch's end, and reads R replicas per total (no lane groups' shuffles)."""
    plain, atomic = (build(8, 2, knobs(4, 4, 2, 2, atomic_sums=R)).cuda_source for R in (0, 4))
    assert "atomicAdd" not in plain and "prnn_sums_clear" not in plain and "__shfl_xor_sync" in plain
    kernel = atomic[atomic.index(" recurrent_kernel(") :]
    assert kernel.count("atomicAdd(") == 2  # the gates' sums, the cell state's
    assert kernel.count("prnn_sums_clear(") == 1


def test_the_knob_is_validated_with_its_reason():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_layernorm"), 2, 8)
    with pytest.raises(ConfigError, match="atomic_sums=3: must be one of 0, 1, 2, 4, 8"):
        pc.validate(pc.PersistentConfig(4, 4, 2, 2, barrier="counter", atomic_sums=3), plan, SM90)
    lstm = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 2, 8)
    with pytest.raises(ConfigError, match="sums over no units: use atomic_sums=0"):
        pc.validate(pc.PersistentConfig(4, 4, 2, 2, barrier="counter", atomic_sums=2), lstm, SM90)
    half = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 8, 64, "float16")
    with pytest.raises(ConfigError, match="atomic_sums=1 adds the blocks' partial sums"):
        mc.validate(mc.MmaConfig(16, 2, barrier="grid_sync", atomic_sums=1), half, SM90)


@pytest.mark.parametrize("module, dtype", [(pc, "float32"), (mc, "float16")])
def test_the_space_records_and_features_know_the_knob(module, dtype):
    """Offered where the cell sums over units (every value), absent elsewhere; a record's dict names it only where it
    is not 0 (configs and records from before the knob stay as they were) and reads back; a cost-model feature."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_layernorm"), 8, 256, dtype)
    assert {c.atomic_sums for c in module.space(plan, SM90)} == set(ATOMIC_SUMS)
    plain = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 8, 256, dtype)
    assert {c.atomic_sums for c in module.space(plain, SM90)} == {0}
    default = module.ranked_configs(plan, SM90, limit=1)[0]
    # the half template's default: one accumulator (measured faster); the float32 template's: the partials
    assert default.atomic_sums == (mc.SUMS_ATOMICS if module is mc else 0)
    assert "atomic_sums" not in dataclasses.replace(default, atomic_sums=0).as_dict()
    atomic = dataclasses.replace(default, atomic_sums=4)
    assert atomic.as_dict()["atomic_sums"] == 4
    template = prnn_tvm.schedules.by_name("persistent_cuda" if module is pc else "persistent_mma")
    assert template.config_from_dict(atomic.as_dict()) == atomic
    assert module.features(atomic, plan, SM90)["atomic_sums"] == 4
    assert module.features(dataclasses.replace(default, atomic_sums=0), plan, SM90)["atomic_sums"] == 0


@pytest.mark.parametrize("replicas", [1, 8])
def test_the_tensor_core_kernel_with_atomic_sums_compiles_without_spills(replicas):
    """lstm_layernorm 1024 x 8 fp16 at its default config with atomic sums: ptxas (sm_90) places it without spills
    and in no more registers than the cap."""
    config = {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "grid_sync", "atomic_sums": replicas}
    layer = build(1024, 8, config, dtype="float16")
    assert layer.report.spill_bytes == 0, layer.report.format()
    assert layer.report.registers <= 255

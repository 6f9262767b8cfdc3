"""The tensor-core template's ``poll_sleep`` (nanoseconds between the polls of a data-carried exchange), without
a GPU: where it is refused, what the space offers, the code it makes. On the GPU: ``test_gpu_poll_sleep.py``."""

import dataclasses
import re
import shutil
import subprocess

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec

from .test_batch_groups import plan_of

SM90 = gpu_spec("sm_90")


@pytest.mark.parametrize(
    "cfg, why",
    [
        (mc.MmaConfig(16, 1, 1, "sentinel", poll_sleep=100), "poll_sleep=100: must be one of 0, 256, 512"),
        (
            mc.MmaConfig(16, 1, 1, "counter", poll_sleep=256),
            "poll_sleep=256 paces the polls .* 'counter' does not poll",
        ),
        (mc.MmaConfig(16, 1, 1, "grid_sync", poll_sleep=512), "'grid_sync' does not poll values"),
    ],
)
def test_poll_sleep_is_refused_with_the_reason(cfg, why):
    with pytest.raises(ConfigError, match=why):
        mc.validate(cfg, plan_of(batch=16), SM90)


@pytest.mark.parametrize("batch, sleeps", [(16, {0, 256, 512}), (8, {0, 256, 512}), (4, {0}), (1, {0})])
def test_the_space_offers_a_sleep_to_data_carried_exchanges_of_at_least_eight_rows(batch, sleeps):
    space = mc.space(plan_of(batch=batch), SM90)
    assert {c.poll_sleep for c in space} == sleeps
    slept = [c for c in space if c.poll_sleep]
    assert all(c.barrier in ("tags", "sentinel") and batch // c.batch_groups >= mc.SLEEP_MIN_ROWS for c in slept)
    # every other knob combination is offered with each sleep
    assert len({dataclasses.replace(c, poll_sleep=0) for c in slept}) * (len(sleeps) - 1) == len(slept)


def test_the_cost_model_sees_the_sleep():
    features = mc.features(mc.MmaConfig(16, 1, 1, "sentinel", poll_sleep=512), plan_of(batch=16), SM90)
    assert features["poll_sleep"] == 512


def _ptx(source: str) -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    proc = subprocess.run(
        [nvcc, "-ptx", "-arch=sm_90", "-std=c++17", "-x", "cu", "-", "-o", "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


@pytest.mark.parametrize(
    "barrier, copy",
    [("sentinel", r"prnn_sentinel_copy<[^>]*, (\d+), \d+>\("), ("tags", r"prnn_tag_copy<[^>]*, (\d+)>\(")],
)
@pytest.mark.parametrize("sleep", [0, 512])
def test_a_sleeping_poll_sleeps_between_polls_only(barrier, copy, sleep):
    """The poll's sleep template argument (nanoseconds: the last, the sentinel's last but one, before its count
    of sources), and the PTX holds a ``nanosleep`` only where it is set; the kernel still has no spills."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        256,
        16,
        dtype="float16",
        target="cuda",
        arch="sm_90",
        config={
            "units_per_cta": 16,
            "k_groups": 2,
            "n_tiles": 1,
            "barrier": barrier,
            "batch_groups": 2,
            "poll_sleep": sleep,
        },
    )
    calls = re.findall(copy, layer.cuda_source)
    assert calls and set(calls) == {str(sleep)}
    assert layer.report.spill_bytes == 0
    assert layer.report.config.get("poll_sleep", 0) == sleep  # quiet: records without it read as 0
    assert ("nanosleep.u32" in _ptx(layer.cuda_source)) == bool(sleep)


def test_the_training_forward_of_a_sleeping_sentinel_layer_runs_counter_without_a_sleep():
    plan = plan_of(batch=16)
    saving = mc.saving_config(mc.MmaConfig(16, 1, 1, "sentinel", batch_groups=2, poll_sleep=256), plan, SM90)
    assert (saving.barrier, saving.batch_groups, saving.poll_sleep) == ("counter", 1, 0)
    tags = mc.saving_config(mc.MmaConfig(16, 1, 1, "tags", poll_sleep=256), plan, SM90)
    assert (tags.barrier, tags.poll_sleep) == ("tags", 256)  # tags poll in the training forward too

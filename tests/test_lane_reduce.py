"""The float32 template's lane reduction (``RegisterWeights.lane_reduce``): recursive halving over the
``k_split`` lanes of a row, each total stored by one lane (``held_value``). The first test checks the halving
plan and ``held_value`` over many sizes against a lane-by-lane model; the emitted shuffles themselves run in
``test_emulated.py::test_every_lane_reduction_as_emitted`` (the CUDA source on the host), where a kernel that keeps
the half it should send fails."""

from __future__ import annotations

import types

import numpy as np
import pytest
from tvm import tirx
from tvm.sym import Analyzer

import prnn_tvm
from prnn_tvm.schedules.persistent_weights import (
    RegisterWeights,
    halving_levels,
    held_after_halving,
    lane_shuffles,
)


def halves(acc: list[float], level) -> tuple[list[float], list[float]]:
    """The sums a lane keeps or sends at a halving level: the lower and upper half, the upper one padded with a
    zero where the lane held an odd number."""
    return acc[: level.half], acc[level.half : level.held] + [0.0] * (2 * level.half - level.held)


def reduce_like_the_kernel(parts: np.ndarray) -> list[list[float]]:
    """What each lane's accumulators hold after ``lane_reduce``, lane by lane as the emitted code runs:
    ``parts[lane, value]`` are the lanes' partial sums."""
    k_split, values = parts.shape
    acc = [list(row) for row in parts]
    for level in halving_levels(values, k_split):
        before = [list(a) for a in acc]
        for lane in range(k_split):
            partner = lane ^ level.offset
            if level.half is None:
                acc[lane][0] = before[lane][0] + before[partner][0]
                continue
            low, high = halves(before[lane], level)
            p_low, p_high = halves(before[partner], level)
            upper = bool(lane & level.offset)
            kept, received = (high, p_high) if upper else (low, p_low)  # the partner sends the half it drops
            acc[lane] = [k + r for k, r in zip(kept, received)]
    return acc


@pytest.mark.parametrize("k_split", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("values", [1, 2, 3, 5, 6, 7, 12, 16, 24, 33, 64])
def test_every_total_is_stored_once_by_a_lane_that_holds_it(values, k_split):
    parts = np.random.default_rng(values * 64 + k_split).standard_normal((k_split, values))
    acc = reduce_like_the_kernel(parts)
    an, stored = Analyzer(), {}
    for lane in range(k_split):
        builder = types.SimpleNamespace(
            ks=tirx.const(lane, "int32"), c=types.SimpleNamespace(rows_per_thread=values, batch_tile=1, k_split=k_split)
        )
        for slot in range(held_after_halving(values, k_split)):
            index, stores = RegisterWeights.held_value(builder, slot)
            if bool(an.simplify(stores)):
                index = int(an.simplify(index))
                assert index not in stored, f"value {index} stored twice"
                stored[index] = acc[lane][slot]
    assert sorted(stored) == list(range(values))
    np.testing.assert_allclose([stored[i] for i in range(values)], parts.sum(axis=0), rtol=1e-12, atol=1e-12)


def test_each_level_shuffles_half_of_what_the_one_before_did():
    # LSTM 1024x4's record: 4 rows x 4 batch rows over 32 lanes, 8 + 4 + 2 + 1 + 1 (an all-reduce: 16 x 5 = 80)
    assert lane_shuffles(16, 32) == 16
    assert [level.half for level in halving_levels(16, 32)] == [8, 4, 2, 1, None]
    assert lane_shuffles(1, 32) == 5  # one value: an all-reduce
    assert lane_shuffles(6, 4) == 3 + 2 and held_after_halving(6, 4) == 2  # more values than lanes
    assert lane_shuffles(5, 1) == 0 and held_after_halving(5, 1) == 5


def test_the_kernel_issues_the_halving_shuffles():
    layer = prnn_tvm.compile_cell(
        "lstm",
        1024,
        4,
        target="cuda",
        arch="sm_90",
        tuning_logs=[],
        config=dict(units_per_cta=8, k_split=32, rows_per_thread=4, batch_tile=4, vec=4, barrier="sentinel"),
    )
    assert layer.report.spill_store_bytes == 0
    assert layer.cuda_source.count("__shfl_xor_sync") == lane_shuffles(16, 32)

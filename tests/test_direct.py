"""The tensor-core template's ``operand_path="direct"`` (each lane polls its B fragments from the output sequence
into registers) and the sentinel's freshness check, without a GPU: where it is refused and why, what the space
offers, the column order the lanes load, the code it makes. On the GPU: ``test_gpu_direct.py``."""

import re

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.codegen.barriers.source import cuda_source
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import streamed_tier
from prnn_tvm.target import gpu_spec

from .test_batch_groups import plan_of
from .test_ptxas import kernel_source, time_loops

SM90 = gpu_spec("sm_90")


@pytest.mark.parametrize(
    "cfg, plan, why",
    [
        (
            mc.MmaConfig(16, 1, 1, "counter", operand_path="direct"),
            plan_of(),
            "only the 'sentinel' exchange writes a slot per step of; not 'counter'",
        ),
        (
            mc.MmaConfig(16, 1, 1, "sentinel", operand_path="ldmatrix"),
            plan_of(),
            "operand_path 'ldmatrix' unknown; available: shared, direct",
        ),
        (
            mc.MmaConfig(16, 2, 1, "sentinel", operand_path="direct"),
            plan_of("lstm_x2"),
            "one exchanged state; cell 'lstm_x2' multiplies l0_h, l1_h",
        ),
        (
            mc.MmaConfig(16, 2, 1, "sentinel", operand_path="direct"),
            plan_of(hidden=100),
            "hidden=100 is not a multiple of 8",
        ),
        (
            mc.MmaConfig(16, 1, 2, "sentinel", operand_path="direct"),
            plan_of(hidden=1024),
            r"polls 64 loads per lane \(2 batch tiles x 64 k tiles of 16\); at most 32",
        ),
    ],
)
def test_direct_fragments_are_refused_with_the_reason(cfg, plan, why):
    with pytest.raises(ConfigError, match=why):
        mc.validate(cfg, plan, SM90)


@pytest.mark.parametrize(
    "cell, hidden, offered",
    [("lstm", 256, True), ("gru", 1024, True), ("lstm", 100, False), ("lstm_x2", 256, False), ("gru_cho", 256, False)],
)
def test_the_space_offers_direct_fragments_with_the_sentinel_exchange_only(cell, hidden, offered):
    space = mc.space(plan_of(cell, hidden), SM90)
    direct = [c for c in space if c.direct]
    assert bool(direct) == offered
    assert all(c.barrier == "sentinel" for c in direct)
    assert {c.__class__(**{**c.as_dict(), "operand_path": "shared"}) for c in direct} <= set(space)  # each a twin
    assert not any(c.direct for c in mc.ranked_configs(plan_of(cell, hidden), SM90))  # a tuning choice only
    assert (
        mc.features(mc.MmaConfig(16, 2, 1, "sentinel", operand_path="direct"), plan_of(), SM90)["operand_path=direct"]
        == 1.0
    )


def test_the_training_forward_loads_whole_tiles():
    """It exchanges through its barrier-separated workspace (``counter``), which direct fragments cannot poll."""
    saving = mc.saving_config(
        mc.MmaConfig(16, 8, 1, "sentinel", m_tiles_per_warp=4, operand_path="direct"), plan_of(), SM90
    )
    assert (saving.barrier, saving.operand_path) == ("counter", "shared")


@pytest.mark.parametrize("k_tiles", range(1, 17))
def test_the_lanes_load_every_column_of_their_warp_once_in_whole_contiguous_loads(k_tiles):
    """``direct_k`` is a bijection of the warp's ``16 * k_tiles`` columns; each of a lane's loads holds ``v``
    consecutive columns (the fragments of ``v / 4`` k tiles, in order), and the four lanes of a batch row load
    side by side: one load instruction of a warp reads ``4v`` consecutive columns of each row."""
    width, loads = streamed_tier.direct_loads(k_tiles)
    v = width // 2
    columns = {(q, kt, j): streamed_tier.direct_k(q, kt, j, k_tiles)
               for q in range(4) for kt in range(k_tiles) for j in range(4)}
    assert sorted(columns.values()) == list(range(16 * k_tiles))
    assert loads * v == 4 * k_tiles
    for q in range(4):
        lane = [columns[q, kt, j] for kt in range(k_tiles) for j in range(4)]  # the lane's registers, in order
        for p in range(loads):
            assert lane[p * v : (p + 1) * v] == list(range(p * 4 * v + q * v, p * 4 * v + (q + 1) * v))


def test_a_direct_kernel_polls_its_fragments_and_runs_its_tiles_in_turn():
    """LSTM fp16 1024x16 in cuDNN's layout (16 units on 64 CTAs, every row tile in each of 8 warps, two tiles of 8
    rows): each lane polls 4 loads of 16 bytes per tile into registers (its initial state loaded once, not polled);
    no shared operand tile and no ``__syncthreads`` in the time loop: one block-wide OR per tile, whose pointwise
    math and publishing follow inside the tile loop; the partial sums alternate by step parity; no spills."""
    layer = prnn_tvm.compile_cell(
        "lstm",
        1024,
        16,
        dtype="float16",
        target="cuda",
        arch="sm_90",
        config=dict(
            units_per_cta=16, k_groups=8, m_tiles_per_warp=4, n_tiles=1, barrier="sentinel", operand_path="direct"
        ),
    )
    report = layer.report
    assert report.spill_bytes == 0 and (report.ctas, report.threads) == (64, 256), report.format()
    body = kernel_source(layer)
    start, end = time_loops(body)[-1]  # after the loop that fills the slots
    loop = body[start:end]
    assert "prnn_sentinel_frags<half, 1, 4, 16, 0, 1>(" in loop and "prnn_sentinel_frags<half, 1, 4, 16, 0, 0>(" in loop
    assert "prnn_sentinel_copy<" not in loop and "__syncthreads()" not in loop and "ldmatrix" not in loop
    assert loop.count("prnn_block_or(") == 1 and "(v_1 & 1)" in loop
    tiles = re.search(r"for \(int (v_\d+) = 0; \1 < 2; \+\+\1\) \{", loop)
    depth, i = 1, tiles.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(loop[i], 0)
        i += 1
    assert tiles.end() < loop.index("prnn_block_or(") < loop.index("prnn_sentinel_store<") < i  # within a tile


def test_the_sentinel_check_marks_exactly_the_values_of_all_bits_set():
    """``prnn_sentinel_marks``: its expression and the mask ``prnn_still_stale`` applies once per load (both read
    from the kernel source) mark a 32-bit word of two 16-bit values exactly where either is 0xffff (a NaN no store
    writes), over every 16-bit value in each half, and a 16-byte load exactly where one of its eight halves is,
    over loads of edge and random values (the marks of its four words or-ed, as the poll does)."""
    source = cuda_source("sentinel.cuh")
    expr = re.search(r"return (\(0xfffefffeu - w\) & w);", source).group(1)
    check = eval("lambda w: (" + re.sub(r"(0x[0-9a-f]+)u", r"\1", expr) + ") & 0xffffffff")  # noqa: S307
    half_bits = re.search(r"struct prnn_sentinel_bits<half> \{.*?\};", source, re.DOTALL).group(0)
    mask = int(re.search(r"marked = (0x[0-9a-f]+)u;", half_bits).group(1), 16)
    for h in range(1 << 16):
        for other in (0, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF):
            for w in ((other << 16) | h, (h << 16) | other):
                assert bool(check(w) & mask) == (h == 0xFFFF or other == 0xFFFF), hex(w)
    rng = np.random.default_rng(0)
    edges = np.array([0, 1, 0x7FFE, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF])
    for _ in range(5000):
        halves = np.where(rng.random(8) < 0.5, rng.choice(edges, 8), rng.integers(0, 1 << 16, 8))
        halves[rng.random(8) < 0.8] &= 0xFFFE  # most loads hold no sentinel
        words = [int(halves[2 * i]) | int(halves[2 * i + 1]) << 16 for i in range(4)]
        marks = check(words[0]) | check(words[1]) | check(words[2]) | check(words[3])
        assert bool(marks & mask) == bool((halves == 0xFFFF).any()), [hex(w) for w in words]

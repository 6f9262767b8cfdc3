"""Where each weight tier stops (``prnn_tvm.bench.tiers``, ``prnn-tvm bench --tiers``): from compile-time analysis, no
GPU. The timed sweep (``prnn-tvm bench --hidden max``) is a GPU run."""

import pytest

from prnn_tvm.bench import tiers
from prnn_tvm.target import gpu_spec

from . import cli_run

H100 = gpu_spec("sm_90")


def fake_place(edges: dict):
    """A ``placement`` whose tier changes at the hidden sizes ``edges`` (tier -> its last size), 2 bytes a weight."""

    def place(cell, hidden, batch, dtype, gpu):
        tier = next((t for t, last in sorted(edges.items()) if hidden <= last), None)
        return tiers.Placement(hidden, 2 * hidden * hidden, tier, hidden if tier and tier >= 2 else 0)

    return place


def test_bisection_finds_each_tier_s_last_size():
    place = fake_place({0: 1536, 1: 2048, 2: 3200, 3: 5000})
    edges = tiers.tier_edges("lstm", "float16", 4, H100, top=8192, place=place)
    assert [e.hidden for e in edges] == [1536, 2048, 3200, 4992]  # multiples of 128
    assert [e.weight_bytes for e in edges] == [2 * h * h for h in (1536, 2048, 3200, 4992)]
    assert edges[2].streamed == 3200 and edges[0].streamed == 0
    assert [e.capacity for e in edges] == tiers.capacities(H100)
    assert tiers.capacities(H100)[:3] == [132 * 4 * 65536, 132 * (4 * 65536 + 228 * 1024),
                                          132 * (4 * 65536 + 228 * 1024) + 50 * 1024 * 1024]
    assert not any(e.beyond for e in edges)


def test_a_tier_never_taken_and_one_past_the_range():
    edges = tiers.tier_edges("rnn_tanh", "float32", 4, H100, top=1024, place=fake_place({0: 256, 2: 10**6}))
    assert [e.hidden for e in edges] == [256, None, 1024, None]
    assert edges[2].beyond
    table = tiers.markdown(edges)
    assert "| + shared memory | none |" in table and "1024+ (range end)" in table
    timed = tiers.markdown(edges, [dict(cell="rnn_tanh", dtype="float32", hidden=1024, batch=4, seq_len=100,
                                        status="ok", prnn_layer_ms=1.0, cudnn_ms=3.0)])
    lines = timed.splitlines()[2:]
    assert lines[2].endswith("| 10.00 | 30.00 |") and all(line.endswith("| - | - |") for line in lines[:2] + lines[3:])


def test_lstm_half_on_the_h100():
    """The untuned configs' tiers (no build): registers stop below the shared tier, which stops below the streamed
    one; LSTM fp16 4096 (134 MB of weights) streams from DRAM, its streamed bytes those of the config it compiles."""
    edges = tiers.tier_edges("lstm", "float16", 4, H100, top=4096)
    registers, shared, l2, dram = edges
    assert registers.hidden < shared.hidden < l2.hidden < dram.hidden == 4096
    assert registers.weight_bytes <= registers.capacity and shared.weight_bytes <= shared.capacity
    assert l2.streamed <= H100.l2_bytes < dram.streamed
    p = tiers.placement("lstm", 4096, 4, "float16", H100)
    assert p.tier == 3 and p.weight_bytes == 4 * 4096 * 4096 * 2 and p.streamed == dram.streamed


def test_cli_prints_the_tiers_without_a_gpu(monkeypatch):
    monkeypatch.setattr(tiers, "placement", fake_place({0: 512, 1: 768, 2: 1024, 3: 1536}))
    result = cli_run.run_cli("bench", "--tiers", "--arch", "sm_90", "--cells", "lstm", "--dtype", "float16",
                             "--batch", "1", "4")
    assert result.returncode == 0, result.stderr
    assert "where each weight tier stops on sm_90 at batch 4" in result.stdout
    assert "| lstm | float16 | 4 | + L2 (streamed) | 1024 |" in result.stdout


def test_cli_tiers_refuses_what_it_does_not_use():
    result = cli_run.run_cli("bench", "--tiers", "--arch", "sm_90", "--hidden", "256")
    assert result.returncode != 0 and "--tiers finds the hidden sizes itself" in result.stdout + result.stderr


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_known_gpu_has_its_l2(arch):
    assert gpu_spec(arch).l2_bytes >= 40 * 1024 * 1024

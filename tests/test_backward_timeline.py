"""The backward's timeline (``prnn_tvm.bench.backward_timeline``, ``bench/backward_timeline.py``): its rewrite of the
generated backward still finds its anchors and compiles for sm_90 (no GPU needed), leaves other kernels alone,
refuses a backward it cannot read, and its summary measures what it says; on the GPU, the stamps of a run through
the torch module are in program order."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import compiler
from prnn_tvm.bench import backward_timeline as bt
from prnn_tvm.codegen import build
from prnn_tvm.compiler import compile_training
from prnn_tvm.schedules import backward_kernel
from prnn_tvm.schedules import backward_mma_config as bc


@pytest.mark.parametrize(
    "cell, hidden, dtype, change, copy",
    [
        ("lstm", 128, "float16", {"copy_stages": 2, "cluster": 1}, "prnn_cp_async_wait_group<1>();"),  # staged
        ("lstm", 128, "float16", {"copy_stages": 0, "cluster": 1}, "prnn_cp_async_wait_all();"),  # the block's
        ("lstm", 128, "float16", {"copy_stages": 0, "cluster": 2}, "copy_abort = prnn_cluster_wait("),  # clusters
        ("lstm", 128, "float16", {"copy_stages": 1, "cluster": 2}, "    prnn_cluster_wait_warp("),  # a warp's own
        ("rnn_tanh", 37, "bfloat16", {"copy_stages": 2}, "prnn_sync_warp();"),  # odd gate rows: plain loads
        ("lstm", 128, "float32", None, None),  # the float32 backward: plain loads, issue and wait one stamp
    ],
)
def test_the_rewrite_applies_and_compiles(cell, hidden, dtype, change, copy, monkeypatch):
    layer = prnn_tvm.compile_cell(cell, hidden, 16, dtype=dtype, arch="sm_90", tuning_logs=[])
    if change is not None:  # the ranked config with that copy
        cfg = dataclasses.replace(bc.ranked_configs(layer.plan, layer.gpu)[0], **change)
        monkeypatch.setattr(compiler, "gpu_backward", lambda plan, gpu: iter([backward_kernel(plan, gpu, cfg)]))
    sources = []

    def keep(code):
        sources.append(bt.instrument(code))
        return sources[-1]

    with build.rewriting_sources(keep):
        report = compile_training(layer).report
    source = next(s for s in sources if "recurrent_backward_kernel(" in s)
    assert f"__shared__ unsigned long long prnn_btl[{bt.STEPS * bt.SLOTS}];" in source
    for slot in range(bt.SLOTS):  # each slot stamped once per step
        assert source.count(f"prnn_btl[v * {bt.SLOTS} + {slot}] = ") == 1, slot
    assert "((unsigned long long*)d_xp_ptr)[blockIdx.x * " in source
    if copy:  # the copy's issue stamped before its wait
        assert source.index(f"prnn_btl[v * {bt.SLOTS} + 3]") < source.index(copy)
    backward = next(line for line in report.splitlines() if line.startswith("recurrent_backward"))
    assert " 0 spill bytes" in backward, report


def test_sources_without_the_backward_are_unchanged_and_moved_anchors_refused():
    other = 'extern "C" __global__ void __launch_bounds__(128, 1) recurrent_kernel(float* x) {\n}\n'
    assert bt.instrument(other) == other
    broken = other.replace("recurrent_kernel", "recurrent_backward_kernel")
    with pytest.raises(ValueError, match="dynamic shared buffer"):
        bt.instrument(broken)


def test_the_summary_measures_each_phase():
    """Stamps 10 ns apart per phase but the barrier (100 ns) and the products (40 ns), at 1 GHz; block 1 arrives
    at the barrier 30 ns after block 0."""
    steps, blocks = bt.STEPS, 2
    stamps = np.zeros((blocks, steps, bt.SLOTS), np.int64)
    gaps = [10, 100, 10, 10, 40, 10]  # the six phases, the last up to the next step's start
    start = np.arange(steps) * sum(gaps)
    for b in range(blocks):
        clocks = start + 30 * b
        for slot, gap in enumerate(gaps[:5]):
            stamps[b, :, slot] = clocks
            clocks = clocks + (gap if slot != 1 else gap - 30 * b)  # every block leaves the barrier at once
        stamps[b, :, 5] = clocks
        stamps[b, :, 6], stamps[b, :, 7], stamps[b, :, 8] = stamps[b, :, 0], stamps[b, :, 1], stamps[b, :, 2]
        stamps[b, :, 9] = 7 + b
    lines = bt.summary(stamps)
    assert lines[0].startswith(f"step {sum(gaps)} ns") and "clock 1.00 GHz" in lines[0]
    phases = dict(zip(bt.PHASES, lines[1:7]))
    assert phases["products"].split()[1] == "40"
    assert phases["copy issue"].split()[2] == "10"
    assert "arrivals spread 30 ns" in lines[7]
    assert lines[8].startswith("latest arrivals") and "block 1 on SM 8" in lines[8]


@pytest.mark.gpu
def test_the_stamps_of_a_run_are_in_program_order():
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import case, step
    from prnn_tvm.target import gpu_spec

    seq = 64
    ref, x, hx = case("LSTM", 128, 16, torch.float16, seq)
    with bt.capturing() as kept:
        fast = pt.from_torch(ref)
        step(fast, x, hx)
        torch.cuda.synchronize()
    stamps = kept[-1][:, :seq]
    c = [stamps[..., i] for i in range(6)]
    assert all((a <= b).all() for a, b in zip(c, c[1:]))
    assert (np.diff(c[0], axis=1) > 0).all()  # each step after the one before
    assert ((0 <= stamps[..., 9]) & (stamps[..., 9] < gpu_spec().sms)).all()
    assert len(bt.summary(stamps)) == 9

"""The backward without its copy of the gate gradients (``prnn_tvm.bench.backward_no_copy``,
``bench/backward_timeline.py --no-copy``, timing only): the rewrite removes every copy and wait it names and
nothing else, after the timeline's stamps, compiles for sm_90 without spills (no GPU needed), refuses a copy by
plain loads; on the GPU the step runs to its end with its copy phases shorter than the copying kernel's."""

import dataclasses
import re

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import compiler
from prnn_tvm.bench import backward_timeline as bt
from prnn_tvm.bench.backward_no_copy import without_copy
from prnn_tvm.codegen import build
from prnn_tvm.compiler import compile_training
from prnn_tvm.schedules import backward_kernel
from prnn_tvm.schedules import backward_mma_config as bc

COPY = ("prnn_cp_async", "prnn_cluster_copy", "prnn_cluster_wait", "prnn_mbar_arm")


def built_sources(layer, change, monkeypatch) -> tuple[str, str]:
    """The backward's source as compiled (stamped, then without its copy) and ptxas's report line for it, with the
    first ranked config changed by ``change``."""
    cfg = dataclasses.replace(bc.ranked_configs(layer.plan, layer.gpu)[0], **change)
    monkeypatch.setattr(compiler, "gpu_backward", lambda plan, gpu: iter([backward_kernel(plan, gpu, cfg)]))
    sources = []

    def keep(code):
        sources.append(code)
        return code

    with build.rewriting_sources(bt.instrument), build.rewriting_sources(without_copy), build.rewriting_sources(keep):
        report = compile_training(layer).report
    source = next(s for s in sources if "recurrent_backward_kernel(" in s)
    return source, next(line for line in report.splitlines() if line.startswith("recurrent_backward"))


@pytest.mark.parametrize("change", [{"cluster": 8, "copy_stages": 0}, {"cluster": 4, "copy_stages": 1},
                                    {"cluster": 1, "copy_stages": 2}, {"cluster": 1, "copy_stages": 0}])
def test_the_copy_and_its_waits_are_gone_and_the_rest_compiles(change, monkeypatch):
    layer = prnn_tvm.compile_cell("lstm", 128, 16, dtype="float16", arch="sm_90", tuning_logs=[])
    source, report = built_sources(layer, change, monkeypatch)
    kernel = re.search(bt.KERNEL, source, re.M).end()
    start = source.index("for (int v = 0; v < seq_len; ++v) {", kernel)
    loop = source[start : source.index("int barrier_error = ", start)]
    assert not [name for name in COPY if name in loop], loop
    assert ("int copy_abort = 0;" in loop) == (change == {"cluster": 8, "copy_stages": 0})
    for slot in range(bt.SLOTS):  # the timeline's stamps stay, each once per step
        assert loop.count(f"prnn_btl[v * {bt.SLOTS} + {slot}] = ") == 1, slot
    assert "mma.sync" in loop and "prnn_barrier_counter(" in loop  # the products and the grid barrier stay
    assert " 0 spill bytes" in report, report


def test_plain_loads_are_refused_and_other_kernels_left_alone(monkeypatch):
    other = 'extern "C" __global__ void __launch_bounds__(128, 1) recurrent_kernel(float* x) {\n}\n'
    assert without_copy(other) == other
    layer = prnn_tvm.compile_cell("rnn_tanh", 37, 16, dtype="bfloat16", arch="sm_90", tuning_logs=[])
    with pytest.raises(ValueError, match="plain loads.*even number of gate rows x hidden"):
        built_sources(layer, {}, monkeypatch)


@pytest.mark.gpu
def test_the_step_without_the_copy_runs_and_its_copy_phases_shrink():
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import case, step

    seq = 64
    ref, x, hx = case("LSTM", 1024, 16, torch.float16, seq)
    copy_ns = []
    for rewrite in (lambda code: code, without_copy):
        with bt.capturing() as kept, build.rewriting_sources(rewrite):
            fast = pt.from_torch(ref)
            for _ in range(2):
                step(fast, x, hx)
            torch.cuda.synchronize()
        stamps = kept[-1][:, :seq]
        assert (np.diff(stamps[..., 0], axis=1) > 0).all()  # every step ran, one after another
        copy_ns.append(float(np.median(stamps[..., 4] - stamps[..., 2])))  # the copy's issue and wait
    assert copy_ns[1] < copy_ns[0], copy_ns

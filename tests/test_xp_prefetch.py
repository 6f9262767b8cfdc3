"""The input projection asked into L2 two steps ahead (``PersistentBuilder.inputs_prefetched``): in the tensor-core
kernels that load a step's projection at its top, one ``prefetch.global.L2`` per word a thread will read, guarded
by the sequence's end; not where the projection is loaded a step early (``block``), nor in a session kernel (no
projection), nor in the float32 template. Numerics on the GPU: ``test_gpu_half.py``."""

import re

import pytest

import prnn_tvm
from prnn_tvm.compiler import compile_session
from prnn_tvm.verify import ptx

from .test_ptxas import kernel_source, time_loops

# LSTM float16 1024x16's tuned config, where the prefetch was measured (docs/findings.md)
TUNED = dict(units_per_cta=16, k_groups=4, n_tiles=1, barrier="sentinel", m_tiles_per_warp=2, batch_groups=2)
PREFETCH = "prnn_prefetch_l2("


def build(cell, hidden, batch, dtype="float16", config=None):
    return prnn_tvm.compile_cell(
        cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config, tuning_logs=[]
    )


def test_a_tensor_core_step_asks_its_projection_two_steps_on_into_l2():
    layer = build("lstm", 1024, 16, config=TUNED)
    assert layer.report.spill_bytes == 0, layer.report.format()
    body = kernel_source(layer)
    start, end = next((s, e) for s, e in time_loops(body) if PREFETCH in body[s:e])  # the steps' loop
    loop = body[start:end]
    step = re.match(r"for \(int (v\w*) = 0; \1 < seq_len;", loop).group(1)
    guard = loop.index(f"if (({step} + 2) < seq_len) {{")
    calls = re.findall(r"prnn_prefetch_l2\(\(&\(xp_ptr\[(.*)\]\)\)\);", loop)
    assert body.count(PREFETCH) == len(calls) == 4  # one item a thread, one word (and line) of each gate
    # each the address the step two on loads: this step's gate column plus two steps of B x 4H words
    loads = re.findall(r"= xp_ptr\[(.*)\];", loop)[:4]
    step_words = 16 * 4 * 1024
    offsets = [int(re.search(r"\+ (\d+)\)$", c).group(1)) for c in calls]
    gate_offsets = [0] + [int(re.search(r"\+ (\d+)\)$", ld).group(1)) for ld in loads[1:]]
    assert offsets == [2 * step_words + g for g in gate_offsets], (offsets, gate_offsets)
    assert guard < loop.index(PREFETCH) < loop.index("= xp_ptr[")  # issued before this step's own loads
    assert "prefetch.global.L2 [%0];" in layer.cuda_source and ptx.PREFETCH.search(layer.cuda_source)


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, config",
    [
        ("lstm", 256, 4, "float32", None),  # the float32 template: unmeasured, left as it was
        ("lstm_h12", 768, 16, "bfloat16", None),  # block: the projection already loaded a step early
    ],
)
def test_kernels_without_the_prefetch(cell, hidden, batch, dtype, config):
    layer = build(cell, hidden, batch, dtype, config)
    assert "xp" in [a.name for a in layer.kernel.launch.args]
    assert PREFETCH not in layer.cuda_source


def test_a_session_kernel_has_no_projection_to_prefetch():
    layer = build("lstm", 640, 8)
    assert PREFETCH in kernel_source(layer)  # the layer's own kernel has it
    assert PREFETCH not in compile_session(layer).source

"""The input projection asked into L2 ahead of its load: in the tensor-core kernels that load a step's projection at
its top, two steps on, one ``prefetch.global.L2`` per word a thread will read (``PersistentBuilder.inputs_prefetched``),
guarded by the sequence's end; where it is loaded a step or two early (``block``), ``XP_PREFETCH_EARLY_STEPS`` on from
the loaded step, one ``cp.async.bulk.prefetch.L2`` per contiguous segment of the CTA's projection, each by a thread of
its own (``prefetch_segments``); not in a session kernel (no projection), nor in the float32 template. Numerics on the
GPU: ``test_gpu_half.py``."""

import re

import pytest

import prnn_tvm
from prnn_tvm.compiler import compile_session
from prnn_tvm.schedules.persistent_mma import _MmaBuilder
from prnn_tvm.verify import ptx

from .test_ptxas import kernel_source, time_loops

# LSTM float16 1024x16's tuned config, where the prefetch was measured (docs/findings.md)
TUNED = dict(units_per_cta=16, k_groups=4, n_tiles=1, barrier="sentinel", m_tiles_per_warp=2, batch_groups=2)
PREFETCH = "prnn_prefetch_l2("
BULK = "prnn_prefetch_l2_bulk("
# lstm_h48 bfloat16 768x16's tuned config (a head of 16 units a CTA, 8 batch rows a group), and lstm_h12's
HEADS48 = dict(units_per_cta=16, k_groups=1, n_tiles=1, barrier="block", m_tiles_per_warp=2, batch_groups=2,
               gate_layout="in_warp", xp="half")
HEADS12 = dict(HEADS48, units_per_cta=64, batch_groups=16)


def build(cell, hidden, batch, dtype="float16", config=None, cache=True):
    """``cache=False`` where a test changes the builder's class settings (the layer cache's key knows nothing of
    them)."""
    return prnn_tvm.compile_cell(
        cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config, tuning_logs=[], cache=cache
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


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 256, 4), ("lstm_h12", 768, 16)])  # grid-wide and block
def test_kernels_without_the_prefetch(cell, hidden, batch):
    layer = build(cell, hidden, batch, "float32")  # the float32 template: unmeasured, left as it was
    assert "xp" in [a.name for a in layer.kernel.launch.args]
    assert PREFETCH not in layer.cuda_source and BULK not in layer.cuda_source


def test_a_block_kernel_asks_its_segments_of_the_projection_into_l2():
    """lstm_h48: each CTA's 8 rows x 4 gates of 16 units (32 bytes of bfloat16), one bulk prefetch each by threads
    0-31, of the step ``XP_PREFETCH_EARLY_STEPS`` on from the one whose loads follow (two steps on in the loop)."""
    layer = build("lstm_h48", 768, 16, "bfloat16", HEADS48)
    assert layer.report.spill_bytes == 0, layer.report.format()
    body, ahead = kernel_source(layer), _MmaBuilder.XP_PREFETCH_EARLY_STEPS
    assert ahead > 0 and PREFETCH not in body  # by segment, not by word
    start, end = time_loops(body)[0]
    loop = body[start:end]
    step = re.match(r"for \(int (v\w*) = 0; \1 < seq_len;", loop).group(1)
    calls = re.findall(r"prnn_prefetch_l2_bulk\(\(&\(xp_ptr\[(.*)\]\)\), (\d+)\);", loop)
    assert len(calls) == 1 and calls[0][1] == "32", calls  # one call a thread, 16 units x 2 bytes
    at = loop.index(BULK)
    guard = loop.rindex(f"if (({step} + {2 + ahead}) < seq_len) {{", 0, at)  # past the steps: none
    first = loop.rindex(f"if (({step} + 2) < seq_len)", 0, at)
    assert first < guard < loop.rindex("if (((int)threadIdx.x) < 32) {", 0, at)
    # thread tx: row tx / 4 of the group (3072 columns a row), gate tx % 4 (768 a gate), the CTA's head of 16 units,
    # 2 + ahead steps of 16 rows on
    index = calls[0][0].replace(" ", "")
    for term in ("(((int)threadIdx.x)*768)", "((((int)blockIdx.x)%48)*16)", "((((int)blockIdx.x)/48)*24576)",
                 f"+{(2 + ahead) * 16 * 3072})"):
        assert term in index, (term, index)
    assert body.count(BULK) == 3  # the prologue's loads of steps 0 and 1 too
    assert "cp.async.bulk.prefetch.L2.global [%0], %1;" in layer.cuda_source
    emulated = ptx.translate('"cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(lo), "r"(size)')
    assert emulated == "(void)(lo); (void)(size);"  # nothing on the host


def test_the_early_prefetch_by_segment_off_and_by_word(monkeypatch):
    """``XP_PREFETCH_EARLY_STEPS = 0``: the block kernel's source as before the prefetch; ``XP_PREFETCH_EARLY_BY =
    "word"``: each thread's words instead; ``XP_PREFETCH_EARLY_AT = "barrier"``: one call, after the step's barrier."""
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_STEPS", 0)
    off = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False).cuda_source
    assert PREFETCH not in off and BULK not in off
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_STEPS", 3)
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BY", "word")
    words = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False).cuda_source
    assert PREFETCH in words and BULK not in words
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BY", "segment")
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_AT", "barrier")
    layer = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False)
    body = kernel_source(layer)
    assert body.count(BULK) == 1 and PREFETCH not in body and layer.report.spill_bytes == 0
    loop = body[slice(*time_loops(body)[0])]
    assert loop.index("__syncthreads()") < loop.index(BULK)  # after the step's block barrier


def test_a_session_kernel_has_no_projection_to_prefetch():
    layer = build("lstm", 640, 8)
    assert PREFETCH in kernel_source(layer)  # the layer's own kernel has it
    assert PREFETCH not in compile_session(layer).source

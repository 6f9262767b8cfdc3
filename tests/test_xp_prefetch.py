"""The input projection asked into L2 ahead of its load: in the tensor-core kernels that load a step's projection at
its top, two steps on, one ``prefetch.global.L2`` per word a thread will read (``PersistentBuilder.inputs_prefetched``),
guarded by the sequence's end; where it is loaded a step or two early (``block``), ``XP_PREFETCH_EARLY_STEPS`` on from
the loaded step, by warp 0, a lane a sector of the CTA's projection (``persistent_xp_sectors``); not in a session
kernel (no projection), nor in the float32 template. Numerics on the GPU: ``test_gpu_half.py``."""

import re

import pytest

import prnn_tvm
from prnn_tvm.codegen.prefetch import lines_covering
from prnn_tvm.compiler import compile_session
from prnn_tvm.schedules.persistent_mma import _MmaBuilder
from prnn_tvm.verify import ptx

from .test_ptxas import TIME_LOOP, kernel_source, loop_steps, steps_a_turn, time_loops

# LSTM float16 1024x16's tuned config, where the prefetch was measured (docs/findings.md)
TUNED = dict(units_per_cta=16, k_groups=4, n_tiles=1, barrier="sentinel", m_tiles_per_warp=2, batch_groups=2)
PREFETCH = "prnn_prefetch_l2("
# lstm_h48 bfloat16 768x16's tuned config (a head of 16 units a CTA, 8 batch rows a group), and lstm_h12's
HEADS48 = dict(units_per_cta=16, k_groups=1, n_tiles=1, barrier="block", m_tiles_per_warp=2, batch_groups=2,
               gate_layout="in_warp", xp="half")
HEADS12 = dict(HEADS48, units_per_cta=64, batch_groups=16)
SLSTM12 = dict(HEADS48, units_per_cta=64)  # slstm_h12's: 8 rows a group


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
    assert PREFETCH not in layer.cuda_source


def early_prefetch(layer):
    """The time loop of a block kernel's source, its first step where a turn of it runs two (the projection's
    register banks taking turns), and the address indices of its prefetches there, each with the guard of its warp's
    lanes."""
    body = kernel_source(layer)
    loop = loop_steps(body[slice(*time_loops(body)[0])])[0]
    lanes = r"if \(\(\(int\)threadIdx\.x\) < (\d+)\) \{\s*"
    calls = re.findall(lanes + r"prnn_prefetch_l2\(\(&\(xp_ptr\[(.*)\]\)\)\);", loop)
    return loop, [(int(lanes), index.replace(" ", "")) for lanes, index in calls]


def test_a_block_kernel_asks_its_projection_into_l2_from_one_warp():
    """lstm_h48: each CTA's 8 rows x 4 gates of 16 units (32 bytes of bfloat16, a sector each), one prefetch from each
    lane of warp 0, after the step's barrier, of the step ``XP_PREFETCH_EARLY_STEPS`` on from the one loaded before it
    (two steps on): one line or sector a segment, whichever of the two a lane asks for."""
    layer = build("lstm_h48", 768, 16, "bfloat16", HEADS48)
    assert layer.report.spill_bytes == 0, layer.report.format()
    ahead = _MmaBuilder.XP_PREFETCH_EARLY_STEPS
    assert ahead > 0 and _MmaBuilder.XP_PREFETCH_EARLY_AT == "barrier" and _MmaBuilder.XP_PREFETCH_EARLY_BYTES >= 32
    loop, calls = early_prefetch(layer)
    assert loop.count(PREFETCH) == len(calls) == 1 and calls[0][0] == 32, calls  # one warp instruction a step
    step = TIME_LOOP.match(loop)
    step = step[1] if step[2] == "seq_len" else f"({step[1]} * 2)"  # a turn's first step
    at = loop.index(PREFETCH)
    assert loop.rindex("__syncthreads()", 0, at) < loop.rindex(f"if (({step} + {2 + ahead}) < seq_len) {{", 0, at)
    # lane i: row i / 4 of the group (3072 columns a row), gate i % 4 (768 a gate): i * 768; the CTA's head of 16
    # units, 2 + ahead steps of 16 rows on
    for term in ("(((int)threadIdx.x)*768)", "((((int)blockIdx.x)%48)*16)", "((((int)blockIdx.x)/48)*24576)",
                 f"+{(2 + ahead) * 16 * 3072})"):
        assert term in calls[0][1], (term, calls[0][1])


@pytest.mark.parametrize("nbytes, warps, turns, lanes",
                         [(32, 1, 4, 32), (128, 1, 1, 32), (32, 2, 2, 64), (32, 8, 1, 128)])
def test_more_sectors_than_lanes_take_turns(monkeypatch, nbytes, warps, turns, lanes):
    """slstm_h12: 8 rows x 4 gates of 64 units (128 bytes): 128 sectors, four turns of warp 0, or 32 lines, or two
    turns of two warps, or one of the CTA's four warps (no more than it has)."""
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BYTES", nbytes)
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_WARPS", warps)
    layer = build("slstm_h12", 768, 16, "bfloat16", SLSTM12, cache=False)
    assert layer.report.spill_bytes == 0, layer.report.format()
    _, calls = early_prefetch(layer)
    assert [n for n, _ in calls] == [lanes] * turns, calls
    if turns > 1:  # turn k: sectors 32k on, 4 a segment: 8 segments, two rows of 4 gates (4 x 768 columns a row)
        assert all("((((int)threadIdx.x)&3)*16)" in index for _, index in calls), calls  # 16 units a sector
        ends = [int(re.search(r"\+(\d+)\)$", index).group(1)) for _, index in calls]
        assert [end - ends[0] for end in ends] == [k * 6144 * lanes // 32 for k in range(turns)], ends


def test_the_lines_a_segment_touches():
    """A run of bytes starting at a multiple of its alignment: the most lines it touches."""
    assert lines_covering(128, 128, 32) == 4 and lines_covering(64, 64, 128) == 1 and lines_covering(32, 32, 32) == 1
    assert lines_covering(32, 16, 32) == 2 and lines_covering(40, 40, 32) == 2 and lines_covering(40, 8, 128) == 2
    assert lines_covering(80, 80, 32) == 3 and lines_covering(256, 2, 128) == 3


def test_segments_off_the_sectors(monkeypatch):
    """lstm_h12 at hidden 240 (heads of 20 units, 40 bytes at multiples of 40 bytes): two sectors a segment, 8 rows x
    4 gates of them in two turns of warp 0; lstm_h15 at hidden 120 (CTAs of 16 units at multiples of 16 bytes, the
    last of 8 units): two sectors a segment, the second clamped to the CTA's last unit."""
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BYTES", 32)
    layer = build("lstm_h12", 240, 16, "bfloat16", cache=False)
    assert layer.report.config["units_per_cta"] == 20 and layer.report.config["batch_groups"] == 2
    _, calls = early_prefetch(layer)
    assert [n for n, _ in calls] == [32, 32] and all("((((int)threadIdx.x)&1)*16)" in i for _, i in calls), calls
    ends = [int(re.search(r"\+(\d+)\)$", index).group(1)) for _, index in calls]
    assert ends[1] - ends[0] == 4 * 960, ends  # the second turn: rows 4-7 of the group
    _, calls = early_prefetch(build("lstm_h15", 120, 16, "bfloat16", HEADS48, cache=False))
    assert [n for n, _ in calls] == [32, 32], calls
    clamp = "min(((((int)threadIdx.x)&1)*16),(min(16,(120-((((int)blockIdx.x)&7)*16)))-1))"
    assert all(clamp in index for _, index in calls), calls


def test_the_early_prefetch_off_by_word_and_with_the_loads(monkeypatch):
    """``XP_PREFETCH_EARLY_STEPS = 0``: the block kernel's source as before the prefetch; ``XP_PREFETCH_EARLY_BY =
    "word"``: each thread's words instead; ``XP_PREFETCH_EARLY_AT = "load"``: warp 0's with the loads of the
    projection, before the step's barrier (and with the prologue's)."""
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_STEPS", 0)
    off = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False).cuda_source
    assert PREFETCH not in off
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_STEPS", 3)
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BY", "word")
    words = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False)
    assert kernel_source(words).count(PREFETCH) > 3 and early_prefetch(words)[1] == []  # every thread's, unguarded
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BY", "sector")
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_AT", "load")
    monkeypatch.setattr(_MmaBuilder, "XP_PREFETCH_EARLY_BYTES", 32)
    layer = build("lstm_h12", 768, 16, "bfloat16", HEADS12, cache=False)
    body = kernel_source(layer)
    # each step's of the loop (two a turn where the banks take turns) and the prologue's two
    assert body.count(PREFETCH) == steps_a_turn(body) + 2 and layer.report.spill_bytes == 0
    loop, calls = early_prefetch(layer)
    assert [n for n, _ in calls] == [16], calls  # one row x 4 gates x 4 sectors of 64 units' 128 bytes
    assert loop.index(PREFETCH) < loop.index("__syncthreads()")


def test_a_session_kernel_has_no_projection_to_prefetch():
    layer = build("lstm", 640, 8)
    assert PREFETCH in kernel_source(layer)  # the layer's own kernel has it
    assert PREFETCH not in compile_session(layer).source

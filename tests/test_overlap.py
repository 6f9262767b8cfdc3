"""The input projection beside the recurrence (``prnn_tvm.torch.overlap``, ``schedules/xp_ready.py``) without a GPU:
the chunk plan, where it applies, the kernel's flag wait and its bound in the generated source, the runtime's own call
waiting for nothing, the error a wait that gave up raises. The GPU's side: tests/test_gpu_overlap.py."""

import pytest

import prnn_tvm
from prnn_tvm.errors import BarrierTimeout, ConfigError
from prnn_tvm.signature import XP_READY_SCALARS
from prnn_tvm.xp_ready_build import compile_xp_ready

torch = pytest.importorskip("torch")
overlap = pytest.importorskip("prnn_tvm.torch.overlap")
import prnn_tvm.torch  # noqa: E402  (after torch's skip)


@pytest.mark.parametrize("steps", [16, 17, 100, 255, 256, 1000, 1024, 4099, 100_000])
def test_the_chunk_plan_covers_every_step_once(steps):
    plan = overlap.chunk_plan(steps)
    assert plan.chunk == max(overlap.MIN_CHUNK_STEPS, -(-steps // overlap.MAX_CHUNKS))
    # the pieces follow the first chunk without a gap, each as long as every step before it, the last cut at steps
    starts = [plan.chunk] + [stop for _, stop in plan.pieces[:-1]]
    assert [start for start, _ in plan.pieces] == starts
    assert plan.pieces[-1][1] == steps
    assert all(stop - start <= start for start, stop in plan.pieces)
    assert all(start % plan.chunk == 0 for start, _ in plan.pieces)  # a piece starts a chunk: the kernel's flag
    # every chunk k after the first is flagged (word 1 + k, after the epoch) by exactly one piece, within the words
    flagged = [w for start, stop in plan.pieces for w in range(overlap.FLAG_WORDS + 8)[plan.flags(start, stop)]]
    chunks = -(-steps // plan.chunk)
    assert flagged == [1 + k for k in range(1, chunks)]
    assert max(flagged) < overlap.FLAG_WORDS


@pytest.mark.parametrize("steps", [1, 2, 7, 15])
def test_a_sequence_of_one_chunk_does_not_overlap(steps):
    assert overlap.chunk_plan(steps) is None


@pytest.fixture(scope="module")
def heads():
    """LSTM 12 heads of 64, bfloat16, batch 16: the in_warp head-a-block kernel (source only, here)."""
    return prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype="bfloat16", target="cuda", arch="sm_90")


def test_the_heads_kernel_waits_for_each_chunk_with_a_bound(heads):
    """The variant built for the overlap waits; the layer's own kernel is as it was (no wait, ``xp`` restricted)."""
    waiting = compile_xp_ready(heads)
    names = [a.name for a in waiting.launch.args]
    assert names[-len(XP_READY_SCALARS) :] == list(XP_READY_SCALARS)
    assert [a.name for a in heads.signature.launch("recurrent").args] == names[: -len(XP_READY_SCALARS)]
    assert overlap.waiting_kernel(heads) is waiting.runtime and compile_xp_ready(heads) is waiting  # built once
    src = waiting.source
    kernel = src[src.index(f"void __launch_bounds__({heads.report.threads}, 1) recurrent_kernel(") :]
    # the wait beside the projection's loads: the prologue's step 0, its step 1 and every step's load two ahead
    assert kernel.count("prnn_xp_wait(xp_flags, xp_chunk, ") == 3, kernel[:2000]
    wait = src[src.index("__device__ __forceinline__ int prnn_xp_wait(") :]
    assert "%globaltimer" in wait and "1000ull * (unsigned long long)timeout_us" in wait  # bounded
    assert "*(volatile unsigned int*)error_host = 1u + (unsigned int)step" in wait  # reported to the host
    assert "ld.acquire.gpu" in wait
    # a wait that gave up: NaN chosen where the step reads its projection (a thread's items x 4 gate inputs),
    # never written over the registers the loads fill (ptxas then waited for each load right after issuing it: an FSEL
    # per register, 1.9x a step on the H200)
    lines = kernel.splitlines()
    nans = [i for i, line in enumerate(lines) if "2143289344" in line]  # 0x7FC00000
    inputs = 16 // heads.report.config.get("batch_warps", 1)  # a split's thread has its share of the items
    assert len(nans) == inputs and all("condval" in lines[i + 1] for i in nans), [lines[i + 1] for i in nans]
    params = kernel[: kernel.index(") {")]  # written by the side stream's GEMMs during the launch: no __restrict__
    assert "float* xp_ptr" in params and "__restrict__ xp_ptr" not in params
    assert "0 spill bytes" in waiting.report, waiting.report
    own = heads.cuda_source
    assert "prnn_xp_wait" not in own and "float* __restrict__ xp_ptr" in own  # the plain call's kernel: main's
    assert heads.report.spill_bytes == 0, heads.report.format()


def test_other_kernels_have_no_kernel_that_waits():
    """A grid-synchronized layer (heads of 256 at hidden 768, the default) and a dense one: no variant (the reason
    said), so the projection runs before their launch; their own kernels take no flags."""
    for cell in ("lstm_h3", "lstm"):
        layer = prnn_tvm.compile_cell(cell, 768, 16, dtype="bfloat16", target="cuda", arch="sm_90")
        names = {a.name for a in layer.signature.launch("recurrent").args}
        assert not names & set(XP_READY_SCALARS), (cell, layer.report.config)
        assert "prnn_xp_wait" not in layer.cuda_source
        with pytest.raises(ConfigError, match="runs before its launch"):
            compile_xp_ready(layer)
        assert overlap.waiting_kernel(layer) is None
        with pytest.raises(ConfigError, match="runs before its launch"):  # kept, not built again
            compile_xp_ready(layer)


def test_the_layers_own_call_waits_for_nothing():
    """Every layer passes the flags' scalars as 0 (a complete projection): its own call, an exported layer's."""
    layer = prnn_tvm.compile_cell("lstm_h2", 8, 2, target="llvm")
    layer.barrier_timeout_us = 1234
    scalars = layer.scalars()
    assert scalars["xp_flags"] == 0 and scalars["xp_error_host"] == 0 and scalars["xp_chunk"] == 0
    assert scalars["xp_timeout_us"] == 1234


def test_where_the_projection_overlaps(heads, monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(overlap, "_sm_count", lambda index: 132)
    assert overlap.overlaps(heads, 1024, cuda, True) == overlap.chunk_plan(1024)
    assert overlap.overlaps(heads, 1024, cuda, False) is None  # the module's switch
    assert overlap.overlaps(heads, 15, cuda, True) is None  # one chunk
    assert overlap.overlaps(heads, 1024, torch.device("cpu"), True) is None
    # buffers of 2^31 elements or more (16 x 3072 a step: 43691 steps) run as launches over pieces: projected first
    assert overlap.overlaps(heads, 43690, cuda, True) == overlap.chunk_plan(43690)
    assert overlap.overlaps(heads, 43691, cuda, True) is None
    monkeypatch.setattr(overlap, "_sm_count", lambda index: 23)  # 12 CTAs: more than half of the SMs
    assert overlap.overlaps(heads, 1024, cuda, True) is None


def test_a_wait_that_gave_up_raises_once_with_the_fix():
    class Word:
        value = 65

        def read(self):
            return self.value

        def clear(self):
            self.value = 0

    overlaps = overlap.Overlaps()
    overlaps._words[torch.device("cuda", 0)] = Word()
    with pytest.raises(BarrierTimeout, match=r"(?s)step 64.*overlap_projection = False"):
        overlaps.check("Recurrent", "50000 us")
    overlaps.check("Recurrent", "50000 us")  # cleared: the next call starts clean


def test_the_module_has_the_switch():
    module = prnn_tvm.torch.Recurrent("lstm_h2", 16, 16)
    assert module.overlap_projection is True
    assert isinstance(module._overlaps, overlap.Overlaps)

"""The head-a-block step's timeline (``prnn_tvm.bench.heads_timeline``, ``bench/heads_timeline.py``): its rewrite of
the in_warp kernel still finds its anchors and compiles for sm_90 without spills (no GPU needed), refuses a kernel it
cannot read, its summary reports what the spans hold; on the GPU, the spans of a run add up to the step."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.bench import heads_timeline as htl
from prnn_tvm.codegen import build


def instrumented(arch="sm_90", first=0):
    sources = []

    def keep(code):
        sources.append(htl.instrument(code, first) if "recurrent_kernel(" in code else code)
        return sources[-1]

    with build.rewriting_sources(keep), htl.one_step_a_turn():
        layer = prnn_tvm.compile_cell("lstm_h2", 128, 16, dtype="bfloat16", config=htl.IN_WARP, arch=arch)
    return layer, next(s for s in sources if "prnn_htl_t[" in s)


def test_the_rewrite_stamps_every_border_once_and_compiles_without_spills():
    layer, source = instrumented(first=3)
    for slot in range(len(htl.PHASES) + 1):
        assert source.count(f"prnn_htl_t[{slot}] = clock64();") == 1, slot
    body = source[source.index("for (int v = 0; v < seq_len; ++v) {") :]
    order = [body.index(f"prnn_htl_t[{slot}] = clock64();") for slot in range(len(htl.PHASES) + 1)]
    assert order == sorted(order)  # the borders in program order
    assert body.index("prnn_htl_t[1] = clock64();") < body.index('"mma.sync')  # the first fragment, then products
    assert "const int prnn_htl_first = 3;" in source
    assert f"__shared__ unsigned short prnn_htl[{htl.STEPS * 8 * len(htl.PHASES)}];" in source
    assert "((unsigned short*)xp_ptr)[blockIdx.x * " in source
    assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report


def test_a_kernel_without_its_anchors_is_refused_naming_the_anchor():
    kernel = 'extern "C" __global__ void __launch_bounds__(256, 1) recurrent_kernel(float* xp_ptr, int seq_len) {\n'
    with pytest.raises(ValueError, match="loop over the steps"):
        htl.instrument(kernel + "}\n")
    loop = kernel + "  for (int v = 0; v < seq_len; ++v) {\n    x = 1;\n  }\n}\n"
    with pytest.raises(ValueError, match="block barrier ending the step"):
        htl.instrument(loop)


def test_the_summary_reports_the_spans_and_the_clock():
    spans = np.zeros((2, htl.STEPS, 8, len(htl.PHASES)), dtype=np.int64)
    spans[..., 1] = 300  # products
    spans[..., 6] = 100  # barrier
    spans[:, :, 3, 6] = 500  # one warp waits longer at the barrier
    seq_len = 1000
    clocks = np.array([[0, 0, 2_000_000, 1_000_000]] * 2)  # 2 GHz, 1000 ns a step
    lines = htl.summary(spans, clocks, seq_len)
    assert lines[0].startswith("time loop 1000 ns per step at 2.00 GHz (2000 cycles)")
    products = next(line for line in lines if line.strip().startswith("products"))
    assert "300 cycles    150 ns" in products
    barrier = next(line for line in lines if line.strip().startswith("barrier"))
    assert "max    500" in barrier
    assert "3: 0 300 0 0 0 0 500" in lines[-1]


@pytest.mark.gpu
def test_the_spans_of_a_run_add_up_to_the_step():
    layer, _ = instrumented(arch=None, first=64)
    seq_len = 512
    spans, clocks = htl.run(layer, seq_len)
    assert spans.shape == (2, htl.STEPS, 8, len(htl.PHASES))
    per_ns = np.median((clocks[:, 2] - clocks[:, 0]) / (clocks[:, 3] - clocks[:, 1]))
    assert 0.5 < per_ns < 3.0  # a GPU's clock, in GHz
    step_cycles = np.median(clocks[:, 2] - clocks[:, 0]) / seq_len
    total = np.median(spans.sum(axis=-1))
    assert 0.8 * step_cycles < total < 1.05 * step_cycles, (total, step_cycles)  # the phases cover the step
    assert np.median(spans[..., 1]) > 0 and np.median(spans[..., 6]) > 0  # products and barrier take time


def test_a_block_of_16_warps_records_fewer_steps_and_its_one_tile_loads():
    """``batch_warps=2`` (512 threads, a warp's one batch tile read by two 32-bit loads, no ``ldmatrix``): 128 steps,
    so that the spans stay within the static shared memory, the first border after the second load."""
    config = dict(htl.IN_WARP, batch_warps=2)
    sources = []

    def keep(code):
        sources.append(htl.instrument(code) if "recurrent_kernel(" in code else code)
        return sources[-1]

    with build.rewriting_sources(keep), htl.one_step_a_turn():
        layer = prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype="bfloat16", config=config, arch="sm_90")
    source = next(s for s in sources if "prnn_htl_t[" in s)
    assert htl.steps_recorded(16) == 128 and htl.steps_recorded(8) == htl.STEPS
    assert f"__shared__ unsigned short prnn_htl[{128 * 16 * len(htl.PHASES)}];" in source
    border = source.index("prnn_htl_t[1] = clock64();")
    assert "prnn_ldmatrix_x4" not in source and "(_ptr_2 + 2) = *(" in source[border - 400 : border], source
    assert layer.report.spill_store_bytes == 0 and layer.report.threads == 512, layer.report

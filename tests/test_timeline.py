"""The timeline tool (``prnn_tvm.bench.timeline``, ``bench/timeline.py``): its rewrite of the generated CUDA still
finds its anchors and compiles, it refuses layers it cannot read, and its summary measures what it says."""

import numpy as np
import pytest

from prnn_tvm.bench import timeline

# 16 units on 8 warps with every row tile each, two batch tiles of 8 rows in turn, one item per thread
DIRECT = {
    "units_per_cta": 16,
    "k_groups": 8,
    "m_tiles_per_warp": 4,
    "n_tiles": 1,
    "barrier": "sentinel",
    "operand_path": "direct",
}


@pytest.mark.parametrize(
    "batch, knobs, tiles",
    [
        (16, {}, 2),  # direct fragments, two tiles in turn: stamps per tile
        (8, {}, 1),  # direct fragments, one tile: per step
        (8, {"operand_path": "shared"}, 1),  # the shared operand tile (prnn_sentinel_copy), one pass: per step
        (16, {"operand_path": "shared", "batch_groups": 2}, 1),
    ],
)  # two groups of one pass each
def test_the_rewrite_applies_and_compiles(batch, knobs, tiles):
    layer, g, stamped = timeline.instrumented_layer("lstm", 128, batch, "float16", {**DIRECT, **knobs}, arch="sm_90")
    source = layer.cuda_source
    assert stamped == tiles and g.items_per_thread == 1
    assert source.count("prnn_timeline_ns()") == 1 + 3  # defined; before the poll, after the barrier and the publish
    assert f"prnn_timeline[{timeline.STEPS * tiles * timeline.SLOTS}]" in source
    assert "threadIdx.x % 128 == 0" in source  # the first item of each 8 x 16 tile records it
    # ptxas read the rewritten kernel: the stamps' shared words are its static shared memory
    report = layer.report
    assert report.spill_bytes == 0 and report.static_smem_bytes >= 8 * timeline.STEPS * tiles * timeline.SLOTS, (
        report.format()
    )


@pytest.mark.parametrize(
    "dtype, knobs, why",
    [
        ("float16", {"operand_path": "shared"}, "more than one batch tile per pass"),  # two passes of 8 rows
        ("float16", {"barrier": "counter", "operand_path": "shared"}, "not the sentinel exchange"),
        ("float16", {"k_groups": 2}, "more than one item per thread"),  # 2 warps, 256 items
        ("float32", None, "not the tensor-core template"),
    ],
)
def test_layers_it_cannot_read_are_refused(dtype, knobs, why):
    with pytest.raises(ValueError, match=why):
        timeline.instrumented_layer("lstm", 128, 16, dtype, knobs and {**DIRECT, **knobs}, arch="sm_90")


def test_a_source_without_its_anchors_is_refused():
    with pytest.raises(ValueError, match="recurrent kernel"):
        timeline.instrument("__global__ void other() {}", 2, 128)


def test_the_summary_measures_skew_and_lateness():
    blocks, tiles = 4, 2
    t = np.arange(timeline.STEPS)[None, :, None]
    publish = 2000 * t + 1000 * np.arange(tiles)[None, None, :] + 10 * np.arange(blocks)[:, None, None]
    stamps = np.zeros((blocks, timeline.STEPS, tiles, timeline.SLOTS), np.int64)
    for slot, ns in enumerate((publish - 900, publish - 700, publish - 400, publish)):  # clocks at 2 GHz
        stamps[..., slot] = 2 * ns
    stamps[..., 4], stamps[..., 5], stamps[..., 6] = publish - 900, publish - 400, publish
    stamps[..., 7] = 100 + np.arange(blocks)[:, None, None]
    lines = timeline.summary(stamps)
    assert lines[0].startswith("step 2000 ns") and "clock 2.00 GHz" in lines[0]
    # the last block publishes 30 ns after the first; the next step's polls start 2000 - 900 - 30 + 10 * block ns after
    assert "poll 200, poll to block barrier 300, pointwise and publish 400; publish skew across blocks 30" in lines[1]
    assert "poll start - last publish 1085 (p10 1070); block barrier - last publish 1585" in lines[1]
    assert lines[3].startswith("latest publishers of tile 0") and "block 3 on SM 103 +15" in lines[3]
    two = timeline.summary(stamps, groups=2)  # blocks 0-1 and 2-3: 10 ns apart within each
    assert "publish skew across blocks 10" in two[1]


@pytest.mark.gpu
def test_the_stamps_of_a_run_are_ordered_in_every_block():
    """On the GPU: each (block, step, tile) stamped once, its stamps in program order, steps after one another,
    every block on an SM of this GPU."""
    from prnn_tvm.target import gpu_spec

    layer, g, tiles = timeline.instrumented_layer("lstm", 128, 16, "float16", DIRECT)
    stamps = timeline.run(layer, g, tiles)
    assert stamps.shape == (g.ctas, timeline.STEPS, 2, timeline.SLOTS)
    c0, c1, c2, c3, g0, g2, g3, sm = (stamps[..., i] for i in range(timeline.SLOTS))
    assert (c0 <= c1).all() and (c1 <= c2).all() and (c2 <= c3).all()
    assert (g0 <= g2).all() and (g2 <= g3).all() and (g0 > 0).all()
    assert (np.diff(g0[:, :, 0], axis=1) > 0).all()  # each step's first tile after the step before's
    assert ((0 <= sm) & (sm < gpu_spec().sms)).all()
    assert len(timeline.summary(stamps)) == 5


def test_a_source_rewrite_applies_within_its_block_only():
    """``codegen.build.rewriting_sources``, the hook the timeline builds through: the layer built inside the block
    compiles and keeps the rewritten source; one built after it (the block left by an exception) does not."""
    import prnn_tvm
    from prnn_tvm.codegen import build

    def mark(code):
        return code + "\n// rewritten\n"

    with pytest.raises(RuntimeError), build.rewriting_sources(mark):
        inside = prnn_tvm.compile_cell("lstm", 16, 2, dtype="float16", arch="sm_90", tuning_logs=[])
        raise RuntimeError("leave the block")
    after = prnn_tvm.compile_cell("lstm", 16, 2, dtype="float16", arch="sm_90", tuning_logs=[])
    assert inside.cuda_source.endswith("// rewritten\n") and "// rewritten" not in after.cuda_source
    assert inside.cuda_source.replace("\n// rewritten\n", "") == after.cuda_source

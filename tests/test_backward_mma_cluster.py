"""The tensor-core backward in thread-block clusters (``cluster``: ``schedules/cluster_copy.py``): the knob's
validation, the co-residency rule for clusters, the generated code (compiled here for sm_90 by nvcc; no GPU
needed). Its gradients need a GPU (``tests/test_gpu_backward_mma.py``)."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.compiler import build_functions
from prnn_tvm.schedules import backward_mma
from prnn_tvm.schedules import backward_mma_config as bc
from prnn_tvm.signature import Grid, Launch
from prnn_tvm.target import gpu_spec, resident_ctas

SM90 = gpu_spec("sm_90")


def layer_of(cell, hidden, batch, dtype="float16"):
    return prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])


def clustered(plan, gpu, cluster, **changes):
    """The first ranked config in clusters of ``cluster`` (the whole-tile wait they take), with ``changes``."""
    return dataclasses.replace(bc.ranked_configs(plan, gpu)[0], **{"cluster": cluster, "copy_stages": 0, **changes})


@pytest.mark.parametrize(
    "cell, hidden, batch, change, match",
    [
        ("lstm", 1024, 16, {"cluster": 3}, "cluster=3: one of 1, 2, 4, 8"),
        ("lstm", 1024, 16, {"copy_stages": 2}, "not in copy_stages=2; take 0 or 1"),
        ("lstm", 1024, 16, {"n_tiles": 1}, "whole batch.*take n_tiles=2"),  # two passes a phase
        ("lstm", 1024, 16, {"barrier": "grid_sync"}, "error word.*counter"),
        ("lstm", 1024, 16, {"units_per_cta": 8, "cluster": 8}, "16 clusters of 8 CTAs cannot be co-resident.*9 fit"),
        ("lstm", 136, 3, {"units_per_cta": 16}, "9 CTAs.*not whole clusters of 2; take units_per_cta in \\[17"),
        ("rnn_tanh", 37, 5, {"units_per_cta": 4}, "74 bytes.*16-byte granules"),  # odd gate rows: no bulk copy
    ],
)
def test_validate_refuses_clusters_it_cannot_place(cell, hidden, batch, change, match):
    layer = layer_of(cell, hidden, batch)
    cfg = clustered(layer.plan, layer.gpu, **{"cluster": 2, **change})
    with pytest.raises(ConfigError, match=match):
        bc.validate(cfg, layer.plan, layer.gpu)


def test_clusters_need_sm90():
    layer = layer_of("lstm", 128, 16)
    cfg = clustered(layer.plan, layer.gpu, 2)
    bc.validate(cfg, layer.plan, layer.gpu)
    with pytest.raises(ConfigError, match="need sm_90 or later, not sm_80; take cluster=1"):
        bc.validate(cfg, layer.plan, gpu_spec("sm_80"))


def test_resident_clusters_leave_slots_per_gpc():
    """132 SMs in up to 8 GPCs, one CTA each: each GPC may leave cluster - 1 slots unused; no clusters before sm_90."""
    one = dict(ctas=64, threads=256, dynamic_smem_bytes=139520, cooperative=True, registers=254)
    assert [resident_ctas(Grid(**one, cluster=c), SM90) for c in (1, 2, 4, 8)] == [132, 124, 108, 72]
    assert resident_ctas(Grid(**one, cluster=2), gpu_spec("sm_80")) == 0


def test_a_grid_in_clusters_reads_back_from_its_signature():
    """``cluster`` is written only where the grid has clusters: a signature without them reads as before."""
    plain = Grid(64, 256, 1024, True, registers=200)
    assert "cluster" not in plain.as_dict()
    for grid in (plain, dataclasses.replace(plain, cluster=4)):
        launch = Launch("recurrent_backward", (), grid)
        assert Launch.from_dict(launch.as_dict()).grid == grid


def test_the_space_offers_clusters():
    layer = layer_of("lstm", 1024, 16)
    space = bc.space(layer.plan, layer.gpu)
    assert {cfg.cluster for cfg in space} == {1, 2, 4, 8}
    assert {cfg.copy_stages for cfg in space if cfg.cluster > 1} == {0, 1}
    assert any(cfg.cluster > 1 for cfg in space if _valid(cfg, layer))


@pytest.mark.parametrize(
    "cell, hidden, batch, arch, copy",
    [
        ("lstm", 1024, 16, "sm_90", (8, 0)),  # 64 CTAs: 8 clusters of 8 (9 fit)
        ("gru", 512, 8, "sm_90", (8, 0)),
        ("lstm", 1536, 8, "sm_90", (4, 1)),  # 96 CTAs: 12 clusters of 8 do not fit, 24 of 4 do (27)
        ("lstm", 1024, 16, "sm_80", (1, 2)),  # no clusters before sm_90
        ("lstm", 1024, 64, "sm_90", (1, 2)),  # two batch tiles a pass: four passes a phase
        ("lstm", 136, 3, "sm_90", (1, 2)),  # 9 CTAs
    ],
)
def test_the_default_takes_the_largest_cluster_that_fits(cell, hidden, batch, arch, copy):
    """Every ranked config in clusters of 8 with the block's wait, else of 4 with each warp's, else none (the
    measured order: bench/results/training-clusters-h100.md); the rest of the config as ranked without them."""
    layer = layer_of(cell, hidden, batch)
    gpu = gpu_spec(arch)
    ranked = bc.ranked_configs(layer.plan, gpu)
    unclustered = [dataclasses.replace(cfg, cluster=1, copy_stages=2) for cfg in ranked]
    assert ranked == [bc.clustered(cfg, layer.plan, gpu) for cfg in unclustered]
    for cfg in ranked:
        assert (cfg.cluster, cfg.copy_stages) == copy, cfg


def _valid(cfg, layer) -> bool:
    try:
        bc.validate(cfg, layer.plan, layer.gpu)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hidden, batch, units", [(1024, 16, None), (136, 3, 17), (128, 3, 16)])  # 8 CTAs: 136, 128
def test_clusters_share_the_copy_without_spills(hidden, batch, units, dtype):
    """Cluster 1 is today's kernel (no multicast, no cluster); 2, 4 and 8: the launch in clusters (TVM's
    ``clusterCtaIdx.x`` thread tag, which its launcher turns into the cluster dimension), each CTA's bulk copies of
    its share multicast to the cluster after the proxy fence, the waits that can give up: the block's for the whole
    tile (copy_stages 0), or each warp's for its own columns (1, where a k group is one warp: one row tile a CTA, not
    at 136 / 17), and ptxas's figures without spills."""
    layer = layer_of("lstm", hidden, batch, dtype)
    plan, gpu = layer.plan, layer.gpu
    for cluster, stages in [(1, 0), *((c, s) for c in (2, 4, 8) for s in (0, 1))]:
        cfg = clustered(plan, gpu, cluster, copy_stages=stages, **({"units_per_cta": units} if units else {}))
        own = cluster > 1 and stages == 1 and bc.geometry(cfg, plan).warp_rows == 1
        assert own == (stages == 1 and hidden != 136), cfg
        kernel = backward_mma.backward_kernel(plan, gpu, cfg)
        assert kernel.launch.grid.cluster == cluster
        assert ("clusterCtaIdx.x" in kernel.func.script()) == (cluster > 1)
        built = build_functions({"recurrent_backward": kernel.func}, layer.target, gpu)
        fn = built.ptxas.function("recurrent_backward")
        assert fn.spills == 0, (cfg, fn)
        body = built.source.split("recurrent_backward_kernel(")[-1]
        assert ("multicast::cluster" in built.source) == (cluster > 1)
        assert ("fence.proxy.async.global" in built.source) == (cluster > 1)
        copies = body.count(f"prnn_cluster_copy<{cluster}>(")  # one a waited mbarrier with columns
        assert 1 <= copies <= cfg.k_groups if own else copies == (cluster > 1), (cfg, copies)
        assert body.count("prnn_cluster_wait(") == (cluster > 1 and not own)
        assert body.count("prnn_cluster_wait_warp(") == own
        assert body.count("prnn_mbar_init(") == (cfg.k_groups if own else cluster > 1)
        assert body.count("prnn_cluster_sync();") == 2 * (cluster > 1)  # after the mbarrier's init, before exit
        assert ("prnn_cp_async" in body) == (cluster == 1)


@pytest.mark.parametrize("cluster, stages", [(2, 1), (4, 1), (4, 0)])
@pytest.mark.parametrize("cell", ["rnn_tanh", "gru", "lstm"])
def test_small_layers_build_in_clusters(cell, cluster, stages):
    """64 x 8 (4 or 8 CTAs, k groups of 16 or 32 columns, some wholly in the padding): each mbarrier's copies are
    emitted with its columns as constants (symbolic ones made TVM's simplifier divide by zero in a pass), and build
    without spills."""
    layer = layer_of(cell, 64, 8)
    cfg = clustered(layer.plan, layer.gpu, cluster, copy_stages=stages)
    bc.validate(cfg, layer.plan, layer.gpu)
    kernel = backward_mma.backward_kernel(layer.plan, layer.gpu, cfg)
    built = build_functions({"recurrent_backward": kernel.func}, layer.target, layer.gpu)
    assert built.ptxas.function("recurrent_backward").spills == 0
    assert f"prnn_cluster_copy<{cluster}>(" in built.source

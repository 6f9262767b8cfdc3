"""How a split layer's step takes the hop (``schedules/split.py``, the split's knob ``hop``), on the CPU: the k tile
order of ``overlap`` (own GPU's units first), the generated polls (own columns before the product, each peer's
before its k tiles), every shared access inside the launch's allocation, and the refusals. The emulator does not run
the tensor-core template: the numerics of each hop against float64 are in ``test_gpu_split.py``."""

import itertools
import re

import pytest

import prnn_tvm
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import split
from prnn_tvm.verify.split import shared_problems


def half_split(hidden: int, batch: int, gpus: int, hop: str | None, **knobs):
    config = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, **knobs}
    if hop is not None:
        config["hop"] = hop
    return prnn_tvm.compile_cell("lstm", hidden, batch, dtype="float16", arch="sm_90", tuning_logs=[],
                                 devices=list(range(gpus)), config=config, cache=False)


def polls(source: str) -> list:
    """The tagged polls' template arguments: (per-thread loads, vec, row, row pad, sleep[, source row])."""
    return re.findall(r"prnn_tag_copy<half, ([0-9, ]+)>\(", source)


@pytest.mark.parametrize("gpus, k_groups, per_part", [(2, 2, 3), (2, 4, 1), (4, 2, 2), (4, 1, 5)])
def test_each_warp_takes_every_k_tile_once_its_own_gpus_first(gpus, k_groups, per_part):
    part = k_groups * per_part  # k tiles of one GPU's units
    for gpu in range(gpus):
        taken = [split.part_k_tile(kt, kg, gpu, gpus, per_part, k_groups)
                 for kg, kt in itertools.product(range(k_groups), range(gpus * per_part))]
        assert sorted(taken) == list(range(gpus * part))  # every k tile of the state, once
        for kg in range(k_groups):
            owners = [split.part_k_tile(kt, kg, gpu, gpus, per_part, k_groups) // part
                      for kt in range(gpus * per_part)]
            # a run of per_part k tiles per GPU: this one's first, then each next GPU's
            assert owners == [(gpu + kt // per_part) % gpus for kt in range(gpus * per_part)]


@pytest.mark.parametrize("hidden, batch, gpus, knobs", [
    (192, 5, 2, {}),  # 6 CTAs of 16 units a GPU: 96 units, 6 k tiles, 3 of each GPU's a warp
    (256, 3, 4, {}),  # 4 CTAs a GPU, 2 k tiles of each GPU's a warp
    (192, 11, 2, {}),  # two batch tiles (8 rows, then 3): each polled part by part
    (192, 5, 2, {"smem_k_tiles": 2}),  # the last two k tiles of a warp (the peer's) in shared memory
])
def test_overlap_polls_its_own_columns_then_each_peers(hidden, batch, gpus, knobs):
    layer = half_split(hidden, batch, gpus, None, **knobs)  # overlap: the default
    assert "hop overlapped" in layer.report.format()
    width = hidden // gpus
    sites = polls(layer.cuda_source)
    assert sites and all(s.split(", ")[2] == str(width) and s.split(", ")[-1] == str(hidden) for s in sites), sites
    assert len(set(re.findall(r"part(\d+)_column", layer.cuda_source))) == gpus  # its own, then each peer's
    assert layer.cuda_source.count("prnn_tag_store_peer<half>(") == gpus - 1
    assert shared_problems(layer) == [], layer.report.format()


def test_exposed_polls_the_whole_state_before_the_product():
    layer = half_split(192, 5, 2, "exposed")
    assert "hop exposed" in layer.report.format()
    sites = polls(layer.cuda_source)
    assert sites and all(s.split(", ")[2] == "192" and len(s.split(", ")) == 5 for s in sites), sites
    assert "part0_column" not in layer.cuda_source


def test_floor_keeps_every_load_and_store_local():
    """The floor's kernel is overlap's with each peer replaced by the GPU's own copy: the same polls and stores, none
    reaching a peer."""
    floor, overlap = (half_split(192, 5, 2, hop) for hop in ("floor", "overlap"))
    assert "hop floor" in floor.report.format()
    kernel = floor.cuda_source.split("recurrent_kernel(")[-1]
    assert "peer_workspace_0" not in kernel.split(") {", 1)[1]  # the peer's address is never used
    assert kernel.count("prnn_tag_store_peer<half>(") == overlap.cuda_source.split("recurrent_kernel(")[-1].count(
        "prnn_tag_store_peer<half>(")
    assert polls(floor.cuda_source) == polls(overlap.cuda_source)
    assert "part1_source" in kernel  # the peer's columns read from its own
    assert shared_problems(floor) == []


def test_a_layer_whose_gpus_are_not_whole_k_tiles_takes_the_hop_exposed():
    layer = half_split(96, 3, 2, None)  # 48 units a GPU: three k tiles, which two k groups do not share evenly
    assert "hop exposed" in layer.report.format() and "not whole k tiles" in layer.report.format()
    with pytest.raises(ConfigError, match="hop='floor' polls each peer's part from this GPU's own, which needs"):
        half_split(96, 3, 2, "floor")


def test_an_unknown_hop_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="hop='pull': one of overlap, exposed, floor"):
        half_split(192, 5, 2, "pull")


def test_the_split_knob_leaves_the_templates_config():
    assert split.split_knobs({"hop": "exposed"}) == (None, "exposed")
    assert split.split_knobs({"hop": "floor", "k_groups": 4}) == ({"k_groups": 4}, "floor")
    assert split.split_knobs({"k_groups": 4}) == ({"k_groups": 4}, None)
    assert split.split_knobs(None) == (None, None)
    assert split.split_hops(None) == ("overlap", "exposed") and split.split_hops("floor") == ("floor",)

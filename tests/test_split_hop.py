"""How a split layer's step takes the hop (``schedules/split.py``, the split's knob ``hop``), on the CPU: ``exposed``
(the default) is the split kernel as it was, and the timing floors keep its work on this GPU's own copy: the floor
every poll and store, ``floor_own`` its own GPU's columns' polls alone. The numerics against float64 and the
floors' runs are in ``test_gpu_split.py``."""

import logging
import re

import pytest

import prnn_tvm
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import split
from prnn_tvm.verify.split import shared_problems


def half_split(hidden: int, batch: int, gpus: int, hop: str | None, **knobs):
    config = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "words": "single", **knobs}  # packed: test_split_words
    if hop is not None:
        config["hop"] = hop
    return prnn_tvm.compile_cell("lstm", hidden, batch, dtype="float16", arch="sm_90", tuning_logs=[],
                                 devices=list(range(gpus)), config=config, cache=False)


def kernel_body(layer) -> str:
    """The recurrent kernel's body (its parameters and the device functions before it left out)."""
    return layer.cuda_source.split("recurrent_kernel(")[-1].split(") {", 1)[1]


def polls(layer) -> list:
    """The kernel's tagged polls' template arguments: (per-thread loads, vec, row, row pad, sleep[, source row])."""
    return re.findall(r"prnn_tag_copy<half, ([0-9, ]+)>\(", kernel_body(layer))


def test_exposed_is_the_default_and_polls_the_whole_state_before_the_product():
    layer, named = half_split(192, 5, 2, None), half_split(192, 5, 2, "exposed")
    assert "hop exposed" in layer.report.format()
    assert layer.cuda_source == named.cuda_source
    sites = polls(layer)
    assert sites and all(s.split(", ")[2] == "192" and len(s.split(", ")) == 5 for s in sites), sites
    assert "part0_column" not in layer.cuda_source
    assert kernel_body(layer).count("prnn_tag_store_peer<half>(") == 1
    assert "peer_workspace_0" in kernel_body(layer)


@pytest.mark.parametrize("hidden, batch, gpus", [
    (256, 8, 2),  # one chunk of rows a poll: as many polls of as many values as exposed's
    (192, 11, 2),  # two batch tiles (8 rows, then 3)
    (256, 3, 4),  # 4 CTAs a GPU, each polling its own and 3 peers' parts
])
def test_the_floor_keeps_every_load_and_store_local(hidden, batch, gpus):
    """The floor's kernel is exposed's with each peer replaced by the GPU's own copy: a GPU's part of each row at a
    time, each read from its own columns (``own_column``), and as many stores, none reaching a peer."""
    floor, exposed = (half_split(hidden, batch, gpus, hop) for hop in ("floor", "exposed"))
    assert "hop floor:" in floor.report.format()
    body = kernel_body(floor)
    assert "peer_workspace_" not in body  # the peers' addresses are never used
    assert body.count("prnn_tag_store_peer<half>(") == kernel_body(exposed).count("prnn_tag_store_peer<half>(")
    width = hidden // gpus
    sites = polls(floor)
    # (rows, per-thread loads) as polled: a GPU's part (``width`` columns of rows ``hidden`` apart) at a time
    assert sites and all(s.split(", ")[2] == str(width) and s.split(", ")[-1] == str(hidden) for s in sites), sites
    assert len(set(re.findall(r"part(\d+)_column", body))) == gpus and "own_column" in body
    assert shared_problems(floor) == [], floor.report.format()


def test_at_the_measured_layer_the_floor_polls_as_exposed_and_floor_own_half():
    """LSTM fp16 H=2048 B=8 over two GPUs (8 units a CTA, 4 k groups: a poll waits for one row of 2048 words): the
    floor polls a GPU's 1024 columns of two rows at a time, as many polls of as many loads a thread as exposed's 8
    (its local work holds every polled word), and floor_own half of them (the peers' words left out); every kernel
    without spills, as ptxas reports."""
    exposed, floor, own = (half_split(2048, 8, 2, hop, units_per_cta=8, k_groups=4)
                           for hop in ("exposed", "floor", "floor_own"))
    loads = [[s.split(", ")[0] for s in polls(layer)] for layer in (exposed, floor, own)]
    assert loads[0] == loads[1] == ["4"] * 8 and loads[2] == ["4"] * 4, loads
    assert all(layer.report.spill_store_bytes == 0 for layer in (exposed, floor, own))


def test_floor_own_polls_its_own_gpus_part_alone():
    """``floor_own``: the floor without the peers' polls (1/gpus of the polled words), every store kept."""
    own, floor = (half_split(256, 3, 4, hop) for hop in ("floor_own", "floor"))
    assert "hop floor_own" in own.report.format()
    body = kernel_body(own)
    assert set(re.findall(r"part(\d+)_column", body)) == {"0"}
    assert polls(own) and len(polls(floor)) == 4 * len(polls(own))
    assert body.count("prnn_tag_store_peer<half>(") == kernel_body(floor).count("prnn_tag_store_peer<half>(") == 3
    assert "peer_workspace_" not in body
    assert shared_problems(own) == []


def test_a_floor_needs_every_gpus_units_whole():
    # 120 units as 8 CTAs of 16 over 2 GPUs: 64 units a GPU, the second's run past hidden
    with pytest.raises(ConfigError, match="hop='floor' polls each peer's part from this GPU's own, which needs "
                                          "hidden=120 run as 2 GPUs of 64 units"):
        half_split(120, 3, 2, "floor")
    assert "hop exposed" in half_split(120, 3, 2, None).report.format()


def test_an_unknown_hop_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="hop='overlap': one of exposed, floor, floor_own"):
        half_split(192, 5, 2, "overlap")


def test_the_split_knob_leaves_the_templates_config():
    assert split.split_knobs({"hop": "floor"}) == (None, split.SplitKnobs("floor"))
    assert split.split_knobs({"hop": "floor_own", "k_groups": 4}) == ({"k_groups": 4}, split.SplitKnobs("floor_own"))
    assert split.split_knobs({"k_groups": 4}) == ({"k_groups": 4}, split.SplitKnobs("exposed"))
    assert split.split_knobs(None) == (None, split.SplitKnobs())


def test_a_floor_says_its_outputs_are_wrong(caplog):
    """A floor is a timing probe: building one warns that its outputs are wrong; the real exchange does not."""
    with caplog.at_level(logging.WARNING, logger="prnn_tvm.schedules.split"):
        half_split(192, 5, 2, None)
        assert not [r for r in caplog.records if "outputs are wrong" in r.getMessage()]
        half_split(192, 5, 2, "floor_own")
    assert any("hop='floor_own': a timing probe whose outputs are wrong" in r.getMessage() for r in caplog.records)

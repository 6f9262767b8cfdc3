"""The kinds of synchronization between steps as behaviour (``prnn_tvm.codegen.barriers``), without a GPU: what each
says about its workspace, launch, cost and fit, and the device code it pastes from its ``.cuh`` files."""

import re

import pytest

import prnn_tvm
from prnn_tvm.codegen.barriers import BARRIERS, SYNC_WORDS, Barrier, by_name, of_launch
from prnn_tvm.codegen.barriers.source import cuda_source
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import GridSync


def plan(cell, hidden=64, batch=4, **stack):
    cell = prnn_tvm.resolve(cell)
    if stack.get("layers"):
        from prnn_tvm.frontend.stack import stacked

        cell = stacked(cell, stack["layers"])
    return prnn_tvm.analyze(cell, batch, hidden)


def test_every_kind_is_a_barrier_found_by_its_name():
    assert list(BARRIERS) == ["tags", "sentinel", "counter", "grid_sync", "block"]  # the cost model's one-hot order
    for name, kind in BARRIERS.items():
        assert isinstance(kind, Barrier) and kind.name == name and by_name(name) is kind
    with pytest.raises(
        ConfigError, match="barrier 'spin' unknown; available: tags, sentinel, counter, grid_sync, block"
    ):
        by_name("spin")


@pytest.mark.parametrize(
    "name, words, counts, advance, exchange",
    [
        ("tags", SYNC_WORDS, "steps", 10, "uint64"),  # the base counts steps
        ("sentinel", SYNC_WORDS, "steps", 1, "float16"),  # the launch's one barrier
        ("counter", SYNC_WORDS, "barriers", 19, "float16"),  # every barrier passed
        ("grid_sync", None, "barriers", 19, "float16"),  # no state
        ("block", None, "barriers", 19, "float16"),  # no state: each block with itself
    ],
)
def test_a_kind_says_its_workspace_and_how_far_a_launch_moves_the_base(name, words, counts, advance, exchange):
    kind = by_name(name)
    assert kind.grid_sync(2) == GridSync(name, words, counts, 2)
    assert kind.advance(10, 19) == advance and kind.exchange_dtype("float16") == exchange


def test_the_kinds_that_poll_values_say_what_a_poll_holds():
    assert (
        by_name("counter").polled_loads(4 * 256, 256, 256, 4)
        == (0, 0)
        == by_name("grid_sync").polled_loads(4 * 256, 256, 256, 4)
    )
    assert by_name("tags").polled_loads(4 * 256, 256, 256, 4) == (2, 6)  # two tagged words a load
    assert by_name("sentinel").polled_loads(4 * 256, 256, 256, 4) == (1, 6)  # 16 bytes a load
    assert [k for k, b in BARRIERS.items() if b.polls_values] == ["tags", "sentinel"]


def test_a_kind_says_why_it_does_not_fit_a_plan_or_layout():
    assert all(kind.problem(plan("lstm"), "shared") is None for kind in BARRIERS.values())
    assert by_name("sentinel").problem(plan("gru_cho"), "shared") == (
        "barrier 'sentinel' exchanges each step's state through the output sequence, and cell 'gru_cho' exchanges "
        "a stage within each step (2 phases): use tags, counter or grid_sync"
    )
    stack = plan("lstm", layers=2)
    assert "stack's lower layers never read the upper ones" in by_name("tags").problem(stack, "split")
    assert by_name("tags").problem(stack, "shared") is None and by_name("counter").problem(stack, "split") is None
    assert by_name("sentinel").fragments_problem() is None and "not 'tags'" in by_name("tags").fragments_problem()
    assert by_name("sentinel").probe_problem(True) and by_name("tags").probe_problem(False)
    assert by_name("tags").probe_problem(True) is None
    assert by_name("sentinel").training_kind() == "counter" and by_name("tags").training_kind() == "tags"


def test_a_launch_names_its_kind():
    layer = prnn_tvm.compile_cell(
        "lstm",
        64,
        4,
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 1, "k_split": 32, "rows_per_thread": 1, "batch_tile": 4, "barrier": "counter"},
    )
    assert of_launch(layer.kernel.launch) is by_name("counter")
    no_products = prnn_tvm.compile_cell("indrnn", 64, 4, target="cuda", arch="sm_90")
    assert no_products.kernel.launch.sync is None and of_launch(no_products.kernel.launch) is by_name("grid_sync")


def test_the_device_code_comes_from_the_cuh_files_with_what_they_include():
    """Each file's includes are pasted before it, each part after a blank line, each guard once."""
    sentinel = cuda_source("sentinel.cuh")
    assert sentinel.startswith(cuda_source("counter.cuh")) and cuda_source("counter.cuh").startswith(
        "\n#ifndef PRNN_BARRIER_COMMON\n"
    )
    assert '#include "' not in sentinel
    for guard in ("PRNN_BARRIER_COMMON", "PRNN_BARRIER_COUNTER", "PRNN_SENTINEL"):
        assert len(re.findall(rf"^#ifndef {guard}$", sentinel, re.M)) == 1
    assert cuda_source("tags.cuh").startswith(cuda_source("common.cuh")) and "PRNN_BARRIER_COUNTER" not in cuda_source(
        "tags.cuh"
    )

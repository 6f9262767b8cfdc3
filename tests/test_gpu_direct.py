"""``operand_path="direct"`` on the GPU (``pytest -m gpu``): each lane polls its tensor-core fragments straight
from the output sequence. Every cell that takes it, float16 and bfloat16, awkward sizes (hidden past the last
full k tile, rows past the batch, one k tile per warp), rows that stop at their own lengths, random direct configs
of the space, and a wait that never ends. Refusals and generated code: ``test_direct.py``."""

import random

import pytest

import prnn_tvm
from prnn_tvm.checks import plan_tolerance
from prnn_tvm.codegen import barriers
from prnn_tvm.dtypes import TENSOR_CORE_DTYPES, tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import resolve
from prnn_tvm.reference import random_lengths
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import template_for
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune.space import ConfigSpace

from .test_gpu_barrier import assert_a_stall_gives_up
from .test_gpu_half import error_of
from .test_sentinel import sentinel_layer

pytestmark = pytest.mark.gpu


def _takes_the_direct_path(cell: str) -> bool:
    """The direct path runs on the sentinel exchange: a cell it offers the path to, and that the exchange takes
    (not one that sums over units inside a step)."""
    plan = analyze(resolve(cell), 4, 64, "float16")
    return "direct" in mc.paths_for(plan, "sentinel") and not barriers.by_name("sentinel").problem(plan, "shared")


DIRECT_CELLS = [c for c in sorted(prnn_tvm.builtin_cells()) if _takes_the_direct_path(c)]


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize("cell", DIRECT_CELLS)
@pytest.mark.parametrize(
    "hidden, batch, knobs",
    [
        (1024, 16, {"units_per_cta": 16, "n_tiles": 2}),  # cuDNN's layout: 8 warps, each with every row tile it can
        (512, 16, {"units_per_cta": 8, "k_groups": 4, "batch_groups": 2, "poll_sleep": 256}),
        (264, 19, {"units_per_cta": 16, "n_tiles": 1}),  # tile by tile: three passes, the last of 3 rows
        (1000, 5, {"units_per_cta": 16}),  # hidden past the last full k tile, partial last CTA
        (136, 3, {"units_per_cta": 8, "k_groups": 3}),  # odd k tiles per warp: 8-byte loads
        (8, 1, {"units_per_cta": 8, "k_groups": 1}),
    ],
)  # one k tile: half of it past hidden
def test_direct_fragments_match_the_reference(dtype, cell, hidden, batch, knobs):
    if "k_groups" not in knobs:
        knobs = eight_warps(cell, hidden, batch, knobs)
    layer = sentinel_layer(cell, hidden, batch, dtype, **{**knobs, "operand_path": "direct"})
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 64):
        err = error_of(layer, seq_len, seed=seq_len)
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"
    lengths = random_lengths(batch, 40, seed=2)
    assert error_of(layer, 40, lengths=lengths) <= plan_tolerance(layer.plan, 40)


def eight_warps(cell: str, hidden: int, batch: int, knobs: dict) -> dict:
    """``knobs`` with warps that hold all their CTA's row tiles where the space has that many per warp (else one),
    the k range split over eight warps or, where a warp's registers do not fit that, the fewest more that fit;
    where none fits, a batch tile per pass (two passes over a batch of 16: GRU at 1024)."""
    plan = analyze(resolve(cell), batch, hidden, "float16")
    (tiles,) = mc.product_tiles(plan.reductions, knobs["units_per_cta"])
    per_warp = tiles if tiles in mc.M_TILES_PER_WARP else 1
    for n_tiles in sorted({knobs.get("n_tiles", 1), 1}, reverse=True):
        for k_groups in (kg for kg in mc.K_GROUPS if kg * tiles // per_warp >= 8):
            cfg = {
                **knobs,
                "k_groups": k_groups,
                "n_tiles": n_tiles,
                "m_tiles_per_warp": per_warp,
                "barrier": "sentinel",
                "operand_path": "direct",
            }
            try:
                mc.validate(mc.MmaConfig(**cfg), plan, gpu_spec("sm_90"))
            except ConfigError:
                continue
            return cfg
    raise AssertionError(f"no direct config of {knobs} fits {cell} {hidden}x{batch}")


@pytest.mark.parametrize("cell, hidden, batch", [("lstm", 1024, 16), ("gru", 512, 8), ("rnn_tanh", 264, 33)])
def test_random_direct_configs_of_the_space_are_right(cell, hidden, batch):
    """Any direct config the tuner may pick: six drawn from the space's valid ones (shared ``m_tiles_per_warp=4``
    among them, which came to the space with it)."""
    gpu = gpu_spec()
    plan = analyze(resolve(cell), batch, hidden, "float16")
    space = ConfigSpace(plan, gpu, template_for(plan, gpu.target())).configs
    valid = [cfg for cfg in space if cfg.direct or cfg.m_tiles_per_warp == 4]
    for cfg in random.Random(hidden).sample(valid, 6):
        layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype="float16", target="cuda", config=cfg.as_dict())
        if layer.report.spill_bytes:  # the tuner records a spilling config as an error, never runs it
            continue
        assert error_of(layer, 33, seed=3) <= tolerance("float16", 33), layer.report.format()


def test_a_direct_wait_still_gives_up_in_time():
    """Block 0 never publishes step 3: every polling lane gives up within the 20 ms bound, the whole block leaves
    its loop (the flag made block-uniform), the timeout is raised, and the next call is right."""
    layer = sentinel_layer(
        "lstm",
        512,
        16,
        "float16",
        units_per_cta=16,
        k_groups=8,
        m_tiles_per_warp=4,
        operand_path="direct",
        poll_sleep=256,
        batch_groups=2,
    )
    assert_a_stall_gives_up(layer)
    assert error_of(layer, 16) <= tolerance("float16", 16)

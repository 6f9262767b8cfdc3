"""Sums over the hidden units of a row inside a step (``c.sum``, ``c.mean``: ``UnitSum``), a phase of their own: the
analysis, the float64 references, the CPU build and its derived backward, the float32 CUDA kernels as emitted
(the blocks' partial sums meeting through the exchange), ptxas; the layer-normalized LSTM (``lstm_layernorm``)
and an RMS-normalized RNN written here. GPU runs: ``test_gpu_heads.py``."""

import numpy as np
import pytest
from tvm import te, tirx

import prnn_tvm
from prnn_tvm import Cell, CellError
from prnn_tvm.checks import check_gradients
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.plan import Leaf
from prnn_tvm.reference import plan_layer, random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import saving_forward
from prnn_tvm.verify import emulator

from .test_backward import compare
from .test_emulated import T, emulated, knobs
from .test_heads import assert_cpu_build_matches
from .test_ptxas import assert_launchable


def rms_step(c):
    """An RNN normalized by the root mean square of its pre-activation, and of its state: sums over a product
    and over a state."""
    x, h = c.input(), c.state("h")
    hw = c.matvec(h, c.weight("W_hh"), name="hw")
    pre = c.pointwise(lambda n, j: x[n, j] + hw[n, j], name="pre")
    k = te.reduce_axis((0, c.hidden), name="k")
    ms = te.compute((c.batch, c.hidden), lambda n, j: te.sum(pre[n, k] * pre[n, k], axis=k), name="ms")  # by hand
    h_ms = c.mean(h, "h_mean")
    eps = tirx.const(1e-3, c.dtype)
    return {
        "h": c.pointwise(
            lambda n, j: te.tanh(pre[n, j] / te.sqrt(ms[n, j] / c.hidden + eps)) + 0.1 * h_ms[n, j], "h_new"
        )
    }


def rms_reference(x, state, p):
    pre = x + state["h"] @ p["W_hh"].T
    ms = (pre * pre).mean(axis=1, keepdims=True)
    return {"h": np.tanh(pre / np.sqrt(ms + 1e-3)) + 0.1 * state["h"].mean(axis=1, keepdims=True)}


RMS = Cell("rms_rnn", rms_step, rms_reference)


def test_a_sum_over_units_is_a_phase_of_its_own():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_layernorm"), 2, 8)
    assert plan.phases == 3 and not plan.exchanged_stages
    assert {us.name: us.phase for us in plan.unit_sums} == {
        "x_mean": 1,
        "x_mean_sq": 1,
        "h_mean": 1,
        "h_mean_sq": 1,
        "c_mean": 2,
        "c_mean_sq": 2,
    }
    assert [us.name for us in plan.sums_of(1)] == ["c_mean", "c_mean_sq"]  # added up in phase 1, read in 2
    assert len(next(us for us in plan.unit_sums if us.name == "x_mean").exprs) == 4  # over the 4 input slices
    rms = prnn_tvm.analyze(RMS, 2, 8)
    assert {us.name: len(us.exprs) for us in rms.unit_sums} == {"ms": 1, "h_mean": 1} and rms.phases == 2
    assert Leaf("stage", "pre", 0) in rms.live_outs(0)  # read again in phase 1, after its sum


def test_a_sum_keys_the_cells_math():
    def step(c, reduce):
        x, h = c.input(), c.state("h")
        s = reduce(c, h)
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + s[n, j]), "h_new")}

    plans = [
        prnn_tvm.analyze(Cell("s", lambda c, f=f: step(c, f), None), 2, 8).fingerprint()
        for f in (lambda c, h: c.sum(h, "s"), lambda c, h: c.mean(h, "s"))
    ]
    assert plans[0] != plans[1]


def _wide_sum(c, h, W):
    k = te.reduce_axis((0, c.hidden), name="k")
    return te.compute((c.batch, 2 * c.hidden), lambda n, j: te.sum(h[n, k], axis=k), name="wide")


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda c, h, W: c.matvec(c.mean(h, "mu"), W, "hw"), "multiplies the weight by 'mu', a sum over units"),
        (_wide_sum, r"stage 'wide': has shape \(2, 8\); a sum over units is \(batch, hidden\) = \(2, 4\)"),
    ],
)
def test_what_a_sum_over_units_may_not_be(body, message):
    def step(c):
        x, h = c.input(), c.state("h")
        W = c.weight("W_hh")
        found = body(c, h, W)
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + found[n, j]), "h_new")}

    with pytest.raises(CellError, match=message):
        prnn_tvm.analyze(Cell("bad_sum", step, None), 2, 4)


def test_a_sum_over_part_of_a_row_is_refused():
    def step(c):
        x, h = c.input(), c.state("h")
        k = te.reduce_axis((0, c.hidden - 1), name="k")
        s = te.compute((c.batch, c.hidden), lambda n, j: te.sum(h[n, k], axis=k), name="s")
        return {"h": c.pointwise(lambda n, j: x[n, j] + s[n, j], "h_new")}

    with pytest.raises(
        CellError,
        match=r"reduces over range\(0, 3\); a sum over units runs over range\(0, S \* "
        r"hidden\)",
    ):
        prnn_tvm.analyze(Cell("part", step, None), 2, 4)


@pytest.mark.parametrize("cell", ["lstm_layernorm", RMS])
def test_the_plan_and_the_cells_own_reference_agree(cell):
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 3, 12)
    inputs = random_inputs(plan, 5, 4, seed=2)
    out, finals = reference_layer(plan, inputs)
    got, got_finals, _ = plan_layer(plan, inputs)
    assert np.abs(out - got).max() < 1e-12 and all(np.abs(finals[s] - got_finals[s]).max() < 1e-12 for s in finals)


SIZES = [(1, 1, 3), (7, 3, 7), (12, 2, 5), (33, 4, 2)]  # hidden 1 (a norm over one unit), odd and prime hidden


@pytest.mark.parametrize("cell", ["lstm_layernorm", RMS])
@pytest.mark.parametrize("hidden, batch, input_size", SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_cpu_build_matches_the_float64_reference(cell, hidden, batch, input_size, dtype):
    assert_cpu_build_matches(cell, hidden, batch, input_size, dtype)


@pytest.mark.parametrize("cell", ["lstm_layernorm", RMS])
@pytest.mark.parametrize("hidden, batch, input_size", SIZES)
def test_the_derived_backward_equals_the_plans(cell, hidden, batch, input_size):
    assert compare(cell, hidden, batch, 6, input_size, "float64", lengths=random_lengths(batch, 6, seed=1)) < 1e-12


@pytest.mark.parametrize("cell", ["lstm_layernorm", RMS])
def test_the_derived_backward_matches_central_differences(cell):
    """A row total's adjoint is every unit's share added up, a phase of its own backwards."""
    res = check_gradients(cell)
    assert res.ok and res.max_abs_error < 1e-7, res.max_abs_error


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize(
    "cell, hidden, batch, config, options",
    [
        ("lstm_layernorm", 8, 3, knobs(4, 4, 2, 2), {}),
        ("lstm_layernorm", 10, 3, knobs(4, 4, 3, 2, barrier="grid_sync"), {}),  # the last block's units past hidden
        ("lstm_layernorm", 40, 2, knobs(1, 1, 1, 2, vec=1), {}),  # 40 blocks: two partials a lane, one guarded
        ("lstm_layernorm", 8, 2, knobs(8, 4, 4, 2, barrier="block"), {}),  # one block holds every unit
        ("lstm_layernorm", 7, 1, knobs(1, 1, 1, 1, vec=1), {}),  # a block per unit
        (RMS, 9, 5, knobs(2, 2, 1, 3, vec=1), {}),
        ("lstm_layernorm", 6, 4, knobs(3, 2, 2, 2), {"bidirectional": True}),  # each direction's own sums
        ("lstm_layernorm", 6, 3, knobs(3, 2, 2, 2), {"layers": 2}),  # each layer's, on the same blocks
    ],
)
def test_sums_over_units_as_emitted(cell, hidden, batch, config, options):
    err, layer = emulated(cell, hidden, batch, config, **options)
    assert err <= tolerance("float32", T * options.get("layers", 1)), (err, layer.report.config)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            pc.PersistentConfig(4, 4, 2, 2, 2, "tags"),
            "sums over units, whose blocks' partial sums meet through the plain exchange",
        ),
        (pc.PersistentConfig(4, 4, 2, 2, 2, "sentinel"), r"exchanges sums over units within each step \(3 phases\)"),
        (pc.PersistentConfig(4, 4, 2, 2, 2, "block"), "a block must hold every unit its products read"),
    ],
)
def test_sums_over_units_take_the_plain_exchange(config, message):
    with pytest.raises(ConfigError, match=message):
        prnn_tvm.compile_cell("lstm_layernorm", 8, 2, target="cuda", arch="sm_90", config=config)


def test_the_gpu_training_kernels_refuse_sums_over_units():
    layer = prnn_tvm.compile_cell("lstm_layernorm", 8, 2, target="cuda", arch="sm_90", tuning_logs=[])
    with pytest.raises(ConfigError, match="sums over units, whose backward adds up across blocks too"):
        saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)


@pytest.mark.parametrize(
    "hidden, batch, dtype", [(1024, 8, "float16"), (1024, 8, "float32"), (256, 4, "bfloat16"), (7, 3, "float16")]
)
def test_defaults_build_without_spills(hidden, batch, dtype):
    layer = prnn_tvm.compile_cell(
        "lstm_layernorm", hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[]
    )
    rep = layer.report
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0, rep.format()
    assert rep.config["barrier"] in ("counter", "grid_sync", "block")
    assert_launchable(layer)

"""Batch groups in the float32 GPU backward (``schedules/backward_groups.py``), without a GPU: the training kernels
as emitted, run on the host (``prnn_tvm.verify.emulator``), every argument's gradient against the plan's in float64;
where the knob is refused and why; the grid and launch it makes; what the space offers (the default it ranks first:
``test_heads_cuda.py``). On the GPU: ``test_gpu_heads.py::test_the_training_kernels_in_batch_groups``."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.schedules import backward_kernel
from prnn_tvm.schedules import backward_mma_config as bmc
from prnn_tvm.schedules import persistent_backward as pb
from prnn_tvm.schedules.backward_groups import BackwardConfig
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify import bounds, emulator

from . import test_emulated

GPU = gpu_spec("sm_90")


def plan(cell, batch, hidden, dtype="float32"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


@pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")
@pytest.mark.parametrize(
    "cell, hidden, batch, backward",
    [
        ("lstm_h4", 8, 4, BackwardConfig(2, 2, 2, 1, 2, "block", batch_groups=2)),  # a head a CTA, 2 x 4 CTAs
        ("slstm_h2", 8, 6, BackwardConfig(4, 4, 2, 2, 2, "block", batch_groups=3)),  # 3 groups of 2 rows
        ("lstm_h2", 8, 4, BackwardConfig(8, 4, 2, 1, 2, "block", batch_groups=4)),  # both heads a CTA, a row a group
        ("gru_cho_h2", 6, 4, BackwardConfig(3, 2, 3, 2, 1, "block", batch_groups=2)),  # two phases backwards
        ("rnn_tanh_h7", 7, 4, BackwardConfig(7, 2, 1, 1, 1, "block", batch_groups=2)),  # heads of one unit
        ("lstm", 8, 6, BackwardConfig(8, 4, 2, 3, 2, "block", batch_groups=2)),  # dense: one CTA holds every unit
    ],
)
def test_the_backward_in_batch_groups_as_emitted(cell, hidden, batch, backward, monkeypatch):
    """The saving forward and the backward of ``backward`` (ragged lengths: a row past its length passes its
    adjoints through), every argument's gradient against backpropagation through time in float64."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=3, target="cuda", arch="sm_90", tuning_logs=[])
    kernel = backward_kernel(layer.plan, GPU, backward)
    assert not bounds.launch_problems(kernel.func, kernel.launch.grid)
    monkeypatch.setattr(test_emulated, "gpu_backward", lambda p, gpu: iter([kernel]))
    got, want = test_emulated.emulated_gradients(layer)
    assert set(got) == set(want)
    assert worst(relative_error(got[n], want[n]) for n in want) <= 1e-5, {
        n: relative_error(got[n], want[n]) for n in want
    }


def test_a_group_runs_its_rows_on_ctas_of_its_own_without_a_grid_barrier():
    p = plan("slstm_h12", 16, 768, "bfloat16")
    one = BackwardConfig(64, 16, 4, 16, 4, "block")
    four = dataclasses.replace(one, batch_groups=4, batch_tile=4)
    g1, g4 = pb.validate(one, p, GPU), pb.validate(four, p, GPU)
    assert (g1.ctas, g4.ctas) == (12, 48) and g1.threads == g4.threads == 256
    assert (g1.items_per_thread, g4.items_per_thread) == (4, 1)  # 16 rows x 64 units, then 4 x 64, over 256
    assert g4.smem_gs * 4 == g1.smem_gs
    launch = backward_kernel(p, GPU, four).launch
    assert launch.grid.ctas == 48 and launch.sync is None and not launch.grid.cooperative
    assert launch.arg("d_gates").shape[1] == launch.arg("workspace").shape[1] == 16  # the whole batch's arguments
    assert four.as_dict()["batch_groups"] == 4 and "batch_groups" not in one.as_dict()  # quiet at its default


@pytest.mark.parametrize(
    "cell, batch, cfg, why",
    [
        ("slstm_h12", 16, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=3), "16 does not split into 3 equal"),
        ("slstm_h12", 16, BackwardConfig(8, 32, 1, 4, 4, "counter", batch_groups=4), "not across the grid barrier of"),
        ("slstm_h12", 16, BackwardConfig(64, 16, 4, 8, 4, "block", batch_groups=4), r"group's rows \(4: batch_g"),
        ("slstm_h12", 16, BackwardConfig(64, 16, 4, 1, 4, "block", batch_groups=0), "a positive integer"),
        ("slstm_h48", 64, BackwardConfig(16, 16, 1, 1, 4, "block", batch_groups=64), "co-resident.*lower batch_groups"),
        ("lstm_h4", 16, BackwardConfig(2, 2, 2, 1, 2, "block", batch_groups=2), "must be a multiple of the head size"),
    ],
)
def test_batch_groups_that_do_not_fit_are_refused_with_the_reason(cell, batch, cfg, why):
    hidden = 16 if cell == "lstm_h4" else 768
    with pytest.raises(ConfigError, match=why):
        pb.validate(cfg, plan(cell, batch, hidden, "bfloat16"), GPU)


def test_the_tensor_core_backward_refuses_batch_groups_with_the_reason():
    p = plan("lstm", 16, 1024, "float16")
    with pytest.raises(ConfigError, match="batch_groups=2: the tensor-core backward multiplies dense products"):
        bmc.validate(bmc.BackwardMmaConfig(16, 4, 2, "counter", batch_groups=2), p, GPU)
    assert "head-wise products" in bmc.refusal(plan("lstm_h12", 16, 768, "float16"), "sm_90")


@pytest.mark.parametrize("cell, batch, groups", [("slstm_h12", 16, {1, 2, 4, 8}), ("lstm_h12", 8, {1, 2, 4}),
                                                 ("lstm_h12", 4, {1, 2}), ("lstm_h12", 1, {1}),
                                                 ("lstm_h48", 16, {1, 2, 4, 8}), ("lstm_h12", 64, {1, 2, 4, 8, 16})])
def test_the_space_offers_groups_where_no_block_waits_for_another(cell, batch, groups):
    """Equal groups of at least two rows (``backward_groups.GROUP_MIN_ROWS``, of the forward's counts) with barrier
    ``block`` alone, each grid within one CTA per SM; a group's batch tiles within its rows."""
    p = plan(cell, batch, 768, "bfloat16")
    assert {c.batch_groups for c in pb.space(p, GPU)} == {1}  # the grid's barrier
    local = pb.space(p, GPU, "block")
    assert {c.batch_groups for c in local} == groups
    assert all(c.batch_tile <= batch // c.batch_groups for c in local)
    grouped = [c for c in local if c.batch_groups > 1]
    assert all(c.batch_groups * -(-768 // c.units_per_cta) <= GPU.sms for c in grouped)

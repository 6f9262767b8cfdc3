"""Batch groups with head-wise products under barrier ``block`` on a real GPU (``pytest -m gpu``): each group of rows
on CTAs of its own, no CTA waiting for another. Every grouped config ``grouped`` makes at heads of 16 to 128 (hidden
768, batches 16 and 8, bf16 and fp16) against the float64 reference, and bit for bit against the same layer in one
group; the torch module's call with a grouped config; the training forward in batch groups (its saved values against
float64 and one group, the training kernels' gradients). Refusals, space, default and generated code:
test_heads_batch_groups.py."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import plan_tolerance, relative_error
from prnn_tvm.compiler import compile_training
from prnn_tvm.reference import plan_layer, random_inputs, random_lengths
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify.emulator import projection

from .test_gpu_half import error_of
from .test_gpu_heads import training_error
from .test_gpu_sentinel import assert_same_bits
from .test_heads_batch_groups import SAVING

pytestmark = pytest.mark.gpu

HEADS = {16: "lstm_h48", 32: "lstm_h24", 64: "lstm_h12", 128: "lstm_h6"}  # at hidden 768


def one_group(plan, gpu):
    """The untuned config of one batch group (the default's fallback: the default is it in batch groups)."""
    return next(c for c in mc.ranked_configs(plan, gpu) if c.batch_groups == 1)


def grouped_configs(cell: str, batch: int, dtype: str, gpu) -> list:
    """The config of one group and each config of more groups that :func:`mc.grouped` makes of it (one a count)."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, 768, dtype)
    base = one_group(plan, gpu)
    found = {mc.grouped(base, plan, gpu, most=G) for G in mc.BATCH_GROUPS[1:]} - {base}
    return [base, *sorted(found, key=lambda c: c.batch_groups)]


def check(layer, config, dtype: str, batch: int) -> None:
    """``layer`` built without spills from ``config``, within the dtype's bound of float64 at T=1, 7 and 64 with rows
    stopping at their own lengths."""
    assert layer.report.spill_bytes == 0 and layer.kernel.config == config, layer.report.format()
    for seq_len in (1, 7, 64):
        lengths = random_lengths(batch, seq_len, seed=seq_len)
        err = error_of(layer, seq_len, seed=seq_len, lengths=lengths)
        assert err <= plan_tolerance(layer.plan, seq_len), f"{config}: T={seq_len}: {err:.2e}"


@pytest.mark.parametrize("batch", [16, 8])
@pytest.mark.parametrize("D", sorted(HEADS))
def test_grouped_configs_match_the_reference_and_one_group(D, batch):
    """bfloat16: every grouped config at batch 16 (the most groups at 8) within the bound, and the same bits as the
    one-group layer (rows never read each other; each row's products and pointwise math are the same)."""
    cell = HEADS[D]
    base, *grouped = grouped_configs(cell, batch, "bfloat16", gpu_spec())
    one = prnn_tvm.compile_cell(cell, 768, batch, dtype="bfloat16", target="cuda", config=base, tuning_logs=[])
    assert grouped and one.kernel.config == base
    for config in grouped if batch == 16 else grouped[-1:]:
        layer = prnn_tvm.compile_cell(cell, 768, batch, dtype="bfloat16", target="cuda", config=config,
                                      tuning_logs=[])
        assert layer.report.ctas == config.batch_groups * one.report.ctas
        check(layer, config, "bfloat16", batch)
        assert_same_bits(layer, one, batch)


@pytest.mark.parametrize("batch", [16, 8])
@pytest.mark.parametrize("D", sorted(HEADS))
def test_grouped_float16_matches_the_reference(D, batch):
    """float16: the most groups of each head size and batch within the bound (the builds are most of the time)."""
    cell = HEADS[D]
    config = grouped_configs(cell, batch, "float16", gpu_spec())[-1]
    layer = prnn_tvm.compile_cell(cell, 768, batch, dtype="float16", target="cuda", config=config, tuning_logs=[])
    check(layer, config, "float16", batch)


def test_a_torch_module_with_grouped_heads():
    """A grouped config through ``prnn_tvm.torch.Recurrent`` (cuBLAS projection, torch's allocator): the same outputs
    as the one-group module on the same weights, and twice in a row (the workspace and tiles of the first call leave
    nothing the second reads)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.manual_seed(7)
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_h12"), 16, 768, "bfloat16")
    base = one_group(plan, gpu_spec())
    config = mc.grouped(base, plan, gpu_spec(), most=8)
    assert config.batch_groups == 8
    modules = [pt.Recurrent("lstm_h12", 768, 768, device="cuda", dtype=torch.bfloat16, config=dataclasses.asdict(c))
               for c in (config, base)]
    with torch.no_grad():
        for a, b in zip(modules[0].parameters(), modules[1].parameters()):
            b.copy_(a)
        x = torch.randn(96, 16, 768, device="cuda", dtype=torch.bfloat16)
        (got, _), (again, _), (want, _) = modules[0](x), modules[0](x), modules[1](x)
    assert modules[0].layer_for(16, x.device).report.config["batch_groups"] == 8
    assert torch.equal(got, want) and torch.equal(again, want)
    assert np.isfinite(got.float().cpu().numpy()).all()


def saved_of(layer, inputs: dict) -> np.ndarray:
    """What ``layer``'s training forward (``compile_training``) saves on ``inputs``: (step, batch row, column)."""
    training = compile_training(layer)
    args = {k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")}
    _, (*_, saved) = training.forward(xp=projection(inputs, "float32"), **args)
    return np.asarray(saved)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cell, hidden, batch, config", SAVING)
def test_the_training_forward_in_batch_groups(cell, hidden, batch, config, dtype):
    """The training forward of a grouped config runs in its groups (each group's CTAs save their own rows), under the
    GPU's memory order and ragged lengths: every saved value (the states at each step's start, the products' gate rows)
    within the bound of float64 and bit for bit those of the same layer in one group; every gradient of the training
    kernels (the float32 backward reading them) within the bound of the training kernels' test."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", config=config, tuning_logs=[],
                                  cache=False)
    grid = compile_training(layer).forward.signature.launches[0].grid
    assert grid.ctas == config.batch_groups * -(-hidden // config.units_per_cta)
    plan, seq_len = layer.plan, 16
    inputs = random_inputs(plan, seq_len, layer.input_size, seed=5)
    inputs["lengths"] = random_lengths(batch, seq_len, seed=6)
    saved = saved_of(layer, inputs)
    _, _, steps = plan_layer(plan, inputs)
    want = np.stack([np.concatenate([step[leaf] for leaf in plan.saved_leaves()], axis=1) for step in steps])
    assert saved.shape == want.shape
    H = plan.hidden
    for column, leaf in enumerate(plan.saved_leaves()):
        err = relative_error(saved[:, :, column * H : (column + 1) * H], want[:, :, column * H : (column + 1) * H])
        assert err <= plan_tolerance(plan, seq_len), f"{leaf}: {err:.2e}"
    one = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", config=one_group(plan, layer.gpu),
                                tuning_logs=[], cache=False)
    assert compile_training(one).forward.signature.launches[0].grid.ctas < grid.ctas
    assert np.array_equal(saved, saved_of(one, inputs))
    assert training_error(layer) <= 5e-2

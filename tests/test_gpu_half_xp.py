"""A half layer's input projection in its own type (the tensor-core knob ``xp``, ``pytest -m gpu``): against the
float64 reference with the unchanged bounds, either type on the same config; the torch modules' inference and
training. The projection's single rounding: ``test_gpu_half.py``; the CPU side: ``test_half_xp.py``."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error, plan_tolerance
from prnn_tvm.dtypes import BOUND_MAGNITUDE, TENSOR_CORE_DTYPES, tolerance
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer

pytestmark = pytest.mark.gpu
XP_TYPES = ("float32", "half")


def layers(cell, hidden, batch, dtype, input_size=None, config=None) -> dict:
    """The layer of ``config`` (default: the untuned default) with each projection type, by type."""
    first = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="cuda",
                                  tuning_logs=[], config=config)
    found = {}
    for xp in XP_TYPES:
        cfg = dataclasses.replace(first.kernel.config, xp=xp)
        found[xp] = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, dtype=dtype, target="cuda",
                                          config=cfg)
        assert found[xp].signature.launch("recurrent").arg("xp").dtype == ("float32" if xp == "float32" else dtype)
        assert found[xp].report.spill_bytes == 0, found[xp].report.format()
    return found


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
@pytest.mark.parametrize(
    "cell, hidden, batch, input_size, config",
    [
        ("lstm", 1024, 16, None, None),  # issue 51's shape
        ("lstm", 896, 16, 300, None),
        ("lstm_h12", 768, 16, None, None),  # in_warp heads, the projection loaded a step early
        ("lstm_h24", 768, 16, 40, None),
        ("gru_cho", 133, 11, 7, {"units_per_cta": 3, "k_groups": 2, "n_tiles": 1, "barrier": "counter"}),
        ("lstm", 256, 16, None, {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "sentinel",
                                 "operand_path": "direct"}),  # the tiles in turn
        ("lstm_layernorm", 256, 8, None, None),
        ("rnn_tanh", 1, 1, 3, None),
        ("indrnn", 13, 1, 62, None),  # ReLU: outputs past the bounds' magnitude
    ],
)
def test_either_projection_matches_float64(dtype, cell, hidden, batch, input_size, config):
    """Both projection types of one config within the plan's bound at T=1, 7 and 256, with rows of their own
    lengths (a length-1 row and a full one)."""
    for xp, layer in layers(cell, hidden, batch, dtype, input_size, config).items():
        for seq_len in (1, 7, 256):
            inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seq_len)
            inputs["lengths"] = random_lengths(batch, seq_len, seed=seq_len)
            err = max_abs_error(layer.plan, layer(**inputs), reference_layer(layer.plan, inputs), BOUND_MAGNITUDE)
            assert err <= plan_tolerance(layer.plan, seq_len), f"xp {xp}, T={seq_len}: {err:.2e}"


@pytest.mark.parametrize("dtype", TENSOR_CORE_DTYPES)
def test_torch_modules_project_into_the_half_type_and_train_as_before(dtype):
    """A torch module of a half-xp config: inference within 1.5x cuDNN's error (or the bound) against float64; a call
    that trains gives bitwise the outputs and gradients of the float32-xp config (training keeps float32)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    from .test_gpu_half import errors_against_float64

    T, H, B, n_in = 64, 256, 8, 96
    config = prnn_tvm.compile_cell("lstm", H, B, input_size=n_in, dtype=dtype, target="cuda",
                                   tuning_logs=[]).kernel.config
    configs = {xp: dataclasses.replace(config, xp=xp).as_dict() for xp in XP_TYPES}
    ours, cudnn = errors_against_float64(torch.nn.LSTM, n_in, H, T, B, dtype,
                                         lambda m: pt.from_torch(m, config=configs["half"]))
    assert ours <= max(1.5 * cudnn, tolerance(dtype, T)), f"ours {ours:.2e}, cuDNN {cudnn:.2e}"
    torch.manual_seed(1)
    module = torch.nn.LSTM(n_in, H).cuda().to(getattr(torch, dtype))
    x = torch.randn(T, B, n_in, device="cuda", dtype=getattr(torch, dtype))
    results = {}
    for xp, cfg in configs.items():
        ours = pt.from_torch(module, config=cfg)  # module's own parameters: their gradients cleared for each
        for p in module.parameters():
            p.grad = None
        with torch.no_grad():
            layer = ours.layer_for(B, x.device, x.dtype)
        assert layer.signature.launch("recurrent").arg("xp").dtype == ("float32" if xp == "float32" else dtype)
        given = x.clone().requires_grad_(True)
        out, _ = ours(given)
        out.float().square().sum().backward()
        results[xp] = [out.detach(), given.grad, *(p.grad.clone() for p in module.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(results["float32"], results["half"]))

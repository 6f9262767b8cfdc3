"""The input projection beside the recurrence on a real GPU (``pytest -m gpu``; ``prnn_tvm.torch.overlap``): the
module's overlapped call against the float64 reference and against the call that projects first, at awkward sizes;
a late side stream; a CUDA graph's replays; a flag that never comes (the bounded wait, NaN, the error)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm.bench.baselines import captured  # noqa: E402
from prnn_tvm.checks import max_abs_error  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.errors import BarrierTimeout  # noqa: E402
from prnn_tvm.reference import random_inputs, reference_layer  # noqa: E402
from prnn_tvm.schedules import persistent_mma_config as mc  # noqa: E402
from prnn_tvm.torch import overlap  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("no_tf32")]
H = 768
CONFIGS = {  # the in_warp config where the default is not one (test_gpu_heads.IN_WARP_CASES)
    "lstm_h6": mc.MmaConfig(128, 1, 2, "block", m_tiles_per_warp=2, smem_k_tiles=2, gate_layout="in_warp"),
}


def module_and_inputs(cell: str, batch: int, steps: int, seed: int = 0):
    """A bfloat16 module of ``cell`` at hidden 768 with the reference's random parameters, its input and initial
    states (torch tensors on the GPU), and the float64 reference's inputs."""
    module = pt.Recurrent(cell, H, H, device="cuda", dtype=torch.bfloat16, config=CONFIGS.get(cell))
    module.batch_buckets = False  # the batch as it is: B=1, B=3
    plan = module.layer_for(batch, torch.device("cuda", 0)).plan
    inputs = random_inputs(plan, steps, H, seed=seed)
    with torch.no_grad():
        for name in ("W_ih", "b_ih", "W_hh", "b_hh"):
            getattr(module, f"{name}_l0").copy_(torch.from_numpy(inputs[name].astype(np.float32)))
    x = torch.from_numpy(inputs["x"].astype(np.float32)).cuda().to(torch.bfloat16)
    hx = tuple(torch.from_numpy(inputs[s].astype(np.float32)).cuda()[None].to(torch.bfloat16) for s in ("h0", "c0"))
    return module, plan, inputs, x, hx


def call(module, x, hx, overlapped: bool):
    module.overlap_projection = overlapped
    with torch.no_grad():
        out, (h_n, c_n) = module(x, hx)
    torch.cuda.synchronize()
    return out.float().cpu().numpy(), (h_n[0].float().cpu().numpy(), c_n[0].float().cpu().numpy())


def as_expected(plan, result) -> tuple:
    """A call's ``(out, (h_n, c_n))`` as ``max_abs_error`` takes the expected side."""
    return result[0], {state.name: final for state, final in zip(plan.states, result[1])}


def overlapped_calls(module) -> int:
    """The epoch of the module's flags on the current stream: its overlapped calls there (0: none)."""
    flags = module._overlaps._flags.get((torch.device("cuda", 0), torch.cuda.current_stream().cuda_stream))
    return 0 if flags is None else int(flags[0].item())


@pytest.mark.parametrize(
    "cell, batch, steps",
    [
        ("lstm_h48", 16, 1024),  # heads of 16
        ("lstm_h48", 1, 100),  # B=1, T not a multiple of the chunk (8)
        ("lstm_h12", 16, 1000),  # T not a multiple of the chunk (63)
        ("lstm_h12", 3, 17),  # chunks of 8: the last of one step
        ("lstm_h12", 16, 1),  # T=1: one chunk, projected first
        ("lstm_h6", 16, 255),  # heads of 128 (the in_warp config)
        ("lstm_h3", 16, 256),  # heads of 256: the grid-synchronized default, no flags: projected first
    ],
)
def test_the_overlapped_call_matches_the_reference_and_the_plain_call(cell, batch, steps):
    module, plan, inputs, x, hx = module_and_inputs(cell, batch, steps, seed=steps)
    want = reference_layer(plan, inputs)
    got = call(module, x, hx, True)
    expected_plan = overlap.overlaps(module.layer_for(batch, x.device), steps, x.device, True)
    assert overlapped_calls(module) == (expected_plan is not None)  # which path ran
    assert (expected_plan is None) == (cell == "lstm_h3" or steps < 16), expected_plan
    plain = call(module, x, hx, False)
    assert overlapped_calls(module) == (expected_plan is not None)  # the switch: no overlapped call more
    bound = tolerance("bfloat16", steps)
    assert max_abs_error(plan, got, want) <= bound
    assert max_abs_error(plan, plain, want) <= bound
    assert max_abs_error(plan, got, as_expected(plan, plain)) <= bound


def test_repeated_calls_keep_overlapping():
    """A repeated call of the same shapes (which a plan would serve with the projection first: ``torch.repeat``)
    overlaps every time, and the same outputs come back; switched off, none does."""
    module, plan, _, x, hx = module_and_inputs("lstm_h12", 16, 128, seed=5)
    first = call(module, x, hx, True)
    for calls in (2, 3, 4):
        again = call(module, x, hx, True)
        assert overlapped_calls(module) == calls
        assert max_abs_error(plan, again, as_expected(plan, first)) <= tolerance("bfloat16", 128)
    for _ in range(3):
        call(module, x, hx, False)
    assert overlapped_calls(module) == 4


def test_a_late_side_stream_is_waited_for(monkeypatch):
    """Every piece on the side stream (4) starts after a spin of ~10 ms (the recurrence: 0.2 ms): the kernel
    waits for each chunk's flag (within its 50 ms bound) and computes what the plain call computes."""
    module, plan, inputs, x, hx = module_and_inputs("lstm_h12", 16, 256, seed=1)
    plain = call(module, x, hx, False)
    monkeypatch.setattr(overlap, "before_piece", lambda start: torch.cuda._sleep(20_000_000))
    got = call(module, x, hx, True)
    assert overlapped_calls(module) == 1
    module.check()  # no wait gave up
    assert max_abs_error(plan, got, as_expected(plan, plain)) <= tolerance("bfloat16", 256)
    assert max_abs_error(plan, got, reference_layer(plan, inputs)) <= tolerance("bfloat16", 256)


def test_graph_replays_of_the_overlapped_call_equal_eager_calls():
    """A captured call (projection pieces on the side stream, fork and join as events, the epoch incremented on the
    device) replayed on new inputs computes what an eager call that projects first computes."""
    module, plan, _, x, hx = module_and_inputs("lstm_h12", 16, 512, seed=2)
    module.overlap_projection = True
    static = x.clone()
    with torch.no_grad():
        graph, (out, (h_n, c_n)) = captured(lambda: module(static, hx))
    for seed in range(3):
        fresh = torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16) * (1 + seed)
        static.copy_(fresh)
        graph.replay()
        replayed = (out.float().cpu().numpy(), (h_n[0].float().cpu().numpy(), c_n[0].float().cpu().numpy()))
        plain = call(module, fresh, hx, False)
        err = max_abs_error(plan, replayed, as_expected(plan, plain))
        assert err <= tolerance("bfloat16", 512), (seed, err)
    module.check()


def test_a_flag_that_never_comes_times_out_with_nan_and_raises(monkeypatch):
    """The side stream never flags the piece from step 64: the kernel's waits give up after the layer's bound (20 ms
    here), every output from step 64 on and the final states are NaN, the steps before are the plain call's, and
    ``check()`` raises naming the switch; the next call is whole again."""
    module, plan, _, x, hx = module_and_inputs("lstm_h12", 16, 256, seed=3)
    module.layer_for(16, x.device).barrier_timeout_us = 20_000
    plain = call(module, x, hx, False)
    write = overlap.write_flags
    monkeypatch.setattr(overlap, "write_flags", lambda f, p, a, b: None if a == 64 else write(f, p, a, b))
    got = call(module, x, hx, True)
    assert np.isnan(got[0][64:]).all() and np.isnan(got[1][0]).all() and np.isnan(got[1][1]).all()
    assert np.isfinite(got[0][:64]).all()
    assert np.abs(got[0][:64] - plain[0][:64]).max() <= tolerance("bfloat16", 64)
    with pytest.raises(BarrierTimeout, match=r"(?s)step 64.*overlap_projection = False"):
        module.check()
    monkeypatch.setattr(overlap, "write_flags", write)
    again = call(module, x, hx, True)
    module.check()
    assert max_abs_error(plan, again, as_expected(plan, plain)) <= tolerance("bfloat16", 256)

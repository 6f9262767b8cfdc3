"""Head-wise products, sLSTM and sums over units on a real GPU (``pytest -m gpu``): every dtype against the float64
reference under the GPU's own memory order, each kind of synchronization a head-wise layer takes (``block``:
none between blocks; ``tags``: a block waits for its head's blocks only), the GPU training kernels of heads, and
a timing that says whether a block-local step beats the grid-synchronized one (printed; the targets are the
benchmark's, ``bench/against_flashrnn.py``)."""

import dataclasses

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error, plan_tolerance, relative_error, time_layer, worst
from prnn_tvm.compiler import compile_training
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import plan_gradients, random_inputs, random_lengths, reference_layer
from prnn_tvm.schedules import backward_kernel, by_name
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules.backward_groups import BackwardConfig
from prnn_tvm.verify.emulator import projection

from .test_emulated import gradients_from

pytestmark = pytest.mark.gpu


def error_of(layer, seq_len, seed=0, lengths=None):
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    return max_abs_error(layer.plan, layer(**inputs), reference_layer(layer.plan, inputs))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "cell, hidden, batch",
    [
        ("lstm_h48", 768, 16),
        ("lstm_h24", 768, 16),
        ("lstm_h12", 768, 16),
        ("lstm_h6", 768, 16),
        ("lstm_h3", 768, 16),
        ("slstm_h12", 768, 16),
        ("slstm_h4", 512, 4),
        ("slstm", 256, 8),
        ("gru_cho_h4", 512, 5),
        ("lstm_h7", 7, 3),
        ("lstm_layernorm", 1024, 8),
        ("lstm_layernorm", 256, 1),
        ("lstm_layernorm", 33, 3),
    ],
)
def test_defaults_match_the_reference(cell, hidden, batch, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda")
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 256):
        err = error_of(layer, seq_len, seed=seq_len, lengths=random_lengths(batch, seq_len, seed=seq_len))
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("barrier", ["block", "tags", "counter", "grid_sync"])
@pytest.mark.parametrize("cell", ["lstm_h12", "slstm_h12"])
def test_every_synchronization_of_one_head_placement(cell, barrier, dtype):
    """The default placement (a head a block, or two) under each kind: block needs no grid barrier, tags waits for
    the head's blocks, counter and grid_sync for every block; the same numbers within the bound."""
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda")
    config = dataclasses.replace(layer.kernel.config, barrier=barrier)
    if barrier != "block" and getattr(config, "in_warp", False):  # its gates in warps write the block's own tiles
        config = dataclasses.replace(config, gate_layout="by_gate", batch_warps=1, batch_groups=1)  # (groups: block)
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda", config=config)
    assert error_of(layer, 64, seed=4) <= plan_tolerance(layer.plan, 64)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cell, hidden, batch", [("lstm_h4", 512, 4), ("slstm_h12", 768, 16), ("gru_cho_h2", 256, 3)])
def test_the_training_kernels_of_heads(cell, hidden, batch, dtype):
    """The saving forward and the GPU backward run on the GPU, every argument's gradient assembled as prnn_tvm.torch
    does (``test_emulated.gradients_from``), against the plan's in float64 (emulated twin: test_heads_cuda.py)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda")
    assert training_error(layer) <= (1e-4 if dtype == "float32" else 5e-2)


def training_error(layer, seq_len: int = 16) -> float:
    """The worst relative error, over every argument's gradient, of ``layer``'s training kernels run on the GPU
    (``compile_training``: the saving forward, the GPU backward) on random inputs and output gradients, assembled as
    prnn_tvm.torch does (``test_emulated.gradients_from``), against the plan's in float64; the kernels built without
    spills."""
    plan, batch, hidden = layer.plan, layer.plan.batch, layer.plan.hidden
    training = compile_training(layer)
    assert all(", 0 spill bytes" in line for line in training.report.splitlines()), training.report
    inputs = random_inputs(plan, seq_len, layer.input_size)
    inputs["lengths"] = random_lengths(batch, seq_len, seed=3)
    rng = np.random.default_rng(1)
    d_out = rng.standard_normal((seq_len, batch, hidden)).astype(plan.dtype)  # in the layer's type, as torch's
    d_finals = {s.name: rng.standard_normal((batch, hidden)).astype(plan.dtype) for s in plan.states}
    args = {k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")}
    xp = projection(inputs, "float32")
    _, (*_, saved) = training.forward(xp=xp, **args)
    takes = {a.name for launch in training.backward.signature.launches for a in launch.args}
    first, rest = training.backward(
        xp=xp,
        saved=saved,
        d_out=d_out,
        **{f"d_{s}_n": v for s, v in d_finals.items()},
        **{k: v for k, v in args.items() if k in takes},  # the saved states stand for the initial ones
    )
    written = [a.name for a in training.backward.signature.launches[0].args if a.role.written]
    got = gradients_from(plan, inputs, dict(zip(written, (first, *rest))), saved, layer.input_size)
    wide = {s: v.astype(np.float64) for s, v in d_finals.items()}
    want = plan_gradients(plan, inputs, d_out.astype(np.float64), wide)
    return worst(relative_error(got[n], want[n]) for n in want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    "cell, hidden, batch, config",
    [
        ("slstm_h12", 768, 16, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=8)),  # the default
        ("slstm_h12", 768, 16, BackwardConfig(64, 16, 4, 4, 4, "block", batch_groups=4)),
        ("slstm_h12", 768, 8, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=4)),  # the default at 8 rows
        ("lstm_h12", 768, 16, BackwardConfig(64, 16, 4, 2, 4, "block", batch_groups=8)),
        ("lstm_h12", 768, 8, BackwardConfig(64, 16, 4, 1, 4, "block", batch_groups=8)),  # a row a group
        ("rnn_tanh_h7", 7, 4, BackwardConfig(7, 2, 1, 2, 1, "block", batch_groups=2)),  # heads of one unit, odd hidden
        ("lstm_h4", 36, 6, BackwardConfig(36, 4, 3, 2, 4, "block", batch_groups=3)),  # heads of 9, groups of 2 rows
    ],
)
def test_the_training_kernels_in_batch_groups(cell, hidden, batch, config, dtype, monkeypatch):
    """The GPU backward in batch groups (``schedules/backward_groups.py``: whole heads a block, a run of blocks per
    group of rows, no grid barrier) under the GPU's own memory order, ragged lengths, against the plan's gradients in
    float64 at the bound of the training kernels' test (emulated twin: test_backward_groups.py)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", cache=False)
    kernel = backward_kernel(layer.plan, layer.gpu, config)
    grid = kernel.launch.grid
    assert kernel.launch.sync is None and grid.ctas == config.batch_groups * -(-hidden // config.units_per_cta)
    monkeypatch.setattr(prnn_tvm.compiler, "gpu_backward", lambda plan, gpu: iter([kernel]))
    assert training_error(layer) <= (1e-4 if dtype == "float32" else 5e-2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    "cell, T, B, H, n_in",
    [
        ("slstm_h12", 64, 16, 768, 48),  # FlashRNN's shape, fewer steps
        ("lstm_h4", 17, 1, 36, 5),  # one batch row, heads of 9
        ("rnn_tanh_h7", 9, 3, 7, 4),  # heads of one unit, odd hidden
        ("slstm_h4", 12, 5, 20, 6),
    ],
)
def test_the_torch_module_trains_heads_within_the_bound(cell, T, B, H, n_in, dtype):
    """A training step through ``prnn_tvm.torch`` (the saving forward, the GPU backward, each head-wise weight's
    gradient as a batched GEMM of its heads' blocks, in the half type for half layers: ``autograd.weight_gradient``)
    against the float64 CPU module on the same (rounded) parameters and inputs, within ``checks.plan_tolerance``
    relative to a gradient's largest entry (float32: 1e-4)."""
    import torch

    from .test_gpu_backward_mma import _trained_layer, modules
    from .test_torch import _gradient_error, _gradients

    torch_dtype = getattr(torch, dtype)
    fast, ref = modules(cell, n_in, H, torch_dtype)
    x = torch.randn(T, B, n_in).to(torch_dtype)
    hx = [(0.5 * torch.randn(1, B, H)).to(torch_dtype) for _ in fast._states]
    want = _gradients(
        ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx], list(ref.parameters()), None
    )
    params = list(fast.parameters())
    got = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx], params, None)
    layer = _trained_layer(fast)
    assert all(p.grad.dtype == torch_dtype for p in params)
    bound = 1e-4 if dtype == "float32" else plan_tolerance(layer.plan, T)
    assert _gradient_error(want, got) <= bound


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_head_a_block_against_the_grid(dtype, capsys):
    """12 heads of 64 at hidden 768, batch 16: the default (a head a block, ``block``) and the best grid-wide
    placement the template ranks, timed (recurrent kernel, us per step); printed for the run's notes."""
    plan_layer = prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype=dtype, target="cuda")
    template = by_name(plan_layer.report.template)
    grid = next(
        cfg
        for cfg in template.default_configs(plan_layer.plan, plan_layer.target, plan_layer.gpu)
        if cfg.barrier != "block"
    )
    grid_layer = prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype=dtype, target="cuda", config=grid)
    local, wide = (time_layer(layer, 256).per_step_s * 1e6 for layer in (plan_layer, grid_layer))
    with capsys.disabled():
        print(
            f"\nlstm_h12 768x16 {dtype}: block {local:.2f} us/step ({plan_layer.report.config}), grid {wide:.2f} "
            f"us/step ({grid_layer.report.config})"
        )
    assert local > 0 and wide > 0


@pytest.mark.parametrize(
    "cell, units, k_groups, m_tiles_per_warp, barrier",
    [
        ("lstm_h12", 64, 1, 2, "block"),  # the default: 8 warps a head
        ("lstm_h12", 64, 1, 1, "block"),  # 16 warps, one row tile each
        ("lstm_h12", 64, 2, 2, "block"),  # 16 warps, half a head's k range each
        ("lstm_h12", 64, 2, 1, "block"),  # 32 warps
        ("lstm_h12", 32, 1, 1, "tags"),  # two blocks a head (24 SMs), each polling only its head's other block
        ("lstm_h12", 32, 1, 2, "tags"),  # the same over 4 warps a block
        ("lstm_h48", 64, 1, 1, "block"),  # heads of 16: four a block, 16 warps
        ("lstm_h48", 32, 1, 1, "block"),  # two a block (the default), 8 warps
    ],
)
def test_a_head_over_more_warps(cell, units, k_groups, m_tiles_per_warp, barrier, capsys):
    """A head over more or fewer warps, or over two blocks (``tags``, polling only the head's blocks; else ``block``,
    its values exchanged in its operand tiles): the same numbers within the bound, and each placement's recurrent
    kernel timed (us per step, printed for the run's notes: which to rank first)."""
    config = mc.MmaConfig(units, k_groups, 2, barrier, m_tiles_per_warp=m_tiles_per_warp)
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype="bfloat16", target="cuda", config=config)
    assert layer.report.spill_bytes == 0, layer.report.format()
    err = error_of(layer, 256, seed=2, lengths=random_lengths(16, 256, seed=2))
    assert err <= tolerance("bfloat16", 256), err
    per_step = time_layer(layer, 1024).per_step_s * 1e6
    with capsys.disabled():
        print(f"\n{cell} 768x16 bf16 {layer.report.config}: {per_step:.3f} us/step, {layer.report.registers} registers")
    assert per_step > 0


def test_the_torch_module_runs_heads_within_the_bound():
    """The benchmark's module call (``prnn_tvm.torch.Recurrent``, inference: cuBLAS projection, then the head-a-block
    kernel exchanging in its tiles) at FlashRNN's shape, against the float64 reference of the same arrays."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    layer = prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype="bfloat16", target="cuda")
    inputs = random_inputs(layer.plan, 256, 768, seed=3)
    module = pt.Recurrent("lstm_h12", 768, 768, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for name in ("W_ih", "b_ih", "W_hh", "b_hh"):
            getattr(module, f"{name}_l0").copy_(torch.from_numpy(inputs[name].astype(np.float32)))
        out, (h_n, c_n) = module(
            torch.from_numpy(inputs["x"].astype(np.float32)).cuda().to(torch.bfloat16),
            tuple(torch.from_numpy(inputs[s].astype(np.float32)).cuda()[None].to(torch.bfloat16) for s in ("h0", "c0")),
        )
    got = tuple(t.float().cpu().numpy() for t in (out, h_n[0], c_n[0]))
    err = max_abs_error(layer.plan, (got[0], got[1:]), reference_layer(layer.plan, inputs))
    assert err <= tolerance("bfloat16", 256), err


IN_WARP_CASES = {  # head size D at hidden 768: its cell, whose default is in_warp up to heads of 128
    16: "lstm_h48",  # a head a CTA, batch_warps=2 at batch 16
    32: "lstm_h24",
    64: "lstm_h12",
    128: "lstm_h6",  # 512 threads, 2 of a warp's 8 k tiles in shared memory at batch 16
    256: "lstm_h3",  # no block holds a head of 256 (bench/batch_warps.py): the default synchronizes the grid
}


@pytest.mark.parametrize("D", sorted(IN_WARP_CASES))
def test_gates_in_warp_by_head_size(D, capsys, dtype="bfloat16"):
    """Every head size at hidden 768, batch 16, bfloat16 (float16: test_defaults_match_the_reference): the default
    (``gate_layout="in_warp"`` up to heads of 128) against the float64 reference for T = 1, 7
    and 255 (odd), with per-row lengths at T > 1; then its recurrent kernel and the first by_gate config the
    template ranks, timed (us per step, printed: which to rank first)."""
    cell = IN_WARP_CASES[D]
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda")
    assert layer.report.spill_bytes == 0, layer.report.format()
    assert layer.kernel.config.in_warp == (D <= 128), layer.report.format()
    for seq_len in (1, 7, 255):
        lengths = random_lengths(16, seq_len, seed=seq_len) if seq_len > 1 else None
        err = error_of(layer, seq_len, seed=seq_len, lengths=lengths)
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"
    template = by_name(layer.report.template)
    by_gate = next(c for c in template.default_configs(layer.plan, layer.target, layer.gpu) if not c.in_warp)
    other = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda", config=by_gate)
    assert error_of(other, 255, seed=5) <= plan_tolerance(other.plan, 255)
    times = [time_layer(built, 1024).per_step_s * 1e6 for built in (layer, other)]
    with capsys.disabled():
        print(
            f"\n{cell} (D={D}) 768x16 {dtype}: {times[0]:.3f} us/step ({layer.report.config}, "
            f"{layer.report.registers} registers), by_gate {times[1]:.3f} us/step ({other.report.config})"
        )
    assert min(times) > 0


@pytest.mark.parametrize(
    "cell, batch",
    [
        ("lstm_h12", 16),  # 512 threads (batch_warps=2): the projection one step ahead
        ("lstm_h12", 5),  # one batch tile, 5 of its 8 rows, 256 threads: copies of the outputs for 5 rows, two ahead
        ("slstm_h12", 16),
        ("lstm_h6", 16),  # 512 threads, shared k tiles: one step ahead
    ],
)
def test_in_warp_over_a_long_ragged_sequence(cell, batch, dtype="bfloat16"):
    """T=1024 with per-row lengths (a row of one step, one of all): the outputs copied from the operand tile after
    each step's barrier (zeros past a row's length) and the projection loaded ahead, against float64."""
    layer = prnn_tvm.compile_cell(cell, 768, batch, dtype=dtype, target="cuda")
    assert layer.kernel.config.in_warp and layer.report.spill_bytes == 0, layer.report.format()
    err = error_of(layer, 1024, seed=11, lengths=random_lengths(batch, 1024, seed=11))
    assert err <= plan_tolerance(layer.plan, 1024), f"{err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("batch", [16, 9])
@pytest.mark.parametrize("D", [16, 32, 64])
def test_split_batch_tiles_match_the_reference(D, batch, dtype="bfloat16"):
    """``batch_warps=2`` (schedules/gate_layout.py): the default in_warp config with its pass's two batch tiles on
    two sets of warps, against float64 at T = 1, 7, 255 with per-row lengths; batch 9: the second set's tile holds
    one row of the batch."""
    cell = IN_WARP_CASES[D]  # units of 32 at D=16: two heads a CTA (the default takes one: test_gate_layout.py)
    config = mc.MmaConfig(max(D, 32), 1, 2, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_warps=2)
    layer = prnn_tvm.compile_cell(cell, 768, batch, dtype=dtype, target="cuda", config=config)
    assert layer.kernel.config.batch_warps == 2 and layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (1, 7, 255):
        lengths = random_lengths(batch, seq_len, seed=seq_len) if seq_len > 1 else None
        err = error_of(layer, seq_len, seed=seq_len, lengths=lengths)
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("D", sorted(IN_WARP_CASES))
def test_every_head_size_at_batch_1(D, dtype="bfloat16"):
    """The default at batch 1 (one batch tile: nothing to split) for every head size at hidden 768, odd T."""
    layer = prnn_tvm.compile_cell(IN_WARP_CASES[D], 768, 1, dtype=dtype, target="cuda")
    assert layer.report.spill_bytes == 0, layer.report.format()
    for seq_len in (7, 255):
        err = error_of(layer, seq_len, seed=seq_len)
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"


@pytest.mark.parametrize("cell, config", [
    ("lstm_h12", mc.MmaConfig(64, 1, 2, "block", m_tiles_per_warp=2, gate_layout="in_warp")),
    ("slstm_h12", mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp", batch_groups=2)),
])
def test_the_banks_taking_turns_answer_bitwise_as_the_moved_values(monkeypatch, cell, config):
    """Two steps a turn (the projection's register banks taking turns) against a step a turn with the values moved
    between the banks: the same outputs and final states, bit for bit, at odd and even lengths, T=1 and rows of
    their own lengths (a turn whose second step is past the sequence, or past a row's end)."""
    def built(alternate):
        monkeypatch.setattr(by_name("persistent_mma").builder, "XP_BANKS_ALTERNATE", alternate)
        return prnn_tvm.compile_cell(cell, 768, 16, dtype="bfloat16", target="cuda", config=config, tuning_logs=[],
                                     cache=False)

    turns, moved = built(True), built(False)
    for seq_len in (1, 2, 5, 64):
        inputs = random_inputs(turns.plan, seq_len, turns.input_size, seed=seq_len)
        for call in (inputs, {**inputs, "lengths": random_lengths(16, seq_len, seed=seq_len)}):
            (out_a, finals_a), (out_b, finals_b) = turns(**call), moved(**call)
            for a, b in zip((out_a, *finals_a), (out_b, *finals_b)):
                same = np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
                assert same, (seq_len, sorted(call))

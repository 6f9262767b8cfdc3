"""The tensor-core backward of half layers (``schedules/backward_mma.py``): which layers take it, its knobs'
validation, and its generated code (compiled here for sm_90 by nvcc; no GPU needed). Its numerics need a GPU:
the emulator has no host translation of ``mma.sync`` (``tests/test_gpu_backward_mma.py``)."""

import dataclasses

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.compiler import build_functions, compile_training
from prnn_tvm.schedules import backward_mma, gpu_backward
from prnn_tvm.schedules import backward_mma_config as bc
from prnn_tvm.schedules import persistent_backward as fb
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules.backward_mma_config import BackwardMmaConfig


def plan_of(cell, hidden, batch, dtype="float16"):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    return layer.plan, layer.gpu


@pytest.mark.parametrize("dtype, template", [("float16", "persistent_backward_mma"),
                                             ("bfloat16", "persistent_backward_mma"),
                                             ("float32", "persistent_backward")])
def test_half_layers_take_the_tensor_core_backward_first(dtype, template):
    plan, gpu = plan_of("lstm", 64, 4, dtype)
    kernel = next(iter(gpu_backward(plan, gpu)))
    assert kernel.template == template
    args = {a.name: a for a in kernel.launch.args}
    gates = "float32" if dtype == "float32" else dtype  # published and written in the half type
    assert (args["d_gates"].dtype, args["workspace"].dtype) == (gates, gates)
    # the outputs' gradients in and the projection's out in the layer's type, as torch gives and its GEMMs take them
    assert (args["d_out"].dtype, args["d_h_n"].dtype, args["d_xp"].dtype) == (dtype,) * 3
    assert (args["d_h0"].dtype, args["saved"].dtype) == ("float32",) * 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_float32_backward_of_a_half_layer_writes_its_gate_gradients_in_the_half_type(dtype):
    """Head-wise products take the float32 backward: it exchanges the gate gradients in float32 but writes ``d_gates``
    and ``d_xp`` in the layer's type, which the weights' and the projection's GEMMs take
    (``torch.autograd.weight_gradient``, ``torch.projection.projection_gradients``)."""
    layer = prnn_tvm.compile_cell("lstm_h4", 64, 4, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    kernel = next(iter(gpu_backward(layer.plan, layer.gpu)))
    assert kernel.template == "persistent_backward"
    args = {a.name: a for a in kernel.launch.args}
    assert (args["d_gates"].dtype, args["workspace"].dtype, args["d_xp"].dtype) == (dtype, "float32", dtype)
    source = build_functions({"recurrent_backward": kernel.func}, layer.target, layer.gpu).source
    for name in ("d_gates", "d_xp", "d_out"):
        assert f"{'half' if dtype == 'float16' else 'nv_bfloat16'}* __restrict__ {name}" in source, name


def test_refusals_name_the_reason():
    plan, gpu = plan_of("lstm", 64, 4, "float32")
    assert "float16" in bc.refusal(plan, "sm_90")
    plan, gpu = plan_of("lstm", 64, 4)
    assert bc.refusal(plan, "sm_90") is None
    assert "sm_80" in bc.refusal(plan, "sm_75")
    plan, _ = plan_of("slstm_h4", 64, 4)
    assert "head-wise" in bc.refusal(plan, "sm_90")
    kernel = next(iter(gpu_backward(plan, gpu)))  # the float32 backward takes it
    assert kernel.template == "persistent_backward"


@pytest.mark.parametrize(
    "change, match",
    [
        ({"barrier": "tags"}, "barrier is one of"),
        ({"poll_sleep": 256}, "poll_sleep=256"),
        ({"batch_groups": 2}, "batch_groups=2"),
        ({"operand_path": "direct"}, "operand_path='direct'"),
        ({"units_per_cta": 0}, "units_per_cta=0"),
        ({"k_groups": 5}, "k_groups=5"),
        ({"n_tiles": 2}, "n_tiles=2"),  # a batch of 4 is one tile of 8 rows
        ({"m_tiles_per_warp": 2}, "m_tiles_per_warp=2"),  # 8 units: one row tile
        ({"k_chains": 3}, "k_chains=3"),
        ({"k_groups": 1}, "registers per thread"),  # every transposed weight of the CTA in one warp
        ({"copy_stages": 3}, "copy_stages=3"),
        ({"prefetch_steps": 9}, "prefetch_steps=9"),
    ],
)
def test_validate_refuses_what_the_backward_cannot_place(change, match):
    plan, gpu = plan_of("lstm", 1024, 4)
    cfg = dataclasses.replace(BackwardMmaConfig(8, 8, 1), **change)
    with pytest.raises(ConfigError, match=match):
        bc.validate(cfg, plan, gpu)


def test_the_transposed_weights_take_half_the_registers_of_the_float32_backward():
    """16 units per CTA fill a row tile: the fragments hold every weight once, in two bytes."""
    plan, gpu = plan_of("lstm", 1024, 16)
    half = bc.geometry(BackwardMmaConfig(16, 16, 2), plan)
    widened = fb.geometry(pc.PersistentConfig(16, 32, 1, 8, 4), plan)
    assert half.weights_per_thread * half.threads * 2 == widened.weights_per_thread * widened.threads
    assert half.weights_per_thread * half.threads * 4 == 16 * 4 * 1024 * 2  # 32-bit registers of 16 x 4096 halves


def test_two_operands_start_at_row_tile_boundaries():
    """Cho's GRU multiplies h and r * h: each operand's units get row tiles of their own."""
    plan, gpu = plan_of("gru_cho", 512, 8)
    g = bc.validate(BackwardMmaConfig(4, 4, 1), plan, gpu)
    assert (g.m_tiles, g.rows) == (2, 32)
    assert g.k_pad == 16 * g.k_tiles_per_warp * 4 >= fb.gate_rows(plan) * 512


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, cluster",
    [
        ("lstm", 1024, 16, "float16", 8),
        ("lstm", 1024, 16, "bfloat16", 8),
        ("gru", 1024, 16, "float16", 8),
        ("rnn_tanh", 1024, 16, "float16", 8),
        ("gru_cho", 512, 8, "float16", 8),  # two operands, two phases
        ("lstm", 37, 1, "float16", 1),  # odd hidden: gate rows not a multiple of 8 (8-byte copies)
        ("rnn_tanh", 37, 5, "bfloat16", 1),  # odd gate rows: plain copies
        ("lstm", 1536, 16, "float16", 1),  # part of the fragments in shared memory; two passes a phase
        ("lstm", 1536, 8, "float16", 4),  # 96 CTAs: clusters of 4
        ("lstm", 512, 8, "float16", 8),
        ("gru", 512, 8, "float16", 8),
    ],
)
def test_the_tensor_core_backward_compiles_without_spills(cell, hidden, batch, dtype, cluster):
    """ptxas's figures for the first ranked config, and the code it runs: mma.sync on half fragments; in clusters
    (where it takes them: ``test_backward_mma_cluster.py``) the cluster's shared copy, waited for by the block
    (clusters of 8: copy_stages=0) or by each warp for its own columns (of 4: 1); else the gate gradients' tile by
    cp.async where the rows allow: where each k group is one warp, each warp its own columns in two groups
    (copy_stages=2), waited for one at a time, else the block's whole tile; the forward's values of two steps on
    asked into L2 (prefetch_steps=2)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    plan, gpu = layer.plan, layer.gpu
    cfg = bc.ranked_configs(plan, gpu)[0]
    kernel = backward_mma.backward_kernel(plan, gpu, cfg)
    built = build_functions({"recurrent_backward": kernel.func}, layer.target, gpu)
    fn = built.ptxas.function("recurrent_backward")
    assert fn.spills == 0, (cfg, fn)
    assert (cfg.shared_k_tiles > 0) == (hidden == 1536) and cfg.cluster == cluster, cfg
    assert "mma.sync.aligned.m16n8k16" in built.source
    g = bc.geometry(cfg, plan)
    calls = built.source.split("recurrent_backward_kernel(")[-1]  # the kernel's body, not the helpers' definitions
    per_item = plan.input.slices + len(plan.saved_leaves()) + 1  # its xp, saved and d_out columns of 2 steps on
    assert calls.count("prnn_prefetch_l2(") == per_item * g.items_per_thread, calls.count("prnn_prefetch_l2(")
    if cluster > 1:
        own = cfg.copy_stages == 1 and g.warp_rows == 1
        copies = calls.count(f"prnn_cluster_copy<{cluster}>(")  # a phase's: one per waited mbarrier with columns
        assert (plan.phases <= copies <= plan.phases * cfg.k_groups if own else copies == plan.phases), copies
        assert "prnn_cp_async" not in calls
        assert calls.count("prnn_cluster_wait_warp(" if own else "prnn_cluster_wait(") == plan.phases, cfg
        return
    asynchronous = fb.gate_rows(plan) * hidden % 2 == 0
    assert ("prnn_cp_async" in built.source) == asynchronous
    own = g.warp_rows == 1 and cfg.copy_stages == 2
    stages = min(2, g.k_tiles_per_warp) if own else 0  # a stage per k tile at most
    assert calls.count("prnn_cp_async_commit();") == (stages if asynchronous else 0)
    assert ("prnn_cp_async_wait_group<0>();" in calls) == (own and asynchronous)
    assert ("prnn_cp_async_wait_group<1>();" in calls) == (stages == 2 and asynchronous)
    assert calls.count("prnn_sync_warp();") == stages
    assert ("prnn_cp_async_wait_all();" in calls) == (asynchronous and not own)


def test_a_half_layer_trains_on_the_tensor_cores():
    """compile_training's report names the tensor-core backward's knobs and no spills."""
    layer = prnn_tvm.compile_cell("lstm", 1024, 16, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])
    report = compile_training(layer).report
    backward = report.splitlines()[-1]
    assert backward.startswith("recurrent_backward: 64 CTAs") and "units_per_cta=16 k_groups=" in backward, report
    assert all(", 0 spill bytes" in line for line in report.splitlines()), report

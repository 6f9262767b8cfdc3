"""``gate_layout="in_warp"`` (``schedules/gate_layout.py``, ``schedules/persistent_warp_gates.py``): a unit's gates in
one warp's accumulators. Refusals, the default and the tuning space, and the kernels as ptxas builds them (no
spills; one block barrier a step, no partial sums in shared memory). Its numbers on the GPU: test_gpu_heads.py."""

import dataclasses
import re

import pytest

import prnn_tvm
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import by_name
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.target import gpu_spec, max_regs_per_thread
from prnn_tvm.tune.space import ConfigSpace

from .test_ptxas import kernel_source, time_loops

GPU = gpu_spec("sm_90")
IN_WARP = mc.MmaConfig(64, 1, 2, "block", m_tiles_per_warp=2, gate_layout="in_warp")  # lstm_h12's at 768 x 16


def plan(cell, hidden=768, batch=16, dtype="bfloat16"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


def build(cell, dtype, config=None, hidden=768, batch=16):
    return prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config,
                                 tuning_logs=[])


@pytest.mark.parametrize(
    "cell, hidden, batch, config, message",
    [
        ("lstm_h12", 768, 16, dataclasses.replace(IN_WARP, gate_layout="rows"), "gate_layout 'rows' unknown"),
        ("lstm_h12", 768, 16, dataclasses.replace(IN_WARP, barrier="tags"), "barrier 'block', not 'tags'"),
        ("lstm_h12", 768, 16, dataclasses.replace(IN_WARP, m_tiles_per_warp=1), "take m_tiles_per_warp=2, not 1"),
        ("lstm_h12", 768, 16, dataclasses.replace(IN_WARP, k_groups=2), "take k_groups=1, not 2"),
        ("lstm_h12", 768, 16, dataclasses.replace(IN_WARP, n_tiles=1), "n_tiles covering the batch"),
        ("lstm_h12", 48, 16, dataclasses.replace(IN_WARP, units_per_cta=48), "heads of 4 units are not a multiple"),
        ("gru_h12", 768, 16, dataclasses.replace(IN_WARP, m_tiles_per_warp=1), r"an even number of slices"),
        ("lstm_x2", 64, 8, dataclasses.replace(IN_WARP, n_tiles=1), "one recurrent product"),
    ],
)
def test_configs_it_cannot_place_are_refused_with_the_reason(cell, hidden, batch, config, message):
    with pytest.raises(ConfigError, match=message):
        mc.validate(config, plan(cell, hidden, batch), GPU)


def test_a_single_block_of_a_dense_cell_takes_it():
    """Not only heads: a dense LSTM whose one block holds every unit (``block``) has its gates in warps too."""
    config = mc.MmaConfig(64, 1, 1, "block", m_tiles_per_warp=2, gate_layout="in_warp")
    g = mc.validate(config, plan("lstm", 64, 8), GPU)
    assert g.items_per_thread == 2 and g.threads == 256 and g.smem_gs == 0


@pytest.mark.parametrize("cell", ["lstm_h12", "lstm_h48", "lstm_h24", "slstm_h12", "slstm_h48"])
def test_the_default_puts_a_units_gates_in_one_warp(cell):
    """Where it fits, the first untuned config is ``in_warp``, the same placement ``by_gate`` next (a fallback)."""
    p = plan(cell)
    first, *rest = mc.ranked_configs(p, GPU)
    assert first.in_warp and first.barrier == "block" and first.k_groups == 1, first
    assert first.m_tiles_per_warp == p.reductions[0].slices // 2
    assert any(not c.in_warp and c.units_per_cta == first.units_per_cta for c in rest), rest


@pytest.mark.parametrize("cell", ["lstm_h3", "lstm"])  # heads of 256: no block holds one; dense: the grid
def test_the_default_stays_by_gate_where_it_does_not_fit(cell):
    assert not any(c.in_warp for c in mc.ranked_configs(plan(cell), GPU))


def test_the_tuning_space_offers_both_layouts():
    space = ConfigSpace(plan("lstm_h12", dtype="float16"), GPU, by_name("persistent_mma"))
    in_warp = [c for c in space.configs if c.in_warp]
    assert in_warp and all(c.barrier == "block" and c.k_groups == 1 for c in in_warp)
    assert all(dataclasses.replace(c, gate_layout="by_gate") in space.configs for c in in_warp)  # each a twin
    assert "gate_layout=in_warp" in space.feature_names
    assert space.configs[space.defaults()[0]].in_warp


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "cell, config",
    [
        ("lstm_h12", None),
        ("lstm_h48", None),
        ("slstm_h12", None),
        ("slstm_h48", None),
        ("lstm_h6", mc.MmaConfig(128, 1, 2, "block", m_tiles_per_warp=2, smem_k_tiles=2, gate_layout="in_warp")),
    ],
)
def test_the_kernels_build_without_spills(cell, config, dtype):
    """ptxas: no spills, within the registers the CTA allows; a step's time loop is the step alone (below) and
    stores no partial sums to shared memory."""
    layer = build(cell, dtype, config)
    rep = layer.report
    assert layer.kernel.config.in_warp, rep.format()
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
    assert rep.registers <= max_regs_per_thread(rep.threads, GPU), rep.format()
    body = kernel_source(layer)
    begin, end = time_loops(body)[0]
    loop = body[begin:end]
    assert_the_step_alone(layer, body, loop)
    assert "((float*)" not in loop and "_ptr_3[" not in loop.replace("((nv_bfloat16*)_ptr_3)[", "").replace(
        "((half*)_ptr_3)[", ""
    )  # shared memory is read and written as the half operand tiles only


def assert_the_step_alone(layer, body: str, loop: str):
    """What the hand-written prototype's loop does and no more (bench/changes/heads_gates_in_warp.json, issue 49):
    no test for the first step (the initial states go into the tiles before the loop), no test for the last (the
    final states are written after it, from registers), the operand tile read by ldmatrix alone (a row past its
    length keeps its state in registers), and one block barrier, unguarded, after the next step's loads of the
    projection (a guarded one shared their guard, and ptxas issued the loads after the barrier). After the barrier,
    the outputs alone: 16-byte copies from the tile the step wrote (heads_out_from_tile), no store of them before."""
    assert "v == 0" not in loop and "seq_len - 1" not in loop, loop
    finals = [f"{a.name}_ptr[" for a in layer.kernel.launch.args if a.role == "final"]
    assert finals and all(f not in loop and f in body[body.index(loop) + len(loop):] for f in finals), finals
    tile_reads = [ln for ln in loop.splitlines() if "_ptr_3)[" in ln and not re.match(r"\s*\(\(\w+\*\)_ptr_3\)\[", ln)]
    assert tile_reads and all("prnn_ldmatrix_x4(" in ln for ln in tile_reads), tile_reads
    assert loop.count("__syncthreads()") == 1 and "\n    __syncthreads();\n" in loop, loop[-300:]
    step, after = loop.split("__syncthreads()")
    assert step.rindex("xp_ptr[") and "out_ptr" not in step, step[-300:]
    copies = [ln for ln in after.splitlines() if "out_ptr" in ln]
    assert copies and all(ln.lstrip().startswith("*(uint4*)(out_ptr + ") for ln in copies), after
    assert "*(uint4*)(((" in after and "_ptr_3) + (((((v + 1) & 1) * " in after, after  # the set the step wrote


def test_by_gate_keeps_two_barriers_a_step_and_the_shared_gate_sums():
    """The same placement by gate (what the layout removes): the partial sums' barrier and the end of the step."""
    layer = build("lstm_h12", "bfloat16", dataclasses.replace(IN_WARP, gate_layout="by_gate"))
    begin, end = time_loops(kernel_source(layer))[0]
    loop = kernel_source(layer)[begin:end]
    assert loop.count("__syncthreads()") == 3 and "_ptr_3[" in loop  # float partial sums


def test_the_operand_tile_is_double_buffered():
    """Step ``v`` multiplies set ``v % 2`` (ldmatrix) and writes its new h into set ``(v + 1) % 2``."""
    layer = build("lstm_h12", "bfloat16", IN_WARP)
    set_elements = 16 * (64 + mc.ROW_SKEW)  # batch tile rows x (span + skew)
    assert layer.kernel.launch.grid.smem_bytes >= 2 * 2 * set_elements
    body = kernel_source(layer)
    assert f"((v & 1) * {set_elements})" in body and f"(((v + 1) & 1) * {set_elements})" in body


@pytest.mark.parametrize(
    "cell, config, ahead",
    [
        ("lstm_h12", IN_WARP, 2),  # 256 threads: 255 registers a thread, room for a second bank
        ("lstm_h6", mc.MmaConfig(128, 1, 2, "block", m_tiles_per_warp=2, smem_k_tiles=2, gate_layout="in_warp"), 1),
    ],
)
def test_the_projection_is_loaded_two_steps_ahead_where_the_registers_allow(cell, config, ahead):
    """The prologue loads the first ``ahead`` steps' projection, each step the one ``ahead`` steps on; a CTA of 512
    threads (128 registers a thread) keeps one step ahead, without spills."""
    layer = build(cell, "bfloat16", config)
    body = kernel_source(layer)
    begin, end = time_loops(body)[0]
    per_step = body[begin:end].count("= xp_ptr[")
    assert per_step and body[:begin].count("= xp_ptr[") == ahead * per_step
    assert layer.report.spill_store_bytes == 0 and layer.report.stack_bytes == 0, layer.report.format()
    stride = 16 * 4 * 768  # a step of the projection: batch x 4 gates x hidden
    assert f"+ {ahead * stride})]" in body[begin:end], body[begin:end][-2000:]

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

from .test_ptxas import kernel_source, loop_steps, time_loops

GPU = gpu_spec("sm_90")
IN_WARP = mc.MmaConfig(64, 1, 2, "block", m_tiles_per_warp=2, gate_layout="in_warp")  # lstm_h12's at 768 x 16


def plan(cell, hidden=768, batch=16, dtype="bfloat16"):
    return prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)


def one_group(p) -> list:
    """The ranked configs of one batch group (the default takes the first of them in batch groups first:
    test_heads_batch_groups.py)."""
    return [c for c in mc.ranked_configs(p, GPU) if c.batch_groups == 1]


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
    """Where it fits, the first untuned config is ``in_warp``, a head a CTA (48 heads fit the SMs one an SM), the
    placement ``by_gate`` later (a fallback)."""
    p = plan(cell)
    first, *rest = mc.ranked_configs(p, GPU)
    assert first.in_warp and first.barrier == "block" and first.k_groups == 1, first
    assert first.m_tiles_per_warp == p.reductions[0].slices // 2
    assert first.units_per_cta == p.reductions[0].head_size(768), first
    assert any(not c.in_warp for c in rest), rest


@pytest.mark.parametrize("cell, hidden, units", [("lstm_h48", 768, 16), ("lstm_h96", 1536, 16),
                                                ("lstm_h192", 3072, 32)])
def test_the_default_takes_a_head_a_cta_where_the_heads_fit_the_sms(cell, hidden, units):
    """A block of the ``block`` barrier waits for no other: heads of 16 take a CTA each (48 or 96 CTAs, where the
    estimate ranks two heads a CTA first), 192 heads (more than the 132 SMs) keep two a CTA."""
    p = plan(cell, hidden)
    first = mc.ranked_configs(p, GPU)[0]
    assert first.in_warp and first.units_per_cta == units, first
    assert next(c for c in mc.ranked_configs(p, GPU) if not c.in_warp).units_per_cta == 32


@pytest.mark.parametrize("batch, sk", [(16, 2), (9, 2), (32, 6), (1, 0), (5, 0)])
def test_a_head_of_128_takes_its_gates_in_one_warp_with_shared_k_tiles(batch, sk):
    """Heads of 128 at batch 16: in_warp at 512 threads (128 registers) holds 2 of a warp's 8 k tiles' weights in
    shared memory (H200: 1.425 us per step against 2.435 by gate, 252 registers at 256 threads); the fewest that
    validate at each batch (none at one batch tile), the by_gate config next (a fallback)."""
    p = plan("lstm_h6", batch=batch)
    first, second, *_ = one_group(p)
    assert first.in_warp and first.smem_k_tiles == sk and mc.geometry(first, p).threads == 512, first
    if sk:
        with pytest.raises(ConfigError, match="registers per thread"):
            mc.validate(dataclasses.replace(first, smem_k_tiles=sk - 1), p, GPU)
    assert not second.in_warp and second.units_per_cta == 128, second


def test_fewest_shared_tiles_is_none_where_no_count_fits():
    """Heads of 256: a unit's gates in one warp make 1024 threads of 64 registers, short even with every weight in
    shared memory."""
    cfg = mc.MmaConfig(256, 1, 2, "block", m_tiles_per_warp=2, gate_layout="in_warp")
    assert mc.fewest_shared_tiles(cfg, plan("lstm_h3"), GPU) is None
    assert mc.fewest_shared_tiles(IN_WARP, plan("lstm_h12"), GPU) == IN_WARP


@pytest.mark.parametrize("cell", ["lstm_h3", "lstm"])  # heads of 256: no block holds one; dense: the grid
def test_the_default_stays_by_gate_where_it_does_not_fit(cell):
    assert not any(c.in_warp for c in mc.ranked_configs(plan(cell), GPU))


def test_the_tuning_space_offers_both_layouts():
    space = ConfigSpace(plan("lstm_h12", dtype="float16"), GPU, by_name("persistent_mma"))
    in_warp = [c for c in space.configs if c.in_warp]
    assert in_warp and all(c.barrier == "block" and c.k_groups == 1 for c in in_warp)
    assert all(dataclasses.replace(c, gate_layout="by_gate", batch_warps=1) in space.configs for c in in_warp)  # twins
    assert "gate_layout=in_warp" in space.feature_names
    assert space.configs[space.defaults()[0]].in_warp


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "cell, config",
    [
        ("lstm_h12", None),  # batch_warps=2: a warp's one batch tile
        ("lstm_h12", IN_WARP),  # two batch tiles a warp: ldmatrix
        ("lstm_h48", None),
        ("slstm_h12", None),
        ("slstm_h48", None),
        ("lstm_h6", None),  # 512 threads, 2 of a warp's k tiles in shared memory
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
    length keeps its state in registers; a warp of one batch tile, ``batch_warps``: by two 32-bit loads into its B
    fragment a k tile), and one block barrier, unguarded, after the next step's loads of the
    projection (a guarded one shared their guard, and ptxas issued the loads after the barrier). After the barrier,
    the outputs alone: 16-byte copies from the tile the step wrote (heads_out_from_tile), no store of them before.
    Where the projection's register banks take turns, a turn of the loop is two such steps (``loop_steps``), the
    second under its guard, each copying out the set of tiles it wrote, known when built: set 1, then set 0."""
    assert "v == 0" not in loop and "seq_len - 1" not in loop, loop
    finals = [f"{a.name}_ptr[" for a in layer.kernel.launch.args if a.role == "final"]
    assert finals and all(f not in loop and f in body[body.index(loop) + len(loop):] for f in finals), finals
    steps, copied = loop_steps(loop), []
    for k, text in enumerate(steps):
        lines = text.splitlines()
        tile_reads = [ln for ln in lines if "_ptr_3)[" in ln and not re.match(r"\s*\(\(\w+\*\)_ptr_3\)\[", ln)]
        indent = " " * (4 + 2 * k)  # the loop's level, or the second step's guarded block's
        assert text.count("__syncthreads()") == 1 and f"\n{indent}__syncthreads();\n" in text, text[-300:]
        step, after = text.split("__syncthreads()")
        if layer.kernel.config.warp_n_tiles > 1:
            assert tile_reads and all("prnn_ldmatrix_x4(" in ln for ln in tile_reads), tile_reads
        else:
            loads = [ln for ln in step.splitlines() if "_ptr_3) + " in ln]
            assert not tile_reads and loads, (tile_reads, step[:2000])
            assert all(re.match(r"\s*\*\(\w+2\*\)\(_ptr_2 \+ \d+\) = \*\(\w+2\*\)\(", ln) for ln in loads), loads
        assert step.rindex("xp_ptr[") and "out_ptr" not in step, step[-300:]
        copies = [ln for ln in after.splitlines() if "out_ptr" in ln]
        assert copies and all(ln.lstrip().startswith("*(uint4*)(out_ptr + ") for ln in copies), after
        copied += re.findall(r"\*\(uint4\*\)\(\(\(\w+\*\)_ptr_3\) \+ (.*)\);", after)[:1]
    if len(steps) == 1:
        assert "_ptr_3) + (((((v + 1) & 1) * " in after, after  # the set the step wrote
    else:
        first, second = copied
        assert re.fullmatch(rf"\({re.escape(second)} \+ \d+\)", first) and "v" not in first, copied


def test_by_gate_keeps_two_barriers_a_step_and_the_shared_gate_sums():
    """The same placement by gate (what the layout removes): the partial sums' barrier and the end of the step."""
    layer = build("lstm_h12", "bfloat16", dataclasses.replace(IN_WARP, gate_layout="by_gate"))
    begin, end = time_loops(kernel_source(layer))[0]
    loop = kernel_source(layer)[begin:end]
    assert loop.count("__syncthreads()") == 3 and "_ptr_3[" in loop  # float partial sums


def test_the_operand_tile_is_double_buffered():
    """Step ``v`` multiplies set ``v % 2`` (ldmatrix) and writes its new h into set ``(v + 1) % 2``: in a turn of two
    steps (the projection's banks taking turns), the first multiplies set 0 and the second set 1, each ldmatrix of
    the second a set on from the first's (the copies out of the set each wrote: test_the_kernels_build_...)."""
    layer = build("lstm_h12", "bfloat16", IN_WARP)
    set_elements = 16 * (64 + mc.ROW_SKEW)  # batch tile rows x (span + skew)
    assert layer.kernel.launch.grid.smem_bytes >= 2 * 2 * set_elements
    body = kernel_source(layer)
    steps = loop_steps(body[slice(*time_loops(body)[0])])
    if len(steps) == 1:
        assert f"((v & 1) * {set_elements})" in body and f"(((v + 1) & 1) * {set_elements})" in body
        return

    def offsets(text):  # each ldmatrix's constant offset into the tiles
        found = re.findall(r"prnn_ldmatrix_x4\(\(&\(_ptr_2\[0\]\)\), \(&\(\(\(\w+\*\)_ptr_3\)\[(.*)\]\)\)\);", text)
        return [int(m[1]) if (m := re.search(r" \+ (\d+)\)$", index)) else 0 for index in found]

    first, second = (offsets(text) for text in steps)
    assert first and len(first) == len(second) and max(first) < set_elements, (first, second)
    assert [b - a for a, b in zip(first, second)] == [set_elements] * len(first), (first, second)


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
    step = loop_steps(body[begin:end])[0]  # a turn's first step
    per_step = step.count("= xp_ptr[")
    assert per_step and body[:begin].count("= xp_ptr[") == ahead * per_step
    assert layer.report.spill_store_bytes == 0 and layer.report.stack_bytes == 0, layer.report.format()
    stride = 16 * 4 * 768  # a step of the projection: batch x 4 gates x hidden
    assert f"+ {ahead * stride})]" in step, step[-2000:]


# ---------------------------------------------------------------- batch_warps: a pass's batch tiles over sets of warps
SPLIT = dataclasses.replace(IN_WARP, batch_warps=2)


@pytest.mark.parametrize(
    "config, batch, message",
    [
        (dataclasses.replace(IN_WARP, batch_warps=3), 16, "batch_warps=3: must be one of 1, 2, 4, 8"),
        (dataclasses.replace(SPLIT, gate_layout="by_gate"), 16, "take gate_layout='in_warp', or batch_warps=1"),
        (dataclasses.replace(SPLIT, n_tiles=1), 8, "n_tiles=1 does not split into 2"),
        (dataclasses.replace(IN_WARP, n_tiles=4, batch_warps=4), 32, "a 1024-thread CTA allows 64"),
    ],
)
def test_batch_warps_it_cannot_place_are_refused_with_the_reason(config, batch, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        mc.validate(config, plan("lstm_h12", batch=batch), GPU)


def test_split_batch_tiles_halve_a_threads_work_and_double_the_warps():
    one, two = (mc.validate(c, plan("lstm_h12"), GPU) for c in (IN_WARP, SPLIT))
    assert (one.threads, two.threads) == (256, 512) and (one.items_per_thread, two.items_per_thread) == (4, 2)
    assert two.weights_per_thread == one.weights_per_thread and two.regs_estimate < one.regs_estimate
    assert mc.MmaConfig(64, 1, 4, batch_warps=2).warp_n_tiles == 2
    assert SPLIT.as_dict()["batch_warps"] == 2 and "batch_warps" not in IN_WARP.as_dict()  # records from before


def test_the_tuning_space_offers_each_in_warp_config_split():
    space = ConfigSpace(plan("lstm_h12"), GPU, by_name("persistent_mma"))
    split = [c for c in space.configs if c.batch_warps > 1]
    assert split and all(c.in_warp and c.n_tiles % c.batch_warps == 0 for c in split)
    assert all(dataclasses.replace(c, batch_warps=1) in space.configs for c in split)  # each a twin


@pytest.mark.parametrize("cell", ["lstm_h12", "lstm_h48", "lstm_h24", "slstm_h12"])
def test_the_default_splits_the_batch_tiles_only_below_the_measured_warps(cell, monkeypatch):
    """BATCH_WARPS_BELOW = 16 (H200, 768 x 16: heads of 16, 32 and 64 0.88-0.95x the step unsplit): the CTAs of
    fewer than 16 warps take twice the warps, each with half the batch tiles, and the unsplit config follows (a
    fallback); 0 would never split."""
    p = plan(cell)
    assert mc.BATCH_WARPS_BELOW == 16
    first, second, *_ = one_group(p)
    assert first == dataclasses.replace(second, batch_warps=2), (first, second)
    assert mc.geometry(first, p).threads == 2 * mc.geometry(second, p).threads <= 16 * 32
    monkeypatch.setattr(mc, "BATCH_WARPS_BELOW", 0)
    assert all(c.batch_warps == 1 for c in mc.ranked_configs(p, GPU))


@pytest.mark.parametrize("batch, warps", [(1, 1), (5, 1), (9, 2), (32, 4), (64, 8)])
def test_the_split_takes_the_batch_tiles_of_each_batch_up_to_16_warps(batch, warps):
    """Heads of 16 (2 warps a CTA unsplit): one batch tile has nothing to split; 2, 4, 8 tiles a pass take as many
    sets of warps (4, 8, 16 warps), each set one tile."""
    p = plan("lstm_h48", batch=batch)
    first = one_group(p)[0]
    assert first.in_warp and first.batch_warps == warps and first.warp_n_tiles == 1, first
    assert mc.geometry(first, p).threads == 64 * warps


@pytest.mark.parametrize(
    "cell, batch, config",
    [
        ("lstm_h12", 16, SPLIT),  # 512 threads, warps 8-15 on batch rows 8-15
        ("lstm_h12", 9, SPLIT),  # the second set's tile holds one row of the batch
        ("lstm_h48", 16, dataclasses.replace(SPLIT, units_per_cta=32)),  # two heads a CTA
        ("lstm_h12", 32, dataclasses.replace(SPLIT, n_tiles=4)),  # two batch tiles a warp (ldmatrix pairs)
        ("slstm_h12", 16, SPLIT),
    ],
)
def test_split_kernels_build_without_spills_and_place_each_warp_on_its_tiles(cell, batch, config):
    layer = build(cell, "bfloat16", config, batch=batch)
    rep = layer.report
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
    assert rep.threads == 2 * 32 * config.units_per_cta // 8 and rep.registers <= max_regs_per_thread(rep.threads, GPU)
    body = kernel_source(layer)
    sets = rep.threads // 2  # threads of one set of warps
    # a set's warps hold the same units (tx % sets) and start at batch tile tx / sets of the pass's
    assert f"((((int)threadIdx.x) & {sets - 1}) >> 2)" in body, body[:3000]
    assert f"((((int)threadIdx.x) >> {sets.bit_length() - 1}) * {8 * config.warp_n_tiles})" in body, body[:5000]
    begin, end = time_loops(body)[0]
    assert all(step.count("__syncthreads()") == 1 for step in loop_steps(body[begin:end]))


def test_a_session_runs_a_split_config_by_gate_on_one_set_of_warps():
    """A session kernel (``tags``, by_gate: in_warp writes its block's own tiles) takes batch_warps=1 with it."""
    from prnn_tvm.schedules import session

    got = session.session_config(SPLIT, plan("lstm_h12"), GPU, mc.validate, mc.ranked_configs, 768)
    assert not got.in_warp and got.batch_warps == 1, got


# ---------------------------------------------------------------- the projection's register banks taking turns
def test_the_projection_banks_take_turns_two_steps_a_turn(monkeypatch):
    """With a second bank of the projection's registers (``xp_two_ahead``) the time loop runs two steps a turn, each
    loading the projection of two steps on into the bank it read (``WarpGates.time_loop``): no values move between
    the banks. ``XP_BANKS_ALTERNATE`` off: a step a turn, the next step's values moved into the bank the step reads
    (the form the banks replaced: ``bench/xp_prefetch_block.py``'s ``moved+`` variants)."""
    layer = build("lstm_h12", "bfloat16", IN_WARP)
    body = kernel_source(layer)
    steps = loop_steps(body[slice(*time_loops(body)[0])])
    banks = [set(re.findall(r"(_ptr_\d+)\[\d+\] = xp_ptr\[", step)) for step in steps]
    assert len(steps) == 2 and all(len(bank) == 1 for bank in banks) and banks[0] != banks[1], banks
    (a,), (b,) = banks
    assert not re.search(rf"({a}\[\d+\] = {b}\[)|({b}\[\d+\] = {a}\[)", body)
    assert re.search(rf"\bif \(\(\(v \* 2\) \+ 2\) < seq_len\) \{{[^}}]*{a}\[0\] = xp_ptr\[", steps[0])  # 2 on, its own
    assert layer.report.spill_bytes == 0, layer.report.format()
    monkeypatch.setattr(by_name("persistent_mma").builder, "XP_BANKS_ALTERNATE", False)
    moved = prnn_tvm.compile_cell("lstm_h12", 768, 16, dtype="bfloat16", target="cuda", arch="sm_90", config=IN_WARP,
                                  tuning_logs=[], cache=False)
    body = kernel_source(moved)
    (step,) = loop_steps(body[slice(*time_loops(body)[0])])
    (into,) = set(re.findall(r"(_ptr_\d+)\[\d+\] = xp_ptr\[", step))
    assert re.search(rf"_ptr_\d+\[0\] = {into}\[0\];", step)  # the next step's values moved out of the bank loaded

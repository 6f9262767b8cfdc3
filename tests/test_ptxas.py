"""Generated CUDA, inspected: ptxas registers and spills for every default config, and structure.

Runs without a GPU: TVM emits CUDA source, which is compiled here with nvcc for each arch.
"""

import dataclasses
import re

import numpy as np
import pytest
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import tirx

import prnn_tvm
from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.codegen.pointwise import fast_transcendentals
from prnn_tvm.codegen.ptxas import parse_report
from prnn_tvm.dtypes import itemsize
from prnn_tvm.errors import ConfigError, LaunchError
from prnn_tvm.frontend.texpr import evaluate, rebuild
from prnn_tvm.report import ConfigOrigin
from prnn_tvm.runtime.base import RuntimeLayer
from prnn_tvm.schedules import by_name, template_for
from prnn_tvm.schedules.persistent_config import default_config
from prnn_tvm.target import DEFAULT_SMEM_PER_BLOCK, gpu_spec, launchable_smem, max_regs_per_thread, smem_launch_problem
from prnn_tvm.tune.space import ConfigSpace
from prnn_tvm.verify import bounds

CELLS = sorted(prnn_tvm.builtin_cells())
GRID_KINDS = sorted(name for name, b in BARRIERS.items() if b.grid_wide)  # ``block`` takes heads: test_heads_cuda.py
EXP_FREE_CELLS = ("indrnn", "rnn_relu", "rnn_tanh", "stacked_rnn")  # no exp or sigmoid in their math
TANH_FREE_CELLS = ("indrnn", "rnn_relu")


# Where the register estimate ranks first a config that ptxas spills, and the build takes the next
# ranked default (the report names it): (cell, hidden, batch, arch) -> spill bytes passed over.
# Cho's GRU at 1024x4 on sm_90: 112 B since the cost model counts the halving lane reduction's shuffles (144 B
# before; 128 before the last block out advanced the barrier base, 136 before its two pointwise groups, 104
# before lengths).
KNOWN_FALLBACKS = {("gru_cho", 1024, 4, "sm_90"): (112,)}

# The no-spill grids check every cell at every shape on sm_90, the arch of the shipped tuning records and of the
# GPU the kernels are measured on, and a sample on sm_80 (A100 defaults, no records, no GPU to run them): each
# cell at one shape, the shapes taken in turn down the sorted cells so that every shape and every cell is
# compiled for sm_80, and every known sm_80 fallback. An sm_80 compile costs nvcc 1.5-3x an sm_90 one
# (stacked_rnn 1024x4: 16 s of CPU); the whole sm_80 grid was ~150 s of `make test`'s CPU.
SHAPES = [(256, 4), (1024, 4), (128, 16)]


def arch_grid(shapes: list, known_sm80: set) -> list:
    """``(arch, *shape, cell)`` for every shape and cell on sm_90, and on sm_80 cell i at ``shapes[i % n]`` plus
    the ``(*shape, cell)`` of ``known_sm80`` (see above)."""
    sm90 = [("sm_90", *shape, cell) for shape in shapes for cell in CELLS]
    sampled = {(*shapes[i % len(shapes)], cell) for i, cell in enumerate(CELLS)} | set(known_sm80)
    return sm90 + [("sm_80", *shape, cell) for shape in shapes for cell in CELLS if (*shape, cell) in sampled]


@pytest.mark.parametrize(
    "arch, hidden, batch, cell",
    arch_grid(SHAPES, {(h, b, c) for c, h, b, a in KNOWN_FALLBACKS if a == "sm_80"}),
    ids=str,
)
def test_default_configs_have_no_spills(arch, hidden, batch, cell):
    """Every default config of every cell at each shape has no spills and can launch: all of them on sm_90, a
    sample on sm_80 that compiles every cell, every shape and every known fallback once (``arch_grid``: the
    whole sm_80 grid cost ~75 s of CPU per run)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, target="cuda", arch=arch, tuning_logs=[])
    rep = layer.report
    assert rep.registers is not None, rep.ptxas_note
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0, rep.format()
    assert rep.registers <= max_regs_per_thread(rep.threads, gpu_spec(arch))
    assert_launchable(layer)
    assert rep.config_origin is ConfigOrigin.DEFAULT
    # the first ranked default, unless this is a known fallback (then the report says what spilled)
    passed_over = KNOWN_FALLBACKS.get((cell, hidden, batch, arch), ())
    assert rep.config_passed_over == passed_over, rep.format()
    assert rep.config == default_configs(layer)[len(passed_over)].as_dict()
    assert all(f"spilled: {b} B" in rep.config_detail for b in passed_over)
    assert ("spilled:" in rep.config_detail) == bool(passed_over)


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, arch",
    [
        ("lstm", 1024, 4, "float32", "sm_90"),
        ("lstm", 1024, 4, "float32", "sm_80"),  # 128x128 k-major tiles
        ("lstm", 1024, 1, "float32", "sm_90"),  # 64x128 k-major tiles
        ("gru", 512, 64, "float32", "sm_90"),  # 128x128 k-major tiles, a width of 3 x 512
        ("lstm", 256, 1, "float32", "sm_90"),  # 64x64 k-major tiles (batch x width 1024 < 4096)
        ("lstm", 1024, 16, "float16", "sm_90"),
        ("gru", 33, 3, "bfloat16", "sm_80"),
    ],
)  # tensor cores
def test_the_projection_compiles_without_spills(cell, hidden, batch, dtype, arch):
    """The input projection's kernel, for each tiling ``codegen/projection.py`` picks (its ptxas figures, as
    the report gives them)."""
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch=arch, tuning_logs=[])
    figures = layer.report.projection_ptxas
    assert re.fullmatch(r"(\d+) registers/thread, 0 B spills, 0 B stack, \d+ B static shared memory", figures), figures
    assert int(figures.split()[0]) <= max_regs_per_thread(256, gpu_spec(arch))
    assert f"projection  {figures}" in layer.report.format()


@pytest.mark.parametrize("dtype, ptx", [("float16", "f16"), ("bfloat16", "bf16")])
@pytest.mark.parametrize("input_size", [1024, 37])
def test_a_half_projection_multiplies_on_tensor_cores(dtype, ptx, input_size):
    """Half layers' input projection is the hand-placed mma.sync GEMM (float32 accumulators), with 16-byte
    global loads where the input size allows them and element loads where it does not."""
    layer = prnn_tvm.compile_cell(
        "lstm", 256, 4, input_size=input_size, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[]
    )
    body = projection_body(layer)
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx}.{ptx}.f32" in body
    assert ("uint4 condval" in body) == (input_size % 8 == 0)  # a predicated 16-byte load
    assert " 0 B spills" in layer.report.projection_ptxas


@pytest.mark.parametrize("cell, hidden, pairs", [("lstm", 256, True), ("lstm", 129, True), ("gru", 33, False)])
def test_a_half_projection_stores_pairs_where_the_width_is_even(cell, hidden, pairs):
    """The projection's epilogue writes each lane's two adjacent columns with one 8-byte store where the width
    (gates x hidden: 1024, 516) is even, and with 4-byte stores where it is odd (99: a pair is not aligned)."""
    layer = prnn_tvm.compile_cell(cell, hidden, 3, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])
    assert ("*(float2*)" in projection_body(layer)) == pairs
    assert " 0 B spills" in layer.report.projection_ptxas


def projection_body(layer) -> str:
    """The CUDA source of ``layer``'s projection kernel's definition."""
    src = layer.cuda_source
    start = src.rindex("projection_kernel(")  # the definition (the declaration comes first)
    end = src.find('extern "C"', start)  # the next kernel, if the projection is not the last
    return src[start:] if end < 0 else src[start:end]


def test_a_config_whose_real_grid_cannot_be_co_resident_is_refused_at_compile(monkeypatch):
    """The templates validate a config with an estimate of its registers; ptxas decides. A caller's config whose
    grid does not fit with ptxas's figures is refused when compiled, with them (this one: estimated at 2 CTAs
    per SM, ptxas gives 184 registers, so 1); a default that does not fit is passed over, and the report says
    so (here: every default made to look too large, so none is left)."""
    from prnn_tvm import choice
    from prnn_tvm.schedules import persistent_mma_config as mc

    cfg = mc.MmaConfig(8, 4, 2, "counter", "split")
    assert mc.validate(cfg, prnn_tvm.analyze(prnn_tvm.resolve("lstm_bi"), 16, 1024, "float16"), gpu_spec("sm_90"))
    with pytest.raises(
        ConfigError,
        match=r"grid of 256 CTAs cannot be co-resident on sm_90: ptxas gives \d+ "
        r"registers .* so 132 fit",
    ):
        prnn_tvm.compile_cell("lstm", 1024, 16, dtype="float16", arch="sm_90", bidirectional=True, config=cfg)
    first = prnn_tvm.compile_cell("lstm", 512, 4, arch="sm_90", tuning_logs=[]).report.config
    seen = []

    def fits_after_the_first(kernel, built, gpu):  # the first default "cannot be co-resident"
        seen.append(kernel.config.as_dict())
        return "its grid cannot be co-resident" if len(seen) == 1 else ""

    monkeypatch.setattr(choice, "unlaunchable", fits_after_the_first)  # a patched choice: build, whatever is cached
    rep = prnn_tvm.compile_cell("lstm", 512, 4, arch="sm_90", tuning_logs=[], cache=False).report
    assert seen[0] == first and rep.config == seen[1] != first
    assert "1 ranked before it cannot be co-resident with ptxas's registers" in rep.config_detail
    monkeypatch.setattr(choice, "unlaunchable", lambda kernel, built, gpu: "its grid cannot be co-resident")
    with pytest.raises(ConfigError, match="no default config of cell 'lstm' can launch"):
        prnn_tvm.compile_cell("lstm", 512, 4, arch="sm_90", tuning_logs=[], cache=False)


def assert_launchable(layer):
    """The kernel's shared-memory accesses, every thread's at every step as its TIR writes them, stay inside
    the buffers it declares, and those inside what the launch allocates (``prnn_tvm.verify.bounds``: not a
    figure of the template's geometry); the kernel allocates the dynamic shared memory its grid declares, and
    the launch can have it: TVM lifts the 48 KB default limit only where the dynamic part reaches 48 KB, and the
    static part counts too."""
    rep = layer.report
    assert not bounds.launch_problems(layer.kernel.func, layer.kernel.launch.grid), rep.format()
    allocated = sum(
        int(n) * itemsize(dtype or "float32")
        for n, dtype in re.findall(
            r'T\.alloc_buffer\(\((\d+),\)(?:, "(\w+)")?, scope="shared\.dyn"\)', layer.kernel.func.script()
        )
    )
    assert allocated == rep.dynamic_smem_bytes, (allocated, rep.format())
    assert smem_launch_problem(rep.dynamic_smem_bytes, rep.static_smem_bytes) is None, rep.format()


@pytest.mark.parametrize(
    "dynamic, allocated",
    [(0, 0), (47 * 1024, 47 * 1024), (48 * 1024 - 56, 48 * 1024), (48 * 1024, 48 * 1024), (60_000, 60_000)],
)
def test_dynamic_shared_memory_just_under_48_kb_is_rounded_up(dynamic, allocated):
    assert launchable_smem(dynamic) == allocated


def test_a_layer_that_could_not_launch_is_refused_with_the_reason():
    # what a template that declared more static shared memory than the reserve would build: refused before the
    # launch (which would fail with CUDA_ERROR_INVALID_VALUE and the whole source dumped)
    assert smem_launch_problem(48 * 1024 - 56, 64) is not None and smem_launch_problem(48 * 1024, 64) is None
    layer = prnn_tvm.compile_cell("lstm", 64, 4, target="cuda", arch="sm_90", tuning_logs=[])
    launch = layer.signature.launch("recurrent")
    bad = layer.signature.with_grid("recurrent", dynamic_smem_bytes=48 * 1024 - 56, static_smem_bytes=64)
    with pytest.raises(
        LaunchError,
        match=r"recurrent of lstm cannot launch: its 49096 B of dynamic and 64 B of "
        r"static shared memory pass the default limit of 49152 B",
    ):
        RuntimeLayer(bad, None, True)._check_coresidency()
    assert launch.grid.dynamic_smem_bytes < 48 * 1024 - 1024  # the layer itself is fine


def test_a_grid_just_under_48_kb_of_shared_memory_can_launch():
    # Found by the GPU fuzz test: 49,096 B of dynamic shared memory plus the barrier's 64 B static failed at
    # launch (TVM sets the kernel's limit only from 48 KB of dynamic memory up); now it allocates 48 KB.
    layer = prnn_tvm.compile_cell(
        "rnn_tanh",
        289,
        38,
        input_size=1,
        target="cuda",
        arch="sm_90",
        tuning_logs=[],
        config={
            "units_per_cta": 3,
            "k_split": 32,
            "rows_per_thread": 1,
            "batch_tile": 38,
            "vec": 2,
            "barrier": "counter",
        },
    )
    assert layer.report.dynamic_smem_bytes == DEFAULT_SMEM_PER_BLOCK and layer.report.static_smem_bytes > 0
    assert_launchable(layer)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    cell=st.sampled_from(CELLS),
    hidden=st.integers(1, 1100),
    batch=st.integers(1, 70),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    pick=st.floats(0, 1, exclude_max=True) | st.none(),
)
def test_fuzz_any_size_and_tuning_config_builds_a_launchable_kernel(cell, hidden, batch, dtype, pick):
    """Any config the tuner may pick (None: the default), at any size: the kernel allocates the shared memory its
    grid declares and can launch with it (the GPU fuzz found one that could not; this needs no GPU)."""
    try:
        layer = prnn_tvm.compile_cell(
            cell,
            hidden,
            batch,
            dtype=dtype,
            target="cuda",
            arch="sm_90",
            tuning_logs=[],
            config=config_at(pick, cell, hidden, batch, dtype, gpu_spec("sm_90")),
        )
    except ConfigError as err:  # a refusal with its reason is allowed where nothing fits
        assert "fit" in str(err) or "registers" in str(err), err
        return
    assert_launchable(layer)


def config_at(pick, cell, hidden, batch, dtype, gpu):
    """Any config the tuner may pick: the one at fraction ``pick`` of the tuning space's list (None: None, the
    default). ConfigError where no config fits."""
    if pick is None:
        return None
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden, dtype)
    space = ConfigSpace(plan, gpu, template_for(plan, gpu.target()))
    return space.configs[int(pick * len(space))]


def default_configs(layer):
    return by_name(layer.report.template).default_configs(layer.plan, layer.target, layer.gpu)


def kernel_source(layer):
    src = layer.cuda_source
    start = src.index("recurrent_kernel(", src.index("recurrent_kernel(") + 1)  # the definition, not the declaration
    return src[start : src.index("\n}\n", start)]


# a time loop's head: a step a turn, or two (``(seq_len + 1) >> 1`` turns: the tensor-core block kernels whose two
# register banks of the projection take turns, ``WarpGates.time_loop``)
TIME_LOOP = re.compile(r"for \(int (v\w*) = 0; \1 < (seq_len|\(\(seq_len \+ 1\) >> 1\)); \+\+\1\) \{")


def _block_end(source: str, start: int) -> int:
    """Where the block whose ``{`` ends ``source[:start]`` closes (just past its ``}``)."""
    depth, i = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
    return i


def time_loops(body: str) -> list:
    """``(start, end)`` of each time loop in a kernel's body: one, or one per part of a split grid (the NaN fills
    after ``prnn_report`` are not time loops)."""
    head = body[: body.index("prnn_report(")] if "prnn_report(" in body else body
    return [(m.start(), _block_end(body, m.end())) for m in TIME_LOOP.finditer(head)]


def steps_a_turn(source: str) -> int:
    """Steps a turn of the (first) time loop in ``source``: 1, or 2 (:data:`TIME_LOOP`); an index of step ``v`` is
    then ``v * (2 x its step's stride)`` in the turn's first step."""
    return 1 if TIME_LOOP.search(source).group(2) == "seq_len" else 2


def loop_steps(loop: str) -> list:
    """The steps of a turn of a time loop (``body[start:end]`` of :func:`time_loops`), each as its text: the loop
    itself where a turn is a step; where it is two, the first step (the loop's head and what precedes the second) and
    the second (the block under ``if (((v * 2) + 1) < seq_len) {``, indented one level more)."""
    head = TIME_LOOP.match(loop)
    if head.group(2) == "seq_len":
        return [loop]
    second = loop.index(f"if ((({head.group(1)} * 2) + 1) < seq_len) {{")
    return [loop[:second], loop[second : _block_end(loop, loop.index("{", second) + 1)]]


@pytest.mark.parametrize("cell", CELLS)
def test_weights_are_loaded_once_before_the_time_loop(cell):
    layer = prnn_tvm.compile_cell(cell, 256, 4, target="cuda", arch="sm_90")
    plan, body = layer.plan, kernel_source(layer)
    loops = time_loops(body)
    parts = plan.cta_parts if layer.report.config.get("layout") == "split" else ()
    assert len(loops) == (len(parts) if plan.independent_parts and parts else 1)  # a loop per direction
    loop = loops[0][0]
    for w in plan.weights:
        assert f"{w.name}_ptr[" in body[:loop]
        assert all(f"{w.name}_ptr[" not in body[start:end] for start, end in loops)
    barrier = BARRIERS[layer.report.config["barrier"]]
    if not plan.needs_grid_barrier:
        assert "prnn_tag_copy<" not in body and "prnn_barrier" not in body and "grid_sync" not in body
    elif barrier.polls_values:  # every operand polled once per step (tags: the defaults never take sentinel)
        polled = sum(len(part.operands) for part in parts) or len(plan.operands)
        assert body.count("prnn_tag_copy<") == polled and body.index("prnn_tag_copy<") > loop
    else:  # one barrier after each phase (the last one skipped on the last step), in each part's loop
        call = f"{getattr(barrier, 'function', 'tvm_builtin_cuda_grid_sync')}("
        assert body.count(call) == plan.phases * len(loops) and body.index(call) > loop
    if plan.reductions and layer.report.config["k_split"] > 1:
        assert "__shfl_xor_sync" in body[loop:]


@pytest.mark.parametrize("barrier", GRID_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_timed_out_launch_fills_its_outputs_with_nan_and_tells_the_host(barrier, dtype):
    """After the time loop a block reads the error word; when set it writes NaN over its part of
    ``out`` (every step) and the final states, and copies the word to the host's (``error_host``)."""
    layer = prnn_tvm.compile_cell("lstm", 256, 4, dtype=dtype, target="cuda", arch="sm_90")
    if layer.report.config["barrier"] != barrier:
        config = dataclasses.replace(default_configs(layer)[0], barrier=barrier)
        layer = prnn_tvm.compile_cell("lstm", 256, 4, dtype=dtype, target="cuda", arch="sm_90", config=config)
    body = kernel_source(layer)
    if BARRIERS[barrier].state_words is None:  # grid.sync() cannot time out: nothing to report
        assert "prnn_report" not in body and "error_host" not in body
        return
    report = body.index("prnn_report(sync_ptr, ((uint64_t)error_host))")
    assert report > body.index("< seq_len;")  # after the time loop
    fill = body[report:]
    nan = "2143289344"  # 0x7fc00000: a float32 quiet NaN, cast to the storage type
    assert fill.count(nan) == 3 and "out_ptr[" in fill and "h_n_ptr[" in fill and "c_n_ptr[" in fill
    assert "for (int" in fill[: fill.index("out_ptr[")]  # out: every step
    assert fill.index("prnn_barrier_end") > fill.index("c_n_ptr[")


@pytest.mark.parametrize("barrier", GRID_KINDS)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_barrier_variant_compiles_without_spills(barrier, arch):
    gpu = gpu_spec(arch)
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 4, 512)
    cfg = dataclasses.replace(default_config(plan, gpu), barrier=barrier)
    layer = prnn_tvm.compile_cell("lstm", 512, 4, target="cuda", arch=arch, config=cfg)
    rep = layer.report
    assert rep.spill_bytes == 0 and rep.stack_bytes == 0, rep.format()
    body = kernel_source(layer)
    if barrier == "sentinel":
        assert "prnn_sentinel_copy<" in body and "prnn_sentinel_store<" in body
        assert "prnn_barrier_end(sync_ptr, barrier_base, 1)" in body  # the launch's one barrier
    elif barrier == "tags":
        assert "prnn_tag_copy<" in body and "prnn_tag_store(" in body
        assert "prnn_barrier_end(sync_ptr, barrier_base, seq_len)" in body  # the base advances by T steps
    elif barrier == "counter":
        assert "prnn_barrier_counter(" in body
        assert "prnn_barrier_end(sync_ptr, barrier_base, (seq_len - 1))" in body  # by T - 1 barriers
    if BARRIERS[barrier].state_words is not None:
        assert layer.kernel.launch.sync.state_words == 4
    else:
        assert "tvm_builtin_cuda_grid_sync()" in body and layer.kernel.launch.sync.state_words is None


def test_private_state_stays_in_registers():
    """LSTM's c never goes to the workspace: only h (the exchanged state) is written there."""
    body = kernel_source(prnn_tvm.compile_cell("lstm", 256, 4, target="cuda", arch="sm_90"))
    loop = body[body.index("< seq_len;") :]
    assert "c0_ptr[" not in loop and "workspace_ptr[" in loop
    assert re.search(r"c_n_ptr\[.*\] = ", loop)


def test_parse_report():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'recurrent_kernel' for 'sm_90'
ptxas info    : Function properties for recurrent_kernel
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 400 bytes smem, 448 bytes cmem[0]
ptxas info    : Compiling entry function 'projection_kernel' for 'sm_90'
ptxas info    : Function properties for projection_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 6912 bytes smem, 400 bytes cmem[0]
"""
    rep = parse_report(log, "sm_90")
    r = rep.function("recurrent")
    assert (r.registers, r.stack_bytes, r.spill_store_bytes, r.spill_load_bytes, r.static_smem_bytes) == (
        168,
        8,
        12,
        16,
        400,
    )
    assert rep.function("projection").registers == 64 and r.spills == 28


# ---------------------------------------------------------------- half precision: the tensor-core template
# Where the first ranked default spills and the build takes a later one (the report names what it passed over):
# Cho's GRU at hidden 1024 on the A100, whose 10 units per CTA pad their 16-row tiles; 16 units do not. (The
# two-phase stacked_rnn spilled there too until its two layers ran on CTAs of their own: the split layout.)
KNOWN_HALF_FALLBACKS = {("gru_cho", 1024, "sm_80")}


HALF_SHAPES = [(256, "float16"), (1024, "bfloat16"), (1024, "float16"), (256, "bfloat16")]


@pytest.mark.parametrize(
    "arch, hidden, cell, dtype",
    [
        (arch, hidden, cell, dtype)
        for arch, hidden, dtype, cell in arch_grid(
            HALF_SHAPES,
            {(h, d, c) for c, h, a in KNOWN_HALF_FALLBACKS if a == "sm_80" for d in ("float16", "bfloat16")},
        )
    ],
    ids=str,
)
def test_half_default_configs_use_tensor_cores_without_spills(arch, hidden, cell, dtype):
    """Every half default config of every cell, at hidden 256 and 1024 in both half dtypes, multiplies on tensor
    cores without spills: all of them on sm_90, a sample on sm_80 that compiles every cell, every (hidden, dtype)
    and the known fallback in both dtypes once (``arch_grid``: the whole sm_80 grid cost ~75 s of CPU per run)."""
    layer = prnn_tvm.compile_cell(cell, hidden, 16, dtype=dtype, target="cuda", arch=arch, tuning_logs=[])
    rep = layer.report
    assert rep.template == "persistent_mma" and rep.registers is not None, rep.ptxas_note
    assert rep.registers <= max_regs_per_thread(rep.threads, gpu_spec(arch))
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
    assert_launchable(layer)
    assert bool(rep.config_passed_over) == ((cell, hidden, arch) in KNOWN_HALF_FALLBACKS), rep.format()
    body = kernel_source(layer)
    ptx_type = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    products = len(layer.plan.reductions) > 0
    assert (f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in body) == products
    start, loops = body.index("{"), time_loops(body)
    for w in layer.plan.weights:  # fragments loaded once (half2 loads where hidden is even), before the time loops
        assert f"{w.name}_ptr" in body[start : loops[0][0]]
        assert all(f"{w.name}_ptr" not in body[begin:end] for begin, end in loops)
    # exp and sigmoid on the approximate exp2 and reciprocal units, tanh on the tanh unit: no exact form is left
    assert "tanhf(" not in body and "expf(" not in body.replace("__expf(", "")
    assert ("__expf(" in body) == (cell not in EXP_FREE_CELLS)
    assert ("prnn_tanh_approx(" in body) == (cell not in TANH_FREE_CELLS)


@pytest.mark.parametrize(
    "cell, dtype, training",
    [
        ("lstm", "float16", False),
        ("gru_cho", "float32", False),
        ("lstm_x2", "bfloat16", False),
        ("gru", "float32", True),
        ("gru", "bfloat16", True),  # the tensor-core backward
    ],
)
def test_only_read_only_arguments_are_restrict(monkeypatch, cell, dtype, training):
    """What nvcc compiles: no ``__restrict__`` on the exchange, the barrier's words and the initial states, which
    the launch's blocks write, or which a kernel reads through one load with the exchange, while it runs (nvcc
    read them through ``ld.global.nc``); weights, the projection and the lengths keep it. Every kernel of the
    module, the training ones too."""
    from prnn_tvm.codegen import ptxas

    compiled, compile_cuda, report = [], ptxas.compile_cuda, ptxas.report
    monkeypatch.setattr(ptxas, "_CACHE", {})
    monkeypatch.setattr(
        ptxas, "compile_cuda", lambda source, arch: compiled.append(source) or compile_cuda(source, arch)
    )
    # (a build without a GPU asks for the report alone, which the table of known reports may give without nvcc)
    monkeypatch.setattr(ptxas, "report", lambda source, arch: compiled.append(source) or report(source, arch))
    # (not from the layer cache: a layer this run built before would compile nothing here)
    layer = prnn_tvm.compile_cell(cell, 133, 11, dtype=dtype, target="cuda", arch="sm_90", cache=False)
    if training:
        prnn_tvm.compile_training(layer)
    kernels = [
        params
        for src in compiled
        for params in re.findall(r'extern "C" __global__ void[^{;]*recurrent\w*\(([^)]*)\) \{', src)
    ]
    assert len(kernels) >= (3 if training else 1)
    states = [s.name for s in layer.plan.states]
    plain = ("workspace", "sync", *(f"{s}0" for s in states), *(f"d_{s}_n" for s in states))
    kept = (*(w.name for w in layer.plan.weights), "xp", "lengths")
    for params in kernels:
        declared = {m[2]: m[1] for m in re.finditer(r"([\w*]+\*(?: __restrict__)?) (\w+)_ptr\b", params)}
        assert all("__restrict__" not in declared[n] for n in plain if n in declared), params
        assert all("__restrict__" in declared[n] for n in kept if n in declared), params
        assert "workspace" in declared


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_weight_prologue_loads_unconditionally(dtype):
    """Regression (Cho's GRU fp16 133x11, 8 units per block, ``counter``: wrong outputs in the last block): every
    weight load of the tensor-core prologue is its own statement, clamped into the matrix and kept or dropped
    after (``persistent_fragments._weight_or``); guarded loads made ptxas reach a block barrier with a diverged
    warp. ptxas's registers for that kernel fell from 242 to 184."""
    layer = prnn_tvm.compile_cell(
        "gru_cho",
        133,
        11,
        dtype=dtype,
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 8, "k_groups": 1, "n_tiles": 1, "barrier": "counter"},
    )
    body = kernel_source(layer)
    loads = [ln.strip() for ln in body.splitlines() if re.search(r"\bU_(rz|n)_ptr\[", ln)]
    assert loads and all(re.match(r"\w+ w\w* = U_(rz|n)_ptr\[.*\];$", ln) for ln in loads), loads[:3]
    assert layer.report.spill_bytes == 0 and layer.report.registers <= 200, layer.report.format()


def test_two_row_tiles_per_warp_share_each_b_fragment():
    """``m_tiles_per_warp=2`` (LSTM fp16 1024x16; H100: 2.43 -> 2.33 us per step): twice the mma per warp over
    the same shared loads of the state (``ldmatrix``: two batch tiles per load), no spills."""
    from prnn_tvm.schedules.persistent_mma_config import MmaConfig

    counts = {}
    for mw in (1, 2):
        layer = prnn_tvm.compile_cell(
            "lstm",
            1024,
            16,
            dtype="float16",
            target="cuda",
            arch="sm_90",
            config=MmaConfig(8, 8, 2, "counter", "shared", mw),
        )
        rep = layer.report
        assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
        assert rep.threads == 512 // mw
        body = kernel_source(layer)
        shared_loads = re.findall(r"prnn_ldmatrix_x4\(\(&", body)  # B fragments
        counts[mw] = (body.count("mma.sync.aligned"), len(shared_loads))
    assert counts[2][0] == 2 * counts[1][0] and counts[2][1] == counts[1][1] > 0, counts


@pytest.mark.parametrize(
    "cell, layers, knobs",
    [
        ("lstm", 4, {"units_per_cta": 16, "k_groups": 1, "n_tiles": 1, "barrier": "counter", "layout": "split"}),
        ("gru_cho", 1, {"units_per_cta": 8, "k_groups": 4, "n_tiles": 1, "barrier": "tags"}),
    ],
)
def test_accumulator_chains_keep_the_mma_steps_without_spills(cell, layers, knobs):
    """``k_chains``: the same mma steps over more accumulator sets (the four-layer LSTM fp16 512x8 stack's tuned
    shape holds 128 KB of weights per CTA: 250 registers before), no spills, the sets added up once per pass."""
    counts = {}
    for chains in (1, 4):
        layer = prnn_tvm.compile_cell(
            cell,
            512,
            8,
            dtype="float16",
            target="cuda",
            arch="sm_90",
            layers=layers,
            config={**knobs, "k_chains": chains},
        )
        rep = layer.report
        assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
        assert layer.report.config.get("k_chains", 1) == chains
        counts[chains] = kernel_source(layer).count("mma.sync.aligned")
    assert counts[4] == counts[1] > 0


@pytest.mark.parametrize("n_tiles", [1, 2, 4])
def test_b_fragments_of_two_batch_tiles_per_ldmatrix(n_tiles):
    """Each k tile of a warp loads its B fragments with one ``ldmatrix.x4`` per two batch tiles; a pass of one
    batch tile keeps two 32-bit shared loads (H100: ``.x2`` was no faster there)."""
    from prnn_tvm.schedules.persistent_mma_config import MmaConfig

    layer = prnn_tvm.compile_cell(
        "lstm", 256, 32, dtype="float16", target="cuda", arch="sm_90", config=MmaConfig(4, 2, n_tiles, "counter")
    )
    rep = layer.report
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()
    body = kernel_source(layer)
    k_tiles_per_warp = 256 // 16 // 2
    pairs = len(re.findall(r"prnn_ldmatrix_x4\(\(&", body))
    words = len(re.findall(r"= \*\(half2\*\)\(\(\(half\*\)_ptr_\d+\) \+", body))
    if n_tiles == 1:
        assert pairs == 0 and words == 2 * k_tiles_per_warp, (pairs, words)
    else:
        assert pairs == k_tiles_per_warp * n_tiles // 2 and words == 0, (pairs, words)


def test_float32_kernels_keep_the_exact_transcendentals():
    body = kernel_source(prnn_tvm.compile_cell("lstm", 256, 4, target="cuda", arch="sm_90", tuning_logs=[]))
    assert "tanhf(" in body and "expf(" in body and "__expf(" not in body and "__fdividef(" not in body


@pytest.mark.parametrize("function", ["sigmoid", "exp", "log", "division"])
def test_fast_transcendentals_are_the_same_functions(function):
    # The rewrite is algebra (sigmoid = 1 / (1 + e^-x)) over CUDA's __expf, __logf and __fdividef; evaluated with
    # exact exp, log and division it must give the function itself.
    x = tirx.Var("x", "float32")
    expr = (x + 3.0) / (x * x + 0.5) if function == "division" else getattr(tirx, function)(x)
    fast = fast_transcendentals(expr)
    assert "call_pure_extern" in str(fast) and function not in str(fast).replace("__expf", "").replace("__logf", "")
    if function == "division":
        assert "__fdividef" in str(fast) and not isinstance(fast, type(expr))
    values = np.concatenate([np.linspace(-30, 30, 601), [-1e-4, 0.0, 1e-4]])
    values = np.abs(values) + 1e-6 if function == "log" else values
    got, want = evaluate(fast, {x: values}), evaluate(expr, {x: values})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_only_float32_divisions_go_to_the_reciprocal_unit():
    """An integer division (an index) and a float64 one keep their exact form; a float32 one inside another
    function's argument is rewritten too."""
    i, d, x = tirx.Var("i", "int32"), tirx.Var("d", "float64"), tirx.Var("x", "float32")
    assert "__fdividef" not in str(fast_transcendentals(tirx.truncdiv(i, 7)))
    assert "__fdividef" not in str(fast_transcendentals(d / (d + 1.0)))
    nested = fast_transcendentals(tirx.tanh(x / 3.0))
    assert "__fdividef" in str(nested) and "prnn_tanh_approx" in str(nested)


def test_fast_tanh_is_the_hardware_tanh_of_the_same_argument():
    x = tirx.Var("x", "float32")
    fast = fast_transcendentals(tirx.tanh(2.0 * x + 1.0))
    assert fast.op.name == "tirx.cuda.func_call" and fast.args[0].value == "prnn_tanh_approx"
    tvm.ir.assert_structural_equal(fast.args[1], 2.0 * x + 1.0)
    assert "tanh.approx.f32" in fast.args[2].value  # the helper's source, pasted into the kernel


def test_sigmoid_through_tanh_is_the_same_function():
    # 1/2 + tanh(x/2) / 2 on the tanh unit; evaluated with the exact tanh it must give sigmoid itself
    x = tirx.Var("x", "float32")
    fast = fast_transcendentals(tirx.sigmoid(x), sigmoid_through_tanh=True)
    calls = []

    def exact(node):
        if getattr(getattr(node, "op", None), "name", None) == "tirx.cuda.func_call":
            calls.append(node.args[0].value)
            return tirx.tanh(rebuild(node.args[1], exact))
        return None

    values = np.concatenate([np.linspace(-30, 30, 601), [-1e-4, 0.0, 1e-4]])
    got = evaluate(rebuild(fast, exact), {x: values})
    assert calls == ["prnn_tanh_approx"] and "__expf" not in str(fast)
    np.testing.assert_allclose(got, evaluate(tirx.sigmoid(x), {x: values}), rtol=1e-12, atol=1e-15)
    assert "__fdividef" in str(fast_transcendentals(tirx.sigmoid(x)))  # not asked: the exp2 and reciprocal form


def test_half_kernels_call_the_hardware_tanh():
    layer = prnn_tvm.compile_cell("lstm", 256, 4, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])
    assert kernel_source(layer).count("prnn_tanh_approx(") == 2  # tanh(g) and tanh(c)
    assert 'asm("tanh.approx.f32 %0, %1;"' in layer.cuda_source  # the helper's definition


@pytest.mark.parametrize("batch", [1, 33, 64])
def test_half_batches_up_to_64_compile_clean(batch):
    layer = prnn_tvm.compile_cell("lstm", 1024, batch, dtype="float16", target="cuda", arch="sm_90", tuning_logs=[])
    rep = layer.report
    assert rep.spill_store_bytes == rep.spill_load_bytes == rep.stack_bytes == 0, rep.format()

"""Where the step of a block kernel goes (``barrier="block"``, e.g. ``gate_layout="in_warp"``, issue 49): clocks
each warp records at the borders of its phases, per step.

:func:`instrument` rewrites the generated CUDA of the recurrent kernel so that lane 0 of every warp takes a
``clock64`` at each border below and, for :data:`STEPS` steps from ``first``, keeps the seven spans (16-bit cycles)
in shared memory:

    operands   the step's start to its first operand fragment (``ldmatrix``) landed
    products   to every accumulator of the mma chains final
    xp wait    to the step's projection values (loaded a step ahead) arrived
    pointwise  to every pointwise result computed (the values the stores then write)
    stores     to the last store of the step's states issued (into the operand tile and registers; ``out`` too, where
               the kernel stores it in the pointwise math)
    xp issue   to the block barrier (the next step's projection loads issued)
    barrier    the block barrier (``__syncthreads``) and what follows it to the step's end (the outputs copied from
               the operand tile the step wrote)

A border waits for its values through a test no value passes (a store to a volatile word under it), so each span
is the wait for its phase's results once the one before ended, not the issue of its instructions. After the time
loop each block writes its spans over the start of ``xp`` (the caller's, read back by :func:`run`), with thread 0's
``clock64`` and ``%globaltimer`` at the loop's start and end. Timing only: the stamps add a few instructions and
their waits; compare the instrumented step with the plain one (``bench/heads_timeline.py`` prints both). The
rewrite is textual, of a time loop of one step a turn (build within :func:`one_step_a_turn`), and raises
``ValueError`` where an anchor moved (``tests/test_heads_timeline.py`` builds it for
sm_90); a source change (``bench/changes/*.json``) can be applied first, if it keeps the anchors.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from prnn_tvm.schedules import by_name

PHASES = ("operands", "products", "xp wait", "pointwise", "stores", "xp issue", "barrier")
STEPS = 256  # steps recorded per launch, up to 8 warps a block (fewer with more: steps_recorded)
SPAN_BYTES = STEPS * 8 * len(PHASES) * 2  # static shared memory the spans may take (the kernel's own too: 48 KB)
# lstm_h12's config of issue 49 (12 heads of 64, bf16 768 x 16): a head a block, every gate of a unit in one warp
IN_WARP = {
    "units_per_cta": 64,
    "k_groups": 1,
    "n_tiles": 2,
    "barrier": "block",
    "m_tiles_per_warp": 2,
    "gate_layout": "in_warp",
}
KERNEL = r'^extern "C" __global__ void __launch_bounds__\((\d+), 1\) recurrent_kernel\(.*\{$'
_HELPERS = """__device__ volatile int prnn_htl_sink;
template <class T> __device__ __forceinline__ unsigned prnn_htl_bits(T v) {
  unsigned u = 0; memcpy(&u, &v, sizeof(T) < 4 ? sizeof(T) : 4); return u; }
__device__ __forceinline__ unsigned long long prnn_htl_ns() { unsigned long long t; \
asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
"""


@contextlib.contextmanager
def one_step_a_turn():
    """Within the block, the tensor-core template's kernels run one step a turn of their time loop, the form
    :func:`instrument` reads: the projection's next values moved between its two register banks at each step's end
    (``XP_BANKS_ALTERNATE`` off), where the shipped kernels run two steps a turn, the banks taking turns."""
    builder = by_name("persistent_mma").builder
    saved, builder.XP_BANKS_ALTERNATE = builder.XP_BANKS_ALTERNATE, False
    try:
        yield
    finally:
        builder.XP_BANKS_ALTERNATE = saved


def _find(pattern: str, source: str, what: str, start: int = 0, end: int | None = None) -> re.Match:
    found = re.compile(pattern, re.M).search(source, start, len(source) if end is None else end)
    if found is None:
        raise ValueError(
            f"heads timeline: no {what} in the recurrent kernel's source (the generated code changed: update "
            "prnn_tvm/bench/heads_timeline.py)"
        )
    return found


def _last(pattern: str, source: str, what: str, start: int, end: int) -> re.Match:
    found = list(re.compile(pattern, re.M).finditer(source, start, end))
    if not found:
        _find(pattern, source, what, start, end)  # raises, naming it
    return found[-1]


def _closing_brace(source: str, start: int) -> int:
    """Where the block opened just before ``start`` closes (braces in the kernel's asm strings pair up too)."""
    depth = 1
    for at in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[at], 0)
        if depth == 0:
            return at
    raise ValueError("heads timeline: the loop over the steps never closes")


def _operand_load(source: str, start: int) -> tuple[re.Match, int]:
    """The step's first load of operand fragments from the tile, and the 32-bit words it fills: an ``ldmatrix`` of
    two batch tiles (4), or, where a warp multiplies one batch tile (``batch_warps``, a batch of 8 or fewer), the
    second of its two 32-bit shared loads (2)."""
    pairs = re.compile(r"^\s*prnn_ldmatrix_x4\(\(&\((\w+)\[0\]\)\), .*\);\n", re.M).search(source, start)
    single = re.compile(r"^\s*\*\((?:nv_bfloat162|half2)\*\)\((\w+) \+ 2\) = \*\(.*\);\n", re.M).search(source, start)
    found = [(m, words) for m, words in ((pairs, 4), (single, 2)) if m is not None]
    if not found:
        _find(r"prnn_ldmatrix_x4", source, "operand fragment load", start)  # raises, naming it
    return min(found, key=lambda f: f[0].start())


def _border(slot: int, values: list[str]) -> str:
    """Lane 0's stamp ``slot``, after ``values`` (C expressions) are ready."""
    wait = ""
    if values:
        bits = " | ".join(f"prnn_htl_bits({v})" for v in values)
        wait = f"    if (({bits}) == 0x7fc00001u) prnn_htl_sink = 1;\n"
    return wait + f"    prnn_htl_t[{slot}] = clock64();\n"


def words_per_block(warps: int) -> int:
    """16-bit words a block dumps: its spans, then four 64-bit clocks (padded to 8 bytes)."""
    return -(-(steps_recorded(warps) * warps * len(PHASES)) // 4) * 4 + 16


def steps_recorded(warps: int) -> int:
    """Steps a block of ``warps`` warps records: STEPS, fewer where its spans would pass SPAN_BYTES (16 warps, e.g.
    ``batch_warps=2``: 128)."""
    return min(STEPS, SPAN_BYTES // (2 * warps * len(PHASES)))


def instrument(source: str, first: int = 0) -> str:
    """``source`` with the spans of :data:`PHASES` recorded for steps ``first .. first + steps_recorded`` in its
    ``recurrent_kernel`` (a block kernel: one ``__syncthreads`` ends its step)."""
    head = _find(KERNEL, source, "recurrent_kernel")
    warps, n = int(head[1]) // 32, len(PHASES)
    steps = steps_recorded(warps)
    spans = steps * warps * len(PHASES)
    source = source[: head.start()] + _HELPERS + source[head.start() :]
    body = head.end() + len(_HELPERS)
    loop = _find(r"^  for \(int v = 0; v < seq_len; \+\+v\) \{\n", source, "loop over the steps", body)
    close = _closing_brace(source, loop.end())
    end = _last(r"^    __syncthreads\(\);\n", source, "block barrier ending the step", loop.end(), close)
    ld, ld_words = _operand_load(source, loop.end())
    mmas = list(re.finditer(r'"=f"\(\(\(float \*\)\((\w+) \+ (\d+)\)\)\[(\d)\]\)', source[loop.end() : end.start()]))
    if not mmas:
        raise ValueError("heads timeline: no mma accumulators in the step (not a tensor-core kernel?)")
    accs = sorted({(m[1], int(m[2]) + int(m[3])) for m in mmas}, key=lambda a: a[1])
    last_mma = _last(r'^\s*"mma\.sync\.', source, "mma", loop.end(), end.start())
    mma_end = _find(r"^  \}\n", source, "end of the last mma", last_mma.end())
    tile_store = r"^\s*\(\((?:nv_bfloat16|half)\*\)\w+\)\[.*\] = "
    tile = _find(tile_store, source, "store into the operand tile", mma_end.end())
    staged = list(re.finditer(r"^\s*(_ptr_\d+)\[(\d+)\] = [^;]+;\n", source[mma_end.end() : tile.start()], re.M))
    if not staged:
        raise ValueError("heads timeline: no pointwise results staged before the operand tile's stores")
    stores = r"^\s*out_ptr\[.*\] = \w+;\n"  # the last of the step's stores: to out, else to the operand tile
    if not re.search(stores, source[mma_end.end() : end.start()], re.M):
        stores = tile_store + r".*;\n"
    out = _last(stores, source, "store of the step's states", mma_end.end(), end.start())
    loads = re.finditer(r"(_ptr_\d+)\[(\d+)\] = [^;]*\bxp_ptr\b", source[body : loop.start()])
    xp = sorted({(m[1], int(m[2])) for m in loads})  # the step's projection values, loaded the step before
    record = (
        f"    if ((threadIdx.x & 31) == 0 && v >= prnn_htl_first && v < prnn_htl_first + {steps}) {{\n"
        f"      unsigned short* r = prnn_htl + ((v - prnn_htl_first) * {warps} + (threadIdx.x >> 5)) * {len(PHASES)};\n"
        + "".join(
            f"      r[{i}] = (unsigned short)min(prnn_htl_t[{i + 1}] - prnn_htl_t[{i}], 65535LL);\n" for i in range(n)
        )
        + "    }\n"
    )
    edits = [
        (loop.start(), "  if (threadIdx.x == 0) { prnn_htl_clk[0] = clock64(); prnn_htl_clk[1] = prnn_htl_ns(); }\n"),
        (loop.end(), "    long long prnn_htl_t[8];\n" + _border(0, [])),
        (ld.end(), _border(1, [f"((unsigned*)&{ld[1]}[0])[{i}]" for i in range(ld_words)])),
        (mma_end.end(), _border(2, [f"{b}[{i}]" for b, i in accs]) + _border(3, [f"{b}[{i}]" for b, i in xp])),
        (mma_end.end() + staged[-1].end(), _border(4, [f"{m[1]}[{m[2]}]" for m in staged])),
        (out.end(), _border(5, [])),
        (end.start(), _border(6, [])),
        (source.rindex("\n", 0, close) + 1, _border(7, []) + record),
    ]
    words = words_per_block(warps)
    dump = (
        "  if (threadIdx.x == 0) { prnn_htl_clk[2] = clock64(); prnn_htl_clk[3] = prnn_htl_ns(); }\n"
        "  __syncthreads();\n"
        f"  for (int i = threadIdx.x; i < {spans}; i += blockDim.x) "
        f"((unsigned short*)xp_ptr)[blockIdx.x * {words} + i] = prnn_htl[i];\n"
        f"  if (threadIdx.x < 4) ((unsigned long long*)xp_ptr)[(blockIdx.x * {words} + {words - 16}) / 4 + threadIdx.x]"
        " = prnn_htl_clk[threadIdx.x];\n"
    )
    edits.append((source.index("\n", close) + 1, dump))
    for position, text in sorted(edits, key=lambda e: e[0], reverse=True):
        source = source[:position] + text + source[position:]
    shared = _find(r"^  extern __shared__ __align__\(\d+\) float \w+\[\];\n", source, "dynamic shared buffer", body)
    decl = (
        f"  __shared__ unsigned short prnn_htl[{spans}];\n  __shared__ unsigned long long prnn_htl_clk[4];\n"
        f"  const int prnn_htl_first = {first};\n"
    )
    return source[: shared.end()] + decl + source[shared.end() :]


def run(layer, seq_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Run an instrumented layer's recurrent kernel on random inputs of ``seq_len`` steps: its spans, ``(blocks,
    steps_recorded, warps, phases)`` cycles, and its clocks, ``(blocks, 4)``: ``clock64`` and ``%globaltimer`` (ns)
    of thread 0 at the time loop's start and end."""
    import tvm

    from ..reference import random_inputs

    launch = layer.signature.launches[-1]
    blocks, warps = launch.grid.ctas, launch.grid.threads // 32
    words = words_per_block(warps)
    inputs = random_inputs(layer.plan, seq_len, layer.input_size, seed=seed)
    rng = np.random.default_rng(seed)
    shape = (seq_len, layer.plan.batch, layer.plan.input.slices * layer.plan.hidden)
    xp = (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(launch.arg("xp").dtype)  # float32 or half (xp)
    if xp.nbytes < 2 * blocks * words:
        raise ValueError(f"heads timeline: xp ({xp.nbytes} B) cannot hold {blocks} blocks' spans: a longer sequence")
    xp = tvm.runtime.tensor(xp, layer.device)
    layer.recurrent(xp, **{k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")})
    layer.device.sync()
    dumped = xp.numpy().view(np.uint16).reshape(-1)[: blocks * words].reshape(blocks, words)
    steps = steps_recorded(warps)
    spans = dumped[:, : steps * warps * len(PHASES)].astype(np.int64).reshape(blocks, steps, warps, len(PHASES))
    clocks = np.ascontiguousarray(dumped[:, words - 16 :]).view(np.uint64).astype(np.int64)
    return spans, clocks


def summary(spans: np.ndarray, clocks: np.ndarray, seq_len: int) -> list[str]:
    """Lines that say where a step goes: per phase, cycles (median, p90 and max over blocks, steps and warps) and
    ns at the clock the run kept; the step (the phases' sum per warp) and the kernel's time per step."""
    per_ns = np.median((clocks[:, 2] - clocks[:, 0]) / np.maximum(1, clocks[:, 3] - clocks[:, 1]))
    step_ns = np.median(clocks[:, 3] - clocks[:, 1]) / seq_len
    total = spans.sum(axis=-1)
    lines = [
        f"time loop {step_ns:.0f} ns per step at {per_ns:.2f} GHz ({step_ns * per_ns:.0f} cycles); per warp, the "
        f"phases' sum: median {np.median(total):.0f} cycles, p90 {np.percentile(total, 90):.0f}"
    ]
    for i, name in enumerate(PHASES):
        x = spans[..., i]
        med = np.median(x)
        lines.append(
            f"  {name:<10} {med:6.0f} cycles {med / per_ns:6.0f} ns  p90 {np.percentile(x, 90):6.0f}  max "
            f"{x.max():6d}  ({100 * x.mean() / max(total.mean(), 1e-9):4.1f}% of the sum, means)"
        )
    warp_means = spans.mean(axis=(0, 1))  # (warps, phases)
    lines.append(
        "per warp, mean cycles per phase (warp: "
        + ", ".join(PHASES)
        + "): "
        + "; ".join(f"{w}: " + " ".join(f"{v:.0f}" for v in row) for w, row in enumerate(warp_means))
    )
    return lines

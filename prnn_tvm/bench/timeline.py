"""A timeline of a tensor-core kernel's steps: when each block polled, passed its block barrier and published,
read from clocks the kernel itself records.

For a one-phase layer with the ``sentinel`` exchange, :func:`instrument` rewrites the generated CUDA so that, in
every block and for each step (and each batch tile, where direct fragments run the tiles in turn:
``PersistentBuilder.tile_by_tile``), the thread of the tile's first item keeps seven stamps in shared memory:
``clock64`` and ``%globaltimer`` before the poll, ``clock64`` after it (direct fragments: that thread's own loads;
a shared operand tile: the block's poll and copy), ``clock64`` and ``%globaltimer`` after the block barrier that
ends the products, ``clock64`` and ``%globaltimer`` after its publish, and the block's SM. After the time loop
each block writes its stamps over the start of ``xp`` (its own steps are done; every block is past them), where
:func:`run` reads them back (:func:`instrumented_layer` builds such a layer). :func:`summary` turns them into the
figures a reader needs to see where a step goes: the phases' durations, how far apart the blocks publish the same
tile, how long after the last publish of the values a block needs it has them, and which SMs are late.

The rewrite is textual: it finds its anchors in the kernel's source and raises ``ValueError`` where one moved
(a test builds small layers and checks they are still there). Timing only: the stamps cost a few percent.
"""

from __future__ import annotations

import re

import numpy as np

# stamps per (step, tile): clock64 before the poll, after it, after the block barrier, after the publish;
# %globaltimer before the poll, after the barrier, after the publish; the SM
SLOTS = 8
STEPS = 256  # steps recorded (the first ones)
_CLOCK_NS = (
    "__device__ __forceinline__ unsigned long long prnn_timeline_ns() { unsigned long long t; "
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n'
)


def _find(pattern: str, source: str, what: str, start: int = 0) -> re.Match:
    found = re.compile(pattern, re.M).search(source, start)
    if found is None:
        raise ValueError(
            f"timeline: no {what} in the kernel source (the generated code changed: update prnn_tvm/bench/timeline.py)"
        )
    return found


def instrument(source: str, tiles: int, tile_items: int) -> str:
    """``source`` (a layer's CUDA) with the timeline's stamps in its recurrent kernel: ``tiles`` batch tiles per
    step, ``tile_items`` pointwise items per tile (the thread of item ``j * tile_items`` publishes tile ``j``)."""
    kernel = _find(
        r'^extern "C" __global__ void __launch_bounds__\(\d+, 1\) recurrent_kernel\(.*\{$', source, "recurrent kernel"
    ).start()
    source = source[:kernel] + _CLOCK_NS + source[kernel:]
    kernel += len(_CLOCK_NS)
    shared = _find(r"extern __shared__ __align__\(\d+\) float \w+\[\];\n", source, "dynamic shared buffer", kernel)
    words = STEPS * tiles * SLOTS
    source = (
        source[: shared.end()] + f"  __shared__ unsigned long long prnn_timeline[{words}];\n" + source[shared.end() :]
    )
    polls = list(re.finditer(r"prnn_sentinel_(?:frags|copy)<[^;]*, (\w+), sync_ptr, timeout_us\);", source))
    if not polls:
        raise ValueError(
            "timeline: no sentinel poll in the kernel source (a one-phase layer with the sentinel exchange is needed)"
        )
    step = polls[-1][1]
    if tiles > 1:  # the batch-tile loop of tile_by_tile: stamps per tile
        tile = _find(r"^(\s*)int b0 = \((\w+) \* \d+\);$", source, "batch-tile loop", kernel)
        bc = tile[2]
        loop = rf"^\s*for \(int {bc} = 0; {bc} < {tiles}; \+\+{bc}\) \{{\n"
        before = tile.start()
    else:  # one tile: stamps per step
        bc, loop, before = "0", rf"^\s*for \(int {step} = 0; {step} < seq_len; \+\+{step}\) \{{\n", polls[-1].start()
    headers = list(re.finditer(loop, source[:before], re.M))
    if not headers:
        raise ValueError(
            f"timeline: no loop over {'tiles' if tiles > 1 else 'steps'} before the poll in the kernel source"
        )
    header = headers[-1]
    source = (
        source[: header.end()]
        + "      unsigned long long prnn_c0 = clock64(), prnn_g0 = prnn_timeline_ns();\n"
        + source[header.end() :]
    )
    polls = list(re.finditer(r"prnn_sentinel_(?:frags|copy)<[^;]*, sync_ptr, timeout_us\);", source))
    after = _find(r"^\s*\w+\[0\] = 0x0p\+0f", source, "accumulator reset after the poll", polls[-1].end())
    source = source[: after.start()] + "      unsigned long long prnn_c1 = clock64();\n" + source[after.start() :]
    barrier = _find(
        r"^\s*(?:(\w+)\[0\] = prnn_block_or\(\1\[0\]\);|__syncthreads\(\);)\n",
        source,
        "block barrier after the products",
        after.start(),
    )
    source = (
        source[: barrier.end()]
        + "      unsigned long long prnn_c2 = clock64(), prnn_g2 = prnn_timeline_ns();\n"
        + source[barrier.end() :]
    )
    publish = _find(r"^(\s*)prnn_sentinel_store<\w+>\(.*\);\n", source, "publish", barrier.end())
    record = (
        f"{publish[1]}if (threadIdx.x % {tile_items} == 0 && {step} < {STEPS}) {{ unsigned long long* r = "
        f'prnn_timeline + ({step} * {tiles} + {bc}) * {SLOTS}; unsigned sm; asm volatile("mov.u32 %0, '
        '%%smid;" : "=r"(sm)); r[0] = prnn_c0; r[1] = prnn_c1; r[2] = prnn_c2; r[3] = clock64(); '
        "r[4] = prnn_g0; r[5] = prnn_g2; r[6] = prnn_timeline_ns(); r[7] = sm; }\n"
    )
    source = source[: publish.end()] + record + source[publish.end() :]
    end = _find(r"^  int barrier_error = ", source, "end of the time loop", publish.end())
    dump = (
        f"  __syncthreads();\n  for (int i = threadIdx.x; i < {words}; i += blockDim.x) "
        f"((unsigned long long*)xp_ptr)[blockIdx.x * {words} + i] = prnn_timeline[i];\n"
    )
    return source[: end.start()] + dump + source[end.start() :]


def instrumented_layer(cell: str, hidden: int, batch: int, dtype: str, config: dict, arch: str | None = None):
    """``(layer, geometry, tiles)``: the layer of ``config`` built from :func:`instrument`'s source, and the tiles
    stamped per step. The tensor-core template with the ``sentinel`` exchange, one phase, one part, one item per
    thread; its stamps are per batch tile where direct fragments run the tiles in turn, else per step (a shared
    operand tile: one batch tile per pass)."""
    from ..codegen import build
    from ..compiler import compile_cell
    from ..schedules import by_name

    plain = compile_cell(cell, hidden, batch, dtype=dtype, config=config or None, arch=arch)
    cfg, plan = plain.kernel.config, plain.plan
    g = by_name(plain.kernel.template).geometry(cfg, plan) if plain.kernel.template == "persistent_mma" else None
    why = (
        "not the tensor-core template"
        if g is None
        else "not the sentinel exchange"
        if cfg.barrier != "sentinel"
        else "more than one phase or part"
        if plan.phases > 1 or (cfg.layout == "split" and plan.cta_parts)
        else "more than one item per thread"
        if g.items_per_thread > 1
        else "more than one batch tile per pass of a shared operand tile"
        if not cfg.direct and g.batch_chunks > 1
        else None
    )
    if why:
        raise ValueError(f"timeline: {cell} {hidden}x{batch} {dtype} with {plain.report.config}: {why}")
    tiles = g.batch_chunks if cfg.direct else 1
    with build.rewriting_sources(lambda code: instrument(code, tiles, cfg.batch_tile * cfg.units_per_cta)):
        return compile_cell(cell, hidden, batch, dtype=dtype, config=cfg.as_dict(), arch=arch), g, tiles


def run(layer, g, tiles: int, seed: int = 0) -> np.ndarray:
    """Run an :func:`instrumented_layer` (``g``, ``tiles``: what it returned with it) on random inputs for
    :data:`STEPS` steps; its stamps, ``(blocks, steps, tiles, SLOTS)`` int64."""
    import tvm

    from ..reference import random_inputs

    inputs = random_inputs(layer.plan, STEPS, layer.input_size, seed=seed)
    rng = np.random.default_rng(seed)
    xp = rng.standard_normal((STEPS, layer.plan.batch, layer.plan.input.slices * layer.plan.hidden)) * 0.5
    xp = xp.astype(layer.signature.launch("recurrent").arg("xp").dtype)  # float32, or the half type (``xp``)
    words = STEPS * tiles * SLOTS
    if xp.nbytes < g.ctas * words * 8:
        raise ValueError(f"timeline: xp ({xp.nbytes} B) cannot hold {g.ctas} blocks' stamps")
    xp = tvm.runtime.tensor(xp, layer.device)
    layer.recurrent(xp, **{k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")})
    layer.device.sync()
    stamps = xp.numpy().view(np.uint64).reshape(-1)[: g.ctas * words]
    return stamps.astype(np.int64).reshape(g.ctas, STEPS, tiles, SLOTS)


def summary(stamps: np.ndarray, groups: int = 1, skip: int = 8) -> list[str]:
    """Lines that say where a step goes, medians over blocks and steps ``skip..STEPS - skip`` (ns). ``groups``: the
    layer's batch groups (blocks ``k * n .. (k + 1) * n`` exchange among themselves only); skew and lateness are
    measured within each group."""
    c0, c1, c2, c3, g0, g2, g3, sm = (stamps[..., i] for i in range(SLOTS))
    s = slice(skip, stamps.shape[1] - skip)
    per_ns = np.median((c3 - c0)[:, s] / np.maximum(1, g3 - g0)[:, s])  # clock cycles per ns
    lines = [
        f"step {np.median(np.diff(g0[:, :, 0], axis=1)[:, s]):.0f} ns (median over blocks and steps); "
        f"clock {per_ns:.2f} GHz"
    ]
    parts = np.split(np.arange(stamps.shape[0]), groups)
    for j in range(stamps.shape[2]):
        skew, start, have = [], [], []
        for blocks in parts:
            pub = g3[blocks, :, j]
            last = pub.max(axis=0)  # per step: the group's last publish of tile j
            skew.append((last - pub.min(axis=0))[s])
            start.append((g0[blocks, 1:, j] - last[None, :-1])[:, s])  # poll start - the last publish it needs
            have.append((g2[blocks, 1:, j] - last[None, :-1])[:, s])  # block barrier passed - that publish
        skew, start, have = np.concatenate(skew), np.concatenate(start).ravel(), np.concatenate(have).ravel()
        lines.append(
            f"tile {j}: poll {np.median((c1 - c0)[:, s, j]) / per_ns:.0f}, poll to block barrier "
            f"{np.median((c2 - c1)[:, s, j]) / per_ns:.0f}, pointwise and publish "
            f"{np.median((c3 - c2)[:, s, j]) / per_ns:.0f}; publish skew across blocks {np.median(skew):.0f} "
            f"(p90 {np.percentile(skew, 90):.0f}); poll start - last publish {np.median(start):.0f} "
            f"(p10 {np.percentile(start, 10):.0f}); block barrier - last publish {np.median(have):.0f} "
            f"(p10 {np.percentile(have, 10):.0f})"
        )
    late = np.zeros(stamps.shape[0])  # tile 0's publish against its group's median block, mean over steps
    for blocks in parts:
        pub = g3[blocks, s, 0]
        late[blocks] = (pub - np.median(pub, axis=0)[None, :]).mean(axis=1)
    order = np.argsort(-late)
    pick = lambda idx: ", ".join(f"block {b} on SM {sm[b, skip, 0]} {late[b]:+.0f}" for b in idx)  # noqa: E731
    lines.append(f"latest publishers of tile 0 (mean ns after their group's median block): {pick(order[:4])}")
    lines.append(f"earliest: {pick(order[-4:])}")
    return lines

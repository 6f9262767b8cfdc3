"""A timeline of the persistent backward's steps (``recurrent_backward_kernel``, tensor-core or float32): per block
and step, clocks the kernel itself records at the borders of its phases.

:func:`instrument` rewrites the generated CUDA so that thread 0 of every block stamps, for each of the first
:data:`STEPS` steps walked (``v``: step ``T - 1 - v``), into shared memory:

    0 clock64 at the step's start            6 %globaltimer there
    1 clock64 before the grid barrier         7 %globaltimer there (the pointwise adjoints and publish done)
    2 clock64 after the grid barrier          8 %globaltimer there
    3 clock64 after the gate gradients' copy is issued (cp.async; plain loads: their issue)
    4 clock64 after the copy landed and the block barrier that follows it
    5 clock64 after the products and the block barrier that ends them (the partial sums in shared memory)

With ``copy_stages`` (each warp copies its own columns, ``backward_mma``) thread 0 stamps its warp's: 3 after its
last stage's copies are issued, 4 once its first stage landed; the products (4 -> 5) then hold the waits for the
later stages, and the block barrier after the products is the first one after the grid barrier. In clusters
(``cluster``: ``schedules/cluster_copy.py``) 3 is after this CTA's share of the multicast copy is issued, 4 once the
whole tile landed (every CTA's share: the mbarrier's wait, with its block barrier), or with ``copy_stages`` 1 once
thread 0's warp's own columns landed (its k group's mbarrier).
    9 the block's SM

The phases a step splits into (:func:`summary`): pointwise (0 -> 1: the saved leaves', ``xp``'s and ``d_out``'s
loads, the recomputed gates, the adjoints, the stores of ``d_gates``, ``d_xp`` and the published gate gradients),
grid barrier (1 -> 2), copy issue (2 -> 3), copy wait (3 -> 4), products (4 -> 5) and what was sent back (5 -> the
next step's 0: the k groups' partials summed, the carried adjoints). After the time loop each block writes its
stamps over the start of ``d_xp`` (its own steps are done), which :func:`capture` reads back through the public
torch module. The rewrite is textual and raises ``ValueError`` where an anchor moved (tests build it for sm_90).
Timing only: the stamps cost a few shared stores per step.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

SLOTS = 10
STEPS = 256  # steps recorded (the first walked: the sequence's last)
_CLOCK_NS = (
    "__device__ __forceinline__ unsigned long long prnn_btl_ns() { unsigned long long t; "
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n'
    "__device__ __forceinline__ unsigned long long prnn_btl_sm() { unsigned s; "
    'asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }\n'
)
KERNEL = r'^extern "C" __global__ void __launch_bounds__\(\d+, 1\) recurrent_backward_kernel\(.*\{$'


def _find(pattern: str, source: str, what: str, start: int = 0) -> re.Match:
    found = re.compile(pattern, re.M).search(source, start)
    if found is None:
        raise ValueError(
            f"backward timeline: no {what} in the backward kernel's source (the generated code changed: update "
            "prnn_tvm/bench/backward_timeline.py)"
        )
    return found


def _stamp(slot: int, value: str) -> str:
    return f"      if (threadIdx.x == 0 && v < {STEPS}) prnn_btl[v * {SLOTS} + {slot}] = {value};\n"


def instrument(source: str) -> str:
    """``source`` with the timeline's stamps in its ``recurrent_backward_kernel``; a source without that kernel
    (a forward's, or one with the kernel declared only) comes back unchanged."""
    if not re.search(KERNEL, source, re.M):
        return source
    kernel = _find(KERNEL, source, "recurrent_backward_kernel").start()
    source = source[:kernel] + _CLOCK_NS + source[kernel:]
    kernel += len(_CLOCK_NS)
    shared = _find(r"extern __shared__ __align__\(\d+\) float \w+\[\];\n", source, "dynamic shared buffer", kernel)
    words = STEPS * SLOTS
    source = source[: shared.end()] + f"  __shared__ unsigned long long prnn_btl[{words}];\n" + source[shared.end() :]
    loop = _find(r"^  for \(int v = 0; v < seq_len; \+\+v\) \{\n", source, "loop over the steps", kernel)
    edits = [(loop.end(), _stamp(0, "clock64()") + _stamp(6, "prnn_btl_ns()"))]
    wait = _find(r"^(\s*)int barrier_abort = prnn_barrier_\w+\(.*\);\n", source, "grid barrier", loop.end())
    edits.append((wait.start(), _stamp(1, "clock64()") + _stamp(7, "prnn_btl_ns()")))
    passed = _find(r"^\s*if \(barrier_abort != 0\) \{\n\s*break;\n\s*\}\n", source, "barrier check", wait.end())
    edits.append((passed.end(), _stamp(2, "clock64()") + _stamp(8, "prnn_btl_ns()") + _stamp(9, "prnn_btl_sm()")))
    copied = _find(r"^\s*__syncthreads\(\);\n", source, "block barrier after the copy", passed.end())
    between = source[passed.end() : copied.start()]
    clustered = re.search(r"^\s*int copy_abort = prnn_cluster_wait\(", between, re.M)
    warp_waits = re.search(r"^\s*prnn_cluster_wait_warp\(.*\);\n", between, re.M)
    staged = list(re.finditer(r"^\s*prnn_cp_async_commit\(\);\n", between, re.M))
    warp_met = re.search(r"^\s*prnn_sync_warp\(\);\n", between, re.M)
    if clustered:  # cluster: this CTA's share issued for the cluster, the whole tile landed (a block barrier inside)
        edits.append((passed.end() + clustered.start(), _stamp(3, "clock64()")))
        landed = _find(r"^\s*if \(copy_abort != 0\) \{\n\s*break;\n\s*\}\n", source, "copy check", passed.end())
        edits.append((landed.end(), _stamp(4, "clock64()")))
        summed = copied  # the block barrier that ends the products
    elif warp_waits:  # cluster, each warp waiting for its own columns: thread 0's warp's wait
        edits.append((passed.end() + warp_waits.start(), _stamp(3, "clock64()")))
        edits.append((passed.end() + warp_waits.end(), _stamp(4, "clock64()")))
        summed = copied
    elif warp_met:  # copy_stages: each warp copies its own columns (cp.async groups or plain loads), no block barrier
        issued = passed.end() + (staged[-1].end() if staged else warp_met.start())
        edits.append((issued, _stamp(3, "clock64()")))
        landed = _find(r"^\s*prnn_sync_warp\(\);\n", source, "wait for the first stage", issued)
        edits.append((landed.end(), _stamp(4, "clock64()")))
        summed = copied  # the block barrier that ends the products
    else:
        issued = list(re.finditer(r"^\s*prnn_cp_async_wait_all\(\);\n", source[passed.end() : copied.start()], re.M))
        at = passed.end() + issued[-1].start() if issued else copied.start()  # plain loads: issue and wait are one
        edits.append((at, _stamp(3, "clock64()")))
        edits.append((copied.end(), _stamp(4, "clock64()")))
        summed = _find(r"^\s*__syncthreads\(\);\n", source, "block barrier after the products", copied.end())
    edits.append((summed.end(), _stamp(5, "clock64()")))
    end = _find(r"^  int barrier_error = ", source, "end of the time loop", summed.end())
    dump = (
        f"  __syncthreads();\n  for (int i = threadIdx.x; i < {words}; i += blockDim.x) "
        f"((unsigned long long*)d_xp_ptr)[blockIdx.x * {words} + i] = prnn_btl[i];\n"
    )
    edits.append((end.start(), dump))
    for position, text in sorted(edits, reverse=True):
        source = source[:position] + text + source[position:]
    return source


@contextlib.contextmanager
def capturing():
    """Within the block, every training build is instrumented (:func:`instrument`) and each backward launch through
    a torch module keeps its ``d_xp`` (where the stamps are) before the projection's backward reads it: yields the
    list they are appended to, ``(blocks, STEPS, SLOTS)`` int64 arrays."""
    import torch

    from prnn_tvm.codegen import build
    from prnn_tvm.torch.dispatch import Dispatch

    launch, kept = Dispatch._launch, []

    def keeping(self, layer, xp, recurrent, function="recurrent", into=None):
        out = launch(self, layer, xp, recurrent, function, into)
        if function == "recurrent_backward":
            written = [a.name for a in layer.signature.launches[0].args if a.role.written]
            d_xp = out[written.index("d_xp")]
            blocks = layer.signature.launches[0].grid.ctas
            words = d_xp.detach().reshape(-1).view(dtype=torch.int64)[: blocks * STEPS * SLOTS]
            if words.numel() < blocks * STEPS * SLOTS:
                raise ValueError(
                    f"backward timeline: d_xp holds {words.numel()} words, not the {blocks} blocks' "
                    f"{STEPS * SLOTS} stamps each: a longer sequence"
                )
            kept.append(words.cpu().numpy().reshape(blocks, STEPS, SLOTS))
        return out

    Dispatch._launch = keeping
    try:
        with build.rewriting_sources(instrument):
            yield kept
    finally:
        Dispatch._launch = launch


PHASES = ("pointwise", "grid barrier", "copy issue", "copy wait", "products", "sent back")


def summary(stamps: np.ndarray, skip: int = 8) -> list[str]:
    """Lines that say where a backward step goes: per phase, the median and p90 over blocks and steps
    ``skip..STEPS - skip`` (ns); the barrier's skew (the spread of the blocks' arrivals, from ``%globaltimer``);
    the blocks that arrive last."""
    c = [stamps[..., i].astype(np.float64) for i in range(6)]
    g0, g1, g2, sm = (stamps[..., i] for i in (6, 7, 8, 9))
    s = slice(skip, stamps.shape[1] - skip)
    step = np.diff(g0, axis=1)[:, s]
    per_ns = np.median((c[2] - c[0])[:, s] / np.maximum(1, g2 - g0)[:, s])  # clock cycles per ns
    nxt = np.concatenate([c[0][:, 1:], c[0][:, -1:]], axis=1)  # the next step's start
    spans = [c[1] - c[0], c[2] - c[1], c[3] - c[2], c[4] - c[3], c[5] - c[4], nxt - c[5]]
    lines = [
        f"step {np.median(step):.0f} ns (median over blocks and steps, p90 {np.percentile(step, 90):.0f}); "
        f"clock {per_ns:.2f} GHz"
    ]
    total = sum(np.median(x[:, s]) for x in spans) / per_ns
    for name, x in zip(PHASES, spans):
        med = np.median(x[:, s]) / per_ns
        lines.append(
            f"  {name:<12} {med:7.0f} ns  p90 {np.percentile(x[:, s], 90) / per_ns:7.0f}  "
            f"({100 * med / max(total, 1e-9):4.1f}% of the phases' sum)"
        )
    arrive = g1[:, s]
    skew = arrive.max(axis=0) - arrive.min(axis=0)
    leave = g2[:, s] - arrive.max(axis=0)[None, :]  # a block's release after the last block arrived
    lines.append(
        f"barrier: arrivals spread {np.median(skew):.0f} ns (p90 {np.percentile(skew, 90):.0f}); release "
        f"after the last arrival {np.median(leave):.0f} ns (p90 {np.percentile(leave, 90):.0f})"
    )
    late = (arrive - np.median(arrive, axis=0)[None, :]).mean(axis=1)
    order = np.argsort(-late)
    lines.append(
        "latest arrivals (mean ns after the median block): "
        + ", ".join(f"block {b} on SM {sm[b, skip]} {late[b]:+.0f}" for b in order[:4])
    )
    return lines

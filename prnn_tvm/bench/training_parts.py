"""Where a training step's time goes (``bench/training_parts.py``): each part's GPU and host time from CUDA events,
and every kernel the step runs, from ``torch.profiler``, with the part that launched it.

:func:`part_times` brackets each part of :func:`.training_step.step` with CUDA events (GPU time between the
borders: the part's kernels and any idle gap before them) and ``perf_counter`` (host time to issue it).
:func:`kernel_records` runs steps under the profiler, each part inside a ``record_function`` range, and names
every GPU activity (kernels, copies, sets) with the part whose range holds its launch on the host (by time: the
backward's launches come from autograd's own thread). :func:`kernel_table` and :func:`category_table` turn those
records into lines; they need neither a GPU nor PyTorch.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

from .training_step import PARTS, step

RANGE = "part:"  # the profiler ranges' prefix
UNLAUNCHED = "(no launch seen)"  # GPU activity whose launch the profiler did not link (a copy's, a driver's)
# a kernel's kind, by the first of these its name contains (lower case); else "other"
KINDS = (
    ("recurrent_save", "prnn forward (saving)"),
    ("recurrent_backward", "prnn backward (recurrent)"),
    ("recurrent", "prnn recurrent"),
    ("rnn", "cuDNN RNN"),
    ("lstm", "cuDNN RNN"),
    ("persist", "cuDNN RNN"),
    ("gemm", "GEMM"),
    ("xmma", "GEMM"),
    ("cutlass", "GEMM"),
    ("splitk", "GEMM"),
    ("nvjet", "GEMM"),  # cuBLAS's Hopper half GEMMs (nvjet_sm90_hsh_...)
    ("reduce", "reduction"),
    ("memcpy", "copy / set"),
    ("memset", "copy / set"),
    ("copy", "copy / set"),
    ("elementwise", "elementwise"),
    ("vectorized", "elementwise"),
    ("unrolled", "elementwise"),
)


def kind_of(name: str) -> str:
    """The kind of the GPU activity called ``name`` (:data:`KINDS`)."""
    low = name.lower()
    return next((kind for key, kind in KINDS if key in low), "other")


def part_times(module, x, hx, steps: int) -> dict[str, tuple[float, float]]:
    """Per part of a step: (GPU ms, host ms), medians over ``steps`` steps (after two warm-up steps); ``"step"``:
    the whole step's."""
    import torch

    for _ in range(2):
        step(module, x, hx)
    torch.cuda.synchronize()
    gpu, host = defaultdict(list), defaultdict(list)
    for _ in range(steps):
        marks = []
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        step(module, x, hx, lambda name, marks=marks: _Bracket(name, marks))
        host["step"].append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        before = start
        for name, end, seconds in marks:
            gpu[name].append(before.elapsed_time(end))
            host[name].append(seconds * 1e3)
            before = end
        gpu["step"].append(start.elapsed_time(before))
    return {name: (statistics.median(gpu[name]), statistics.median(host[name])) for name in (*PARTS, "step")}


class _Bracket:
    """A part's context for :func:`part_times`: at its end a CUDA event and the host seconds it took."""

    def __init__(self, name: str, marks: list):
        self.name, self.marks = name, marks

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.marks.append((self.name, end, time.perf_counter() - self.t0))
        return False


def kernel_records(module, x, hx, steps: int) -> list[tuple[str, str, float]]:
    """``(part, name, GPU us)`` of every GPU activity of ``steps`` steps under ``torch.profiler`` (after two warm-up
    steps), the part :data:`UNLAUNCHED` where the profiler linked no launch to it."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(2):
        step(module, x, hx)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(module, x, hx, lambda name: record_function(RANGE + name))
        torch.cuda.synchronize()
    events = prof.events()
    ranges = [
        (e.time_range.start, e.time_range.end, e.name[len(RANGE) :])
        for e in events
        if e.name.startswith(RANGE) and e.device_type == DeviceType.CPU
    ]
    launched = defaultdict(float)  # (part, name): GPU us of the activities linked to a launch
    for e in events:
        if e.device_type == DeviceType.CPU and e.kernels:
            part = next((n for s, end, n in ranges if s <= e.time_range.start <= end), UNLAUNCHED)
            for k in e.kernels:
                launched[part, k.name] += k.duration
    # every GPU activity, linked or not: what is left of each name's total after the linked is unlaunched
    total = defaultdict(float)
    for e in events:
        if e.device_type == DeviceType.CUDA:
            total[e.name] += e.time_range.elapsed_us()
    records = [(part, name, us) for (part, name), us in launched.items()]
    for name, us in total.items():
        rest = us - sum(v for (_, n), v in launched.items() if n == name)
        if rest > 0.5 * steps:  # more than half a microsecond a step
            records.append((UNLAUNCHED, name, rest))
    return records


def kernel_table(records: list[tuple[str, str, float]], steps: int, width: int = 90) -> list[str]:
    """One line per (part, kernel): GPU us per step, its share of the step's kernels, its kind; largest first."""
    total = sum(us for _, _, us in records) or 1.0
    lines = [f"{'part':<16} {'us/step':>9} {'share':>6}  {'kind':<26} kernel"]
    for part, name, us in sorted(records, key=lambda r: -r[2]):
        short = name if len(name) <= width else name[: width - 3] + "..."
        lines.append(f"{part:<16} {us / steps:9.1f} {100 * us / total:5.1f}%  {kind_of(name):<26} {short}")
    lines.append(f"{'all kernels':<16} {total / steps:9.1f}")
    return lines


def category_table(records: list[tuple[str, str, float]], steps: int) -> list[str]:
    """GPU us per step of each part and kind of kernel (:func:`kind_of`), largest first."""
    sums = defaultdict(float)
    for part, name, us in records:
        sums[part, kind_of(name)] += us
    return [
        f"{part:<16} {kind:<26} {us / steps:9.1f} us/step"
        for (part, kind), us in sorted(sums.items(), key=lambda kv: -kv[1])
    ]


def breakdown(module, x, hx, repeats: int, number: int, kernels: int | None = None) -> list[str]:
    """A training step's report as the ``bench/*training_parts.py`` scripts print it: each part's GPU and host ms
    (:func:`part_times`, median of ``repeats`` steps), then the first ``kernels`` lines (all where None) of the
    kernel table of ``number`` profiled steps (:func:`kernel_table`) and the sums per part and kind."""
    times = part_times(module, x, hx, repeats)
    lines = ["part        GPU ms    host ms"]
    lines += [f"{part:<10} {times[part][0]:8.3f} {times[part][1]:9.3f}" for part in (*PARTS, "step")]
    records = kernel_records(module, x, hx, number)
    return lines + kernel_table(records, number)[:kernels] + category_table(records, number)


def inference_kernels(module, x, hx, calls: int) -> dict[str, float]:
    """GPU us per call of each kernel of ``module``'s forward without gradients (``torch.no_grad``: the inference
    layer's kernels, its tuned recurrent one among them), from ``calls`` profiled calls after two warm-up ones."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    state = tuple(hx) if len(hx) > 1 else hx[0]
    with torch.no_grad():
        for _ in range(2):
            module(x, state)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                module(x, state)
            torch.cuda.synchronize()
    total = defaultdict(float)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            total[e.name] += e.time_range.elapsed_us() / calls
    return dict(total)


def floor_lines(records: list[tuple[str, str, float]], steps: int, inference: dict[str, float], seq: int) -> list[str]:
    """The parts of a step's measured floor: per time step, the saving forward's recurrent kernel (training) beside
    the inference forward's (``inference``: :func:`inference_kernels`, the layer's tuned kernel), and the
    backward's; per training step (``records`` of ``steps`` steps: :func:`kernel_records`), every other kernel (the
    parts' ranges left out)."""

    def per_step(kind: str) -> float:
        return sum(us for _, name, us in records if kind_of(name) == kind) / steps

    save, backward = per_step("prnn forward (saving)"), per_step("prnn backward (recurrent)")
    forward = sum(us for name, us in inference.items() if kind_of(name) == "prnn recurrent")
    # the profiler's ranges of the parts show up as GPU activity too (``part:forward``): not kernels
    other = sum(us for _, name, us in records if not name.startswith(RANGE)) / steps - save - backward
    return [
        f"recurrent kernels per time step (T={seq}): saving forward {save / seq:.2f} us, inference forward "
        f"{forward / seq:.2f} us (no grad: the layer's tuned kernel), backward {backward / seq:.2f} us",
        f"every other kernel of a training step (GEMMs, elementwise, copies): {other:.1f} us",
        "floor of a step: inference forward x T + the backward without its exchange x T (bench/backward_timeline.py "
        "--no-copy) + every other kernel",
    ]

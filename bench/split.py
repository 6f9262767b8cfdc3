"""One LSTM layer split over the GPUs of one host (``compile_cell(..., devices=[0, 1])``) against the same layer on one
GPU (ours, where it fits) and cuDNN on one GPU (``torch.nn.LSTM``), fp16, T=256.

    python bench/split.py [--hidden 2048 --batch 8 --gpus 2 --seq 256] [--config '{"k_groups": 4, ...}'] [--breakdown]

``--config`` takes one config (a JSON object) or several (a JSON list; ``null`` for the default): each is compiled,
its report printed, its public call, layer and recurrent kernels timed (``--breakdown``: the first's). A config may
name the split's knob ``hop`` (``schedules/split.py``): ``exposed`` (the default: the whole state polled before the
product), or a floor (timing only, wrong outputs, no public call timed): ``floor`` (each GPU polls and stores a
peer's part in its own copy, every load and store kept, no NVLink: its step the local work alone) or ``floor_own``
(the floor polling its own GPU's part alone: 1/G of the polled words). With a floor, exposed's step is printed as
local work + hop; with both floors, what the peers' polled words cost a step:

    python bench/split.py --hidden 2048 --batch 8 --gpus 2 --config '[null, {"hop": "floor"}, {"hop": "floor_own"}]'

A config may also name the split's knob ``words``: ``packed`` (the default where the config can run them: three
values and a 16-bit tag a word) or ``single`` (a value and its 32-bit tag a word: three times the polled words); each
words' floors are reported apart, each layer's rows naming the words it runs.

Cases of issue 52: LSTM fp16 H=2048 B=8 on 2 GPUs against the same layer on one (weights past one GPU's registers:
part of them in shared memory there) and ``--gpus 4 --hidden 4096 --batch 4`` (134 MB of weights, 254 KB per SM
over four H100s: each GPU's slice keeps part of them in shared memory) against cuDNN on one GPU.

The public calls come first, each timed as cuDNN's ``m(x)`` is, under ``torch.no_grad()``:
``prnn_tvm.torch.from_torch(m)(x)`` on one GPU and ``from_torch(m, devices=[0, .., G-1])(x)`` over G (torch tensors
on GPU 0 in and out: the input copied to the other GPUs, each GPU's units of the outputs copied back).

``--breakdown`` then says where the split public call's time goes, per phase of
:class:`prnn_tvm.torch.split.SplitLayers` (its ``phase`` hook): host milliseconds issuing each phase with nothing
drained, each GPU's milliseconds between the phases (CUDA events recorded on every GPU's current stream at each
phase's end: the GPU's own time for the phase's work where it ran behind the host), and the host wall per phase
with every GPU drained at each phase's end (the phase's host and device time in series).

Every figure is host wall time over ``number`` calls issued back to back, then a wait for every GPU, the median
of ``repeats`` runs: a split call's time is its slowest GPU's. "layer" is the whole layer (each GPU computes its own
columns of the input projection: TVM's GEMM), "recurrent" the recurrent kernels alone on a given projection. Inputs
are placed on the GPUs once (a split call's public form copies NumPy to every GPU and back; that is not timed).
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
import tvm

import prnn_tvm
import prnn_tvm.torch as pt
from prnn_tvm.codegen.barriers.packed import words_of
from prnn_tvm.errors import ConfigError, UnsupportedError
from prnn_tvm.reference import random_inputs
from prnn_tvm.schedules import SPLIT_WORDS, split_knobs

p = argparse.ArgumentParser()
for name, default in {"hidden": 2048, "batch": 8, "gpus": 2, "seq": 256, "repeats": 7, "number": 5}.items():
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--config", type=json.loads, default=None,
               help="the split layer's knobs (a dict, as JSON), or a list of them (null: the default)")
p.add_argument("--breakdown", action="store_true", help="where the split public call's time goes, per phase")
p.add_argument("--calls", type=int, default=20, help="calls the breakdown takes the median of")
p.add_argument("--profile", action="store_true",
               help="the host's own time per function over --calls public calls of the first config (cProfile)")
args = p.parse_args()
configs = args.config if isinstance(args.config, list) else [args.config]
H, B, T, G = args.hidden, args.batch, args.seq, args.gpus
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)


def wall_ms(fn, wait) -> float:
    """Median milliseconds per call of ``fn`` (``wait`` waits for every GPU it used)."""
    for _ in range(3):
        fn()
    wait()
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.number):
            fn()
        wait()
        runs.append((time.perf_counter() - start) * 1e3 / args.number)
    return statistics.median(runs)


def row(what: str, ms: float | None, note: str = "") -> dict:
    per_step = f"{ms * 1e3 / T:8.2f}" if ms is not None else "       -"
    print(f"{what:44s} {ms if ms is not None else float('nan'):9.3f} ms {per_step} us/step  {note}")
    return {"what": what, "ms": ms, "us_per_step": None if ms is None else ms * 1e3 / T, "note": note}


rows = []
print(f"LSTM fp16 H={H} B={B} T={T}; {torch.cuda.device_count()} GPUs: {torch.cuda.get_device_name(0)}; "
      f"host CPUs (affinity) {len(os.sched_getaffinity(0))}")

# cuDNN on one GPU
lstm = torch.nn.LSTM(H, H).cuda().half().eval()
x = torch.randn(T, B, H, device="cuda", dtype=torch.float16)
with torch.no_grad():
    rows.append(row("cuDNN nn.LSTM, 1 GPU", wall_ms(lambda: lstm(x), torch.cuda.synchronize)))


def every_gpu() -> None:
    for d in range(G):
        torch.cuda.synchronize(d)


def public_row(what: str, make) -> dict:
    """The public call of the module ``make()`` makes from ``lstm``, or why it does not run ours."""
    try:
        module = make()
        with torch.no_grad():
            ms = wall_ms(lambda: module(x), every_gpu)
    except (ConfigError, UnsupportedError) as err:
        return row(what, None, f"refused: {str(err)[:160]}")
    notes = "; ".join(str(n) for n in getattr(module, "fallback_notes", {}).values())
    if notes:  # a layer no config places runs on torch.nn's kernels: not ours
        return row(what, None, f"runs torch.nn's kernels: {notes[:160]}")
    return row(what, ms)


def hop_of(knobs) -> str:
    """The split's knob ``hop`` a config names (``exposed`` by default)."""
    return split_knobs(knobs)[1].hop


def words_of_config(knobs) -> str:
    """The split's knob ``words`` a config names (``default`` where it names none)."""
    return split_knobs(knobs)[1].words or "default"


def words_run(layer) -> str:
    """The words a compiled split layer's states travel in (its report's config note names them)."""
    return next(w for w in SPLIT_WORDS if f"words {w}:" in layer.report.format())


rows.append(public_row("prnn-tvm, 1 GPU: public call", lambda: pt.from_torch(lstm)))
split_modules = [pt.from_torch(lstm, devices=list(range(G)), config=knobs) for knobs in configs]
public = [i for i, knobs in enumerate(configs) if not hop_of(knobs).startswith("floor")]  # a floor's outputs are wrong
for i in public:
    rows.append(public_row(f"prnn-tvm, {G} GPUs: public call, hop {hop_of(configs[i])}, words "
                           f"{words_of_config(configs[i])}"
                           + (f" (config {i})" if len(configs) > 1 else ""), lambda module=split_modules[i]: module))
split_module = split_modules[public[0]] if public else None
one_public, split_public = rows[1]["ms"], (rows[2]["ms"] if public else None)


def events() -> list:
    """A timing event recorded on every GPU's current stream."""
    found = []
    for d in range(G):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(d))
        found.append(event)
    return found


def breakdown(module, calls: int) -> list:
    """Per phase of the split public call (``SplitLayers.phase``): the host's milliseconds issuing it (nothing
    drained), each GPU's milliseconds between the phase marks (events), and the host wall with every GPU drained at
    each mark; medians of ``calls`` calls, each started with every GPU idle."""
    marks, stamps, host, device, drained = [], [], {}, {}, {}

    def drain(name):
        every_gpu()
        stamps.append((name, time.perf_counter()))

    for _ in range(calls):
        every_gpu()
        marks.clear()
        module._split.phase = lambda name: marks.append((name, time.perf_counter(), events()))
        marks.append(("start", time.perf_counter(), events()))
        with torch.no_grad():
            module(x)
        marks.append(("call returned", time.perf_counter(), events()))
        every_gpu()
        end = time.perf_counter()
        for (_, t0, e0), (name, t1, e1) in zip(marks, marks[1:]):
            host.setdefault(name, []).append((t1 - t0) * 1e3)
            device.setdefault(name, []).append([a.elapsed_time(b) for a, b in zip(e0, e1)])
        host.setdefault("every GPU done", []).append((end - marks[-1][1]) * 1e3)
        device.setdefault("every GPU done", []).append([float("nan")] * G)
        host.setdefault("whole call", []).append((end - marks[0][1]) * 1e3)
        device.setdefault("whole call", []).append([a.elapsed_time(b) for a, b in zip(marks[0][2], marks[-1][2])])
        stamps.clear()
        module._split.phase = drain
        drain("start")
        with torch.no_grad():
            module(x)
        drain("call returned")
        for (_, t0), (name, t1) in zip(stamps, stamps[1:]):
            drained.setdefault(name, []).append((t1 - t0) * 1e3)
        drained.setdefault("whole call", []).append((stamps[-1][1] - stamps[0][1]) * 1e3)
    module._split.phase = None
    print(f"\nwhere a public call over {G} GPUs goes, ms (median of {calls} calls; a phase's events are recorded at "
          "its end on every GPU's current stream)")
    print(f"{'phase':24s} {'host issue':>10s} " + " ".join(f"{f'GPU {d}':>8s}" for d in range(G))
          + f" {'drained':>9s}")
    found = []
    for name in host:
        gpus = [statistics.median(v[d] for v in device[name]) for d in range(G)]
        wall = statistics.median(drained[name]) if name in drained else float("nan")
        print(f"{name:24s} {statistics.median(host[name]):10.3f} " + " ".join(f"{ms:8.3f}" for ms in gpus)
              + f" {wall:9.3f}")
        found.append({"phase": name, "host_ms": statistics.median(host[name]), "gpu_ms": gpus, "drained_ms": wall})
    return found


phases = breakdown(split_module, args.calls) if args.breakdown and split_public is not None else []


def profile(module, calls: int) -> None:
    """The functions the host spends most of its own time in over ``calls`` public calls (every GPU drained after
    each, outside the profile)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    with torch.no_grad():
        for _ in range(calls):
            profiler.enable()
            module(x)
            profiler.disable()
            every_gpu()
    print(f"\nthe host's own time in a public call over {G} GPUs, {calls} calls (cProfile; tottime, cumtime in s)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if args.profile and split_public is not None:
    profile(split_module, args.calls)

# ours on one GPU, where it fits
inputs = None
try:
    one = prnn_tvm.compile_cell("lstm", H, B, dtype="float16")
except ConfigError as err:
    rows.append(row("prnn-tvm, 1 GPU", None, f"refused: {str(err)[:120]}"))
else:
    inputs = random_inputs(one.plan, T, H)
    dev = tvm.cuda(0)
    bound = one.bind(**{k: tvm.runtime.tensor(v, dev) for k, v in inputs.items()})

    def run_one():
        for name, a in bound.launches:
            one.module[name](*a)

    rows.append(row("prnn-tvm, 1 GPU: layer", wall_ms(run_one, dev.sync), one.report.format().splitlines()[4]))
    one.check()

# ours split over G GPUs, each config given
# words -> hop -> the recurrent kernel's us a step, MB a GPU polls a step (the first config of each)
recurrent_us, polled_mb = {}, {}
for knobs, module in zip(configs, split_modules):
    hop, words = hop_of(knobs), words_of_config(knobs)
    try:  # each config's layer is its public call's, compiled already (a split layer's compile is not cached)
        reused = next(iter(module._split.layers.values()), None)
        split = reused or prnn_tvm.compile_cell("lstm", H, B, dtype="float16", devices=list(range(G)), config=knobs)
    except ConfigError as err:
        rows.append(row(f"prnn-tvm, {G} GPUs, hop {hop}, words {words}", None, f"refused: {err}"))
        continue
    print(split.report.format())
    words = words_run(split)
    if inputs is None:  # one GPU refused the layer
        inputs = random_inputs(split.plan, T, H)
    xp = (inputs["x"].astype(np.float64) @ inputs["W_ih"].T.astype(np.float64) + inputs["b_ih"]).astype(
        split.signature.launch("recurrent").arg("xp").dtype)  # float32, or the half type (the knob xp)
    call = split.bind(**inputs)
    recurrent = split.bind_recurrent(xp, **{k: v for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")})
    config = " ".join(f"{k}={v}" for k, v in split.report.config.items())
    floor = f" ({hop}: no hop, wrong outputs)" if hop.startswith("floor") else ""
    rows.append(row(f"prnn-tvm, {G} GPUs: layer, hop {hop}, words {words}{floor}", wall_ms(call.run, split.check),
                    config))
    # every CTA polls every batch row's tagged words each step, 8 bytes each: a unit's value and its step (single),
    # or three units' values and their step (packed); floor_own: its own GPU's units' alone
    row_words = H if words == "single" else words_of(H, split.units_per_cta)
    polled = split.ctas_per_gpu * B * row_words * 8 / 1e6 / (G if hop == "floor_own" else 1)
    rows.append(row(f"prnn-tvm, {G} GPUs: recurrent, hop {hop}, words {words}{floor}",
                    wall_ms(recurrent.run, split.check),
                    f"{config}; {split.ctas_per_gpu} CTAs a GPU polling {polled:.1f} MB a step"))
    if rows[-1]["us_per_step"] is not None:
        recurrent_us.setdefault(words, {}).setdefault(hop, rows[-1]["us_per_step"])
        polled_mb.setdefault(words, {}).setdefault(hop, polled)
# what a GPU's projection would cost were it its own units' columns alone, by cuBLAS (the GPUs run theirs at once)
w_slice = torch.randn(4 * H // G, H, device=x.device, dtype=torch.float16)
rows.append(row(f"cuBLAS projection of 1/{G} of the columns", wall_ms(
    lambda: torch.mm(x.view(T * B, H), w_slice.t(), out_dtype=torch.float32), torch.cuda.synchronize)))

cudnn = rows[0]["ms"]
for r in rows[1:]:
    if r["ms"] is not None:
        print(f"{r['what']}: {cudnn / r['ms']:.2f}x cuDNN")
for words, us_by_hop in recurrent_us.items():
    if "floor" in us_by_hop and "exposed" in us_by_hop:  # a step: the local work (the floor) and the hop on it
        print(f"recurrent step, words {words}, hop exposed: {us_by_hop['exposed']:.2f} us = local work "
              f"{us_by_hop['floor']:.2f} + hop {us_by_hop['exposed'] - us_by_hop['floor']:.2f}")
    if "floor" in us_by_hop and "floor_own" in us_by_hop:  # what the polled words the peers wrote cost a step
        us, mb = us_by_hop["floor"] - us_by_hop["floor_own"], polled_mb[words]["floor"] - polled_mb[words]["floor_own"]
        print(f"words {words}, the peers' polled words: floor - floor_own = {us:.2f} us a step for {mb:.1f} MB a GPU "
              f"({us / mb:.3f} us per MB polled)")
if one_public is not None and split_public is not None:
    print(f"public calls: {G} GPUs at {one_public / split_public:.2f}x the speed of 1 GPU ({split_public:.3f} ms a "
          f"call against {one_public:.3f})")
print(json.dumps({"hidden": H, "batch": B, "seq": T, "gpus": G, "rows": rows, "phases": phases,
                  "recurrent_us_by_words_and_hop": recurrent_us, "polled_mb_by_words_and_hop": polled_mb}))

"""Does the side stream's projection run while the recurrent kernel runs, and what does the kernel that waits cost?
(``prnn_tvm.torch.overlap``). One process, one GPU, within a minute: LSTM with heads at hidden 768, batch 16,
bfloat16, the module's inference call, CUDA events on both streams (``--rounds`` calls of each mode, interleaved):

- ``plain``: ``overlap_projection`` False: the projection, then the layer's own kernel (main's), and right after it,
  on the same inputs and stream, the kernel that waits with its flags 0 (``waiting``): the two timed alone, their
  outputs compared (``max diff``);
- ``flags0``: the overlapped call with the kernel's ``xp_flags`` forced to 0: the kernel that waits, waiting for
  nothing (its outputs race the side stream's pieces: a diagnostic), the pieces beside it;
- ``flags``: the overlapped call as it runs.

Per mode: the recurrent kernel's time (events around its launch on the caller's stream; median), the call's time
(first event to last, the join included), and from the last call the timeline in us from the call's start: the
launch's start and end, each piece's start and end on the side stream (its flag write included). ``overlapped``
says whether every piece ended before the kernel did; pieces that start only once the kernel has ended mean that the
side stream's work does not run beside it.

    python bench/overlap_timeline.py [--seq 1024 --batch 16 --rounds 15] [--heads 12 48]
"""

import argparse
import statistics

import torch

import prnn_tvm.torch as pt
from prnn_tvm.torch import overlap

p = argparse.ArgumentParser()
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--rounds", type=int, default=15)
p.add_argument("--heads", type=int, nargs="+", default=[12, 48])
args = p.parse_args()
torch.backends.cuda.matmul.allow_tf32 = False
H, MODES = 768, ("plain", "flags0", "flags")


def event() -> torch.cuda.Event:
    e = torch.cuda.Event(enable_timing=True)
    e.record()  # on the current stream
    return e


class Probe:
    """Events of one call: its start and end (caller's stream), the launch's (around ``module._launch``), each
    piece's (side stream: ``before_piece`` and after ``write_flags``); in a plain call, the kernel that waits
    launched again on the same inputs."""

    def __init__(self, module):
        self.module, self.mode = module, "plain"
        self.launch_ = module._launch
        module._launch = self.launch
        overlap.before_piece = lambda start: self.pieces.append([start, event()])
        write = overlap.write_flags
        overlap.write_flags = lambda *a: (write(*a), self.pieces[-1].append(event()))

    def launch(self, layer, xp, rest, function="recurrent", into=None, scalars=None):
        if scalars is not None and self.mode == "flags0":
            scalars = {**scalars, "xp_flags": 0}
        self.kernel = [event()]
        out = self.launch_(layer, xp, rest, function, into, scalars)
        self.kernel.append(event())
        if self.mode == "plain":  # the kernel that waits, its flags 0 (the runtime's scalars): alone, same inputs
            waiting = overlap.waiting_kernel(layer)
            self.waiting = [event()]
            again = self.launch_(waiting, xp, rest, function)
            self.waiting.append(event())
            self.diff = max((a.float() - b.float()).abs().max() for a, b in zip(out, again))
        return out

    def call(self, x, mode: str) -> dict:
        self.module.overlap_projection, self.mode, self.pieces = mode != "plain", mode, []
        start = event()
        with torch.no_grad():
            self.module(x)
        end = event()
        torch.cuda.synchronize()
        since = start.elapsed_time
        found = {
            "kernel": self.kernel[0].elapsed_time(self.kernel[1]) * 1e3,
            "call": since(end) * 1e3,
            "launch": (since(self.kernel[0]) * 1e3, since(self.kernel[1]) * 1e3),
            "pieces": [(s, since(a) * 1e3, since(b) * 1e3) for s, a, b in self.pieces],
        }
        if mode == "plain":
            found["waiting"] = self.waiting[0].elapsed_time(self.waiting[1]) * 1e3
            found["diff"] = float(self.diff)
        return found


def median(found: dict, mode: str, key: str) -> float:
    return statistics.median(f[key] for f in found[mode])


for heads in args.heads:
    module = pt.Recurrent(f"lstm_h{heads}", H, H, device="cuda", dtype=torch.bfloat16)
    module.batch_buckets = False
    x = torch.randn(args.seq, args.batch, H, device="cuda", dtype=torch.bfloat16)
    layer = module.layer_for(args.batch, x.device)
    plan = overlap.overlaps(layer, args.seq, x.device, True)
    waiting = overlap.waiting_kernel(layer)
    print(f"lstm_h{heads} {H}x{args.batch} T={args.seq} bf16: {layer.report.ctas} CTAs, own kernel "
          f"{layer.report.registers} registers; kernel that waits: {layer._xp_ready.report if waiting else None}; "
          f"chunk plan {plan}", flush=True)
    if plan is None:
        continue
    probe = Probe(module)
    for mode in MODES * 3:  # warm: every kernel loaded, every allocation cached
        probe.call(x, mode)
        module.check()
    found = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            found[mode].append(probe.call(x, mode))
            module.check()  # no wait gave up

    plain = median(found, "plain", "kernel")
    waiting_alone = median(found, "plain", "waiting")
    print(f"  own kernel {plain:.1f} us ({plain / args.seq * 1e3:.1f} ns/step); kernel that waits, flags 0, alone: "
          f"{waiting_alone:.1f} us ({waiting_alone / plain:.4f}x); max diff of their outputs "
          f"{max(f['diff'] for f in found['plain']):.3g}", flush=True)
    for mode in MODES:
        kernel, call, last = median(found, mode, "kernel"), median(found, mode, "call"), found[mode][-1]
        print(f"  {mode:6s}: kernel {kernel:8.1f} us ({kernel / plain:.3f}x the own kernel), call {call:8.1f} us "
              "(plain: both kernels); last call: launch "
              f"{last['launch'][0]:.1f}-{last['launch'][1]:.1f} us", flush=True)
        if last["pieces"]:
            ends = [b for _, _, b in last["pieces"]]
            print("          pieces (first step: us start-end): "
                  + ", ".join(f"{s}: {a:.1f}-{b:.1f}" for s, a, b in last["pieces"])
                  + f"; overlapped: {max(ends) < last['launch'][1]}", flush=True)

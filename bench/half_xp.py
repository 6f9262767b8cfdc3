"""What a half ``xp`` would save on the projection's side (issue 49, item 3): cuBLAS computing ``x @ W_ih^T + b_ih``
over all T x B rows of a half layer into float32 (what ``prnn_tvm.torch`` runs today: ``projection.project``) against
the same GEMM written in the layer's half type (``torch.addmm``, bias in cuBLAS's epilogue, float32 accumulation,
one rounding), timed with CUDA events in one process; and how far the half result is from the float32 one (the
rounding a half ``xp`` adds to every gate pre-activation). The layer's side, since built (the tensor-core knob
``xp``): ``bench/xp_types.py`` times the module call with either type. Default: the heads shape of issue 49.

    python bench/half_xp.py [--hidden 768 --batch 16 --seq 1024 --gates 4 --dtype bfloat16 --repeats 7 --number 20]
"""


import torch

from prnn_tvm.bench.baselines import cuda_event_times, script_arguments
from prnn_tvm.torch.projection import biased, projector

args = script_arguments(number=20, hidden=768, batch=16, seq=1024, gates=4, dtype="bfloat16")

dt, H = getattr(torch, args.dtype), args.hidden
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(args.seq, args.batch, H, device="cuda", dtype=dt, generator=g)
W = (torch.rand(args.gates * H, H, device="cuda", generator=g) * 2 - 1).mul_(H**-0.5).to(dt)
b = (torch.rand(args.gates * H, device="cuda", generator=g) * 2 - 1).mul_(H**-0.5).to(dt)
rows, Wt = x.view(-1, H), W.t()
padded = biased(W, b)  # made once, as the torch module keeps it
today = projector(W, b, lambda *_: padded)


def half():
    return torch.addmm(b, rows, Wt)


f32, h = today(x), half()
diff = (h.float().view_as(f32) - f32).abs().max().item()
elements = f32.numel()
print(f"x [{args.seq * args.batch}, {H}] @ W_ih^T [{H}, {args.gates * H}] + b_ih, {args.dtype}:")
for name, fn, size in (("into float32 (today)", lambda: today(x), 4), (f"into {args.dtype}", half, h.element_size())):
    med, best = cuda_event_times(fn, args.repeats, args.number)
    print(f"  {name:<22} {med * 1e6:8.1f} us (min {best * 1e6:.1f}); xp {elements * size / 1e6:.0f} MB written")
print(f"  max |half - float32| {diff:.3g} (xp max {f32.abs().max().item():.3g})")

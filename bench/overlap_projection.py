"""The torch module's inference call with its input projection beside the recurrence (``prnn_tvm.torch.overlap``)
against the call that projects first, in one process on one GPU: LSTM with heads of D at hidden 768 (issue 49's
shape: batch 16, T=1024, bfloat16), D from 16 to 256 and dense (768), the defaults and, for D=128, the in_warp
config. Per row: the recurrent grid's CTAs, whether the call overlaps (``overlaps``: the layer has a kernel that
waits, the grid holds at most ``MAX_GRID_SHARE`` of the SMs, two chunks or more), the module call with and without the
overlap (eager, then replayed from a CUDA graph), and the largest difference between the two calls' outputs. Median of
CUDA-event runs (``prnn_tvm.bench.baselines.cuda_event_times``), ms per sequence.

    python bench/overlap_projection.py [--seq 1024 --batch 16 --hidden 768 --repeats 7 --number 5]
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench.baselines import captured, cuda_event_times, script_arguments
from prnn_tvm.torch import overlap

args = script_arguments(5, seq=1024, hidden=768, batch=16)  # TF32 off, seed 0
HEAD_DIMS = (16, 32, 64, 128, 256, 768)
H, B, T, BF16 = args.hidden, args.batch, args.seq, torch.bfloat16
# heads of 128 in_warp (the default synchronizes by gate): tests/test_gpu_heads.py's IN_WARP_CASES, as knobs
IN_WARP_128 = {"units_per_cta": 128, "k_groups": 1, "n_tiles": 2, "barrier": "block", "m_tiles_per_warp": 2,
               "smem_k_tiles": 2, "gate_layout": "in_warp"}


def ms(fn) -> float:
    return cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def row(D: int, config=None) -> str:
    heads = H // D
    spec = f"lstm_h{heads}" if heads > 1 else "lstm"
    module = pt.Recurrent(spec, H, H, device="cuda", dtype=BF16, config=config)
    x = torch.randn(T, B, H, device="cuda", dtype=BF16)
    times, outs = {}, {}
    with torch.no_grad():
        for on in (True, False):
            module.overlap_projection = on
            outs[on] = module(x)[0].float()
            eager = ms(lambda: module(x))
            graph, _ = captured(lambda: module(x))
            times[on] = (eager, ms(graph.replay))
    module.check()
    layer = module.layer_for(B, x.device)
    plan = overlap.overlaps(layer, T, x.device, True)
    diff = (outs[True] - outs[False]).abs().max().item()
    (on_eager, on_graph), (off_eager, off_graph) = times[True], times[False]
    return (
        f"| {D}{' (in_warp)' if config else ''} | {layer.report.ctas} | {'yes' if plan else 'no'} | "
        f"{on_eager:.3f} | {off_eager:.3f} | {off_eager / on_eager:.2f}x | {on_graph:.3f} | {off_graph:.3f} | "
        f"{off_graph / on_graph:.2f}x | {diff:.1e} |"
    )


print(f"# Projection beside the recurrence ({torch.cuda.get_device_name()}, torch {torch.__version__})")
print(f"LSTM with heads, hidden {H}, batch {B}, T={T}, bf16; module call, ms, median of {args.repeats} x {args.number}")
print()
print(
    "| head size | CTAs | overlaps | eager: beside | eager: first | gain | graph: beside | graph: first | gain | "
    "max abs diff |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for D in HEAD_DIMS:
    print(row(D), flush=True)
    if D == 128:
        print(row(D, IN_WARP_128), flush=True)

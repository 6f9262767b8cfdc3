"""The torch module's call with the input projection ``xp`` in float32 against the same call with ``xp`` in the
layer's half type (the tensor-core template's knob ``xp``), issues 49 and 51: per case, the config a module call
takes by default (a tuning record's, else the untuned default) built both ways, timed in interleaved rounds with CUDA
events in one process, and, for a dense LSTM, cuDNN's ``nn.LSTM`` on the same weights and input (its persistent
kernel in fp16 at batch 16). Also the largest difference between the two projection types' outputs.

    python bench/xp_types.py [--cases lstm_h12:768:bfloat16 lstm_h24:768:bfloat16 lstm:896:float16 \
        lstm:1024:float16 --batch 16 --seq 1024 --repeats 7 --number 10]
"""

import dataclasses
import statistics

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench.baselines import cuda_event_times, script_arguments

args = script_arguments(
    number=10,
    seq=1024,
    cases=["lstm_h12:768:bfloat16", "lstm_h24:768:bfloat16", "lstm:896:float16", "lstm:1024:float16"],
    batch=16,
)
B, T = args.batch, args.seq
XP_TYPES = ("float32", "half")


def modules(spec: str, H: int, dtype: torch.dtype) -> tuple:
    """(the torch baseline or None, {xp type: our module}, the config a default call takes): a dense LSTM from
    ``nn.LSTM`` (whose cuDNN call is the baseline), any other cell as ``pt.Recurrent``; every module on the same
    weights, with the batch's own layer (no batch buckets)."""
    baseline = torch.nn.LSTM(H, H).cuda().to(dtype).eval() if spec == "lstm" else None
    default = pt.from_torch(baseline) if baseline is not None else pt.Recurrent(spec, H, H, device="cuda", dtype=dtype)
    default.batch_buckets = False
    config = default.layer_for(B, torch.device("cuda"), dtype).kernel.config
    ours = {}
    for xp in XP_TYPES:
        cfg = dataclasses.replace(config, xp=xp).as_dict()
        if baseline is not None:
            ours[xp] = pt.from_torch(baseline, config=cfg)
        else:
            ours[xp] = pt.Recurrent(spec, H, H, device="cuda", dtype=dtype, config=cfg)
            ours[xp].load_state_dict(default.state_dict())
        ours[xp].batch_buckets = False
    return baseline, ours, config


def interleaved_ms(calls: dict) -> dict:
    """Median ms per call of each of ``calls`` over ``args.repeats`` rounds, each round timing every call in turn."""
    rounds = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            rounds[name].append(cuda_event_times(fn, 1, args.number, warmup=1)[0] * 1e3)
    return {name: statistics.median(times) for name, times in rounds.items()}


def row(case: str) -> str:
    """The table's row of ``case`` (``cell:hidden:dtype``)."""
    spec, hidden, dtype_name = case.split(":")
    H, dtype = int(hidden), getattr(torch, dtype_name)
    baseline, ours, config = modules(spec, H, dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    with torch.no_grad():
        outs = {xp: module(x)[0] for xp, module in ours.items()}
        calls = {xp: (lambda m=module: m(x)) for xp, module in ours.items()}
        if baseline is not None:
            calls["cuDNN"] = lambda: baseline(x)
        ms = interleaved_ms(calls)
    cudnn = ms.get("cuDNN")
    diff = (outs["half"].float() - outs["float32"].float()).abs().max().item()
    knobs = " ".join(f"{k}={v}" for k, v in config.as_dict().items())
    against = ("-", "-") if cudnn is None else (f"{cudnn:.3f}", f"{cudnn / ms['half']:.2f}x")
    return (f"| {spec} {H} {dtype_name} | {knobs} | {against[0]} | {ms['float32']:.3f} | {ms['half']:.3f} | "
            f"{ms['half'] / ms['float32']:.3f} | {against[1]} | {diff:.2e} |")


print(f"module calls, batch {B}, T={T}, ms (median of {args.repeats} interleaved rounds of {args.number} calls)")
print("| case | config (as a default call takes it) | cuDNN | xp float32 | xp half | half / float32 | cuDNN / half "
      "| max abs difference of the outputs |")
print("|---|---|---|---|---|---|---|---|")
for case in args.cases:
    print(row(case), flush=True)

"""A cell's GPU backward config by config, in a training step through ``prnn_tvm.torch.Recurrent`` on the GPU: sLSTM
with 12 heads of 64, bf16, H=768 B=16 T=1024 by default (FlashRNN's shape, ``bench/against_flashrnn.py``). The
backward's ranked defaults (``schedules.backward_configs``; the first is what a layer trains with), then the first's
variants: other units a CTA (whole heads with the ``block`` barrier, in batch groups or over the whole batch, or parts
of one over the grid), other lane splits and rows per thread.

    PRNN_TVM_CACHE=0 python bench/cell_backward_configs.py [--spec slstm_h12] [--dtype bfloat16]
                                                           [--hidden 768 --batch 16 --seq 1024]

The layer cache is keyed by the layer, not by the backward's config: run it with the cache off. Each figure is the
median of CUDA-event runs of one step (gradients cleared, forward, loss over every output, ``backward()``); the
gradients of each config against the first's: the largest difference relative to a gradient's largest entry.
"""


import torch

import prnn_tvm
import prnn_tvm.compiler
import prnn_tvm.torch as pt
from prnn_tvm import schedules
from prnn_tvm.bench import baselines
from prnn_tvm.bench.backward_variants import add_variants
from prnn_tvm.bench.training_step import cell_arguments, step
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.target import gpu_spec

args = cell_arguments(False)
dtype, H, B, T = getattr(torch, args.dtype), args.hidden, args.batch, args.seq
built_with = prnn_tvm.compiler.gpu_backward  # what a training build asks for its backward; replaced config by config


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def only(cfg):
    """What a training build asks for its backward: the kernel of ``cfg`` alone."""
    return lambda plan, gpu: iter([schedules.backward_kernel(plan, gpu, cfg)])


plan = prnn_tvm.analyze(prnn_tvm.resolve(args.spec), B, H, dtype=args.dtype)
gpu = gpu_spec()
configs = schedules.backward_configs(plan, gpu)
first_cfg = configs[0]
# over the grid, the whole batch a block (the default before batch groups: 8 units, k_split 32, one row a thread)
grid = {"barrier": "counter", "batch_groups": 1, "batch_tile": B}
variants = [{**grid, "units_per_cta": u, "k_split": k, "rows_per_thread": r}
            for u, k, r in ((8, 32, 1), (16, 16, 1), (16, 16, 2), (32, 16, 2))]
# whole heads a block, in batch groups of B / G rows (G=1: the whole batch, four items a thread at 16 rows)
variants += [{"units_per_cta": 64, "barrier": "block", "batch_groups": G, "batch_tile": max(1, B // G), "k_split": k,
              "rows_per_thread": r} for G in (1, 2, 4, 8) for k, r in ((16, 4), (32, 4), (16, 2))]
add_variants(first_cfg, variants, configs, plan, gpu)

module = pt.Recurrent(args.spec, H, H, device="cuda", dtype=dtype).train()
x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)
hx = [(0.1 * torch.randn(1, B, H, device="cuda", dtype=dtype)).requires_grad_() for _ in module._states]
print(f"{args.spec} {args.dtype} H={H} B={B} T={T}: {len(configs)} backward configs")
print("backward | training step ms | gradients against the first")
first = None
for cfg in configs:
    prnn_tvm.compiler.gpu_backward = only(cfg)
    for layer in module._layers.values():  # a layer kept in this process: its training kernels anew
        layer._training = None
    try:
        grads = [g.float() for g in step(module, x, hx)]  # compiles
    except Exception as err:  # a config that fails to build or run is a result: say why, go on
        print(f"{cfg.as_dict()} | failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}")
        continue
    report = next(layer._training.report for layer in module._layers.values() if layer._training is not None)
    first = grads if first is None else first
    error = worst(relative_error(g.cpu().double().numpy(), f.cpu().double().numpy()) for g, f in zip(grads, first))
    took = ms(lambda: step(module, x, hx))
    print(f"{report.splitlines()[-1]} | {took:.3f} | {error:.2e}", flush=True)
prnn_tvm.compiler.gpu_backward = built_with

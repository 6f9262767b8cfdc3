"""The backward of a half LSTM or GRU, config by config, in a training step through the public call on the GPU: the
tensor-core backward's ranked defaults (``schedules.backward_configs``, the first is what a layer trains with),
the first's with one copy of the gate gradients per CTA (``cluster`` 1, ``copy_stages`` 2: the default before
clusters) and from there at 16 k groups, at the fewest units that spread over every SM, with the block's whole-tile
copy and without L2 prefetch (``copy_stages``, ``prefetch_steps``), the first's without L2 prefetch, the first's in
thread-block clusters of 2, 4 and 8 CTAs sharing one copy of the gate gradients (``cluster``; the block's wait for it
and each warp's for its own columns: ``copy_stages`` 0 and 1), and the first config of the float32 backward it
replaced (transposed weights widened in registers), against cuDNN in the same dtype.

    PRNN_TVM_CACHE=0 python bench/backward_configs.py [--cell LSTM] [--hidden 1024] [--batch 16] [--seq 256]
        [--bf16 0] [--clusters 2 4 8]

The layer cache is keyed by the layer, not by the backward's config: run it with the cache off. Each figure is
the median of CUDA-event runs of one step (gradients cleared, forward, loss over every output, ``backward()``);
the gradients of each config against the first's: the largest difference relative to a gradient's largest entry.
"""

import math

import torch

import prnn_tvm
import prnn_tvm.compiler
import prnn_tvm.torch as pt
from prnn_tvm import schedules
from prnn_tvm.bench import baselines, training_step
from prnn_tvm.bench.backward_variants import add_variants
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.target import gpu_spec

args = baselines.script_arguments(number=10, cell="LSTM", hidden=1024, batch=16, bf16=0, clusters=[2, 4, 8])
T, H, B = args.seq, args.hidden, args.batch
dtype = torch.bfloat16 if args.bf16 else torch.float16
built_with = prnn_tvm.compiler.gpu_backward  # what a training build asks for its backward; replaced config by config


def step(module, x, hx):
    return [g.float() for g in training_step.step(module, x, hx)]


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def only(cfg):
    """What a training build asks for its backward: the kernel of ``cfg`` alone."""
    return lambda plan, gpu: iter([schedules.backward_kernel(plan, gpu, cfg)])


ref, x, hx = training_step.case(args.cell, H, B, dtype, T)
plan = prnn_tvm.analyze(prnn_tvm.resolve(args.cell.lower()), B, H, dtype=str(dtype).removeprefix("torch."))
gpu = gpu_spec()
configs = schedules.backward_configs(plan, gpu)  # the tensor-core backward's ranked ones, then the float32 one's
tensor_cores = [cfg for cfg in configs if hasattr(cfg, "k_groups")]
least = math.ceil(H / gpu.sms)
first_cfg = tensor_cores[0]
# one copy per CTA (the default before clusters): at 16 k groups and at the fewest units (more CTAs than clusters of
# 8 fit), and from there the block's whole-tile copy and no L2 prefetch (the kernel before them), each alone, and
# more stages; the first without L2 prefetch
unclustered = {"cluster": 1, "copy_stages": 2}
changes = [{"units_per_cta": units, "k_groups": kg}
           for units, kg in [(first_cfg.units_per_cta, 16), (least, first_cfg.k_groups), (least, 16)]]
changes += [{}, {"copy_stages": 0, "prefetch_steps": 0}, {"copy_stages": 0}, {"prefetch_steps": 0}, {"copy_stages": 4},
            {"prefetch_steps": 1}]
variants = [{**unclustered, **change} for change in changes] + [{"prefetch_steps": 0}]
# thread-block clusters sharing one copy of the gate gradients (``cluster``, with the whole-tile wait it takes)
variants += [{"cluster": c, "copy_stages": s} for c in args.clusters for s in (0, 1)]
add_variants(first_cfg, variants, tensor_cores, plan, gpu)
widened = [cfg for cfg in configs if not hasattr(cfg, "k_groups")][:1]
cudnn_ms = ms(lambda: step(ref, x, hx))
print(f"{args.cell} {str(dtype)[6:]} H={H} B={B} T={T}; cuDNN training step {cudnn_ms:.3f} ms")
print("backward | training step ms | cuDNN / ours | gradients against the first")
first = None
for cfg in [*tensor_cores, *widened]:
    prnn_tvm.compiler.gpu_backward = only(cfg)
    fast = pt.from_torch(ref)
    fast.layer_for(B, x.device, dtype)._training = None  # a layer kept in this process: its training kernels anew
    step(fast, x, hx)  # compiles
    report = fast.layer_for(B, x.device, dtype)._training.report.splitlines()[-1]
    grads = step(fast, x, hx)
    first = grads if first is None else first
    error = worst(relative_error(g.cpu().double().numpy(), f.cpu().double().numpy()) for g, f in zip(grads, first))
    took = ms(lambda fast=fast: step(fast, x, hx))
    print(f"{report} | {took:.3f} | {cudnn_ms / took:.2f}x | {error:.2e}")
prnn_tvm.compiler.gpu_backward = built_with

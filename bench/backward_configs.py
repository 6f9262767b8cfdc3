"""The backward of a half LSTM, config by config, in a training step through the public call on the GPU: the
tensor-core backward's ranked defaults (``schedules.backward_configs``, the first is what a layer trains with),
the first's at 16 k groups and at the fewest units that spread over every SM, the first's with the block's whole-tile
copy of the gate gradients and without L2 prefetch (``copy_stages``, ``prefetch_steps``), the first's in thread-block
clusters of 2, 4 and 8 CTAs sharing one copy of the gate gradients (``cluster``; the block's wait for it and each
warp's for its own columns: ``copy_stages`` 0 and 1), and the first config of the
float32 backward it replaced (transposed weights widened in registers), against cuDNN in the same dtype.

    PRNN_TVM_CACHE=0 python bench/backward_configs.py [--hidden 1024] [--batch 16] [--seq 256] [--bf16 0]
        [--clusters 2 4 8]

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
from prnn_tvm.bench import baselines
from prnn_tvm.bench.backward_variants import add_variants
from prnn_tvm.checks import relative_error, worst
from prnn_tvm.target import gpu_spec

args = baselines.script_arguments(number=10, hidden=1024, batch=16, bf16=0, clusters=[2, 4, 8])
T, H, B = args.seq, args.hidden, args.batch
dtype = torch.bfloat16 if args.bf16 else torch.float16
built_with = prnn_tvm.compiler.gpu_backward  # what a training build asks for its backward; replaced config by config


def step(module, x, hx):
    leaves = [x, *hx, *module.parameters()]
    for t in leaves:
        t.grad = None
    out, finals = module(x, tuple(hx))
    ((out.float().square().sum() + sum(f.float().sum() for f in finals)) / B).backward()
    return [t.grad.float() for t in leaves]


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def only(cfg):
    """What a training build asks for its backward: the kernel of ``cfg`` alone."""
    return lambda plan, gpu: iter([schedules.backward_kernel(plan, gpu, cfg)])


ref = torch.nn.LSTM(H, H).cuda().to(dtype).train()
x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)
hx = [(0.5 * torch.randn(1, B, H, device="cuda")).to(dtype).requires_grad_() for _ in range(2)]
plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), B, H, dtype=str(dtype).removeprefix("torch."))
gpu = gpu_spec()
configs = schedules.backward_configs(plan, gpu)  # the tensor-core backward's ranked ones, then the float32 one's
tensor_cores = [cfg for cfg in configs if hasattr(cfg, "k_groups")]
least = math.ceil(H / gpu.sms)
first_cfg = tensor_cores[0]
variants = [{"units_per_cta": units, "k_groups": kg}
            for units, kg in [(first_cfg.units_per_cta, 16), (least, first_cfg.k_groups), (least, 16)]]
# the first's gate-gradient copy and L2 prefetch: the block's whole-tile copy and none (the kernel before them), each
# alone, and more stages
variants += [{"copy_stages": 0, "prefetch_steps": 0}, {"copy_stages": 0}, {"prefetch_steps": 0}, {"copy_stages": 4},
             {"prefetch_steps": 1}]
# thread-block clusters sharing one copy of the gate gradients (``cluster``, with the whole-tile wait it takes)
variants += [{"cluster": c, "copy_stages": s} for c in args.clusters for s in (0, 1)]
add_variants(first_cfg, variants, tensor_cores, plan, gpu)
widened = [cfg for cfg in configs if not hasattr(cfg, "k_groups")][:1]
cudnn_ms = ms(lambda: step(ref, x, hx))
print(f"LSTM {str(dtype)[6:]} H={H} B={B} T={T}; cuDNN training step {cudnn_ms:.3f} ms")
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

"""The training forward (``recurrent_save``) of a head-wise layer in each count of batch groups, in one run: what the
training step's saving forward gains from its layer's groups (sLSTM with 12 heads of 64, bf16, H=768 B=16 T=1024 by
default: FlashRNN's headline shape).

    python bench/saving_groups.py [--spec slstm_h12] [--dtype bfloat16] [--hidden 768 --batch 16 --seq 1024]
                                  [--repeats 5 --number 2]

For the untuned config of one group and each count of groups the tuning space offers it (``grouped``, through the
template's contract: the group's rows in one pass, one set of warps, the fewest shared k tiles that validate), the
layer's training kernels are built (``compile_training``: the saving forward keeps the layer's groups) and the saving
forward alone is timed with its arguments bound once (median of CUDA-event runs, us per step), its ``saved`` compared
bit for bit with the one-group forward's. Prints one line per count: the config, CTAs x threads, registers and
spills, us per step and its ratio to one group, whether ``saved`` is the same. Writes nothing.
"""

import dataclasses

import numpy as np
import torch

import prnn_tvm
from prnn_tvm.bench import baselines
from prnn_tvm.bench.training_step import cell_arguments
from prnn_tvm.compiler import compile_training
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime.binding import COPY
from prnn_tvm.schedules import by_name
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify.emulator import projection

args = cell_arguments(False)
H, B, T = args.hidden, args.batch, args.seq


def configs(plan, gpu) -> list:
    """The untuned config of one batch group, then it in each count of groups the space offers its barrier."""
    template = by_name("persistent_mma")
    ranked = template.default_configs(plan, gpu.target(), gpu)
    one = next(c for c in ranked if c.batch_groups == 1)
    counts = sorted({c.batch_groups for c in template.space(plan, gpu) if c.barrier == one.barrier} - {1})
    found = [one]
    for G in counts:
        n_tiles = next((n for n in (1, 2, 4, 8) if 8 * n >= plan.batch // G), 8)  # the group's rows in one pass
        cfg = dataclasses.replace(one, batch_groups=G, n_tiles=n_tiles, batch_warps=1, smem_k_tiles=0)
        for sk in range(template.geometry(cfg, plan).k_tiles_per_warp + 1):
            try:
                template.validate(dataclasses.replace(cfg, smem_k_tiles=sk), plan, gpu)
            except ConfigError:
                continue
            found.append(dataclasses.replace(cfg, smem_k_tiles=sk))
            break
    return found


plan = prnn_tvm.analyze(prnn_tvm.resolve(args.spec), B, H, args.dtype)
inputs = random_inputs(plan, T, H, seed=1)  # the layer's input size is its hidden size


def on_gpu(v):
    """A NumPy array on the GPU; bfloat16 (ml_dtypes, which torch.from_numpy refuses) through its 16-bit pattern."""
    v = np.ascontiguousarray(v)
    if v.dtype.name == "bfloat16":
        return torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(v).cuda()


data = {k: on_gpu(v) for k, v in inputs.items() if k not in ("x", "W_ih", "b_ih")}
xp = torch.from_numpy(projection(inputs, "float32")).cuda()
first = None
for config in configs(plan, gpu_spec()):
    layer = prnn_tvm.compile_cell(args.spec, H, B, dtype=args.dtype, target="cuda", config=config, tuning_logs=[])
    training = compile_training(layer)
    bound = training.forward.bind(xp=xp, **data)
    kernels = [(training.forward.function(name), a) for name, a in bound.launches if name != COPY]
    us = baselines.cuda_event_times(lambda kernels=kernels: [fn(*a) for fn, a in kernels], args.repeats,
                                    args.number)[0] / T * 1e6
    _, (*_, saved) = training.forward(xp=xp, **data)
    saved = torch.from_dlpack(saved).cpu().numpy()
    first = first or (us, saved)
    same = "the same bits" if np.array_equal(saved, first[1]) else "DIFFERENT"
    print(f"{args.spec} {args.dtype} {H}x{B} T={T} batch_groups={config.batch_groups}: "
          f"{training.report.splitlines()[0]}; {us:.3f} us/step, {us / first[0]:.3f}x one group; saved {same}",
          flush=True)

"""Where a backward step goes: per block and step, the clocks the persistent backward records at the borders of
its phases (pointwise adjoints and publish, grid barrier, the gate gradients' copy issued and landed, the
products, what was sent back; ``prnn_tvm.bench.backward_timeline``), from a training step through
``prnn_tvm.torch.from_torch(m)``. Default: LSTM fp16 H=1024 B=16 T=256.

    python bench/backward_timeline.py [--cell LSTM --hidden 1024 --batch 16 --seq 256 --dtype float16]
        [--cluster 2 --copy-stages 0]

``--cluster N``: the tensor-core backward's first ranked config in thread-block clusters of N CTAs sharing the copy
of the gate gradients, waited for by the block (``--copy-stages 0``) or by each warp for its own columns (1); run it
with ``PRNN_TVM_CACHE=0`` (the layer cache is keyed by the layer, not by the backward's config).

The instrumented run's gradients are not valid (the stamps overwrite ``d_xp``). Without a GPU (``--arch sm_90``)
it builds the instrumented training kernels, prints ptxas's figures and stops: the rewrite still applies. About
30 s on an H100 (compiling the kernels)."""

import argparse
import logging

from prnn_tvm.bench import backward_timeline as bt

p = argparse.ArgumentParser()
p.add_argument("--cell", default="LSTM", help="torch.nn's class: LSTM or GRU")
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--dtype", default="float16")
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
p.add_argument("--cluster", type=int, default=1, help="CTAs per thread-block cluster of the tensor-core backward")
p.add_argument("--copy-stages", type=int, default=0, help="with --cluster: 0 the block's wait, 1 each warp's")
args = p.parse_args()

if args.cluster > 1:
    import dataclasses

    from prnn_tvm import compiler, schedules
    from prnn_tvm.schedules import backward_mma_config as bc

    def clustered(plan, gpu):
        """What a training build asks for its backward: the first ranked config, in clusters."""
        cfg = dataclasses.replace(bc.ranked_configs(plan, gpu)[0], cluster=args.cluster, copy_stages=args.copy_stages)
        return iter([schedules.backward_kernel(plan, gpu, cfg)])

    compiler.gpu_backward = clustered

if args.arch is not None:
    from prnn_tvm.codegen import build
    from prnn_tvm.compiler import compile_cell, compile_training

    layer = compile_cell(args.cell.lower(), args.hidden, args.batch, dtype=args.dtype, arch=args.arch)
    with build.rewriting_sources(bt.instrument):
        print(compile_training(layer).report)
else:
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import case, step

    logging.basicConfig(format="%(message)s")
    logging.getLogger("prnn_tvm.compiler").setLevel(logging.INFO)  # says the training kernels' config and ptxas's
    ref, x, hx = case(args.cell, args.hidden, args.batch, getattr(torch, args.dtype), args.seq)
    with bt.capturing() as kept:
        fast = pt.from_torch(ref)
        for _ in range(3):  # the first compiles the instrumented kernels; the last is read
            step(fast, x, hx)
        torch.cuda.synchronize()
    if not kept or not kept[-1].any():
        raise SystemExit("backward timeline: no stamps came back (was the backward kernel built inside the block?)")
    for line in bt.summary(kept[-1][:, : min(args.seq, bt.STEPS)]):
        print(line)

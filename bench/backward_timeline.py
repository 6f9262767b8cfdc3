"""Where a backward step goes: per block and step, the clocks the persistent backward records at the borders of
its phases (pointwise adjoints and publish, grid barrier, the gate gradients' copy issued and landed, the
products, what was sent back; ``prnn_tvm.bench.backward_timeline``), from a training step through
``prnn_tvm.torch.from_torch(m)``. Default: LSTM fp16 H=1024 B=16 T=256.

    python bench/backward_timeline.py [--cell LSTM --hidden 1024 --batch 16 --seq 256 --dtype float16]
        [--cluster 2 --copy-stages 0] [--no-copy]

``--cluster N``: the tensor-core backward's first ranked config in thread-block clusters of N CTAs sharing the copy
of the gate gradients (1: none, each CTA copying all of them), waited for by the block (``--copy-stages 0``) or by
each warp for its own columns (1; without clusters 2, the default before them: in two stages); without
``--cluster``, the ranked config as a training build takes it. Run it with ``PRNN_TVM_CACHE=0`` (the layer cache is
keyed by the layer, not by the backward's config or a rewrite of its source).

``--no-copy``: timing only, gradients wrong. The backward's source without its copy of the gate gradients and the
waits for it (``prnn_tvm.bench.backward_no_copy``): the products multiply whatever shared memory holds. What is
left of a step is the backward's floor without the exchange (its copy phases near zero).

The instrumented run's gradients are not valid (the stamps overwrite ``d_xp``). Without a GPU (``--arch sm_90``)
it builds the instrumented training kernels, prints ptxas's figures and stops: the rewrite still applies. About
30 s on an H100 (compiling the kernels)."""

import argparse
import contextlib
import logging

from prnn_tvm.bench import backward_timeline as bt
from prnn_tvm.bench.backward_no_copy import WARNING, without_copy
from prnn_tvm.codegen import build

p = argparse.ArgumentParser()
p.add_argument("--cell", default="LSTM", help="torch.nn's class: LSTM or GRU")
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--dtype", default="float16")
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
p.add_argument("--cluster", type=int, default=None, help="CTAs per thread-block cluster of the tensor-core backward")
p.add_argument("--copy-stages", type=int, default=None,
               help="with --cluster: 0 the block's wait, 1 each warp's (default 0; without clusters 2)")
p.add_argument("--no-copy", action="store_true", help="timing only, gradients wrong: the backward without its copy")
args = p.parse_args()
if args.no_copy:
    print(f"!!! {WARNING} !!!", flush=True)

if args.cluster is not None:
    import dataclasses

    from prnn_tvm import compiler, schedules

    stages = args.copy_stages if args.copy_stages is not None else (0 if args.cluster > 1 else 2)

    def clustered(plan, gpu):
        """What a training build asks for its backward: the first ranked config, in clusters of ``--cluster``."""
        cfg = dataclasses.replace(schedules.backward_configs(plan, gpu)[0], cluster=args.cluster, copy_stages=stages)
        return iter([schedules.backward_kernel(plan, gpu, cfg)])

    compiler.gpu_backward = clustered



def no_copy():
    """With ``--no-copy``, the copy's removal, entered after the stamps' rewrite (which finds the copy's statements)."""
    return build.rewriting_sources(without_copy) if args.no_copy else contextlib.nullcontext()


if args.arch is not None:
    from prnn_tvm.compiler import compile_cell, compile_training

    layer = compile_cell(args.cell.lower(), args.hidden, args.batch, dtype=args.dtype, arch=args.arch)
    with build.rewriting_sources(bt.instrument), no_copy():
        print(compile_training(layer).report)
else:
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import case, step

    logging.basicConfig(format="%(message)s")
    logging.getLogger("prnn_tvm.compiler").setLevel(logging.INFO)  # says the training kernels' config and ptxas's
    ref, x, hx = case(args.cell, args.hidden, args.batch, getattr(torch, args.dtype), args.seq)
    with bt.capturing() as kept, no_copy():
        fast = pt.from_torch(ref)
        for _ in range(3):  # the first compiles the instrumented kernels; the last is read
            step(fast, x, hx)
        torch.cuda.synchronize()
    if not kept or not kept[-1].any():
        raise SystemExit("backward timeline: no stamps came back (was the backward kernel built inside the block?)")
    for line in bt.summary(kept[-1][:, : min(args.seq, bt.STEPS)]):
        print(line)
if args.no_copy:
    print(f"!!! {WARNING} !!!")

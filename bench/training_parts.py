"""Where a training step's time goes, prnn-tvm against cuDNN: LSTM fp16 H=1024 B=16 T=256 by default, through
``prnn_tvm.torch.from_torch(m)`` and ``m`` itself (``prnn_tvm.bench.training_parts``).

    python bench/training_parts.py [--hidden 1024 --batch 16 --seq 256 --repeats 20 --number 5]

Prints, for each: the GPU and host milliseconds of each part of a step (gradients cleared, forward, loss,
backward; CUDA events, median of ``--repeats`` steps), then every kernel of ``--number`` profiled steps
(``torch.profiler``) with the part that launched it, GPU microseconds per step, largest first, and the sums per
part and kind of kernel. For prnn-tvm then the parts of a step's floor: per time step the saving forward's
recurrent kernel beside the inference forward's (the same module without gradients: the layer's tuned kernel) and
the backward's, and every other kernel of a training step. Writes nothing. About a minute on an H100 (most of it
compiling the layer's kernels).
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines
from prnn_tvm.bench import training_parts as tp
from prnn_tvm.bench.training_step import case

args = baselines.script_arguments(number=5, hidden=1024, batch=16)
ref, x, hx = case("LSTM", args.hidden, args.batch, torch.float16, args.seq)
fast = pt.from_torch(ref)
for name, module in (("prnn-tvm", fast), ("cuDNN", ref)):
    print(f"== {name}: LSTM fp16 H={args.hidden} B={args.batch} T={args.seq}", flush=True)
    print("\n".join(tp.breakdown(module, x, hx, args.repeats, args.number)), flush=True)
    if module is fast:
        records, inference = tp.kernel_records(fast, x, hx, args.number), tp.inference_kernels(fast, x, hx, args.number)
        print("\n".join(tp.floor_lines(records, args.number, inference, args.seq)), flush=True)
fast.check()

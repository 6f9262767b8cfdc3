"""Where a training step's time goes for any cell through ``prnn_tvm.torch.Recurrent``: sLSTM with 12 heads of 64, bf16,
H=768 B=16 T=1024 by default (FlashRNN's headline shape; ``bench/against_flashrnn.py`` times FlashRNN there).

    python bench/cell_training_parts.py [--spec slstm_h12 lstm_h12 slstm] [--dtype bfloat16]
                                        [--hidden 768 --batch 16 --seq 1024 --repeats 5 --number 2]

Prints, for each spec: the GPU and host milliseconds of each part of a step (gradients cleared, forward, loss,
backward; CUDA events, median of ``--repeats`` steps), then the kernels of ``--number`` profiled steps
(``torch.profiler``) with the part that launched each, GPU microseconds per step, largest first, and the sums per part
and kind of kernel (``prnn_tvm.bench.training_parts``). Writes nothing.
"""


import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import training_parts as tp
from prnn_tvm.bench.training_step import cell_arguments

args = cell_arguments(True)
dtype, H, B, T = getattr(torch, args.dtype), args.hidden, args.batch, args.seq

for spec in args.spec:
    module = pt.Recurrent(spec, H, H, device="cuda", dtype=dtype).train()
    x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)
    hx = [(0.1 * torch.randn(1, B, H, device="cuda", dtype=dtype)).requires_grad_() for _ in module._states]
    print(f"== {spec} {args.dtype} H={H} B={B} T={T}, {len(hx)} states", flush=True)
    print("\n".join(tp.breakdown(module, x, hx, args.repeats, args.number, 25)), flush=True)

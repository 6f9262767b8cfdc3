"""Where a tensor-core kernel's step goes: each block's poll, block barrier and publish (of each batch tile, where
direct fragments run them in turn), from clocks the kernel records (``prnn_tvm.bench.timeline``). Default: LSTM
fp16 1024x16 in cuDNN's layout (16 units on 64 blocks of 8 warps, each warp with every row tile, two tiles of 8
rows in turn); ``--config '{}'``: the layer's tuned or default config.

    python bench/timeline.py [--cell lstm --hidden 1024 --batch 16 --dtype float16 --config '{...}']

Without a GPU (``--arch sm_90``) it builds the instrumented kernel and stops: the rewrite still applies.
H100 figures: bench/results/exchange-probes-h100.md."""

import argparse
import json

from prnn_tvm.bench import timeline

CUDNN_LAYOUT = {
    "units_per_cta": 16,
    "k_groups": 8,
    "m_tiles_per_warp": 4,
    "n_tiles": 1,
    "barrier": "sentinel",
    "operand_path": "direct",
}
p = argparse.ArgumentParser()
p.add_argument("--cell", default="lstm")
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--dtype", default="float16")
p.add_argument("--config", type=json.loads, default=CUDNN_LAYOUT)
p.add_argument("--arch", default=None, help="build only, for this architecture (no GPU needed)")
args = p.parse_args()
layer, g, tiles = timeline.instrumented_layer(args.cell, args.hidden, args.batch, args.dtype, args.config, args.arch)
print(layer.report.format())
if args.arch is None:
    timeline.run(layer, g, tiles)  # a first launch
    for line in timeline.summary(timeline.run(layer, g, tiles, seed=1), layer.kernel.config.batch_groups):
        print(line)

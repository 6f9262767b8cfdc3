"""The benchmark harness in one command: prnn-tvm vs cuDNN, a CUDA-graph GEMM loop and the floor.

    python bench/run.py [--cells lstm] [--hidden 1024 max] [--batch 1 4 16] [--seq 256] [--name bench-h100]

The same as ``prnn-tvm bench`` (see ``prnn-tvm bench --help``): on the local GPU, for each
case, check prnn-tvm's output against cuDNN on the same weights, time every
implementation with CUDA events, and write ``bench/results/<name>.csv``, ``.md`` and
``.png``. The library is :mod:`prnn_tvm.bench`.
"""

import sys

from prnn_tvm.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))

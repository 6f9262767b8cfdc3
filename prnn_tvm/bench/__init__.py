"""The benchmark harness: prnn-tvm against cuDNN, a CUDA-graph GEMM loop and the physical floor.

    prnn-tvm bench [--cells lstm gru] [--hidden 1024 max] [--batch 1 4] [--seq 256] [--out DIR]

- :mod:`.matrix`: the cases (default matrix, the largest supported hidden size per cell);
- :mod:`.runner` and :mod:`.measure`: the GPU part (compile, check against cuDNN, time);
  :mod:`.baselines`: the PyTorch side (cuDNN modules, the graph loop, CUDA-event timing);
- :mod:`.table`, :mod:`.plot`, :mod:`.outputs`: the pure part (CSV, ratios, Markdown, PNG),
  usable without a GPU or PyTorch.
"""

from .matrix import DEFAULT_BATCHES, DEFAULT_CELLS, DEFAULT_DTYPES, DEFAULT_HIDDEN, DEFAULT_SEQ_LEN, LARGEST, Case
from .outputs import render_csv, write_outputs
from .table import COLUMNS, markdown, ratios, read_csv, write_csv

__all__ = ["COLUMNS", "DEFAULT_BATCHES", "DEFAULT_CELLS", "DEFAULT_DTYPES", "DEFAULT_HIDDEN", "DEFAULT_SEQ_LEN",
           "LARGEST", "Case", "markdown", "ratios", "read_csv", "render_csv", "write_csv", "write_outputs"]

"""The benchmark harness: prnn-tvm against cuDNN, a CUDA-graph GEMM loop and the physical floor.

    prnn-tvm bench [--cells lstm gru] [--hidden 1024 max] [--batch 1 4] [--seq 256] [--out DIR]

- :mod:`.matrix`: the cases (default matrix, the largest supported hidden size per cell);
- :mod:`.runner` and :mod:`.measure`: the GPU part (compile, check against cuDNN, time);
  :mod:`.baselines`: the PyTorch side (cuDNN modules, the graph loop, CUDA-event timing);
- :mod:`.table`, :mod:`.plot`, :mod:`.outputs`: the pure part (CSV, ratios, Markdown, PNG),
  usable without a GPU or PyTorch.

The submodules are imported by name (``from prnn_tvm.bench import matrix``): the command line reads
:mod:`.matrix`'s defaults for its help without the compiler, the plot or PyTorch.
"""

"""The input projection of TVM-built (and exported) float32 layers against cuBLAS, on the GPU.

    python bench/projection.py [--seq 256 --repeats 7 --number 20]

For each benchmark shape the compiled layer's ``projection`` kernel (TVM, ``codegen/projection.py``)
and ``torch.addmm`` (cuBLAS, TF32 off) compute ``x @ W_ih^T + b_ih`` over all T x B rows of the same
tensors; both are timed with CUDA events in one process (median of ``--repeats`` runs of
``--number`` calls, ``prnn_tvm.bench.baselines.cuda_event_times``), and their results compared.
``prnn_tvm.torch`` modules use cuBLAS itself; this is what a compiled or exported layer runs.
"""

import torch
import tvm_ffi

import prnn_tvm
from prnn_tvm.bench import baselines

SHAPES = [("lstm", 1024, 1), ("lstm", 1024, 4), ("lstm", 1024, 16), ("lstm", 1024, 64), ("lstm", 512, 16),
          ("gru", 1024, 4), ("lstm", 512, 1), ("lstm", 256, 1)]

args = baselines.script_arguments(number=20)
T = args.seq


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def row(cell: str, H: int, B: int) -> str:
    """One shape: both projections of the same tensors, timed and compared."""
    layer = prnn_tvm.compile_cell(cell, H, B, target="cuda")
    width = layer.plan.input.slices * H
    x = torch.randn(T, B, H, device="cuda")
    W, b = torch.randn(width, H, device="cuda") / H**0.5, torch.randn(width, device="cuda")
    xp, x2d = torch.full((T, B, width), float("nan"), device="cuda"), x.view(T * B, H)  # unwritten: NaN
    projection = layer.module["projection"]
    with tvm_ffi.use_torch_stream():
        tvm_ms, cublas_ms = ms(lambda: projection(x, W, b, xp)), ms(lambda: torch.addmm(b, x2d, W.t()))
        difference = (xp.view(T * B, width) - torch.addmm(b, x2d, W.t())).abs().max().item()
    return (f"| {cell} | {H} | {B} | {T * B} x {width} x {H} | {tvm_ms:.4f} | {cublas_ms:.4f} | "
            f"{tvm_ms / cublas_ms:.2f}x | {difference:.1e} |")


print(f"# float32 input projection, TVM against cuBLAS, T={T}, {torch.cuda.get_device_name()} (ms, median)\n")
print("| cell | H | B | rows x width x K | TVM | cuBLAS | TVM / cuBLAS | max difference |")
print("|---|---|---|---|---|---|---|---|")
for shape in SHAPES:
    print(row(*shape), flush=True)

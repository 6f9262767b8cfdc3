"""The input projection of TVM-built (and exported) layers against cuBLAS, on the GPU.

    python bench/projection.py [--seq 256 --repeats 7 --number 20]

For each benchmark shape and dtype the compiled layer's ``projection`` kernel (``codegen/projection.py``:
dlight's SIMT matmul for float32, the tensor-core GEMM for float16 and bfloat16) and cuBLAS compute
``x @ W_ih^T + b_ih`` over all T x B rows of the same tensors, into float32: ``torch.addmm`` (TF32 off)
for float32; for the half types ``torch.mm(..., out_dtype=torch.float32)`` and an ``add_`` of the bias
(torch has no bias epilogue for a half GEMM into float32). Both are timed with CUDA events in one process
(median of ``--repeats`` runs of ``--number`` calls, ``prnn_tvm.bench.baselines.cuda_event_times``), and
their results compared. ``prnn_tvm.torch`` modules use cuBLAS itself; this is what a compiled or exported
layer runs.
"""

import torch
import tvm_ffi

import prnn_tvm
from prnn_tvm.bench import baselines

SHAPES = [
    ("lstm", 1024, 1),
    ("lstm", 1024, 4),
    ("lstm", 1024, 16),
    ("lstm", 1024, 64),
    ("lstm", 512, 16),
    ("gru", 1024, 4),
    ("lstm", 512, 1),
    ("lstm", 256, 1),
]

args = baselines.script_arguments(number=20)
T = args.seq


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def cublas(x2d, W, b):
    if x2d.dtype == torch.float32:
        return torch.addmm(b, x2d, W.t())
    return torch.mm(x2d, W.t(), out_dtype=torch.float32).add_(b)


def row(cell: str, H: int, B: int, dtype: str) -> str:
    """One shape: both projections of the same tensors, timed and compared."""
    layer = prnn_tvm.compile_cell(cell, H, B, target="cuda", dtype=dtype)
    width, dt = layer.plan.input.slices * H, getattr(torch, dtype)
    x = torch.randn(T, B, H, device="cuda").to(dt)
    W, b = (torch.randn(width, H, device="cuda") / H**0.5).to(dt), torch.randn(width, device="cuda").to(dt)
    xp, x2d = torch.full((T, B, width), float("nan"), device="cuda"), x.view(T * B, H)  # unwritten: NaN
    projection = layer.module["projection"]
    with tvm_ffi.use_torch_stream():
        tvm_ms, cublas_ms = ms(lambda: projection(x, W, b, xp)), ms(lambda: cublas(x2d, W, b))
        difference = (xp.view(T * B, width) - cublas(x2d, W, b)).abs().max().item()
    return (
        f"| {cell} | {H} | {B} | {T * B} x {width} x {H} | {tvm_ms:.4f} | {cublas_ms:.4f} | "
        f"{tvm_ms / cublas_ms:.2f}x | {difference:.1e} |"
    )


print(f"# The input projection, TVM against cuBLAS, T={T}, {torch.cuda.get_device_name()} (ms, median)")
for dtype in ("float32", "float16", "bfloat16"):
    print(f"\n## {dtype}\n")
    print("| cell | H | B | rows x width x K | TVM | cuBLAS | TVM / cuBLAS | max difference |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        print(row(*shape, dtype), flush=True)

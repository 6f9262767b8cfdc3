"""Bidirectional layers on the GPU through the public calls (TF32 off): a layer's two directions in one
launch (what a module runs wherever both fit on chip: ``Recurrent.directions_for``), against a launch per
direction (side by side on two streams where the GPU holds both grids, else one after the other), and
against cuDNN.

    python bench/bidirectional.py [--seq 256 --repeats 7 --number 5]

One launch: ``compile_cell(..., bidirectional=True)``, each direction on CTAs of its own in one grid, one
projection GEMM for both. A launch per direction: ``module.one_launch_directions = False``. Every figure is
the median of CUDA-event runs in one process (``prnn_tvm.bench.baselines.cuda_event_times``).
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines

SHAPES = [
    ("LSTM", 256, 1, 1, torch.float32),
    ("LSTM", 512, 4, 1, torch.float32),
    ("GRU", 512, 4, 1, torch.float32),
    ("LSTM", 512, 8, 2, torch.float32),
    ("LSTM", 1024, 4, 1, torch.float32),
    ("LSTM", 512, 8, 1, torch.float16),
    ("LSTM", 1024, 16, 1, torch.float16),
    ("GRU", 1024, 4, 1, torch.float16),
    ("LSTM", 512, 8, 2, torch.float16),
]

args = baselines.script_arguments(number=5)
T = args.seq
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"# bidirectional layers, T={T}, {torch.cuda.get_device_name()} ({sms} SMs), ms per call, median\n")
print(
    "| module | one launch (CTAs) | a launch per direction (CTAs each, grids that fit) | one launch's gain | "
    "default: picks | default | cuDNN | cuDNN / default |"
)
print("|---|---|---|---|---|---|---|---|")

PATHS = {"per direction": False, "one launch": True}  # one_launch_directions; the default last


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def row(kind: str, H: int, B: int, layers: int, dtype: torch.dtype) -> str:
    ref = getattr(torch.nn, kind)(H, H, num_layers=layers, bidirectional=True).cuda().to(dtype).eval()
    fast = pt.from_torch(ref)
    fast.batch_buckets = False  # the kernels of batch B itself, whose notes and layers are read below
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    times = {}
    with torch.no_grad():
        for path, one_launch in PATHS.items():  # the default last: the error below is of what it runs
            fast.one_launch_directions = one_launch
            times[path] = ms(lambda: fast(x))
        cudnn = ms(lambda: ref(x))
        error = (fast(x)[0] - ref(x)[0]).abs().max().item()
    fast.check()
    picks = fast.direction_notes[(B, str(x.device), dtype, H)].split(":")[0]
    both = fast.directions_for(B, x.device, dtype, H)
    apart = fast.layer_for(B, x.device, dtype, H)
    one = f"{times['one launch']:.3f} ({both.report.ctas})" if both is not None else "does not fit"
    gain = f"{times['per direction'] / times['one launch']:.2f}x" if both is not None else "-"
    default = times["one launch"] if both is not None else times["per direction"]
    name = f"{kind} {layers}x H={H} B={B} {str(dtype).split('.')[-1]}"
    return (
        f"| {name} | {one} | {times['per direction']:.3f} ({apart.report.ctas}, {apart.grids_that_fit()}) | "
        f"{gain} | {picks} | {default:.3f} | {cudnn:.3f} | "
        f"{cudnn / default:.2f}x (max diff {error:.1e}) |"
    )


for shape in SHAPES:
    print(row(*shape), flush=True)

"""Where the compiled layer's call ``layer(x, **params)`` spends what its kernels do not, on the GPU (issue 49).

    python bench/layer_call_parts.py [--cells lstm_layernorm lstm] [--hidden 1024 --batch 8 --seq 256]
        [--dtype float16] [--repeats 7 --number 5]

At LayerNorm-LSTM 1024 x 8, T=256, fp16 on the H100 the call took 2.278 ms against a recurrent kernel of 1.49 ms and
a projection of about 0.1 (``bench/results/heads-flashrnn-h100.md``, ``bench/configs.py``); the plain LSTM's call
1.134 ms. For each cell, on torch tensors of the layer's device, the rows are:

    projection / recurrent / both kernels, bound    the launches alone, their arguments placed once (CUDA events)
    layer call                                       the call as a benchmark loop makes it: each call's outputs
                                                     dropped before the next (TVM frees them with cudaFree)
    layer call, outputs kept                         the same, every call's outputs held until the run ends
    layer call, outputs kept: host                   what issuing a call costs the CPU (perf_counter, no waiting)
    bind alone: host                                 ``layer.bind``: arguments checked and placed, outputs allocated
    free-memory query: host                          the device's free memory, which each call's memory check asks
    outputs allocated and dropped: host, GPU idle    ``tvm.runtime.empty`` of the call's outputs, then freed
    the same, GPU busy                               while a recurrent launch runs: near the kernel's time where
                                                     freeing waits for the GPU
    module call (and: host)                          ``prnn_tvm.torch.Recurrent(cell)(x)``: cuBLAS projection,
                                                     torch's caching allocator, the launch's arguments kept

CUDA-event rows: the median of ``--repeats`` runs of ``--number`` calls issued back to back; host rows: the
minimum, the GPU drained between runs (``prnn_tvm.bench.baselines``). Milliseconds per call.
"""


import torch
import tvm

import prnn_tvm
import prnn_tvm.torch
from prnn_tvm.bench import baselines
from prnn_tvm.dtypes import policy
from prnn_tvm.reference import random_inputs
from prnn_tvm.runtime.binding import COPY

args = baselines.script_arguments(number=5, cells=["lstm_layernorm", "lstm"], hidden=1024, batch=8, dtype="float16")


def gpu_ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def host_ms(fn) -> float:
    return baselines.host_seconds(fn, args.repeats, args.number) * 1e3


def held(call):
    """``call`` with every result kept until :func:`release` (no output freed inside a timed run)."""
    kept = []
    return (lambda: kept.append(call())), kept.clear


def parts(cell: str) -> list[tuple[str, float]]:
    layer = prnn_tvm.compile_cell(cell, args.hidden, args.batch, dtype=args.dtype, target="cuda")
    print(f"{cell}: config {layer.report.config}, {layer.report.registers} registers", flush=True)
    given = {a.name for a in layer.signature.inputs if not a.role.optional}  # initial states omitted, as benchmarked
    arrays = {
        name: torch.from_numpy(value).cuda()
        for name, value in random_inputs(layer.plan, args.seq, layer.input_size).items()
        if name in given
    }
    bound = layer.bind(**arrays)
    launches = {name: (layer.function(name), a) for name, a in bound.launches if name != COPY}
    found = [(f"{name} kernel, bound", gpu_ms(lambda fn=fn, a=a: fn(*a))) for name, (fn, a) in launches.items()]
    found.append(("both kernels, bound", gpu_ms(lambda: [fn(*a) for fn, a in launches.values()])))
    found.append(("layer call", gpu_ms(lambda: layer(**arrays))))
    keep, release = held(lambda: layer(**arrays))
    found.append(("layer call, outputs kept", gpu_ms(keep)))
    release()
    found.append(("layer call, outputs kept: host", host_ms(keep)))
    release()
    found.append(("bind alone: host", host_ms(lambda: layer.bind(**arrays))))
    device = layer.device
    found.append(("free-memory query: host", host_ms(lambda: device.available_global_memory)))
    outputs = [(a.concrete_shape(args.seq), a.dtype) for a in layer.signature.outputs]

    def allocate():
        return [tvm.runtime.empty(shape, dtype, device) for shape, dtype in outputs]

    found.append(("outputs allocated and dropped: host, GPU idle", host_ms(allocate)))
    recurrent_fn, recurrent_args = launches["recurrent"]

    def allocate_busy():
        recurrent_fn(*recurrent_args)
        allocate()

    kernel_alone = host_ms(lambda: recurrent_fn(*recurrent_args))
    found.append(("the same, GPU busy (host, less the launch's own)", host_ms(allocate_busy) - kernel_alone))
    torch_dtype = getattr(torch, policy(args.dtype).torch_type)
    module = prnn_tvm.torch.Recurrent(cell, layer.input_size, args.hidden, device="cuda", dtype=torch_dtype)
    with torch.no_grad():
        x_name = layer.signature.inputs[0].name
        for name, value in arrays.items():
            if name != x_name:  # the parameters
                getattr(module, f"{name}_l0").copy_(value)
        x = arrays[x_name]
        found.append(("module call", gpu_ms(lambda: module(x))))
        found.append(("module call: host", host_ms(lambda: module(x))))
    return found


print(
    f"{torch.cuda.get_device_name()}, {args.dtype}, hidden {args.hidden}, batch {args.batch}, T={args.seq}; ms per call"
)
for cell in args.cells:
    for what, value in parts(cell):
        print(f"  {what:52s} {value:8.3f}", flush=True)

"""Two prnn-tvm modules in a row (LSTM then GRU), eager and replayed from a CUDA graph, against
the sum of their kernels timed alone and against cuDNN's pair, on the GPU (fp32, TF32 off).

    python bench/two_modules.py [--hidden 1024 --batch 4 --seq 256]

A replay runs exactly the model's kernels (two cuBLAS projections, two persistent kernels)
with no host work between them; the eager call adds what the host costs. Every figure is the
median of CUDA-event runs in one process (``prnn_tvm.bench.baselines.cuda_event_times``).
"""

import torch

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines

args = baselines.script_arguments(number=5, hidden=1024, batch=4)
H, B, T = args.hidden, args.batch, args.seq
lstm, gru = torch.nn.LSTM(H, H).cuda().eval(), torch.nn.GRU(H, H).cuda().eval()
fast_lstm, fast_gru = pt.from_torch(lstm), pt.from_torch(gru)
fast_lstm.batch_buckets = fast_gru.batch_buckets = False  # the kernels of batch B itself, timed alone below
x = torch.randn(T, B, H, device="cuda")


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def model(x):
    return fast_gru(fast_lstm(x)[0])[0]


def kernel_alone(module, fast, inputs):
    """``module``'s recurrent kernel with pre-bound arguments, on the projection of ``inputs``."""
    layer = fast.layer_for(B, inputs.device)
    xp = torch.addmm(module.bias_ih_l0, inputs.view(T * B, H), module.weight_ih_l0.t()).view(T, B, -1)
    ((name, bound),) = layer.bind_recurrent(xp, module.weight_hh_l0.detach(), module.bias_hh_l0.detach()).launches
    function = layer.module[name]
    return lambda: function(*bound)


with torch.no_grad():
    eager = model(x).clone()
    graph, replayed = baselines.captured(lambda: model(x))
    graph.replay()
    torch.cuda.synchronize()
    between = fast_lstm(x)[0]
    parts = {
        "LSTM projection (cuBLAS)": ms(lambda: torch.addmm(lstm.bias_ih_l0, x.view(T * B, H), lstm.weight_ih_l0.t())),
        "LSTM persistent kernel": ms(kernel_alone(lstm, fast_lstm, x)),
        "GRU projection (cuBLAS)": ms(
            lambda: torch.addmm(gru.bias_ih_l0, between.view(T * B, H), gru.weight_ih_l0.t())
        ),
        "GRU persistent kernel": ms(kernel_alone(gru, fast_gru, between)),
    }
    kernels = sum(parts.values())
    eager_ms, replay_ms = ms(lambda: model(x)), ms(graph.replay)
    cudnn_ms = ms(lambda: gru(lstm(x)[0])[0])
    fast_lstm.check()
    fast_gru.check()

print(f"# LSTM then GRU, hidden={H}, batch={B}, T={T}, fp32, {torch.cuda.get_device_name()} (ms per sequence)\n")
print(f"replay equals eager bitwise: {torch.equal(replayed, eager)}\n")
print("| what | ms |\n|---|---|")
for name, value in parts.items():
    print(f"| {name} | {value:.3f} |")
print(f"| sum of the kernels | {kernels:.3f} |")
print(f"| eager call | {eager_ms:.3f} ({eager_ms / kernels:.3f}x the kernels) |")
print(f"| CUDA graph replay | {replay_ms:.3f} ({replay_ms / kernels:.3f}x the kernels) |")
print(f"| cuDNN, same two modules | {cudnn_ms:.3f} ({cudnn_ms / eager_ms:.2f}x ours eager) |")

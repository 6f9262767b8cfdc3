"""LSTM fp32, hidden 1024, batch 4, 256 steps: prnn-tvm's persistent kernel vs cuDNN, timed in one run.

Run on a machine with a CUDA GPU and PyTorch:

    python bench/lstm_vs_cudnn.py [--hidden 1024 --batch 4 --seq 256]

Reads top to bottom: sizes, compile, check against cuDNN on the same weights, then time
both (prnn-tvm with TVM's time_evaluator, cuDNN with CUDA events; minimum and median
over repeats after warm-up) and print times, ratio and achieved FLOP rate.
"""

import argparse
import statistics

import numpy as np
import torch

import prnn_tvm

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--repeat", type=int, default=7)
args = p.parse_args()
H, B, T = args.hidden, args.batch, args.seq

# -- compile: the default (untuned) config for this GPU
layer = prnn_tvm.compile_cell("lstm", H, B, seq_len=T, target="cuda")
print(layer.report.format())

# -- the same weights in torch.nn.LSTM (PyTorch layout and gate order, used as they are).
# cuDNN runs RNNs in TF32 by default; compare and time true fp32 on both sides.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
lstm = torch.nn.LSTM(H, H).cuda().eval()
x = torch.randn(T, B, H, device="cuda")
h0, c0 = 0.5 * torch.randn(1, B, H, device="cuda"), 0.5 * torch.randn(1, B, H, device="cuda")
weights = [t.detach().cpu().numpy() for t in (lstm.weight_ih_l0, lstm.bias_ih_l0, lstm.weight_hh_l0, lstm.bias_hh_l0)]
inputs = [x.cpu().numpy(), *weights, h0[0].cpu().numpy(), c0[0].cpu().numpy()]

# -- check: same answer as cuDNN
with torch.inference_mode():
    ref, (hn, cn) = lstm(x, (h0, c0))
out, (h_n, c_n) = layer(*inputs)
err = max(np.abs(out - ref.cpu().numpy()).max(), np.abs(c_n - cn[0].cpu().numpy()).max())
print(f"max abs difference to cuDNN: {err:.2e}")
assert err < 1e-4, "prnn-tvm and cuDNN disagree"

# -- time prnn-tvm (projection + persistent kernel) and cuDNN (whole layer)
t = layer.time(*inputs, number=20, repeat=args.repeat)


def cuda_time(fn, iters=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(args.repeat):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / iters * 1e-3)
    return min(runs), statistics.median(runs)


with torch.inference_mode():
    cudnn_min, cudnn_med = cuda_time(lambda: lstm(x, (h0, c0)))
ours = t["projection"] + t["recurrent"]
flops = 2 * B * 4 * H * (H + H) * T  # input and recurrent products, 4 gates
print(f"prnn-tvm  {ours * 1e3:8.3f} ms/seq  (projection {t['projection'] * 1e3:.3f} ms, recurrent "
      f"{t['recurrent'] * 1e3:.3f} ms = {t['recurrent'] / T * 1e6:.2f} us/step)  {flops / ours / 1e12:.2f} TFLOP/s")
print(f"cuDNN     {cudnn_min * 1e3:8.3f} ms/seq  (median {cudnn_med * 1e3:.3f} ms, {cudnn_min / T * 1e6:.2f} us/step)  "
      f"{flops / cudnn_min / 1e12:.2f} TFLOP/s")
print(f"speedup over cuDNN: {cudnn_min / ours:.2f}x  ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"cuDNN {torch.backends.cudnn.version()})")

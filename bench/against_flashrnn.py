"""FlashRNN (NX-AI, ICLR'25, PyPI ``flashrnn`` 1.0.8) against prnn-tvm on the GPU, the issue's targets (issue 49):

- LSTM with heads, hidden 768, batch 16, T=1024, bf16, heads of D in 16, 32, 64, 128, 256 units (and dense):
  FlashRNN's fused CUDA, alternating CUDA and fused Triton kernels given the projected input, against prnn-tvm's
  recurrent kernel given the same projection, and two public calls from ``x`` (projection included): the compiled
  layer's (``layer(x, ...)``, its own projection kernel) and the torch module's (``prnn_tvm.torch.Recurrent``,
  inference: the projection through cuBLAS, arrays from torch's allocator). Target: at least 3x FlashRNN's
  fastest backend for every D; 12 heads of 64 in 0.65 ms or less.
- sLSTM, 12 heads of 64, same shape: the forward (against FlashRNN's, and both against each other's outputs) and a
  training step against FlashRNN's forward and backward: the torch module's public step from ``x`` (projection,
  forward, loss, ``backward()``: ``prnn_tvm.bench.training_step``), and the training kernels driven directly (the
  saving forward, the backward, R's gradient). Target: at least 2x FlashRNN's training step.
- The layer-normalized LSTM (``lstm_layernorm``), hidden 1024, batch 8, T=256, fp16, against the same step in
  torch (two LayerNorms over the gates, one over the cell, a GEMM per step) replayed as a CUDA graph, and against
  prnn-tvm's plain LSTM at the size: each through the torch module's call (``prnn_tvm.torch.Recurrent``, weights
  copied from the same tensors), the compiled layer's call and the recurrent kernel alone beside it. Targets (the
  module calls): at least 5x the graph; within 1.3x of the plain LSTM.

Setup (../shared/device/README.md, "FlashRNN as a baseline"): on this machine
    python3 -m pip download --no-deps -d .peers flashrnn einops
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \\
        --implementation cp -d .peers ninja
(``.peers`` git-ignored through .git/info/exclude), carry ``.peers``, and on the GPU machine
    python3 -m pip install -q --no-index --no-deps .peers/*.whl && bash ../shared/device/flashrnn-cuda13.sh
    python3 bench/against_flashrnn.py [--cases heads slstm layernorm] [--out $OUT/flashrnn-h100.md]
                                      [--heads-configs 64=fastest64.json ...]
FlashRNN builds its kernels with nvcc on first use (1-3 minutes per shape and backend). Every figure is the median
of CUDA-event runs (``prnn_tvm.bench.baselines.cuda_event_times``) in one process, milliseconds per sequence.
"""

import argparse
import json
import math
import time

import torch

import prnn_tvm
import prnn_tvm.torch
from prnn_tvm.bench import baselines, flashrnn
from prnn_tvm.bench.training_step import step as training_step
from prnn_tvm.checks import relative_error
from prnn_tvm.compiler import compile_training
from prnn_tvm.runtime.binding import COPY
from prnn_tvm.torch.autograd import weight_gradient

p = argparse.ArgumentParser()
p.add_argument("--cases", nargs="+", default=["heads", "slstm", "layernorm"])
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--head-dims", type=int, nargs="+", default=[16, 32, 64, 128, 256, 768])
p.add_argument(
    "--flashrnn-backends", nargs="+", default=list(flashrnn.BACKENDS), choices=flashrnn.BACKENDS,
    help="FlashRNN backends timed (each builds its kernels by JIT at first use: its fused CUDA ~2.5 min a shape)",
)
p.add_argument(
    "--heads-configs", nargs="*", default=[], metavar="D=FILE",
    help="the config of heads of D units as a JSON file (what bench/configs.py --fastest writes), for its layer and "
    "module; the others take their default",
)
p.add_argument("--repeats", type=int, default=7)
p.add_argument("--number", type=int, default=5)
p.add_argument("--out", default=None)
p.add_argument(
    "--layernorm-config", type=json.loads, default=None,
    help="the layer-normalized LSTM's config as JSON, for its layer and module (default: its tuned or default one)",
)
args = p.parse_args()
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
H, B, T, BF16 = args.hidden, args.batch, args.seq, torch.bfloat16
lines = [f"# FlashRNN against prnn-tvm ({torch.cuda.get_device_name()}, torch {torch.__version__})", ""]


def say(line: str = "") -> None:
    print(line, flush=True)
    lines.append(line)


def ms(fn) -> float:
    return baselines.cuda_event_times(fn, args.repeats, args.number)[0] * 1e3


def flashrnn_inputs(heads: int, D: int, dtype, grad: bool = False):
    """FlashRNN's layouts: Wx[B, T, 4, heads, D], R[4, heads, D, D] (scaled as torch scales a recurrent weight), b."""
    bound = 1.0 / math.sqrt(D)
    Wx = torch.randn(B, T, 4, heads, D, device="cuda", dtype=dtype)
    R = (torch.rand(4, heads, D, D, device="cuda", dtype=dtype) * 2 - 1) * bound
    b = (torch.rand(4, heads, D, device="cuda", dtype=dtype) * 2 - 1) * bound
    return [t.requires_grad_(grad) for t in (Wx, R, b)]


def flashrnn_times(cell: str, Wx, R, b) -> dict:
    """Each backend's forward, ms (or why it did not run)."""
    found = {}
    for backend in flashrnn.BACKENDS:
        if backend not in args.flashrnn_backends:
            found[backend] = "not run (--flashrnn-backends)"
            continue
        try:
            with torch.no_grad():
                found[backend] = ms(lambda backend=backend: flashrnn.call(cell, Wx, R, b, backend, "bfloat16"))
        except Exception as err:  # a backend that does not build or run for this shape: say why, go on
            found[backend] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    return found


def ours(cell: str, heads: int, dtype: str, hidden: int = H, batch: int = B, config=None):
    spec = f"{cell}_h{heads}" if heads > 1 else cell
    start = time.perf_counter()
    layer = prnn_tvm.compile_cell(spec, hidden, batch, dtype=dtype, target="cuda", config=config)
    say(
        f"  {spec}: config {layer.report.config}, {layer.report.registers} registers, "
        f"{layer.report.spill_bytes} B spills, compiled in {time.perf_counter() - start:.0f} s"
    )
    return layer


def layer_xp(layer, xp):
    """``xp`` (float32) in the type ``layer``'s recurrent kernel reads it in: float32, or the layer's half type (the
    tensor-core template's knob ``xp``)."""
    return xp.to(getattr(torch, layer.signature.launch("recurrent").arg("xp").dtype))


def our_times(layer, xp, x, weights: dict) -> tuple:
    """(the recurrent kernel given ``xp``, its arguments bound once, ms; the public call from ``x``, ms)."""
    xp = layer_xp(layer, xp)
    bound = layer.bind_recurrent(xp, **{k: v for k, v in weights.items() if k not in ("W_ih", "b_ih")})
    kernels = [(layer.function(name), a) for name, a in bound.launches if name != COPY]
    recurrent = ms(lambda: [fn(*a) for fn, a in kernels])
    call = ms(lambda: layer(x, **weights))
    return recurrent, call


def best(times: dict) -> float:
    return min((v for v in times.values() if isinstance(v, float)), default=float("nan"))


def module_call(spec: str, x, weights: dict, hidden: int = H, dtype=BF16, config=None):
    """The torch module's inference call on ``x`` with ``weights`` (the compiled layer's argument names), ms, and its
    output (``prnn_tvm.torch.Recurrent``: cuBLAS projection, torch's allocator, the launch's arguments kept)."""
    module = prnn_tvm.torch.Recurrent(spec, hidden, hidden, device="cuda", dtype=dtype, config=config)
    with torch.no_grad():
        for name, value in weights.items():
            getattr(module, f"{name}_l0").copy_(value)
        out, _ = module(x)
        return ms(lambda: module(x)), out


def heads_configs() -> dict:
    """``--heads-configs``: head size -> config dict."""
    found = {}
    for item in args.heads_configs:
        D, _, path = item.partition("=")
        with open(path) as f:
            found[int(D)] = json.load(f)
    return found


def case_heads():
    configs = heads_configs()
    say("## LSTM with heads: hidden {}, batch {}, T={}, bf16".format(H, B, T))
    say("")
    say(
        "| head size | heads | FlashRNN fused CUDA | alternating CUDA | fused Triton | prnn-tvm recurrent (us/step) | "
        "prnn-tvm layer call | prnn-tvm module call | FlashRNN's best / ours: recurrent, layer call, module call |"
    )
    say("|---|---|---|---|---|---|---|---|---|")
    for D in args.head_dims:
        heads = H // D
        Wx, R, b = flashrnn_inputs(heads, D, BF16)
        theirs = flashrnn_times("lstm", Wx, R, b)
        layer = ours("lstm", heads, "bfloat16", config=configs.get(D))
        xp = flashrnn.projection(Wx).float().contiguous()
        x = torch.randn(T, B, H, device="cuda", dtype=BF16)
        weights = {
            "W_ih": torch.randn(4 * H, H, device="cuda", dtype=BF16) / math.sqrt(H),
            "b_ih": torch.zeros(4 * H, device="cuda", dtype=BF16),
            "W_hh": flashrnn.recurrent(R).contiguous(),
            "b_hh": flashrnn.bias(b).contiguous(),
        }
        recurrent, call = our_times(layer, xp, x, weights)
        spec = f"lstm_h{heads}" if heads > 1 else "lstm"
        module, module_out = module_call(spec, x, weights, config=configs.get(D))
        cells = [theirs[k] if isinstance(theirs[k], str) else f"{theirs[k]:.3f}" for k in flashrnn.BACKENDS]
        fastest = best(theirs)
        say(
            f"| {D} | {heads} | {' | '.join(cells)} | {recurrent:.3f} ({recurrent / T * 1e3:.2f}) | {call:.3f} | "
            f"{module:.3f} | {fastest / recurrent:.2f}x, {fastest / call:.2f}x, {fastest / module:.2f}x |"
        )
        layer_out, _ = layer(x, **weights)
        say(
            f"  module call against the layer call, all {T} steps: max abs difference "
            f"{(module_out.float() - torch.from_dlpack(layer_out).float()).abs().max().item():.2e}"
        )
        ran = [k for k in flashrnn.BACKENDS if isinstance(theirs[k], float)]  # a head size one may not build
        if not ran:
            say(f"  FlashRNN ran no backend at heads of {D}: no outputs to compare")
            continue
        check = flashrnn.states(flashrnn.call("lstm", Wx[:, :64], R, b, ran[0], "bfloat16"), 0).float()
        got, _ = layer.recurrent(layer_xp(layer, xp[:64]).contiguous(), W_hh=weights["W_hh"], b_hh=weights["b_hh"])
        say(
            f"  outputs of the first 64 steps, prnn-tvm against FlashRNN ({ran[0]}): max abs difference "
            f"{(torch.from_dlpack(got).float() - check).abs().max().item():.2e}"
        )
    say("")


def case_slstm():
    heads, D = 12, H // 12
    say(f"## sLSTM, {heads} heads of {D}: hidden {H}, batch {B}, T={T}, bf16")
    say("")
    Wx, R, b = flashrnn_inputs(heads, D, BF16, grad=True)
    theirs = flashrnn_times("slstm", Wx, R, b)
    layer = ours("slstm", heads, "bfloat16")
    xp = flashrnn.projection(Wx.detach()).float().contiguous()
    weights = {"R": flashrnn.recurrent(R.detach()).contiguous(), "b_hh": flashrnn.bias(b.detach()).contiguous()}
    x = torch.randn(T, B, H, device="cuda", dtype=BF16)
    full = {
        "W_ih": torch.randn(4 * H, H, device="cuda", dtype=BF16) / math.sqrt(H),
        "b_ih": torch.zeros(4 * H, device="cuda", dtype=BF16),
        **weights,
    }
    recurrent, call = our_times(layer, xp, x, full)
    say(
        f"forward ms: FlashRNN {theirs}; prnn-tvm recurrent {recurrent:.3f}, public call {call:.3f}; "
        f"{best(theirs) / recurrent:.2f}x FlashRNN's best"
    )
    ran = [k for k in flashrnn.BACKENDS if isinstance(theirs[k], float)]
    if ran:
        with torch.no_grad():
            check = flashrnn.states(flashrnn.call("slstm", Wx[:, :64], R, b, ran[0], "bfloat16"), 0).float()
        got, _ = layer.recurrent(layer_xp(layer, xp[:64]).contiguous(), **weights)
        say(
            f"outputs of the first 64 steps, prnn-tvm against FlashRNN ({ran[0]}): relative difference "
            f"{relative_error(torch.from_dlpack(got).float().cpu().numpy(), check.cpu().numpy()):.2e}"
        )

    def flashrnn_step(backend):
        for t in (Wx, R, b):
            t.grad = None
        out = flashrnn.call("slstm", Wx, R, b, backend, "bfloat16")
        out[0].float().square().sum().backward()

    training = compile_training(layer)
    say(f"prnn-tvm training kernels: {training.report}")
    plan = layer.plan
    names = [a.name for a in training.backward.signature.launches[0].args if a.role.written]
    d_out = torch.randn(T, B, H, device="cuda", dtype=BF16)  # the outputs' gradients in the layer's type

    def kernels_step():  # the training kernels driven directly: the saving forward, the backward, R's gradient
        _, (*_, saved) = training.forward(xp=xp, **weights)
        first, rest = training.backward(
            xp=xp,
            saved=saved,
            d_out=d_out,
            **weights,
            **{f"d_{s.name}_n": torch.zeros(B, H, device="cuda", dtype=BF16) for s in plan.states},
        )
        d = dict(zip(names, (first, *rest)))
        gates = torch.from_dlpack(d["d_gates"]).reshape(T * B, -1)
        h = torch.from_dlpack(saved)[:, :, :H].reshape(T * B, H)
        return weight_gradient(gates, h, 4, heads, BF16)

    # the public training step (bench/training.py's for LSTM): the torch module from x, with x, the initial states and
    # every parameter requiring gradients; forward, a loss over every output and final state, backward()
    module = prnn_tvm.torch.Recurrent(f"slstm_h{heads}", H, H, device="cuda", dtype=BF16).train()
    with torch.no_grad():
        for name, value in full.items():
            getattr(module, f"{name}_l0").copy_(value)
    x_grad = x.clone().requires_grad_()
    hx = [torch.zeros(1, B, H, device="cuda", dtype=BF16, requires_grad=True) for _ in plan.states]
    training_step(module, x_grad, hx)  # compiles the module's layer and its training kernels
    module_ms, kernels_ms = ms(lambda: training_step(module, x_grad, hx)), ms(kernels_step)
    found = {}
    for backend in args.flashrnn_backends:
        try:
            found[backend] = ms(lambda backend=backend: flashrnn_step(backend))
        except Exception as err:
            found[backend] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    say(
        f"training step ms: FlashRNN {found} (given the projection); prnn-tvm module step {module_ms:.3f} (from x: "
        f"projection, forward, loss, backward), {best(found) / module_ms:.2f}x FlashRNN's best; the training kernels "
        f"driven directly {kernels_ms:.3f} ({best(found) / kernels_ms:.2f}x)"
    )
    say("")


LAYERNORM_AGREE_STEPS = 16  # steps over which the outputs are compared (see case_layernorm)


def case_layernorm():
    hidden, batch, steps = 1024, 8, 256
    say(f"## Layer-normalized LSTM: hidden {hidden}, batch {batch}, T={steps}, fp16")
    say("")
    layer = ours("lstm_layernorm", 1, "float16", hidden, batch, args.layernorm_config)
    plain = ours("lstm", 1, "float16", hidden, batch)
    dtype = torch.float16
    W = torch.randn(4 * hidden, hidden, device="cuda", dtype=dtype) / math.sqrt(hidden)
    W_ih = torch.randn(4 * hidden, hidden, device="cuda", dtype=dtype) / math.sqrt(hidden)
    x = torch.randn(steps, batch, hidden, device="cuda", dtype=dtype)
    zeros4, ones4 = (
        torch.zeros(4 * hidden, device="cuda", dtype=dtype),
        torch.ones(4 * hidden, device="cuda", dtype=dtype),
    )
    zeros, ones = torch.zeros(hidden, device="cuda", dtype=dtype), torch.ones(hidden, device="cuda", dtype=dtype)
    params = {
        "W_ih": W_ih,
        "b_ih": zeros4,
        "W_hh": W,
        "ln_x_g": ones4,
        "ln_x_b": zeros4,
        "ln_h_g": ones4,
        "ln_h_b": zeros4,
        "ln_c_g": ones,
        "ln_c_b": zeros,
    }
    plain_params = {"W_ih": W_ih, "b_ih": zeros4, "W_hh": W, "b_hh": zeros4}
    ln_x, ln_h = torch.nn.LayerNorm(4 * hidden).cuda().to(dtype), torch.nn.LayerNorm(4 * hidden).cuda().to(dtype)
    ln_c = torch.nn.LayerNorm(hidden).cuda().to(dtype)
    state = [torch.zeros(batch, hidden, device="cuda", dtype=dtype) for _ in range(2)]
    out = torch.empty(steps, batch, hidden, device="cuda", dtype=dtype)

    def torch_loop():
        xp = ln_x(x @ W_ih.t())  # the input's normalization: one GEMM and one LayerNorm for every step
        h, c = state
        for t in range(steps):
            i, f, g, o = (xp[t] + ln_h(h @ W.t())).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(ln_c(c))
            out[t] = h

    torch_loop()
    # the graph is captured before any of our calls, and with the garbage collected first: a TVM tensor freed during
    # a capture (cudaFree) aborts the process (baselines.free_before_capture)
    freed = baselines.free_before_capture()
    if freed:
        say(f"  freed before the capture, held by unreachable cycles: {freed}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch_loop()
    graph_ms = ms(graph.replay)
    rows = x.view(steps * batch, hidden)
    xp = torch.mm(rows, W_ih.t(), out_dtype=torch.float32).view(steps, batch, -1)  # b_ih is zero
    ln_recurrent, ln_call = our_times(layer, xp, x, params)
    plain_recurrent, plain_call = our_times(plain, xp, x, plain_params)
    ln_module, ln_out = module_call("lstm_layernorm", x, params, hidden, dtype, args.layernorm_config)
    plain_module, _ = module_call("lstm", x, plain_params, hidden, dtype)
    got, _ = layer(x, **params)
    torch_loop()
    unreachable = baselines.free_before_capture()  # what a capture here would have freed (and died of)
    say(f"  after our calls, held by unreachable cycles: {unreachable or 'nothing of TVM or prnn-tvm'}")
    # this layer is chaotic at this shape: in float64, a 1e-6 change of h at step 0 grows to 1e-4 by step 64 and to
    # 0.94 by step 255, so two half-precision runs agree only over the first steps
    early = LAYERNORM_AGREE_STEPS

    def early_diff(a, b) -> float:
        return (a[:early].float() - b[:early].float()).abs().max().item()

    say(
        "| layer | torch step loop as a CUDA graph | prnn-tvm module call | prnn-tvm layer call | "
        "prnn-tvm recurrent kernel (us/step) |"
    )
    say("|---|---|---|---|---|")
    say(
        f"| LayerNorm-LSTM | {graph_ms:.3f} | {ln_module:.3f} | {ln_call:.3f} | {ln_recurrent:.3f} "
        f"({ln_recurrent / steps * 1e3:.2f}) |"
    )
    say(
        f"| LSTM | | {plain_module:.3f} | {plain_call:.3f} | {plain_recurrent:.3f} "
        f"({plain_recurrent / steps * 1e3:.2f}) |"
    )
    say(
        f"targets, module calls: {graph_ms / ln_module:.2f}x the torch graph (at least 5x), "
        f"{ln_module / plain_module:.2f}x the plain LSTM (at most 1.3x); layer calls {graph_ms / ln_call:.2f}x, "
        f"{ln_call / plain_call:.2f}x; recurrent kernels {ln_recurrent / plain_recurrent:.2f}x"
    )
    say(
        f"outputs of the first {early} steps: module call against the loop's, max abs difference "
        f"{early_diff(ln_out, out):.2e}; layer call against the loop's {early_diff(torch.from_dlpack(got), out):.2e}"
    )
    say("")


for case in args.cases:
    {"heads": case_heads, "slstm": case_slstm, "layernorm": case_layernorm}[case]()
if args.out:
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")

"""A new cell, written once as one timestep in TVM tensor expressions, trained with prnn-tvm and
checked against the same cell written by hand in PyTorch ops.

The cell is the coupled-input-forget-gate LSTM (CIFG; Greff et al., "LSTM: a search space
odyssey", 2017), which is not one of prnn-tvm's built-in cells:

    i = sigmoid(W_i x + U_i h + b_i)        f = 1 - i   (coupled)
    g = tanh(W_g x + U_g h + b_g)
    o = sigmoid(W_o x + U_o h + b_o)
    c' = (1 - i) * c + i * g
    h' = o * tanh(c')

Nothing else is written for it: ``prnn_tvm.torch.Recurrent`` compiles it, and its backward is
derived from the cell's plan. A character model on this repository's README trains twice from
one initialization (CPU, float32): with prnn-tvm, and with the cell in plain PyTorch ops (autograd
through a Python loop over time). The two loss curves must agree (exit status 1 otherwise). With a
GPU, the trained layer then runs as a persistent kernel, checked against the CPU build.

    python examples/custom_cell.py [--steps 100 --hidden 64 --batch 8 --seq 32]
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tvm import te

import prnn_tvm.torch as pt
from prnn_tvm import Cell


def step(c):
    H = c.hidden
    x, h, cs = c.input(3), c.state("h"), c.state("c")
    U, b = c.weight("U", 3), c.param("b", 3)
    hu = c.matvec(h, U, name="hu")

    def gate(k, act, name):
        return c.pointwise(lambda n, j: act(x[n, k * H + j] + hu[n, k * H + j] + b[k * H + j]), name=name)

    i, g, o = gate(0, te.sigmoid, "i"), gate(1, te.tanh, "g"), gate(2, te.sigmoid, "o")
    c_new = c.pointwise(lambda n, j: (1.0 - i[n, j]) * cs[n, j] + i[n, j] * g[n, j], name="c_new")
    return {"h": c.pointwise(lambda n, j: o[n, j] * te.tanh(c_new[n, j]), name="h_new"), "c": c_new}


def reference(x, state, p):
    i, g, o = np.split(x + state["h"] @ p["U"].T + p["b"], 3, axis=1)
    i, o = 1 / (1 + np.exp(-i)), 1 / (1 + np.exp(-o))
    c = (1 - i) * state["c"] + i * np.tanh(g)
    return {"h": o * np.tanh(c), "c": c}


CIFG = Cell("cifg", step, reference, output="h")


class TorchCifg(torch.nn.Module):
    """The same cell by hand in PyTorch ops, with the prnn-tvm module's parameter names and layout."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        for name, p in layer.named_parameters():
            setattr(self, name, torch.nn.Parameter(p.detach().clone()))

    def forward(self, x):
        h = c = x.new_zeros(x.shape[1], self.U_l0.shape[1])
        xp, outs = x @ self.W_ih_l0.T + self.b_ih_l0, []
        for t in range(x.shape[0]):
            i, g, o = (xp[t] + h @ self.U_l0.T + self.b_l0).chunk(3, dim=1)
            i, g, o = torch.sigmoid(i), torch.tanh(g), torch.sigmoid(o)
            c = (1 - i) * c + i * g
            h = o * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs), (h[None], c[None])


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--tolerance", type=float, default=1e-3, help="largest allowed loss difference")
args = p.parse_args()

text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
vocab = sorted(set(text))
data = torch.tensor([vocab.index(ch) for ch in text])


class CharModel(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.embed = torch.nn.Embedding(len(vocab), args.hidden)
        self.rnn = rnn
        self.head = torch.nn.Linear(args.hidden, len(vocab))

    def forward(self, x):  # x (T, B) of character ids
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


torch.manual_seed(0)
ours = CharModel(pt.Recurrent(CIFG, args.hidden, args.hidden))
by_hand = copy.deepcopy(ours)
by_hand.rnn = TorchCifg(ours.rnn)

batches = torch.Generator().manual_seed(1)
starts = [torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=batches) for _ in range(args.steps)]
curves, seconds = {}, {}
for name, model in (("prnn_tvm (derived backward)", ours), ("PyTorch ops (autograd)", by_hand)):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, start = [], time.perf_counter()
    for step_ in range(args.steps):
        window = torch.stack([data[s:s + args.seq + 1] for s in starts[step_]], dim=1)  # (T + 1, B)
        loss = torch.nn.functional.cross_entropy(model(window[:-1]).reshape(-1, len(vocab)), window[1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    curves[name], seconds[name] = losses, time.perf_counter() - start

names = list(curves)
diff = max(abs(a - b) for a, b in zip(*curves.values()))
print(f"# CIFG cell on README.md: vocab {len(vocab)}, hidden {args.hidden}, batch {args.batch}, T {args.seq}, "
      f"{args.steps} Adam steps, CPU float32\n")
print(f"| step | {names[0]} loss | {names[1]} loss |\n|---|---|---|")
for step_ in sorted({0, *range(max(1, args.steps // 10) - 1, args.steps, max(1, args.steps // 10))}):
    print(f"| {step_ + 1} | {curves[names[0]][step_]:.4f} | {curves[names[1]][step_]:.4f} |")
print(f"\nlargest difference over all steps: {diff:.2e} (tolerance {args.tolerance:.0e}); "
      + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))

if torch.cuda.is_available():  # the trained layer as a persistent kernel
    x = ours.embed(torch.stack([data[s:s + 256] for s in starts[0] % (len(data) - 256)], dim=1)).detach()
    with torch.no_grad():
        want, _ = ours.rnn(x)
        gpu = copy.deepcopy(ours.rnn).cuda()
        got, _ = gpu(x.cuda())
    print(f"GPU persistent kernel (T=256): max abs difference to the CPU build {(got.cpu() - want).abs().max():.2e}")
sys.exit(0 if diff <= args.tolerance else 1)

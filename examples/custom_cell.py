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

import copy

import numpy as np
import torch
from charmodel import DATA, CharModel, arguments, compare
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


args = arguments(__doc__, steps=100)
torch.manual_seed(0)
ours = CharModel(pt.Recurrent(CIFG, args.hidden, args.hidden), args.hidden)
by_hand = copy.deepcopy(ours)
by_hand.rnn = TorchCifg(ours.rnn)
compare("CIFG cell", {"prnn_tvm (derived backward)": ours, "PyTorch ops (autograd)": by_hand}, args)

if torch.cuda.is_available():  # the trained layer as a persistent kernel
    x = ours.embed(torch.stack([DATA[s:s + 256] for s in range(0, 8 * 1000, 1000)], dim=1)).detach()
    with torch.no_grad():
        want, _ = ours.rnn(x)
        gpu = copy.deepcopy(ours.rnn).cuda()
        got, _ = gpu(x.cuda())
    print(f"GPU persistent kernel (T=256): max abs difference to the CPU build {(got.cpu() - want).abs().max():.2e}")

"""GRU, as ``torch.nn.GRU`` (gate order r, z, n; b_hn inside the reset product).

    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h

Cho et al., "Learning phrase representations using RNN encoder-decoder", EMNLP 2014, in
the variant cuDNN and PyTorch implement (reset gate applied after the recurrent product).
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h = c.input(3), c.state("h")
    W, b = c.weight("W_hh", 3), c.param("b_hh", 3)
    hw = c.matvec(h, W, name="hw")
    r = c.pointwise(lambda n, j: te.sigmoid(x[n, j] + hw[n, j] + b[j]), name="r")
    z = c.pointwise(lambda n, j: te.sigmoid(x[n, H + j] + hw[n, H + j] + b[H + j]), name="z")
    cand = c.pointwise(lambda n, j: te.tanh(x[n, 2 * H + j] + r[n, j] * (hw[n, 2 * H + j] + b[2 * H + j])),
                       name="n")
    h_new = c.pointwise(lambda n, j: (1.0 - z[n, j]) * cand[n, j] + z[n, j] * h[n, j], name="h_new")
    return {"h": h_new}


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference(x, state, p):
    hw = state["h"] @ p["W_hh"].T + p["b_hh"]
    xr, xz, xn = np.split(x, 3, axis=1)
    hr, hz, hn = np.split(hw, 3, axis=1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return {"h": (1.0 - z) * n + z * state["h"]}


CELL = Cell("gru", step, reference, output="h", doc=__doc__)

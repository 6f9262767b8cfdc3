"""LSTM, as ``torch.nn.LSTM`` (gate order i, f, g, o in W_ih, W_hh, b_ih, b_hh).

    i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
    f = sigmoid(W_if x + b_if + W_hf h + b_hf)
    g = tanh(W_ig x + b_ig + W_hg h + b_hg)
    o = sigmoid(W_io x + b_io + W_ho h + b_ho)
    c' = f * c + i * g
    h' = o * tanh(c')

Hochreiter and Schmidhuber, "Long short-term memory", Neural Computation 1997 (with the
forget gate of Gers, Schmidhuber and Cummins, 2000).
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h, cs = c.input(4), c.state("h"), c.state("c")
    W, b = c.weight("W_hh", 4), c.param("b_hh", 4)
    hw = c.matvec(h, W, name="hw")

    def gate(k, act, name):
        return c.pointwise(lambda n, j: act(x[n, k * H + j] + hw[n, k * H + j] + b[k * H + j]), name=name)

    i, f = gate(0, te.sigmoid, "i"), gate(1, te.sigmoid, "f")
    g, o = gate(2, te.tanh, "g"), gate(3, te.sigmoid, "o")
    c_new = c.pointwise(lambda n, j: f[n, j] * cs[n, j] + i[n, j] * g[n, j], name="c_new")
    h_new = c.pointwise(lambda n, j: o[n, j] * te.tanh(c_new[n, j]), name="h_new")
    return {"h": h_new, "c": c_new}


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference(x, state, p):
    gates = x + state["h"] @ p["W_hh"].T + p["b_hh"]
    i, f, g, o = np.split(gates, 4, axis=1)
    c = _sigmoid(f) * state["c"] + _sigmoid(i) * np.tanh(g)
    return {"h": _sigmoid(o) * np.tanh(c), "c": c}


CELL = Cell("lstm", step, reference, output="h", doc=__doc__)

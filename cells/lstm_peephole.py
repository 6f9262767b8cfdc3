"""LSTM with peephole connections (Gers and Schmidhuber 2000).

    i  = sigmoid(W_i x + U_i h + p_i * c  + b_i)
    f  = sigmoid(W_f x + U_f h + p_f * c  + b_f)
    c' = f * c + i * tanh(W_g x + U_g h + b_g)
    o  = sigmoid(W_o x + U_o h + p_o * c' + b_o)
    h' = o * tanh(c')

Gate order i, f, g, o as in torch.nn.LSTM; the peepholes ``w_peep`` are per-unit vectors
(slices i, f, o), not matrices. Gers and Schmidhuber, "Recurrent nets that time and
count", IJCNN 2000.
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h, cs = c.input(4), c.state("h"), c.state("c")
    W, b, peep = c.weight("W_hh", 4), c.param("b_hh", 4), c.param("w_peep", 3)
    hw = c.matvec(h, W, name="hw")

    def pre(k):
        return lambda n, j: x[n, k * H + j] + hw[n, k * H + j] + b[k * H + j]

    i = c.pointwise(lambda n, j: te.sigmoid(pre(0)(n, j) + peep[j] * cs[n, j]), name="i")
    f = c.pointwise(lambda n, j: te.sigmoid(pre(1)(n, j) + peep[H + j] * cs[n, j]), name="f")
    c_new = c.pointwise(lambda n, j: f[n, j] * cs[n, j] + i[n, j] * te.tanh(pre(2)(n, j)), name="c_new")
    o = c.pointwise(lambda n, j: te.sigmoid(pre(3)(n, j) + peep[2 * H + j] * c_new[n, j]), name="o")
    return {"h": c.pointwise(lambda n, j: o[n, j] * te.tanh(c_new[n, j]), name="h_new"), "c": c_new}


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference(x, state, p):
    pi, pf, po = np.split(p["w_peep"], 3)
    gi, gf, gg, go = np.split(x + state["h"] @ p["W_hh"].T + p["b_hh"], 4, axis=1)
    c = _sigmoid(gf + pf * state["c"]) * state["c"] + _sigmoid(gi + pi * state["c"]) * np.tanh(gg)
    return {"h": _sigmoid(go + po * c) * np.tanh(c), "c": c}


CELL = Cell("lstm_peephole", step, reference, output="h", doc=__doc__)

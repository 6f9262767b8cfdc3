"""Elman RNN with tanh, as ``torch.nn.RNN(nonlinearity="tanh")``.

    h' = tanh(W_ih x + b_ih + W_hh h + b_hh)

Elman, "Finding structure in time", Cognitive Science 1990.
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    x, h = c.input(1), c.state("h")
    W, b = c.weight("W_hh", 1), c.param("b_hh", 1)
    hw = c.matvec(h, W, name="hw")
    return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + b[j]), name="h_new")}


def reference(x, state, p):
    return {"h": np.tanh(x + state["h"] @ p["W_hh"].T + p["b_hh"])}


CELL = Cell("rnn_tanh", step, reference, output="h", doc=__doc__)

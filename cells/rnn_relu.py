"""Elman RNN with ReLU, as ``torch.nn.RNN(nonlinearity="relu")``.

    h' = max(0, W_ih x + b_ih + W_hh h + b_hh)

Le, Jaitly and Hinton, "A simple way to initialize recurrent networks of rectified linear
units", 2015.
"""

import numpy as np
from tvm import te, tirx

from prnn_tvm.frontend.cell import Cell


def step(c):
    x, h = c.input(1), c.state("h")
    W, b = c.weight("W_hh", 1), c.param("b_hh", 1)
    hw = c.matvec(h, W, name="hw")
    zero = tirx.const(0.0, c.dtype)
    return {"h": c.pointwise(lambda n, j: te.max(x[n, j] + hw[n, j] + b[j], zero), name="h_new")}


def reference(x, state, p):
    return {"h": np.maximum(0.0, x + state["h"] @ p["W_hh"].T + p["b_hh"])}


CELL = Cell("rnn_relu", step, reference, output="h", doc=__doc__)

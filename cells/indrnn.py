"""Independently recurrent network, IndRNN (Li et al. 2018): element-wise recurrence.

    h' = relu(W x + u * h + b)

The recurrent weight ``u`` is a per-unit vector: no unit reads another, so the compiler
finds no recurrent product and builds the kernel without any grid synchronization.
``b`` is the input projection's ``b_ih``. Li, Li, Cook, Zhu and Gao, "Independently
recurrent neural network (IndRNN): building a longer and deeper RNN", CVPR 2018.
"""

import numpy as np
from tvm import te, tirx

from prnn_tvm.frontend.cell import Cell


def step(c):
    x, h, u = c.input(1), c.state("h"), c.param("u")
    zero = tirx.const(0.0, c.dtype)
    return {"h": c.pointwise(lambda n, j: te.max(x[n, j] + u[j] * h[n, j], zero), name="h_new")}


def reference(x, state, p):
    return {"h": np.maximum(0.0, x + p["u"] * state["h"])}


CELL = Cell("indrnn", step, reference, output="h", doc=__doc__)

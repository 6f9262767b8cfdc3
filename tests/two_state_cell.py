"""A test cell with two exchanged states, each feeding its own recurrent product.

    m' = tanh(x_m + V m)
    h' = tanh(x_h + U h + m')

It exercises what no built-in cell does: two products over different states in one step,
so that a thread's weight rows can belong to different products and states.
"""

import numpy as np
from tvm import te

from prnn_tvm import Cell


def step(c):
    H = c.hidden
    x, h, m = c.input(2), c.state("h"), c.state("m")
    U, V = c.weight("U", 1), c.weight("V", 1)
    hu, mv = c.matvec(h, U, "hu"), c.matvec(m, V, "mv")
    m_new = c.pointwise(lambda n, j: te.tanh(x[n, H + j] + mv[n, j]), "m_new")
    h_new = c.pointwise(lambda n, j: te.tanh(x[n, j] + hu[n, j] + m_new[n, j]), "h_new")
    return {"h": h_new, "m": m_new}


def reference(x, state, p):
    xh, xm = np.split(x, 2, axis=1)
    m = np.tanh(xm + state["m"] @ p["V"].T)
    return {"h": np.tanh(xh + state["h"] @ p["U"].T + m), "m": m}


TWO_STATE = Cell("two_state", step, reference)

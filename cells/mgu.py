"""Minimal gated unit (Zhou et al. 2016): one gate, which also resets h before its product.

    f  = sigmoid(W_f x + U_f h + b_f)
    h~ = tanh(W_h x + U_h (f * h) + b_h)
    h' = (1 - f) * h + f * h~

The second product multiplies ``f * h``, computed in the same step, so the compiler runs
the step in two phases with a grid synchronization between them. The biases ``b_f, b_h``
are the input projection's ``b_ih`` (slices f, h). Zhou, Wu, Zhang and Zhou, "Minimal
gated unit for recurrent neural networks", International Journal of Automation and
Computing 2016.
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h = c.input(2), c.state("h")
    U_f, U_h = c.weight("U_f"), c.weight("U_h")
    fh = c.matvec(h, U_f, name="f_h")
    f = c.pointwise(lambda n, j: te.sigmoid(x[n, j] + fh[n, j]), name="f")
    gated = c.pointwise(lambda n, j: f[n, j] * h[n, j], name="f_times_h")
    uh = c.matvec(gated, U_h, name="h_fh")
    cand = c.pointwise(lambda n, j: te.tanh(x[n, H + j] + uh[n, j]), name="cand")
    return {"h": c.pointwise(lambda n, j: (1.0 - f[n, j]) * h[n, j] + f[n, j] * cand[n, j], name="h_new")}


def reference(x, state, p):
    xf, xh = np.split(x, 2, axis=1)
    h = state["h"]
    f = 1.0 / (1.0 + np.exp(-(xf + h @ p["U_f"].T)))
    cand = np.tanh(xh + (f * h) @ p["U_h"].T)
    return {"h": (1.0 - f) * h + f * cand}


CELL = Cell("mgu", step, reference, output="h", doc=__doc__)

"""GRU as Cho et al. defined it (2014): the reset gate multiplies h *before* the product.

    r  = sigmoid(W_r x + U_r h)
    z  = sigmoid(W_z x + U_z h)
    h~ = tanh(W x + U (r * h))
    h' = z * h + (1 - z) * h~

Unlike the cuDNN/PyTorch variant (``cells/gru.py``, ``r * (U h)``), the candidate's
product depends on this step's reset gate, so the compiler runs the step in two phases
with a grid synchronization between them. Biases are the input projection's ``b_ih``
(slices r, z, n). Cho et al., "Learning phrase representations using RNN
encoder-decoder for statistical machine translation", EMNLP 2014, eqs. 5-8.
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h = c.input(3), c.state("h")
    U_rz, U_n = c.weight("U_rz", 2), c.weight("U_n")
    rz = c.matvec(h, U_rz, name="rz_h")
    r = c.pointwise(lambda n, j: te.sigmoid(x[n, j] + rz[n, j]), name="r")
    z = c.pointwise(lambda n, j: te.sigmoid(x[n, H + j] + rz[n, H + j]), name="z")
    rh = c.pointwise(lambda n, j: r[n, j] * h[n, j], name="r_times_h")
    un = c.matvec(rh, U_n, name="n_rh")
    cand = c.pointwise(lambda n, j: te.tanh(x[n, 2 * H + j] + un[n, j]), name="cand")
    return {"h": c.pointwise(lambda n, j: z[n, j] * h[n, j] + (1.0 - z[n, j]) * cand[n, j], name="h_new")}


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference(x, state, p):
    xr, xz, xn = np.split(x, 3, axis=1)
    h = state["h"]
    ur, uz = np.split(h @ p["U_rz"].T, 2, axis=1)
    r, z = _sigmoid(xr + ur), _sigmoid(xz + uz)
    cand = np.tanh(xn + (r * h) @ p["U_n"].T)
    return {"h": z * h + (1.0 - z) * cand}


CELL = Cell("gru_cho", step, reference, output="h", doc=__doc__)

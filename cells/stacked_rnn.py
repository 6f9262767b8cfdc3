"""Two stacked tanh RNN layers fused into one cell: a deep RNN in one persistent kernel.

    h1' = tanh(W1 x + U1 h1)            (b1 is the input projection's b_ih)
    h2' = tanh(V2 h1' + U2 h2 + b2)

It exercises what the other cells do not: two state vectors feeding two products of the
same phase (``U1 h1``, ``U2 h2``), and a third product over a value this step computes
that is also a state's new value (``V2 h1'``): the compiler runs two phases, publishing
``h1'`` both for the second phase and for the next step. The layer's output is ``h2``.
Stacked recurrent layers as in Graves, Mohamed and Hinton, "Speech recognition with deep
recurrent neural networks", ICASSP 2013.
"""

import numpy as np
from tvm import te

from prnn_tvm.frontend.cell import Cell


def step(c):
    x, h1, h2 = c.input(1), c.state("h1"), c.state("h2")
    U1, V2, U2 = c.weight("U1"), c.weight("V2"), c.weight("U2")
    b2 = c.param("b2")
    u1 = c.matvec(h1, U1, name="u1_h1")
    h1_new = c.pointwise(lambda n, j: te.tanh(x[n, j] + u1[n, j]), name="h1_new")
    u2 = c.matvec(h2, U2, name="u2_h2")
    v2 = c.matvec(h1_new, V2, name="v2_h1")
    h2_new = c.pointwise(lambda n, j: te.tanh(v2[n, j] + u2[n, j] + b2[j]), name="h2_new")
    return {"h1": h1_new, "h2": h2_new}


def reference(x, state, p):
    h1 = np.tanh(x + state["h1"] @ p["U1"].T)
    h2 = np.tanh(h1 @ p["V2"].T + state["h2"] @ p["U2"].T + p["b2"])
    return {"h1": h1, "h2": h2}


CELL = Cell("stacked_rnn", step, reference, output="h2", doc=__doc__)

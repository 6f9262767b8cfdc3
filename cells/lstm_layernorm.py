"""LSTM with layer normalization (Ba, Kiros and Hinton, "Layer normalization", 2016, eqs. 20-22).

    (i, f, g, o) = LN(x W_ih + b_ih; a_x, b_x) + LN(h W_hh; a_h, b_h)    (each over all 4 * hidden gate values)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(LN(c'; a_c, b_c))                          (over the hidden units)

    LN(v; a, b) = a * (v - mean(v)) / sqrt(var(v) + 1e-5) + b,  var(v) = mean(v^2) - mean(v)^2

Gate order i, f, g, o as in torch.nn.LSTM; ``ln_x_g``/``ln_x_b``, ``ln_h_g``/``ln_h_b`` (4 slices) and
``ln_c_g``/``ln_c_b`` (one) are the normalizations' gains and biases (the paper's alpha and beta; torch's
LayerNorm weight and bias), and stand in for the recurrent bias. The cell state c keeps its value before the
normalization, as in the paper. The input projection's bias ``b_ih`` comes before its normalization (zero it
for the paper's form). Each mean and mean square is a sum over units (``c.mean``): the input's and the
product's in the step's first phase, the cell state's in its second, so a step meets at three grid barriers on the
GPU: after the first phase (the blocks' partials of the gates' sums), after the second (the cell state's) and at
its end (the new state), each block then adding every block's partials itself (``schedules/persistent_sums.py``).
"""

import numpy as np
from tvm import te, tirx

from prnn_tvm.frontend.cell import Cell

EPS = 1e-5  # torch.nn.LayerNorm's


def step(c):
    H = c.hidden
    x, h, cs = c.input(4), c.state("h"), c.state("c")
    W = c.weight("W_hh", 4)
    gains = {name: c.param(f"ln_{name}_g", 4 if name != "c" else 1) for name in ("x", "h", "c")}
    biases = {name: c.param(f"ln_{name}_b", 4 if name != "c" else 1) for name in ("x", "h", "c")}
    hw = c.matvec(h, W, name="hw")
    eps = tirx.const(EPS, c.dtype)

    def moments(value, name, width):
        """The mean and 1 / sqrt(variance + eps) of each row of ``value`` (``width`` columns)."""
        square = c.pointwise(lambda row, j: value[row, j] * value[row, j], name=f"{name}_sq", slices=width // H)
        mean, mean_sq = c.mean(value, f"{name}_mean"), c.mean(square, f"{name}_mean_sq")
        scale = c.pointwise(lambda row, j: 1.0 / te.sqrt(mean_sq[row, j] - mean[row, j] * mean[row, j] + eps),
                            name=f"{name}_scale")
        return mean, scale

    x_mean, x_scale = moments(x, "x", 4 * H)
    h_mean, h_scale = moments(hw, "h", 4 * H)

    def gate(k, act, name):
        def pre(row, j):
            col = k * H + j
            normed_x = (x[row, col] - x_mean[row, j]) * x_scale[row, j] * gains["x"][col] + biases["x"][col]
            normed_h = (hw[row, col] - h_mean[row, j]) * h_scale[row, j] * gains["h"][col] + biases["h"][col]
            return act(normed_x + normed_h)
        return c.pointwise(pre, name=name)

    i, f = gate(0, te.sigmoid, "i"), gate(1, te.sigmoid, "f")
    g, o = gate(2, te.tanh, "g"), gate(3, te.sigmoid, "o")
    c_new = c.pointwise(lambda row, j: f[row, j] * cs[row, j] + i[row, j] * g[row, j], name="c_new")
    c_mean, c_scale = moments(c_new, "c", H)
    h_new = c.pointwise(lambda row, j: o[row, j] * te.tanh((c_new[row, j] - c_mean[row, j]) * c_scale[row, j]
                                                           * gains["c"][j] + biases["c"][j]), name="h_new")
    return {"h": h_new, "c": c_new}


def _layer_norm(v, gain, bias):
    mean = v.mean(axis=1, keepdims=True)
    return (v - mean) / np.sqrt(v.var(axis=1, keepdims=True) + EPS) * gain + bias


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference(x, state, p):
    gates = (_layer_norm(x, p["ln_x_g"], p["ln_x_b"])
             + _layer_norm(state["h"] @ p["W_hh"].T, p["ln_h_g"], p["ln_h_b"]))
    i, f, g, o = np.split(gates, 4, axis=1)
    c = _sigmoid(f) * state["c"] + _sigmoid(i) * np.tanh(g)
    return {"h": _sigmoid(o) * np.tanh(_layer_norm(c, p["ln_c_g"], p["ln_c_b"])), "c": c}


CELL = Cell("lstm_layernorm", step, reference, output="h", doc=__doc__)

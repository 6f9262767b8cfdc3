"""sLSTM, the scalar LSTM of xLSTM (Beck et al. 2024), as FlashRNN's ``slstm`` computes it (gate order i, f, z, o).

    i~, f~, z~, o~ = x W_ih + b_ih + R h + b_hh   (each gate's slice of the projection, product and bias)
    log f = logsigmoid(f~)                         (a sigmoid forget gate, in log space)
    m'    = i~ where n == 0, else max(log f + m, i~)   (the stabilizer)
    i'    = exp(i~ - m'),  f' = min(1, exp(log f + m - m'))   (exponential gates, stabilized)
    c'    = f' c + i' tanh(z~),  n' = max(f' n + i', 1),  h' = sigmoid(o~) c' / n'

States h (exchanged), c, n, m (the cell's own). Heads: ``slstm_h<N>`` splits R into N heads (xLSTM's
block-diagonal recurrence). Choices, after FlashRNN 1.0.8 (``vanilla/slstm.py``, ``fused/slstm_fused_pointwise.cuh``):
a sigmoid forget gate (the paper offers exp too); the first step from zero states (n == 0) takes m' = i~, so
n' = 1; n' is at least 1 (only rounding or an initial n below 1 makes the bound bite); f' is at most 1, as
FlashRNN bounds it: that first step's m' = i~ may lie far below log f + m, where exp overflows, and f' multiplies
c = n = 0 there (FlashRNN's same bound on i' is left out: m' >= i~ keeps i' at most 1). logsigmoid(v) is written
min(v, 0) - log(1 + exp(-|v|)), finite for every v.

FlashRNN's layout maps onto the layer's as reshapes: its projected input Wx[B, T, gates, heads, D] is this
cell's input projection (T, B, gates * hidden) with column g * hidden + head * D + d; R[gates, heads, D, D]
(output unit, then input unit) is ``R`` of ``slstm_h<heads>`` reshaped to (gates * hidden, D); b[gates, heads, D]
is ``b_hh`` flattened; its states (y, c, n, m) are h, c, n, m. Beck, Poeppel, Spanring, Auer, Prudnikova, Kopp,
Klambauer, Brandstetter and Hochreiter, "xLSTM: Extended Long Short-Term Memory", NeurIPS 2024.
"""

import numpy as np
from tvm import te, tirx

from prnn_tvm.frontend.cell import Cell


def step(c):
    H = c.hidden
    x, h, cs, n, m = c.input(4), c.state("h"), c.state("c"), c.state("n"), c.state("m")
    R, b = c.weight("R", 4), c.param("b_hh", 4)
    rh = c.matvec(h, R, name="rh")
    zero, one = tirx.const(0.0, c.dtype), tirx.const(1.0, c.dtype)

    def pre(k):
        return c.pointwise(lambda row, j: x[row, k * H + j] + rh[row, k * H + j] + b[k * H + j],
                           name="ifzo"[k] + "_pre")

    i_pre, f_pre, z_pre, o_pre = (pre(k) for k in range(4))
    log_f = c.pointwise(lambda row, j: te.min(f_pre[row, j], zero) - te.log(one + te.exp(-te.abs(f_pre[row, j]))),
                        name="log_f")
    m_new = c.pointwise(lambda row, j: tirx.Select(n[row, j] == zero, i_pre[row, j],
                                                 te.max(log_f[row, j] + m[row, j], i_pre[row, j])), name="m_new")
    i_gate = c.pointwise(lambda row, j: te.exp(i_pre[row, j] - m_new[row, j]), name="i_gate")
    f_gate = c.pointwise(lambda row, j: te.min(one, te.exp(log_f[row, j] + m[row, j] - m_new[row, j])),
                         name="f_gate")
    c_new = c.pointwise(lambda row, j: f_gate[row, j] * cs[row, j] + i_gate[row, j] * te.tanh(z_pre[row, j]),
                        name="c_new")
    n_new = c.pointwise(lambda row, j: te.max(f_gate[row, j] * n[row, j] + i_gate[row, j], one), name="n_new")
    h_new = c.pointwise(lambda row, j: te.sigmoid(o_pre[row, j]) * c_new[row, j] / n_new[row, j], name="h_new")
    return {"h": h_new, "c": c_new, "n": n_new, "m": m_new}


def _logsigmoid(v):
    return np.minimum(v, 0.0) - np.log1p(np.exp(-np.abs(v)))


def reference(x, state, p):
    i, f, z, o = np.split(x + state["h"] @ p["R"].T + p["b_hh"], 4, axis=1)
    log_f = _logsigmoid(f)
    m = np.where(state["n"] == 0.0, i, np.maximum(log_f + state["m"], i))
    i_gate, f_gate = np.exp(i - m), np.minimum(1.0, np.exp(log_f + state["m"] - m))
    c = f_gate * state["c"] + i_gate * np.tanh(z)
    n = np.maximum(f_gate * state["n"] + i_gate, 1.0)
    return {"h": 1.0 / (1.0 + np.exp(-o)) * c / n, "c": c, "n": n, "m": m}


# An exponential gate's output moves by its pre-activation's error times itself (a sigmoid's by at most a quarter
# of it), and h divides by the normalizer: an H200 measured float16 kernels at 1.01-1.07x the LSTM's bound at T=7
# (hidden 128-1024, batch 4-33), bfloat16 at 1.02x.
CELL = Cell("slstm", step, reference, output="h", doc=__doc__, error_gain=2.0)

"""FlashRNN (NX-AI, ICLR 2025; PyPI ``flashrnn``) as a baseline: its layouts as a prnn-tvm layer's, and its call.

FlashRNN's ``flashrnn(Wx, R, b, function=..., backend=..., dtype=...)`` takes the projected input
``Wx[B, T, gates, heads, D]``, the recurrent weights ``R[gates, heads, D, D]`` (a head's output unit, then its
input unit) and biases ``b[gates, heads, D]``, and returns every step's states ``[states, B, T, heads, D]``
(``h`` first: y, c for its LSTM; y, c, n, m for its sLSTM) and the last ones. A layer of ``lstm_h<heads>`` or
``slstm_h<heads>`` (``prnn_tvm.frontend.heads``; gate order i, f, z/g, o in both) takes the same numbers as
reshapes: :func:`projection` (the recurrent kernel's ``xp``), :func:`recurrent` (``W_hh`` / ``R``) and :func:`bias`
(``b_hh``); :func:`states` reads FlashRNN's result back as (T, B, hidden) sequences. Each works on NumPy arrays
and torch tensors alike.
"""

from __future__ import annotations

BACKENDS = ("cuda_fused", "cuda", "triton_fused")  # FlashRNN 1.0.8's fused CUDA, alternating CUDA, fused Triton
FUNCTIONS = {"lstm": "lstm", "slstm": "slstm"}  # prnn-tvm's cell -> FlashRNN's function of the same math


def projection(Wx):
    """``Wx[B, T, gates, heads, D]`` as a layer's input projection (T, B, gates * hidden), column ``g * hidden +
    head * D + d``."""
    B, T = Wx.shape[0], Wx.shape[1]
    return Wx.reshape(B, T, -1).swapaxes(0, 1)


def recurrent(R):
    """``R[gates, heads, D, D]`` as a head-wise weight (gates * hidden, D): row ``g * hidden + head * D + d``."""
    return R.reshape(-1, R.shape[-1])


def bias(b):
    """``b[gates, heads, D]`` as a per-unit bias of ``gates * hidden``."""
    return b.reshape(-1)


def states(result, index: int = 0):
    """State ``index`` (0: h) of FlashRNN's ``[states, B, T, heads, D]`` as a (T, B, hidden) sequence."""
    B, T = result.shape[1], result.shape[2]
    return result[index].reshape(B, T, -1).swapaxes(0, 1)


def call(cell: str, Wx, R, b, backend: str, dtype: str):
    """FlashRNN's forward of ``cell`` (``lstm``, ``slstm``) on its own layouts, from zero states: ``[states, B, T,
    heads, D]`` (torch tensors on the GPU; ``flashrnn`` is imported here, where it is installed)."""
    from flashrnn import flashrnn  # a GPU machine's: bench/against_flashrnn.py says how to install it

    out, _ = flashrnn(Wx, R, b, function=FUNCTIONS[cell], backend=backend, dtype=dtype)
    return out

"""torch.nn's own kernels for a layer prnn-tvm cannot compile, so that a module never refuses what torch.nn runs.

Where no config of prnn-tvm's places a layer (``ConfigError`` from the compile: weights that do not fit on chip, as
``nn.LSTM(2048, 2048)`` in float32 on an H100; a dtype no GPU template takes; on the GPU in a training call, a
backward that does not fit), a module of a cell torch.nn has (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) runs
that layer through torch's ``_VF`` functions, the ones ``torch.nn.LSTM``/``GRU``/``RNN`` call (cuDNN on the GPU),
on the module's own Parameters: no copy, and gradients reach them. It logs the first such layer (WARNING) and
notes each in ``module.fallback_notes[(batch, device, dtype, layer)]``. Other cells, and modules made with a
``config`` (the caller's choice of kernel), keep the compile's error.
"""

from __future__ import annotations

import logging

import torch  # PyTorch itself: absolute import
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from prnn_tvm.deferred import compile_training
from prnn_tvm.errors import ConfigError

from .arguments import parameter_suffix

log = logging.getLogger(__name__)

TORCH_CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")  # the cells torch.nn has: torch._VF's function of each
_TORCH_ORDER = ("W_ih", "W_hh", "b_ih", "b_hh")  # a layer and direction's weights in torch's flat list


def refusal(module, layer: int, batch: int, device: torch.device, dtype: torch.dtype, input_size: int, grad: bool):
    """Why layer ``layer`` of ``module`` runs on torch.nn's kernels for ``batch`` rows on ``device`` in ``dtype``
    taking ``input_size`` features, or None where prnn-tvm's kernels run it (compiled here on first use, and the
    answer kept). Only for a cell torch.nn has, and a module without a config of the caller's (who asked for that
    config: its refusal is theirs to see); any other lets the compile's error reach the caller."""
    if not (isinstance(module.cell, str) and module.cell in TORCH_CELLS) or module.config is not None:
        return None
    training = grad and device.type == "cuda"  # the CPU build trains every layer it compiles
    key = (batch, device.type, device.index, dtype, input_size, training)
    if key not in module._fallbacks:
        first, compiled = not any(module._fallbacks.values()), None
        try:
            compiled = module.layer_for(batch, device, dtype, input_size)
            if training:
                compile_training(compiled)
            module._fallbacks[key] = None
        except ConfigError as err:
            what = "its kernel" if compiled is None else "its training kernels"
            module._fallbacks[key] = f"prnn-tvm cannot compile {what}: {err}"
            (log.warning if first else log.info)(
                "%s: layer %d (batch %d, %s, %s) runs on torch.nn's kernels: %s",
                type(module).__name__,
                layer,
                batch,
                device,
                dtype,
                module._fallbacks[key],
            )
    reason = module._fallbacks[key]
    if reason is not None:
        module.fallback_notes[(batch, str(device), dtype, layer)] = f"torch.nn's kernels: {reason}"
    return reason


def run_in_torch(module, layer: int, x: torch.Tensor, initial: list, lengths, padding) -> tuple:
    """Layer ``layer`` of ``module`` (both directions where it has two) on ``x`` (T, rows, F), through torch's
    ``_VF`` function of its cell with the module's Parameters: ``(out, ends)``, out (T, rows, directions x H) as
    the module's kernels give it, ``ends`` per state (directions, rows, H). ``initial``: per state (slots, rows,
    H), or [] for zeros; ``lengths``: each row's steps, or None; ``padding``
    (:class:`~prnn_tvm.torch.buckets.Padding`): where rows were padded, torch runs the caller's alone and the
    padded rows come back as a row of length 0 does from the kernels (zeros, their zero initial states)."""
    rows, directions = x.shape[1], 2 if module.bidirectional else 1
    if padding is not None:  # torch packs no row of length 0: the caller's rows alone
        x, lengths = x[:, : padding.rows].contiguous(), padding.lengths
        initial = [t[:, : padding.rows] for t in initial]
    B, H = x.shape[1], module.hidden_size
    slots = slice(layer * directions, (layer + 1) * directions)
    hx = [t[slots].contiguous() for t in initial] or [x.new_zeros(directions, B, H) for _ in module._states]
    arguments = _TORCH_ORDER if module.bias else _TORCH_ORDER[:2]
    weights = [
        module._tracked(module._names[arg] + parameter_suffix(layer, direction))
        for direction in range(directions)
        for arg in arguments
    ]
    run = getattr(torch._VF, module.cell)
    options = (module.bias, 1, 0.0, module.training, directions == 2)  # dropout between layers: the caller's
    if lengths is None:
        out, *ends = run(x, _state(hx), weights, *options, False)
    else:  # as torch.nn runs a PackedSequence: sorted by length, states in that order
        packed = pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False)
        order, back = packed.sorted_indices, packed.unsorted_indices
        data, *ends = run(
            packed.data, packed.batch_sizes, _state([h.index_select(1, order) for h in hx]), weights, *options
        )
        out, _ = pad_packed_sequence(PackedSequence(data, packed.batch_sizes, order, back), total_length=x.shape[0])
        ends = [e.index_select(1, back) for e in ends]
    if rows > B:
        out = torch.nn.functional.pad(out, (0, 0, 0, rows - B))
        ends = [torch.nn.functional.pad(e, (0, 0, 0, rows - B)) for e in ends]
    return out, ends


def _state(hx: list):
    """The initial states as torch's function of the cell takes them: a tuple (LSTM's ``(h, c)``), or the one."""
    return tuple(hx) if len(hx) > 1 else hx[0]

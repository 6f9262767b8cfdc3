"""Packed and reversed sequences as a call runs them: a ``PackedSequence`` as its padded batch with per-row
lengths and back, and each row read backwards within its own length (a bidirectional layer's reverse
direction)."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence


def reversal_within(lengths: torch.Tensor, steps: int):
    """A function that reverses each row of a (T, B, F) sequence within its own length (a row of length n:
    steps n-1..0, then its padding where it was); applied twice it is the identity."""
    t = torch.arange(steps, device=lengths.device, dtype=lengths.dtype)[:, None]
    index = torch.where(t < lengths, lengths - 1 - t, t).long()  # (T, B)

    def reverse(sequence: torch.Tensor) -> torch.Tensor:
        return sequence.gather(0, index[:, :, None].expand_as(sequence))

    return reverse


def unpacked(packed: PackedSequence) -> tuple:
    """``(padded, lengths, sorted_steps)``: the (T, B, F) padded batch and each row's length (int32, on its
    device) in the caller's batch order, and the lengths in the packing's (descending) order on the CPU.
    Nothing waits for the GPU: the rows are reordered on the device (``pad_packed_sequence`` itself would
    read the order back to the host), the lengths, known on the host, go up by an asynchronous copy."""
    padded, sorted_steps = pad_packed_sequence(PackedSequence(packed.data, packed.batch_sizes))
    lengths = sorted_steps.to(torch.int32)
    if padded.device.type == "cuda":
        lengths = lengths.pin_memory().to(padded.device, non_blocking=True)
    if packed.unsorted_indices is not None:
        order = packed.unsorted_indices
        padded, lengths = padded.index_select(1, order), lengths.index_select(0, order.to(lengths.device))
    return padded, lengths, sorted_steps


def packed_like(packed: PackedSequence, padded: torch.Tensor, sorted_steps: torch.Tensor) -> PackedSequence:
    """A padded (T, B, F) output in the caller's batch order, packed as the input ``packed`` was."""
    if packed.sorted_indices is not None:
        padded = padded.index_select(1, packed.sorted_indices)
    data = pack_padded_sequence(padded, sorted_steps, enforce_sorted=True).data
    return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)

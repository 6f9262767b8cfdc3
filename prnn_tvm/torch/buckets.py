"""Batch buckets: the batch sizes a module compiles for, the padding of a call's rows up to one of them, and the
bounded set of batch sizes whose compiled layers a module keeps.

Batch is a compile-time constant of a kernel, so without buckets every new batch size compiles a layer (seconds:
TVM, and nvcc on the GPU) and keeps it. With them a call of ``B`` rows runs the layers compiled for the smallest
bucket of at least ``B`` rows: its input and initial states are padded with zero rows and only the caller's rows
come back. Rows never meet in a kernel (each row's recurrence reads its own state alone), so the padded rows cannot
change the caller's; where autograd tracks the call, or rows have lengths, the padded rows get length 0 (the kernels
keep a row past its length at its initial state and write zeros), so that nothing of them reaches a product or a
weight's gradient either; an inference call without lengths runs them on zeros and slices them off.

The default buckets: powers of two up to 64, then multiples of 64 (a batch of 1..64 compiles at most 7 layers).
At small batch a persistent step is its barrier and the reads of weights that stay on chip, and a padded row adds
only its share of the exchanged state (``rows x hidden``) and of the products, so padding up to the next power of
two costs little while halving the kernels per doubling; from 64 rows up the products dominate and grow with the
rows, and multiples of 64 waste at most 63 rows (under half from 65 rows, under a quarter from 256). (Reasoned, not
yet measured per row on the GPU.) On the GPU a half layer's products run on tensor cores,
whose tile takes 8 rows (``mma`` m16n8k16's N): its kernel already pads the batch to 8, so its buckets start at 8.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import NamedTuple

import torch  # PyTorch itself: absolute import

from prnn_tvm.dtypes import POLICIES, mma_dims
from prnn_tvm.errors import ConfigError

log = logging.getLogger(__name__)

POWERS_UP_TO = 64  # the default buckets: powers of two up to this, then its multiples
KEPT_BATCH_SIZES = 8  # the default bound on the batch sizes (with device and dtype) a module keeps layers for
_POLICY_OF = {getattr(torch, p.torch_type): p for p in POLICIES.values()}  # a torch dtype's policy


class Padding(NamedTuple):
    """What a padded call had before its rows were padded: ``rows`` the caller's batch, ``lengths`` the caller's
    per-row lengths (None: every row runs the whole sequence)."""

    rows: int
    lengths: torch.Tensor | None


def checked_buckets(value, kind: str = "module"):
    """``batch_buckets`` as a module keeps it: True (the default buckets), False (every batch size exact), or a
    sorted tuple of distinct positive batch sizes; ConfigError naming the option otherwise."""
    if value is True or value is False:
        return value
    sizes = None
    if isinstance(value, (list, tuple, range)) and value:
        sizes = tuple(value)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            sizes = None
    if sizes is None:
        raise ConfigError(
            f"{kind}: batch_buckets must be True (powers of two up to {POWERS_UP_TO}, then multiples of it), "
            f"False (compile every batch size exactly) or a non-empty list of positive batch sizes, got {value!r}"
        )
    return tuple(sorted(set(sizes)))


def checked_bound(value, kind: str = "module") -> int:
    """``kept_batch_sizes``: a positive int; ConfigError naming the option otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{kind}: kept_batch_sizes must be a positive whole number (an int), got {value!r}")
    return value


def row_tile(device: torch.device, dtype: torch.dtype) -> int:
    """The rows a kernel's products take at once on ``device`` in ``dtype``: a tensor-core tile's columns (N of
    the dtype's ``mma`` shape) for a half layer on the GPU, else 1."""
    policy = _POLICY_OF.get(dtype)
    if device.type != "cuda" or policy is None or policy.mma is None:
        return 1
    return mma_dims(policy.mma.shape)[1]


def bucket(batch: int, buckets, tile: int = 1) -> int:
    """The rows a call of ``batch`` rows runs with: ``batch`` itself (``buckets`` False); the smallest of
    ``buckets`` (a sorted tuple) of at least ``batch``, past the largest a multiple of it; or (True) the smallest
    power of two of at least ``max(batch, tile)`` up to :data:`POWERS_UP_TO`, past it a multiple of it."""
    if buckets is False:
        return batch
    if buckets is True:
        if batch > POWERS_UP_TO:
            return -(-batch // POWERS_UP_TO) * POWERS_UP_TO
        return 1 << (max(batch, tile) - 1).bit_length()
    for size in buckets:
        if size >= batch:
            return size
    return -(-batch // buckets[-1]) * buckets[-1]


def padded(x: torch.Tensor, initial: list, lengths: torch.Tensor | None, rows: int, stop: bool) -> tuple:
    """``(x, initial, lengths)`` with zero rows appended up to ``rows``: ``x`` (T, B, F), each initial state
    (slots, B, H). ``stop``: the padded rows get length 0 (the caller's rows theirs, or the whole sequence), so that
    nothing of them reaches a product or a weight's gradient (a call autograd tracks, or one with lengths); else
    they run the whole sequence on zeros, to be sliced off (rows never meet in a kernel: no lengths to make)."""
    extra = rows - x.shape[1]
    x = torch.nn.functional.pad(x, (0, 0, 0, extra))
    initial = [torch.nn.functional.pad(t, (0, 0, 0, extra)) for t in initial]
    if not stop:
        return x, initial, None
    steps = torch.full((rows,), x.shape[0], dtype=torch.int32, device=x.device)
    if lengths is not None:
        steps[: rows - extra] = lengths
    steps[rows - extra :] = 0
    return x, initial, steps


def rows_dropout(out: torch.Tensor, p: float, padding: Padding | None) -> torch.Tensor:
    """torch.nn's dropout between layers (training mode) on the caller's rows of ``out`` (T, rows, F) alone: the
    masks torch draws for them are those torch.nn draws for the same call (padded rows draw none)."""
    if padding is None:
        return torch.nn.functional.dropout(out, p, training=True)
    real = torch.nn.functional.dropout(out[:, : padding.rows], p, training=True)
    return torch.cat([real, out[:, padding.rows :]], dim=1)


class KeptShapes:
    """The batch sizes a module keeps compiled layers for, least recently used first: ``(batch, device type,
    device index, dtype)`` groups (every layer, stack and direction pair of one batch size). A group used while a
    CUDA graph was captured is pinned: the graph launches its kernels and reads its states, so it stays."""

    def __init__(self):
        self._order: OrderedDict = OrderedDict()  # group -> pinned

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, group) -> bool:
        return group in self._order

    def pinned(self) -> bool:
        """Whether a group was used while a CUDA graph was captured."""
        return any(self._order.values())

    def use(self, group: tuple, bound: int, pinned: bool = False) -> list:
        """Mark ``group`` used now (and ``pinned``); return the groups to forget, least recently used first, so
        that at most ``bound`` are kept (pinned ones and ``group`` itself are never forgotten)."""
        order = self._order
        if order and not pinned and next(reversed(order)) == group and len(order) <= bound:
            return []  # the most recent already (a loop of calls of one batch size): nothing moves
        self._order[group] = self._order.get(group, False) or pinned
        self._order.move_to_end(group)
        excess = len(self._order) - bound
        if excess <= 0:
            return []
        gone = [g for g, pin in self._order.items() if not pin and g != group][:excess]
        for g in gone:
            del self._order[g]
        return gone


class BatchBuckets:
    """The part of a prnn_tvm.torch module that runs a call with the rows of a bucket and bounds the compiled
    layers it keeps (see the module's doc). Its options: :attr:`batch_buckets`, :attr:`kept_batch_sizes`. It keeps
    ``_kept`` (:class:`KeptShapes`) and drops, with a batch size, what the module keeps for it: ``_layers`` (their
    launchers, argument lists and training kernels with them), ``_launch_notes``, ``_fallbacks``, ``_plans``, the notes
    (``stack_notes``, ``direction_notes``, ``fallback_notes``) and constants of its rows. Runs the rows through
    ``_run_rows`` (:class:`~prnn_tvm.torch.dispatch.Dispatch`)."""

    _batch_buckets = True
    _kept_batch_sizes = KEPT_BATCH_SIZES

    @property
    def batch_buckets(self):
        """The batch sizes the module compiles for: True (the default: powers of two up to 64, from 8 for a half
        module on the GPU, then multiples of 64), False (every batch size exactly, no padding), or a list of sizes
        (a call runs with the smallest of at least its rows; past the largest, a multiple of it)."""
        return self._batch_buckets

    @batch_buckets.setter
    def batch_buckets(self, value) -> None:
        self._batch_buckets = checked_buckets(value, type(self).__name__)

    @property
    def kept_batch_sizes(self) -> int:
        """How many batch sizes (each with its device and dtype) keep their compiled layers: past it the least
        recently called one's are dropped, and their memory with them (compiled again if called again; from the
        layer cache on disk, where it has them). Batch sizes called while a CUDA graph was captured stay."""
        return self._kept_batch_sizes

    @kept_batch_sizes.setter
    def kept_batch_sizes(self, value) -> None:
        self._kept_batch_sizes = checked_bound(value, type(self).__name__)

    def rows_for(self, batch: int, device: torch.device, dtype: torch.dtype | None = None) -> int:
        """The rows a call of ``batch`` rows runs with on ``device`` in ``dtype`` (the parameters'): the batch its
        layers are compiled for (:attr:`batch_buckets`)."""
        dtype = self.dtype if dtype is None else dtype
        return bucket(batch, self._batch_buckets, row_tile(device, dtype))

    def _run_layers(self, x: torch.Tensor, initial: list, lengths: torch.Tensor | None, grad: bool) -> tuple:
        """Every layer and direction on ``x`` (time-major, compact) from ``initial`` (per state, (slots, B, H), or
        [] for zeros), with the rows of ``x``'s bucket: ``(out, finals)`` of the caller's rows, finals per state a
        list of (B, H) per layer and direction."""
        B, device = x.shape[1], x.device
        rows = self.rows_for(B, device, x.dtype)
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        self._keep((rows, device.type, device.index, x.dtype), pinned=capturing)
        if rows == B:
            return self._run_rows(x, initial, lengths, grad)
        stop = grad or lengths is not None
        out, finals = self._run_rows(*padded(x, initial, lengths, rows, stop), grad, Padding(B, lengths))
        return out[:, :B].contiguous(), [[f[:B] for f in state] for state in finals]

    def _keep(self, group: tuple, pinned: bool = False) -> None:
        """Mark the batch size ``group`` (``(batch, device type, device index, dtype)``) used now; drop the least
        recently used ones past :attr:`kept_batch_sizes`."""
        for gone in self._kept.use(group, self._kept_batch_sizes, pinned):
            self._forget(gone)

    def _forget(self, group: tuple) -> None:
        """Drop what the module keeps for the batch size ``group``: its compiled layers (their memory goes with the
        last reference: a call's autograd graph may still hold one), their launchers and argument lists, its notes
        and refusals, and constants of its rows (unless a CUDA graph may read one)."""
        batch, kind, index, dtype = group
        device = torch.device(kind, index)
        dropped = [self._layers.pop(key) for key in [key for key in self._layers if key[:4] == group]]
        # the layers' ids, and their training kernels' and projected launches' (which launch by their own)
        ids = {id(kernel) for layer in dropped for kernel in (layer, *layer._derived_runtimes())}
        for kept in (self._launch_notes, self._fallbacks):
            for key in [key for key in kept if key[:4] == group]:
                del kept[key]
        for notes in (self.stack_notes, self.direction_notes, self.fallback_notes):
            for key in [key for key in notes if key[:3] == (batch, str(device), dtype)]:
                del notes[key]
        self._plans.clear()  # repeated calls' plans hold layers (:mod:`~prnn_tvm.torch.repeat`)
        for by_layer in (self._launchers, self._arguments):  # keyed by the layers' ids, which new objects reuse
            for key in [key for key in by_layer if key[0] in ids]:
                del by_layer[key]
        if not self._kept.pinned():
            for key in [key for key in self._constants if key[0][:1] == (batch,) and key[1] == device]:
                del self._constants[key]
        log.info(
            "%s: dropped the %d compiled layers of batch %d on %s (%s)",
            type(self).__name__,
            len(dropped),
            batch,
            device,
            dtype,
        )

"""The rows of a repeated call's initial states as its launches take them, kept for the tensors they are views of.

A planned call (:mod:`~prnn_tvm.torch.repeat`) passes each layer's initial states to its launch as a (B, H) row
of the (layers, B, H) state the caller gave (an unbatched call's (layers, H): rows of (1, H)). Taking those rows
costs the host a torch view each (about a microsecond), call after call, while a decoder gives either the same
tensors again or the ones the previous call returned. :class:`StateRows` keeps the rows of both, so such a call
takes none. A row is a view of its state, so what is written into the state in place is what the next launch
reads; rows are kept only while every state is the same object at the same address and still contiguous (else
they are taken again), and only where no row is a copy (a row off a 64-byte boundary, copied as kernels take
it, would go stale).
"""

from __future__ import annotations

from .arguments import aligned_state


class StateRows:
    """A plan's rows of the states it was last given and of those it last returned (see the module's doc): each
    ``(states, their addresses, rows)``, or None."""

    __slots__ = ("given", "returned")

    def __init__(self):
        self.given = self.returned = None

    def rows(self, hx, layers: int, unbatched: bool) -> list:
        """The rows of the states ``hx`` (a tuple of (layers, B, H) tensors, or (layers, H) where ``unbatched``) in
        launch order: layer by layer, the cell's states in order within a layer."""
        for kept in (self.returned, self.given):
            if kept is not None and _holds(kept, hx):
                return kept[2]
        split = [t.split(1) if unbatched else t.unbind(0) for t in hx]
        views = [s[layer] for layer in range(layers) for s in split]
        rows = [aligned_state(v) for v in views]
        if all(r is v for r, v in zip(rows, views)) and all(t.is_contiguous() for t in hx):
            self.given = _kept(hx, rows)
        return rows

    def returning(self, finals, rows: list) -> None:
        """Keep ``rows`` (launch order) as those of ``finals``, the states a call returns: views of them that the
        call's launch wrote, each on a 64-byte boundary."""
        self.returned = _kept(finals, rows)


def _kept(states, rows: list) -> tuple:
    states = tuple(states)
    return states, tuple([t.data_ptr() for t in states]), rows  # a list's comprehension: faster than a generator's


def _holds(kept: tuple, hx) -> bool:
    """Whether ``hx`` are the states ``kept`` was made of, each where it was and contiguous (its shape: the plan's)."""
    states, addresses, _ = kept
    if len(hx) != len(states):
        return False
    for t, k, address in zip(hx, states, addresses):
        if t is not k or t.data_ptr() != address or not t.is_contiguous():
            return False
    return True


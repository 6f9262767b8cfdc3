"""Heads: a cell whose recurrent products are block-diagonal, each head of units reading only its own.

A weight declared with ``heads`` (``c.weight(name, slices, heads=N)``) is ``(slices * hidden, hidden / N)``:
the hidden units form N heads of ``D = hidden / N`` consecutive units, and row ``s * hidden + n * D + d`` (gate
``s`` of unit ``d`` of head ``n``) multiplies only head ``n``'s units. ``c.matvec`` over it is the head-wise
product; the analysis finds it (``Reduction.heads``) and the templates place it: a block holds only its heads'
weights and multiplies only its heads' part of the state.

:func:`headed` makes every recurrent product of a cell head-wise without touching its file (``lstm_h12``: an
LSTM of 12 heads, FlashRNN's "LSTM with heads"); :func:`block_diagonal` and :func:`diagonal_blocks` convert
between a head-wise weight and the dense matrix it stands for (what a NumPy reference multiplies, and how a
dense gradient becomes the weight's).
"""

from __future__ import annotations

import numpy as np

from ..errors import CellError
from .cell import Cell, CellBuilder
from .stack import Renamed


def headed(cell: Cell, heads: int) -> Cell:
    """``cell`` with every recurrent weight split into ``heads`` heads (block-diagonal, see the module's doc),
    named ``<cell>_h<heads>``; ``cell`` itself for one head. Its NumPy reference is the base cell's on the
    block-diagonal dense weights. The base cell declares no heads of its own; ``hidden`` must be a multiple of
    ``heads`` (refused where the cell is traced)."""
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise CellError(f"heads must be a positive integer, got {heads!r}")
    if heads == 1:
        return cell

    def step(c: CellBuilder):
        return cell.step(_HeadedBuilder(c, heads, cell.name))

    def reference(x, state, p):  # the weights are the matrices among the params (the others are vectors)
        return cell.step_reference(
            x,
            state,
            {name: block_diagonal(value, heads) if np.ndim(value) == 2 else value for name, value in p.items()},
        )

    doc = (
        f"'{cell.name}' with {heads} heads: each recurrent product block-diagonal, a head's units reading only "
        f"its own (prnn_tvm.frontend.heads).\n\n" + cell.doc
    )
    return Cell(
        f"{cell.name}_h{heads}",
        step,
        reference,
        output=cell.output,
        doc=doc,
        delays=cell.delays,
        reversed_states=cell.reversed_states,
        reversed_slices=cell.reversed_slices,
        error_gain=cell.error_gain,
    )


class _HeadedBuilder(Renamed):
    """What the base cell's step sees inside :func:`headed`: its own names, every weight declared with the
    heads."""

    def __init__(self, builder: CellBuilder, heads: int, base: str):
        super().__init__(builder, "")
        self._heads, self._base = heads, base

    def input(self, slices: int = 1, name: str = "x"):
        return self._c.input(slices, name)

    def weight(self, name: str, slices: int = 1, heads: int = 1):
        if heads != 1:
            raise CellError(
                f"cell '{self._base}' declares weight '{name}' with heads={heads} itself; <cell>_h<N> "
                "splits the weights of a cell without heads"
            )
        return self._c.weight(name, slices, self._heads)


def block_diagonal(weight: np.ndarray, heads: int) -> np.ndarray:
    """The dense ``(rows, hidden)`` matrix a head-wise weight ``(rows, hidden / heads)`` stands for (zero outside
    each row's head)."""
    weight = np.asarray(weight)
    rows, D = weight.shape
    hidden = D * heads
    dense = np.zeros((rows, hidden), dtype=weight.dtype)
    dense[np.arange(rows)[:, None], _head_columns(rows, hidden, D)] = weight
    return dense


def diagonal_blocks(dense: np.ndarray, heads: int) -> np.ndarray:
    """The head-wise weight ``(rows, hidden / heads)`` within a dense ``(rows, hidden)`` matrix: each row's head's
    columns (the gradient of a head-wise weight, from its dense gradient)."""
    dense = np.asarray(dense)
    rows, hidden = dense.shape
    return dense[np.arange(rows)[:, None], _head_columns(rows, hidden, hidden // heads)]


def _head_columns(rows: int, hidden: int, D: int) -> np.ndarray:
    """(rows, D): the dense columns of each row's head."""
    return (np.arange(rows) % hidden // D * D)[:, None] + np.arange(D)[None, :]

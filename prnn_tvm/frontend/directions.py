"""Bidirectional layers: a cell's two directions as one cell, run in one persistent launch.

A bidirectional layer (``torch.nn``'s ``bidirectional=True``) runs the cell twice over the same input,
with weights of its own each: the forward direction from the first step on, the reverse direction from
each row's last step back to its first. Its output is both directions' side by side, forward first,
each at the step it read. The directions never read each other's values, so together they are one
cell with twice the states:

- its states, weights and params are the base cell's, renamed per direction (``fwd_h``, ``rev_W_hh``);
- its input projection has twice the base cell's slices, the forward direction's then the reverse
  one's (the layer's ``W_ih`` and ``b_ih`` are both directions' stacked, as one GEMM computes them);
- the reverse direction's states and input slices are *reversed* (:attr:`~prnn_tvm.frontend.cell.Cell
  .reversed_states`): at step ``t`` a row of length ``n`` reads them at step ``n - 1 - t`` and writes
  its output there;
- its output is ``(fwd_<output>, rev_<output>)``: ``2 * hidden`` columns.

The templates give each direction CTAs of its own (layout ``split``: the directions are the plan's
:attr:`~prnn_tvm.frontend.plan.CellPlan.cta_parts`). A bidirectional cell has no backward (training
runs the directions one by one) and does not stack into a wavefront (a layer above reads the whole
of both directions).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import CellError
from .cell import Cell, CellBuilder
from .stack import Renamed, declared_slots

DIRECTIONS = ("fwd", "rev")


def direction_name(direction: int, name: str) -> str:
    """A base cell's declared name in direction ``direction`` (0 forward, 1 reverse): ``rev_W_hh``."""
    return f"{DIRECTIONS[direction]}_{name}"


def split_direction_name(name: str) -> tuple[int, str]:
    """``rev_W_hh`` -> ``(1, "W_hh")``: a bidirectional cell's argument name as its direction and the base
    cell's name."""
    prefix, _, base = name.partition("_")
    if prefix not in DIRECTIONS or not base:
        raise ValueError(f"'{name}' is not a direction's name ({'_<name>, '.join(DIRECTIONS)}_<name>)")
    return DIRECTIONS.index(prefix), base


def bidirectional(cell: Cell) -> Cell:
    """Both directions of ``cell`` as one cell named ``<cell>_bi`` (see the module's doc)."""
    if cell.delays or cell.reversed_states or len(cell.outputs) > 1:
        raise CellError(
            f"cell '{cell.name}' is already a stack or has two directions; make a bidirectional layer of its base cell"
        )
    slots = declared_slots(cell)
    states = [s.name for s in slots if s.role.value == "state"]
    slices = next((s.slices for s in slots if s.role.value == "input"), 1)

    def step(c: CellBuilder):
        shared, updates = {}, {}
        for direction in range(2):
            new = cell.step(_DirectionBuilder(c, direction, shared))
            if not isinstance(new, Mapping):
                return new  # the analysis says what is wrong with the base cell
            updates.update({direction_name(direction, name): value for name, value in new.items()})
        return updates

    def reference(x, state, p):
        new, width = {}, x.shape[1] // 2
        for direction in range(2):
            prefix = direction_name(direction, "")
            mine = {name[len(prefix) :]: value for name, value in state.items() if name.startswith(prefix)}
            params = {name[len(prefix) :]: value for name, value in p.items() if name.startswith(prefix)}
            found = cell.step_reference(x[:, direction * width : (direction + 1) * width], mine, params)
            new.update({prefix + name: value for name, value in found.items()})
        return new

    doc = f"Both directions of '{cell.name}' in one launch (prnn_tvm.frontend.directions).\n\n" + cell.doc
    return Cell(
        f"{cell.name}_bi",
        step,
        reference,
        output=tuple(direction_name(d, cell.output) for d in range(2)),
        doc=doc,
        reversed_states=tuple(direction_name(1, name) for name in states),
        reversed_slices=tuple(range(slices, 2 * slices)),
        error_gain=cell.error_gain,
    )


class _DirectionBuilder(Renamed):
    """Direction ``direction`` of a bidirectional cell: names prefixed, and an input that is its half of
    the shared input projection (declared by the forward direction with twice the slices)."""

    def __init__(self, builder: CellBuilder, direction: int, shared: dict):
        super().__init__(builder, direction_name(direction, ""))
        self._direction, self._shared = direction, shared

    def input(self, slices: int = 1, name: str = "x"):
        if self._direction == 0:
            self._shared["input"] = self._c.input(2 * slices, name), slices
            return self._shared["input"][0]  # the forward slices come first: the base cell reads only those
        x, declared = self._shared["input"]
        if declared != slices:
            raise CellError(f"the base cell's input has {declared} slices in one trace and {slices} in another")
        offset = slices * self.hidden
        return self._c.pointwise(lambda n, j: x[n, offset + j], name=self._name(name), slices=slices)

    def sum(self, value, name: str, columns: int | None = None):
        return super().sum(value, name, self._own_columns(value, columns))

    def mean(self, value, name: str, columns: int | None = None):
        return super().mean(value, name, self._own_columns(value, columns))

    def _own_columns(self, value, columns):
        """The forward direction's input is the shared projection, both directions' slices: its own come first."""
        shared = self._shared.get("input")
        if columns is None and shared is not None and value.same_as(shared[0]):
            return shared[1] * self.hidden
        return columns

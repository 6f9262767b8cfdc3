"""Which columns of each operand a CTA multiplies, where its products are head-wise (``Reduction.heads``).

A CTA owns ``units`` consecutive hidden units from ``cta * units``. A row of a head-wise product with heads of
``D`` units multiplies only the ``D`` units of its unit's head, so a CTA needs only its heads' part of each
operand: its *span*, ``units`` columns where it holds whole heads (``units`` a multiple of ``D``), ``D`` where a
whole number of CTAs share a head (``D`` a multiple of ``units``), every ``hidden`` column for a dense product.
Any other ``units`` is refused: a CTA's heads would straddle its neighbours' unevenly.

The exchanged values of a head-wise operand are laid out by span in the workspace, ``[group][batch row][column
of the span]`` (group: the span's index), so a CTA's part of a tile is one contiguous run per batch row and its
rows are ``span`` apart; a dense operand's single group is the plain ``[batch row][unit]`` layout.

Per thread, the register weights of a row run over ``k < K`` (the largest head size of the CTA's products; zero
past the row's own ``D``), and its operand values start at the row's head within the span
(:func:`head_offset`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tvm import tirx

from prnn_tvm.errors import ConfigError


@dataclass(frozen=True)
class OperandColumns:
    """The head sizes of a CTA's operands at ``units`` per CTA: operand -> the head sizes of the products that read
    it (``hidden`` for a dense one)."""

    hidden: int
    units: int
    sizes: dict

    @classmethod
    def of(cls, reductions, hidden: int, units: int) -> "OperandColumns":
        """From a CTA's products; ConfigError where ``units`` does not fit a head size, or two head-wise products of
        one operand have heads of different sizes. Made once per products, hidden and units in a process (every
        config of a space asks, twice: read it, never change it)."""
        return _columns(tuple(reductions), hidden, units)

    @classmethod
    def _of(cls, reductions: tuple, hidden: int, units: int) -> "OperandColumns":
        sizes: dict = {}
        for r in reductions:
            sizes[r.operand] = sizes.get(r.operand, frozenset()) | {r.head_size(hidden)}
        found = cls(hidden, units, sizes)
        for operand, of in sizes.items():
            headed = sorted(of - {hidden})
            if len(headed) > 1:
                raise ConfigError(f"the products of '{operand}' have heads of {' and '.join(map(str, headed))} units; "
                                  "the head-wise products of one operand take heads of one size")
            if headed and units % headed[0] and headed[0] % units:
                raise ConfigError(f"units_per_cta={units}: with heads of {headed[0]} units a CTA holds whole heads (a "
                                  f"multiple of {headed[0]}) or a whole number of CTAs share a head (a divisor of "
                                  f"{headed[0]})")
        return found

    @property
    def headed(self) -> bool:
        """Whether any product is head-wise (else every column is as for dense products)."""
        return any(of != {self.hidden} for of in self.sizes.values())

    @property
    def k_extent(self) -> int:
        """Weights per row: the largest head size (``hidden`` with a dense product)."""
        return max((D for of in self.sizes.values() for D in of), default=self.hidden)

    def span(self, operand: str) -> int:
        """The columns a CTA multiplies of ``operand``: every one where a dense product reads it, else its heads'."""
        D = min(self.sizes[operand])
        if self.hidden in self.sizes[operand]:
            return self.hidden
        return self.units if self.units % D == 0 else D

    def groups(self, operand: str) -> int:
        """Spans of the operand over the hidden units (the workspace's groups)."""
        return math.ceil(self.hidden / self.span(operand))

    def padded_hidden(self) -> int:
        """Columns per batch row of a workspace that lays every operand out by span."""
        return max((self.groups(op) * self.span(op) for op in self.sizes), default=self.hidden)

    def tile_width(self, k_pad: int) -> int:
        """Columns of a shared operand tile's row: a row's ``k_pad`` reads from its head's first column, the last
        head's running ``k_pad - D`` past the span (zeros there)."""
        return max((self.span(op) + k_pad - min(of) for op, of in self.sizes.items()), default=k_pad)

    def first_column(self, operand: str, cta):
        """The operand's first column that CTA ``cta`` multiplies (its span's)."""
        span = self.span(operand)
        if span == self.hidden:
            return 0
        return cta * self.units // span * span

    def head_offset(self, operand: str, D: int, cta, row_unit):
        """Where, within the CTA's span of ``operand``, the head (of ``D`` units) of the CTA's unit ``row_unit``
        (0 .. units - 1) starts: 0 for a dense product's rows."""
        span = self.span(operand)
        if D == self.hidden or span == D:
            return tirx.const(0, "int32")
        if span == self.units:
            return row_unit // D * D
        return (cta * self.units + row_unit) // D * D - self.first_column(operand, cta)

    def rows_in_one_head(self, row_lo: list, reductions, rows: int) -> bool:
        """Whether every run of ``rows`` consecutive CTA rows from a multiple of ``rows`` (a thread's, or a warp's
        row tiles) that holds rows of a head-wise product holds rows of one of its heads only (they share the
        operand values they multiply). ``row_lo``: each product's first CTA row. Answered once per arguments in a
        process (every config of a space asks, a walk over every CTA row each: ~15 million rows in a test run)."""
        return _rows_in_one_head(tuple(row_lo), tuple(reductions), rows, self.hidden, self.units)


@functools.lru_cache(maxsize=16384)
def _rows_in_one_head(row_lo: tuple, reductions: tuple, rows: int, hidden: int, units: int) -> bool:
    def head(row):
        for lo, r in zip(row_lo, reductions):
            if lo <= row < lo + r.slices * units:
                D = r.head_size(hidden)
                return None if D == hidden else (r.operand, (row - lo) % units // D)
        return None

    total = row_lo[-1] + reductions[-1].slices * units if reductions else 0
    for first in range(0, total, rows):
        found = {head(row) for row in range(first, min(first + rows, total))} - {None}
        if len(found) > 1:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _columns(reductions: tuple, hidden: int, units: int) -> OperandColumns:
    return OperandColumns._of(reductions, hidden, units)


def check_heads(cols: OperandColumns, reductions, rows: int, knob: str, what: str, starts: list | None = None) -> None:
    """ConfigError unless every run of ``rows`` consecutive CTA rows (``what``: a thread's, a warp's row tiles;
    the config's ``knob`` sets ``rows``) lies in one head: they multiply the same operand values.
    ``starts``: each product's first CTA row (default: one after the other, ``slices * units`` rows each)."""
    if not cols.headed:
        return
    if starts is None:
        starts, lo = [], 0
        for r in reductions:
            starts.append(lo)
            lo += r.slices * cols.units
    if not cols.rows_in_one_head(starts, reductions, rows):
        sizes = sorted({D for of in cols.sizes.values() for D in of if D != cols.hidden})
        raise ConfigError(f"{knob}: {what} ({rows} rows) multiply the same state values, so they must lie in one head "
                          f"(of {', '.join(map(str, sizes))} units) at units_per_cta={cols.units}; take a divisor of "
                          "the head size")


def fitting_units(plan, min_units: int) -> set:
    """Units per CTA a tuning space adds for head-wise products (none for dense ones): whole heads (one, two, four
    heads per CTA) and the two smallest divisors of a head size from ``min_units`` (CTAs sharing a head), those
    that fit every head size."""
    H = plan.hidden
    sizes = {r.head_size(H) for r in plan.reductions} - {H}
    found = set()
    for D in sizes:
        found |= {m * D for m in (1, 2, 4) if m * D <= H}
        found |= set([u for u in range(max(1, min_units), D + 1) if D % u == 0][:2])
    return {u for u in found if all(u % D == 0 or D % u == 0 for D in sizes)}

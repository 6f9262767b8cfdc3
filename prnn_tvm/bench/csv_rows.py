"""Benchmark rows to and from CSV by a schema: the columns, which must be there, which are counts and which text.

Both benchmark modes write their rows through it (:mod:`.table`'s sequence rows, :mod:`.step_table`'s step-latency
rows), so a committed CSV reads back with the same types anywhere, without a GPU.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..files import MiB, regular_file


@dataclass(frozen=True)
class CsvSchema:
    """``columns`` in file order; ``required`` those a file must have; ``ints`` the counts and ``texts`` the text
    columns (every other column is a float); ``what`` names such a file in messages, ``defined_in`` the constant
    that lists its columns."""

    what: str
    columns: tuple
    required: tuple
    ints: frozenset
    texts: frozenset
    defined_in: str

    def write(self, rows: list[dict], path: str | Path) -> Path:
        """Write rows with exactly these columns (missing values as empty cells; unknown keys are refused)."""
        for row in rows:
            unknown = set(row) - set(self.columns)
            if unknown:
                raise ValueError(f"not {self.what} columns: {', '.join(sorted(unknown))}")
        path = Path(path)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in self.columns})
        return path

    def read(self, path: str | Path) -> list[dict]:
        """Read rows back: empty cells become None, counts int, figures float. InputError when the file is
        missing, has no rows, lacks a required column or holds a value that is not a number where one belongs."""
        path = Path(path)
        if regular_file(path, self.what, "a .csv file written by prnn-tvm bench", 64 * MiB, InputError) is None:
            raise InputError(f"{path}: no such {self.what}")
        with path.open(newline="", errors="replace") as f:
            reader = csv.DictReader(f)
            missing = [c for c in self.required if c not in (reader.fieldnames or ())]
            if missing:
                raise InputError(
                    f"{path} is not a {self.what}: it has no column(s) {', '.join(missing)} (written by "
                    f"prnn-tvm bench, it has the columns of {self.defined_in})"
                )
            try:
                rows = [{k: self._parse(k, v) for k, v in row.items()} for row in reader]
            except ValueError as err:
                raise InputError(f"{path}, line {reader.line_num}: {err}") from err
        if not rows:
            raise InputError(f"{path} has a header but no {self.what.removesuffix(' CSV')} rows")
        return rows

    def _parse(self, key: str, text: str | None):
        if text is None or text == "":
            return None
        if key in self.texts or key not in self.columns:
            return text
        return int(float(text)) if key in self.ints else float(text)

"""The code blocks of the README and the docs/ pages, and how the docs test runs and compares them.

A fenced block's info string says what it is:

- ``python``: runs as written (its own namespace; every block of a page in one working folder, in order);
  ``python gpu``: the same, only where there is a CUDA GPU; ``python file=NAME``: written to NAME in that
  folder (a cell file that a later block or command compiles);
- ``output``: what the ``python`` block just above prints;
- ``console`` (``console gpu``): ``$ `` lines are commands (``prnn-tvm ...`` or ``python ...``, optionally
  after ``NAME=VALUE`` settings), the lines below each its output (stdout, then stderr);
- ``sh``: set-up commands the test does not run (``make``, ``pip``): checked against the Makefile and
  pyproject.toml instead;
- ``text``: not code.

Shown output is compared line by line with what the command prints, except what cannot repeat: numbers in
scientific notation (errors, tolerances) and bracketed seconds are masked on both sides, ``...`` within a line
stands for any text and a line of ``...`` for any number of lines; with a GPU the ``gpu`` lines of a report
(which differ by machine) are left out on both sides.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

KINDS = {"python", "output", "console", "sh", "text"}
FENCE = re.compile(r"^```(?P<info>.*)$")
VOLATILE = re.compile(r"\d+(?:\.\d+)?e[-+]?\d+|\[\d+(?:\.\d+)? s\]")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    kind: str
    flags: dict[str, str]  # "gpu": "", "file": "my_cell.py"
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def gpu(self) -> bool:
        return "gpu" in self.flags


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, in order (ValueError for an unclosed fence)."""
    out, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        kind, *words = m.group("info").split() or [""]
        flags = dict(w.partition("=")[::2] for w in words)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page.name}:{i + 1}: a code block that is never closed")
        out.append(Block(page, i + 1, kind, flags, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return out


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    expected: list[str]  # the lines shown below it


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, each with its settings and shown output."""
    out: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            words = shlex.split(line[2:])
            env = {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            out.append(Command(words, env, []))
        elif out:
            out[-1].expected.append(line)
        elif line.strip():
            raise ValueError(f"{block.where}: output before any command: {line!r}")
    return out


def _mask(line: str) -> str:
    return VOLATILE.sub("#", line.rstrip())


def mismatch(expected: list[str], actual: str, drop_gpu_lines: bool) -> str | None:
    """None where the shown lines match the printed text, else what differs."""

    def keep(line: str) -> bool:
        return not (drop_gpu_lines and re.match(r"gpu\s", line))

    shown = [_mask(line) for line in expected if keep(line)]
    printed = [_mask(line) for line in actual.splitlines() if keep(line)]
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else ".*".join(re.escape(part) for part in line.split("...")) + r"\n"
        for line in shown
    )
    if re.fullmatch(pattern, "".join(line + "\n" for line in printed)):
        return None
    return "shown:\n  " + "\n  ".join(shown) + "\nprinted:\n  " + "\n  ".join(printed)

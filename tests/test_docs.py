"""Every example of the README and the docs/ pages runs as written, and every shown output is what it prints.

Each page's blocks run in order in a folder of its own (``tests/markdown_blocks.py`` says how a block is
marked and compared): Python blocks as written, ``$ prnn-tvm ...`` commands (in this process, through
``tests/cli_run.py``, unless they set environment variables) and ``$ python ...`` commands (a process each) with their
shown output, set-up commands against the Makefile and pyproject.toml. Blocks marked ``gpu`` run only in
``test_page_runs_on_the_gpu`` (``make gpu-test``); the links of every page resolve.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import markdown_blocks as md
from .cli_run import run_cli
from .conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED_FOLDERS = ("bench", "cells", "examples")  # what a page's commands may read, linked into its folder


def _ids(pages):
    return [str(p.relative_to(ROOT)) for p in pages]


def run_page(page: Path, folder: Path, with_gpu_blocks: bool) -> list[str]:
    """Run a page's blocks in ``folder``; returns the problems (empty when every block ran as shown)."""
    for name in LINKED_FOLDERS:
        (folder / name).symlink_to(ROOT / name)
    problems, items = [], md.blocks(page)
    for i, block in enumerate(items):
        if block.kind not in md.KINDS:
            problems.append(f"{block.where}: a ```{block.kind} block; the docs test knows {sorted(md.KINDS)}")
        elif block.gpu and not with_gpu_blocks or block.kind in ("text", "output"):
            continue
        elif block.kind == "python" and "file" in block.flags:
            (folder / block.flags["file"]).write_text(block.text)
        elif block.kind == "python":
            shown = items[i + 1] if i + 1 < len(items) and items[i + 1].kind == "output" else None
            problems += _run_python(block, folder, shown)
        elif block.kind == "console":
            problems += _run_console(block, folder)
        elif block.kind == "sh":
            problems += setup_problems(block)
    return problems


def _run_python(block: md.Block, folder: Path, shown: md.Block | None) -> list[str]:
    printed, here = io.StringIO(), os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block.text, block.where, "exec"), {"__name__": "__docs__"})
    except Exception as err:  # the page's problem, reported with where it is
        return [f"{block.where}: {type(err).__name__}: {err}"]
    finally:
        os.chdir(here)
    differs = shown and md.mismatch(shown.text.splitlines(), printed.getvalue(), HAS_GPU)
    return [f"{shown.where}: the output shown is not what the block above prints\n{differs}"] if differs else []


def _run_console(block: md.Block, folder: Path) -> list[str]:
    problems = []
    for command in md.commands(block):
        program, *args = command.argv
        if program not in ("prnn-tvm", "python"):
            problems.append(f"{block.where}: `{program}`: the docs test runs prnn-tvm and python commands only")
            continue
        if program == "prnn-tvm" and not command.env:  # in this process: the command's output, not a start-up
            done = run_cli(*args, cwd=folder)
        else:
            argv = [sys.executable, "-m", "prnn_tvm.cli", *args] if program == "prnn-tvm" else [sys.executable, *args]
            done = subprocess.run(
                argv, cwd=folder, env={**os.environ, **command.env}, capture_output=True, text=True, timeout=600
            )
        text = " ".join(command.argv)
        fails = any(line.startswith("prnn-tvm: error:") for line in command.expected)
        if (done.returncode != 0) != fails:
            problems.append(f"{block.where}: `{text}` exited with {done.returncode}:\n{done.stdout}{done.stderr}")
        elif command.expected:
            differs = md.mismatch(command.expected, done.stdout + done.stderr, HAS_GPU)
            if differs:
                problems.append(f"{block.where}: `{text}` does not print what the page shows\n{differs}")
    return problems


def setup_problems(block: md.Block) -> list[str]:
    """``make`` targets must be the Makefile's, ``pip install`` must install this repository with extras it
    has (the package is not on PyPI)."""
    makefile = (ROOT / "Makefile").read_text()
    section = (ROOT / "pyproject.toml").read_text().partition("[project.optional-dependencies]")[2].split("\n[")[0]
    extras = re.findall(r"^(\w+) = \[", section, re.M)
    problems = []
    for line in block.text.splitlines():
        words = line.partition("#")[0].split()
        if words[:1] == ["make"] and not all(re.search(rf"^{w}:", makefile, re.M) for w in words[1:]):
            problems.append(f"{block.where}: `{line.strip()}`: no such target in the Makefile")
        elif words[:2] == ["pip", "install"]:
            target = words[-1].strip("'\"")
            m = re.fullmatch(r"\.(?:\[(?P<extras>[\w,]+)\])?", target)
            if not m or not set((m.group("extras") or "").split(",")) - {""} <= set(extras):
                problems.append(
                    f"{block.where}: `{line.strip()}` installs {target!r}, not this repository with "
                    f"one of its extras {sorted(extras)}"
                )
        elif words and words[0] not in ("make", "pip"):
            problems.append(f"{block.where}: `{line.strip()}`: a ```sh block holds make and pip only")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_page_runs_as_written(page, tmp_path):
    problems = run_page(page, tmp_path, with_gpu_blocks=False)
    assert not problems, "\n\n".join(problems)


GPU_PAGES = [p for p in PAGES if any(b.gpu for b in md.blocks(p))]


@pytest.mark.gpu
@pytest.mark.parametrize("page", GPU_PAGES, ids=_ids(GPU_PAGES))
def test_page_runs_on_the_gpu(page, tmp_path):
    problems = run_page(page, tmp_path, with_gpu_blocks=True)
    assert not problems, "\n\n".join(problems)


LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]*)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    heads = re.findall(r"^#+ (.*)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_links_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    broken = []
    for link in LINK.findall(text):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: {target.name} has no heading with that anchor")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_commands_are_in_blocks_the_test_runs(page):
    """A command in an indented block would escape the test: commands go in fenced console or sh blocks."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    indented = re.findall(r"^ {4,}(?:\$ |prnn-tvm |python |make |pip ).*$", text, re.M)
    assert not indented, f"{page.name}: {indented}"


def test_readme_is_a_front_door():
    """At most 300 lines, every docs page reachable from it, and its two commands the Makefile's jobs that CI
    runs."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = {Path(link.partition("#")[0]).name for link in LINK.findall(readme)}
    assert {p.name for p in PAGES[1:]} <= linked, sorted({p.name for p in PAGES[1:]} - linked)
    setup = [b for b in md.blocks(ROOT / "README.md") if b.kind == "sh"]
    assert "make run" in setup[0].text and "make test" in setup[0].text
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_setup_check_refuses_what_is_not_there(tmp_path):
    """The check of set-up commands can fail: a missing target, a distribution from PyPI, an unknown extra."""
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\nmake run\nmake deploy\npip install prnn-tvm[torch]\npip install -e '.[nope]'\n"
        "pip install -e '.[torch]'\n```\n"
    )
    problems = setup_problems(md.blocks(page)[0])
    assert len(problems) == 3 and "deploy" in problems[0] and "prnn-tvm[torch]" in problems[1], problems
    assert "nope" in problems[2]


def test_shown_output_is_compared(tmp_path):
    """A page whose shown output differs from what the command prints fails, naming both; masked figures and
    elided lines do not."""
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ prnn-tvm cells\ngru             GRU, as torch.nn.GRU ...\n...\n"
        "stacked_rnn     Two stacked ...\n```\n\n```console\n$ prnn-tvm cells\nlstm  the wrong line\n```\n"
    )
    (tmp_path / "run").mkdir()
    problems = run_page(page, tmp_path / "run", with_gpu_blocks=False)
    assert len(problems) == 1 and "page.md:8" in problems[0] and "lstm  the wrong line" in problems[0], problems
    assert md.mismatch(["error 1.5e-07 [0.30 s]"], "error 9.9e-05 [12.01 s]\n", False) is None

"""The docs' figures, rendered from the results files they cite and checked against them.

    python bench/docs_figures.py            # re-render every generated block of README.md and docs/*.md
    python bench/docs_figures.py --check    # exit 1, with a diff, where a page differs from its rendering
    python bench/docs_figures.py --audit    # list the figures of a paragraph that its linked results lack

A generated block is everything between a marker naming what to render and ``<!-- /figures -->``:

    <!-- figures: ratio-grid bench/results/bench-h100-float16-latest.csv fp16 -->
    | fp16 | B=1 | ... (rendered)
    <!-- /figures -->

Kinds (paths from the repository root): ``ratio-grid CSV LABEL [CELL...]`` (cuDNN / our call per cell,
hidden and batch), ``cases CSV cell:HxB ...`` (every time per step of those cases), ``summary CSV [floor]``
(the run's cases, range, losses, host time, and the floor), ``between CSV OTHER NAME OTHER_NAME`` (our call in
one run over the same case's in another), ``overview LABEL=CSV ...`` (one row per run), ``run CSV`` (the
command and the machine) and ``copy FILE N`` (the N-th Markdown table of a results file, as it is there).

Prose is checked, not rendered: in a paragraph (or a table under it) that links a file in ``bench/results/``,
every decimal figure must be one of that file's numbers, to the figure's own precision (``1.03`` for 1.026).
``tests/test_docs_figures.py`` runs both checks.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from decimal import Decimal
from pathlib import Path

from prnn_tvm.bench import summary
from prnn_tvm.bench.table import read_csv

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^(<!-- figures: (?P<spec>[^\n]*?) -->\n)(?P<body>.*?)^(<!-- /figures -->)", re.S | re.M)
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]*bench/results/[^)#\s]+)[^)]*\)")
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:e[-+]?\d+)?(?![\d.])")
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages a reader is shown: the README and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_spec(spec: str, root: Path = ROOT) -> str:
    """The Markdown a marker's spec stands for."""
    kind, *args = spec.split()
    if kind == "copy":
        return nth_table((root / args[0]).read_text(), int(args[1]))
    if kind == "overview":
        return summary.overview([(label, read_csv(root / path)) for label, _, path in (a.partition("=") for a in args)])
    rows = read_csv(root / args[0])
    if kind == "ratio-grid":
        return summary.ratio_grid(rows, args[1], args[2:])
    if kind == "cases":
        return summary.case_table(rows, args[1:])
    if kind == "summary":
        return summary.summary(rows, floor="floor" in args[1:])
    if kind == "between":
        return summary.call_ratio_between(rows, read_csv(root / args[1]), args[2], args[3])
    if kind == "run":
        return f"`{command_of(root / args[0])}`, on {summary.environment(rows)}."
    raise ValueError(f"unknown kind of generated block '{kind}' in <!-- figures: {spec} -->")


def command_of(csv_path: Path) -> str:
    """The command of a benchmark run, from its own table beside the CSV."""
    for line in csv_path.with_suffix(".md").read_text().splitlines():
        if line.startswith("    prnn-tvm bench"):
            return line.strip()
    raise ValueError(f"{csv_path.with_suffix('.md')} names no prnn-tvm bench command")


def nth_table(text: str, n: int) -> str:
    """The n-th (1-based) Markdown table of a page, its rows as written."""
    tables = re.findall(r"(?:^\|.*\|[ \t]*\n?)+", text, re.M)
    if not 1 <= n <= len(tables):
        raise ValueError(f"asked for table {n}; the file has {len(tables)}")
    return tables[n - 1].rstrip("\n")


def rendered(text: str, root: Path = ROOT) -> str:
    """The page with every generated block rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + render_spec(m.group("spec"), root) + "\n" + m.group(4), text)


def paragraphs(text: str) -> list[tuple[str, list[str]]]:
    """(paragraph, the results files it links) for the page's prose: code and generated blocks left out, list
    items apart, a table without links of its own taking those of the paragraph above it."""
    text = FENCE.sub("", BLOCK.sub("", text))
    out: list[tuple[str, list[str]]] = []
    for chunk in re.split(r"\n\s*\n|\n(?=\s*- )", text):
        links = LINK.findall(chunk)
        if not links and chunk.lstrip().startswith("|") and out:
            links = out[-1][1]
        out.append((chunk, links))
    return out


def _numbers(path: Path, cache: dict) -> list[Decimal]:
    if path not in cache:
        cache[path] = [Decimal(t) for t in NUMBER.findall(path.read_text(errors="replace"))]
    return cache[path]


def supported(figure: str, numbers: list[Decimal]) -> bool:
    """Whether a figure is one of the numbers, to its own precision (half a unit in its last place)."""
    value = Decimal(figure)
    half_ulp = Decimal(1).scaleb(value.as_tuple().exponent) / 2
    return any(abs(value - n) <= half_ulp for n in numbers)


def unsupported_figures(page: Path, root: Path = ROOT) -> list[str]:
    """Each figure of a paragraph linking results files that none of those files holds, with where it is."""
    problems, cache = [], {}
    for chunk, links in paragraphs(page.read_text()):
        files = [(page.parent / link).resolve() for link in links]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            problems.append(f"{page.name}: links {', '.join(missing)}, which does not exist")
            continue
        numbers = [n for f in files for n in _numbers(f, cache)]
        for figure in DECIMAL.findall(chunk) if files else []:
            if not supported(figure, numbers):
                where = chunk.strip().splitlines()[0][:90]
                problems.append(f"{page.name}: {figure} is in none of {', '.join(links)} (paragraph: {where}...)")
    return problems


def cited_results(root: Path = ROOT) -> set[Path]:
    """The results files the pages link or render from, and those the linked results files link in turn."""
    cited: set[Path] = set()
    for page in pages(root):
        text = page.read_text()
        cited |= {(page.parent / link).resolve() for link in LINK.findall(text)}
        for m in BLOCK.finditer(text):
            cited |= {
                (root / (word.partition("=")[2] or word)).resolve()
                for word in m.group("spec").split()[1:]
                if "/" in word
            }
    todo = [f for f in cited if f.suffix == ".md"]
    while todo:
        results = todo.pop(0)  # before the links are read: they are relative to this file
        linked = {
            (results.parent / link).resolve()
            for link in re.findall(r"\]\(([^)#\s:]+\.(?:md|csv))\)", results.read_text())
        }
        todo += [f for f in linked - cited if f.suffix == ".md" and f.is_file()]
        cited |= linked
    return cited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 where a page differs")
    parser.add_argument("--audit", action="store_true", help="list prose figures their linked results lack")
    parser.add_argument("files", nargs="*", type=Path, help="pages (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    status = 0
    for page in args.files or pages():
        text = page.read_text()
        if args.audit:
            for problem in unsupported_figures(page):
                print(problem)
                status = 1
            continue
        new = rendered(text)
        if new != text and args.check:
            sys.stdout.writelines(
                difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(page), f"{page} (rendered)")
            )
            status = 1
        elif new != text:
            page.write_text(new)
            print(f"rendered {page}")
    return status


if __name__ == "__main__":
    sys.exit(main())

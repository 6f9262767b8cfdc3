"""The docs' figures are the results files' (issue 53): generated tables equal their rendering from the CSVs and
results files they name, and a decimal figure in a paragraph that links a results file is one of its numbers.

``bench/docs_figures.py`` renders and audits; these tests fail where a page and its sources disagree, and show
that the checks catch the kinds of wrong figure found before (a range that leaves out a case, ratios from an
earlier run than the file linked, a host-time range that is not the table's).
"""

import importlib.util
from pathlib import Path

import pytest

from prnn_tvm.bench import summary
from prnn_tvm.bench.table import read_csv

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "bench" / "docs_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)
PAGES = figures.pages(ROOT)
RESULTS = ROOT / "bench" / "results"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_generated_blocks_are_their_rendering(page):
    text = page.read_text()
    assert figures.rendered(text) == text, f"{page.name} differs from its sources: run python bench/docs_figures.py"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_prose_figures_are_in_the_files_they_link(page):
    problems = figures.unsupported_figures(page)
    assert not problems, "\n".join(problems)


def test_every_results_file_is_cited():
    """bench/results/ keeps the runs the docs cite (and what those cite); git keeps the rest."""
    runs = {f.with_suffix("") for f in figures.cited_results(ROOT)}  # a run's .csv, .md and .png go together
    kept = [f for f in RESULTS.rglob("*.*") if f.with_suffix("") not in runs]
    assert not kept, f"results no page cites: {sorted(f.name for f in kept)}"


def test_a_figure_from_an_earlier_run_is_caught(tmp_path):
    """The float32 projection ratios the README once quoted (from a run before the one it linked) fail."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "bench").symlink_to(ROOT / "bench")
    page = docs / "page.md"
    page.write_text(
        "TVM against cuBLAS ([projection-h100.md](../bench/results/projection-h100.md)): LSTM H=1024\n"
        "B=1/4/16/64 1.28/1.25/1.21/1.26x, LSTM H=512 B=16 1.18x, GRU H=1024 B=4 1.30x.\n"
    )
    problems = figures.unsupported_figures(page, tmp_path)
    assert [p.split()[1] for p in problems] == ["1.28", "1.21", "1.26", "1.18", "1.30"], problems
    page.write_text(
        "TVM against cuBLAS ([projection-h100.md](../bench/results/projection-h100.md)): LSTM H=1024\n"
        "B=1/4/16/64 1.33/1.25/1.22/1.25x (0.0841 against 0.0634 ms at B=1), GRU 1.29x.\n"
    )
    assert figures.unsupported_figures(page, tmp_path) == []


def test_a_changed_table_is_caught(tmp_path):
    text = (
        "<!-- figures: ratio-grid bench/results/bench-h100-float16-latest.csv fp16 lstm -->\n"
        "| fp16 | B=1 |\n<!-- /figures -->\n"
    )
    rendered = figures.rendered(text)
    assert rendered != text and "| LSTM H=1024 | 7.56x | 6.30x | 1.27x | **0.86x** | 1.46x | 1.17x |" in rendered
    assert figures.rendered(rendered) == rendered


def test_ranges_cover_every_case():
    """A range is the run's lowest and highest: the bfloat16 / float16 range includes GRU 1024x4 (1.08x), the
    host time per call of the float32 run is its whole table's."""
    f16 = read_csv(RESULTS / "bench-h100-float16-latest.csv")
    b16 = read_csv(RESULTS / "bench-h100-bfloat16-latest.csv")
    ours = {(r["cell"], r["hidden"], r["batch"]): r["prnn_call_ms"] for r in summary.measured(f16)}
    values = [r["prnn_call_ms"] / ours[r["cell"], r["hidden"], r["batch"]] for r in summary.measured(b16)]
    text = summary.call_ratio_between(b16, f16, "bfloat16", "float16")
    assert f"{min(values):.2f}-{max(values):.2f}x" in text and len(values) == 36
    f32 = read_csv(RESULTS / "bench-h100-call-halving-all.csv")
    host = [r["prnn_host_us"] for r in f32]
    assert f"ours {min(host):.0f}-{max(host):.0f} us" in summary.summary(f32)
    assert "cuDNN is faster in LSTM fp16 1024x16 (0.86x)." in summary.summary(f16)

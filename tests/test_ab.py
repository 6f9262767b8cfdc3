"""The A/B tool for changes to the generated CUDA (``prnn_tvm.bench.ab``, ``bench/ab_source.py``): cases and change
files are read or refused with the reason, a change that no longer applies is refused, the changed layer is
exactly the built one's source changed and compiles, and on the GPU the comparison sees a change of the numbers.
The changes queued in ``bench/changes/`` still apply to the code generator and compile."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from prnn_tvm.bench.ab import SourceChange, compare, layer_pair, line
from prnn_tvm.bench.matrix import Case

QUEUED = Path(__file__).parent.parent / "bench" / "changes"
# the queued changes, and an example checked in here (the queue is often empty: the example keeps the test running)
CHANGES = [*sorted(QUEUED.glob("*.json")), Path(__file__).parent / "data" / "ab_change_example.json"]
SENTINEL = {"units_per_cta": 16, "k_groups": 4, "n_tiles": 1, "barrier": "sentinel"}  # LSTM fp16 128 x 16


@pytest.mark.parametrize(
    "spec, want",
    [
        ("lstm:1024x16", ("lstm", 1024, 16)),
        ("lstm_x4:512x8", ("lstm_x4", 512, 8)),
        ("cells/my_cell.py:33x1", ("cells/my_cell.py", 33, 1)),
    ],
)
def test_a_case_is_read_from_its_spec(spec, want):
    case = Case.parse(spec, 64, "bfloat16")
    assert (case.cell, case.hidden, case.batch, case.seq_len, case.dtype) == (*want, 64, "bfloat16")


@pytest.mark.parametrize(
    "spec", ["lstm", "lstm:1024", "lstm:1024x", "lstm:0x4", "lstm:16x-1", ":16x4", "lstm:16x4x2", "lstm 16x4"]
)
def test_a_malformed_case_is_refused_with_the_form(spec):
    with pytest.raises(ValueError, match=r"CELL:HIDDENxBATCH .*" + re.escape(repr(spec))):
        Case.parse(spec)


@pytest.mark.parametrize(
    "content, why",
    [
        ({"why": "no pairs"}, "'replace' must be a non-empty list"),
        ({"replace": []}, "'replace' must be a non-empty list"),
        ({"replace": [["only old"]]}, "'replace' must be a non-empty list"),
        ({"replace": [["", "new"]]}, "non-empty strings"),
        ({"replace": [["a", "b"]], "cases": ["lstm"]}, "CELL:HIDDENxBATCH"),
        ({"replace": [["a", "b"]], "config": "k_groups=8"}, "'config' must be an object"),
        ({"replace": [["a", "b"]], "dtype": "int8"}, "'dtype' must be one of .*'int8'"),
    ],
)
def test_a_malformed_change_file_is_refused(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=why):
        SourceChange.load(path)


def test_a_change_replaces_every_occurrence_in_order_and_refuses_a_missing_text():
    change = SourceChange("two", (("a", "b"), ("b b", "c")))
    assert change.apply("a a x") == "c x" and change.apply("a a a a") == "c c"
    with pytest.raises(ValueError, match=r"change 'two': text 2 of 2 is not in the generated source.*'b b'"):
        change.apply("a x")


def test_the_changed_layer_is_the_built_source_changed_and_compiles():
    marker = "// ab: the changed build"
    change = SourceChange(
        "mark",
        (
            (
                "__device__ __forceinline__ unsigned prnn_ld_relaxed(",
                marker + "\n__device__ __forceinline__ unsigned prnn_ld_relaxed(",
            ),
        ),
    )
    case = Case.parse("lstm:128x16", dtype="float16")
    built, changed = layer_pair(case, change, SENTINEL, arch="sm_90")
    assert marker not in built.cuda_source and changed.cuda_source == change.apply(built.cuda_source)
    assert changed.kernel.config == built.kernel.config and changed.report.registers == built.report.registers > 0
    text = line(case, built, changed, None)
    assert text.startswith("lstm float16 H=128 B=16 (units_per_cta=16 k_groups=4") and text.endswith("(built only)")


def test_a_change_the_layer_does_not_have_is_refused_before_building_it_again():
    change = SourceChange("poll", (("prnn_still_stale<", "prnn_still_stale<"),))
    with pytest.raises(ValueError, match=f"change '{change.name}': text 1 of"):  # `counter`: no sentinel poll
        layer_pair(Case.parse("lstm:128x16", dtype="float16"), change, {**SENTINEL, "barrier": "counter"}, arch="sm_90")


@pytest.mark.parametrize("path", CHANGES, ids=lambda p: p.stem)
def test_a_queued_change_applies_to_its_first_case_and_compiles_clean(path):
    change = SourceChange.load(path)
    assert change.why and change.cases, "a queued change says what it tries and on which cases"
    built, changed = layer_pair(Case.parse(change.cases[0], dtype=change.dtype or "float16"), change, arch="sm_90")
    assert changed.cuda_source == change.apply(built.cuda_source) != built.cuda_source
    assert changed.report.registers and changed.report.spill_bytes == 0  # ptxas built it, without spills
    if change.config:  # a prototype for one config is built with it
        assert all(built.report.config[k] == v for k, v in change.config.items())


@pytest.mark.gpu
def test_on_the_gpu_a_change_of_the_numbers_is_seen_and_a_neutral_one_is_not():
    case = Case.parse("lstm:128x16", seq_len=32, dtype="float16")
    neutral = SourceChange(
        "mark",
        (
            (
                "__device__ __forceinline__ unsigned prnn_ld_relaxed(",
                "// ab\n__device__ __forceinline__ unsigned prnn_ld_relaxed(",
            ),
        ),
    )
    found = compare(*layer_pair(case, neutral, SENTINEL), case.seq_len, rounds=2)
    assert found.bitwise_equal and found.max_abs_diff == 0.0
    assert len(found.built_us) == len(found.changed_us) == 2 and min(found.built_us + found.changed_us) > 0
    skewed = SourceChange(
        "tanh off",
        (
            (
                'asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));',
                'asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); y *= 0.5f;',
            ),
        ),
    )
    found = compare(*layer_pair(case, skewed, SENTINEL), case.seq_len, rounds=1)
    assert not found.bitwise_equal and 1e-3 < found.max_abs_diff < np.inf  # g halved: h and c move, finitely

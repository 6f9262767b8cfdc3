"""The table of known ptxas reports (prnn_tvm.cache.ptxas_table): a hit answers without nvcc, anything that changes
ptxas's output is a miss, a sampled hit is compiled and compared (an edited entry fails), and the committed table
the suite reads is well formed."""

import json
import os
import re
from pathlib import Path

import pytest

from prnn_tvm.cache import ptxas_table
from prnn_tvm.cache.ptxas_table import PtxasTableError
from prnn_tvm.codegen import ptxas

from .test_layer_cache import TINY_KERNEL

COMMITTED = Path(__file__).resolve().parent / "data" / "ptxas-reports.jsonl"

needs_nvcc = pytest.mark.skipif(ptxas.shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture
def table(tmp_path, monkeypatch):
    """An empty table of this test's own, recorded into; every compile forgotten first."""
    path = tmp_path / "reports.jsonl"
    monkeypatch.setenv(ptxas_table.TABLE, str(path))
    monkeypatch.setenv(ptxas_table.RECORD, "1")
    monkeypatch.setenv(ptxas_table.CHECK, "0")
    monkeypatch.setenv("PRNN_TVM_CACHE", "0")  # no nvcc results on disk: a miss runs nvcc
    monkeypatch.setattr(ptxas, "_CACHE", {})
    return path


def _read_only(monkeypatch):
    """Stop recording, forget every compile, and count the compiles that follow."""
    monkeypatch.delenv(ptxas_table.RECORD)
    monkeypatch.setattr(ptxas, "_CACHE", {})
    compiled, compile_cuda = [], ptxas.compile_cuda
    monkeypatch.setattr(
        ptxas, "compile_cuda", lambda source, arch: compiled.append(source) or compile_cuda(source, arch)
    )
    return compiled


@needs_nvcc
def test_a_hit_answers_without_nvcc_and_a_changed_source_compiles(table, monkeypatch):
    first = ptxas.report(TINY_KERNEL, "sm_90")
    [entry] = [json.loads(line) for line in table.read_text().splitlines()]
    assert entry["arch"] == "sm_90" and "Compile time" not in entry["log"] and "recurrent_kernel" in entry["log"]
    compiled = _read_only(monkeypatch)
    again = ptxas.report(TINY_KERNEL, "sm_90")
    assert compiled == [] and again.functions == first.functions and first.function("recurrent").registers > 0
    changed = TINY_KERNEL.replace("1.0f", "2.0f")
    ptxas.report(changed, "sm_90")  # another source, another arch: misses, compiled and not recorded
    ptxas.report(TINY_KERNEL, "sm_80")
    assert compiled == [changed, TINY_KERNEL] and len(table.read_text().splitlines()) == 1


@needs_nvcc
def test_a_recording_run_answers_from_the_table_and_adds_what_it_misses(table, monkeypatch):
    """``PRNN_TVM_PTXAS_TABLE_RECORD=1`` over a table that holds entries: a hit is not compiled again, a miss is
    compiled and appended (a run of the suite brings the table up to date for the sources it changed)."""
    ptxas.report(TINY_KERNEL, "sm_90")
    compiled = _read_only(monkeypatch)
    monkeypatch.setenv(ptxas_table.RECORD, "1")
    ptxas.report(TINY_KERNEL, "sm_90")
    changed = TINY_KERNEL.replace("1.0f", "2.0f")
    ptxas.report(changed, "sm_90")
    assert compiled == [changed]
    assert [json.loads(line)["arch"] for line in table.read_text().splitlines()] == ["sm_90", "sm_90"]


@needs_nvcc
def test_a_checked_hit_that_differs_fails_and_names_the_fix(table, monkeypatch):
    ptxas.report(TINY_KERNEL, "sm_90")
    entry = json.loads(table.read_text())
    entry["log"] = re.sub(r"Used \d+ registers", "Used 200 registers", entry["log"])
    table.write_text(json.dumps(entry) + "\n")
    compiled = _read_only(monkeypatch)
    assert ptxas.report(TINY_KERNEL, "sm_90").function("recurrent").registers == 200  # unchecked: the table's word
    monkeypatch.setenv(ptxas_table.CHECK, "1")
    with pytest.raises(PtxasTableError, match=r"(?s)differs from ptxas's report .*make ptxas-table"):
        ptxas.report(TINY_KERNEL, "sm_90")
    assert compiled == [TINY_KERNEL]


@needs_nvcc
def test_a_checked_hit_that_agrees_is_the_compiled_report(table, monkeypatch):
    first = ptxas.report(TINY_KERNEL, "sm_90")
    compiled = _read_only(monkeypatch)
    monkeypatch.setenv(ptxas_table.CHECK, "1")
    assert ptxas.report(TINY_KERNEL, "sm_90").functions == first.functions and compiled == [TINY_KERNEL]


def test_without_nvcc_there_is_no_key_and_the_build_says_nvcc_is_missing(table, monkeypatch):
    monkeypatch.setattr(ptxas_table.shutil, "which", lambda name: None)
    assert ptxas_table.key(TINY_KERNEL, "sm_90", ["-arch=sm_90"]) is None
    with pytest.raises(ptxas.NvccNotFound, match="nvcc not found"):
        ptxas.report(TINY_KERNEL, "sm_90")


@needs_nvcc
def test_the_key_covers_source_arch_flags_nvcc_and_a_host_compiler(monkeypatch):
    """A whole program's key (a probe's, tests/test_probes.py) holds the host compiler's version text too; without
    that compiler there is no key (nvcc would fail: the build says so)."""
    base = ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"])
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    others = [
        ptxas_table.key(TINY_KERNEL + " ", "sm_90", ["-O3"]),
        ptxas_table.key(TINY_KERNEL, "sm_80", ["-O3"]),
        ptxas_table.key(TINY_KERNEL, "sm_90", ["-O2"]),
        ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"], host="gcc"),
    ]
    assert ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"], host="no-such-compiler") is None
    versions = {"nvcc": "Cuda compilation tools, release 13.0", "gcc": "gcc 12"}
    monkeypatch.setattr(ptxas_table, "_version_text", lambda path: versions["nvcc" if "nvcc" in path else "gcc"])
    with_gcc = ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"], host="gcc")
    versions["gcc"] = "gcc 13"
    others += [with_gcc, ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"], host="gcc")]
    versions["nvcc"] = "Cuda compilation tools, release 99.9"
    others.append(ptxas_table.key(TINY_KERNEL, "sm_90", ["-O3"]))
    assert len({base, *others}) == 8


@pytest.mark.parametrize("text", ["often", "-0.5", "2"])
def test_a_bad_check_rate_names_the_variable(monkeypatch, text):
    monkeypatch.setenv(ptxas_table.CHECK, text)
    with pytest.raises(PtxasTableError, match=f"{ptxas_table.CHECK}=.*within 0 and 1"):
        ptxas_table.check_rate()


def test_a_damaged_table_names_its_line_and_the_fix(tmp_path, monkeypatch):
    path = tmp_path / "reports.jsonl"
    path.write_text('{"key": "ab", "arch": "sm_90", "log": ""}\nnot json\n')
    monkeypatch.setenv(ptxas_table.TABLE, str(path))
    with pytest.raises(PtxasTableError, match=r"reports.jsonl:2: not an entry .*make ptxas-table"):
        ptxas_table.lookup("ab")


def test_the_suite_reads_the_committed_table_and_it_is_well_formed():
    """The suite's processes read ``tests/data/ptxas-reports.jsonl`` (``tests/conftest.py``); every entry has a
    SHA-256 key, an arch and a ptxas log naming a kernel, one entry per key, sorted as ``make ptxas-table`` writes."""
    assert os.environ[ptxas_table.TABLE] == str(COMMITTED)
    lines = COMMITTED.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert entries and lines == sorted(lines)
    assert all(set(e) == {"key", "arch", "log"} and re.fullmatch(r"[0-9a-f]{64}", e["key"]) for e in entries)
    assert all(re.fullmatch(r"sm_\d+a?", e["arch"]) and "Compiling entry function" in e["log"] for e in entries)
    assert len({e["key"] for e in entries}) == len(entries)

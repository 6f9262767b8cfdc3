"""nvcc's outputs cached on disk (``prnn_tvm.cache.cubins``): a source compiled once is not compiled again by
another process, a new nvcc or flags are a new key, and ``PRNN_TVM_CACHE=0`` compiles every time."""

import shutil
import subprocess

import pytest

from prnn_tvm.cache import cubins
from prnn_tvm.codegen import ptxas

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

SOURCE = 'extern "C" __global__ void scale_kernel(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty cache of this test's own, and no cubin this process compiled before."""
    monkeypatch.setenv("PRNN_TVM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ptxas, "_CACHE", {})
    return tmp_path / "cache"


def _no_nvcc(monkeypatch):
    """nvcc refused from here on (as though another process, which has none of this one's memory, asked)."""
    monkeypatch.setattr(ptxas, "_CACHE", {})

    def refuse(*args, **kwargs):
        raise AssertionError(f"nvcc ran: {args[0]}")

    monkeypatch.setattr(subprocess, "run", refuse)


def test_a_compiled_source_is_found_on_disk_with_its_report(cache_dir, monkeypatch):
    cubin, report = ptxas.compile_cuda(SOURCE, "sm_80")
    assert cubin and report.function("scale").registers > 0
    assert [e.info["kind"] for e in cubins._store().entries()] == ["cubin"]
    assert (cache_dir / "nvcc" / "entries").is_dir() and not (cache_dir / "entries").exists()  # not a layer
    _no_nvcc(monkeypatch)
    again, found = ptxas.compile_cuda(SOURCE, "sm_80")
    assert again == cubin and found.functions == report.functions and found.log == report.log
    with pytest.raises(AssertionError, match="nvcc ran"):  # another arch is another key
        ptxas.compile_cuda(SOURCE, "sm_90")


def test_another_nvcc_is_another_key_and_the_cache_can_be_turned_off(cache_dir, monkeypatch, tmp_path):
    nvcc = shutil.which("nvcc")
    flags = ["-arch=sm_80"]
    assert cubins.key(SOURCE, "sm_80", flags, nvcc) == cubins.key(SOURCE, "sm_80", flags, nvcc)
    assert cubins.key(SOURCE, "sm_80", flags, nvcc) != cubins.key(SOURCE, "sm_80", ["-arch=sm_80", "-G"], nvcc)
    other = tmp_path / "nvcc"
    other.write_text("#!/bin/sh\n")
    assert cubins.key(SOURCE, "sm_80", flags, nvcc)["nvcc"] != cubins.key(SOURCE, "sm_80", flags, str(other))["nvcc"]
    monkeypatch.setenv("PRNN_TVM_CACHE", "0")
    ptxas.compile_cuda(SOURCE, "sm_80")
    assert not cache_dir.exists()
    _no_nvcc(monkeypatch)
    with pytest.raises(AssertionError, match="nvcc ran"):
        ptxas.compile_cuda(SOURCE, "sm_80")

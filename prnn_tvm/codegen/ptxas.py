"""Compile CUDA source with nvcc and read ptxas's report: registers, spills, shared memory.

Used two ways: on a GPU host it is the project's CUDA compile callback (the cubin goes
into the module, the report is kept); on a machine without a GPU, TVM returns source
only, and the report comes from compiling that source here. Either way every generated
kernel is inspected, not assumed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import PrnnError

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


@dataclass(frozen=True)
class FunctionReport:
    """ptxas's figures for one kernel."""

    name: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    static_smem_bytes: int

    @property
    def spills(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class PtxasReport:
    arch: str
    functions: dict  # name -> FunctionReport
    log: str

    def function(self, prefix: str) -> FunctionReport:
        """The report of the kernel whose name starts with ``prefix`` (TVM appends ``_kernel``)."""
        for name, rep in self.functions.items():
            if name.startswith(prefix):
                return rep
        raise KeyError(f"no kernel named {prefix}* in the ptxas report ({', '.join(self.functions)})")


class NvccError(PrnnError):
    """nvcc rejected the generated source (a compiler bug: please report it)."""


class NvccNotFound(NvccError):
    """nvcc is not on the PATH, so generated kernels cannot be compiled or inspected here."""


def parse_report(log: str, arch: str) -> PtxasReport:
    functions, current = {}, None
    fields: dict = {}
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current, fields = m.group(1), {}
        elif current and (m := _PROPS.search(line)):
            fields.update(stack=int(m.group(1)), st=int(m.group(2)), ld=int(m.group(3)))
        elif current and (m := _USED.search(line)):
            functions[current] = FunctionReport(
                current,
                int(m.group(1)),
                fields.get("stack", 0),
                fields.get("st", 0),
                fields.get("ld", 0),
                int(m.group(2) or 0),
            )
            current = None
    return PtxasReport(arch, functions, log)


_CACHE: dict = {}
# 177: TVM's common-subexpression pass leaves unused temporaries; they are not our problem.
FLAGS = ("-O3", "-std=c++17", "-diag-suppress=177", "-Xptxas", "-v")


def compile_cuda(source: str, arch: str) -> tuple[bytes, PtxasReport]:
    """Compile ``source`` to a cubin for ``arch`` (e.g. ``sm_90``); return it with the report.

    Results are cached by source and arch, in this process and on disk (:mod:`prnn_tvm.cache.nvcc`, beside the
    layer cache), so inspecting a kernel that was just built on a GPU host costs nothing, and another process
    (or another compile that generates the same source) reads the cubin and ptxas's log back.
    """
    key = (hashlib.sha256(source.encode()).hexdigest(), arch)
    if key in _CACHE:
        return _CACHE[key]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise NvccNotFound(
            "nvcc not found on PATH: the CUDA toolkit (12 or newer) is needed to compile and inspect kernels"
        )
    from ..cache import nvcc as on_disk

    flags = [f"-arch={arch}", *FLAGS]
    found = on_disk.lookup(source, arch, flags)
    if found is None:
        with tempfile.TemporaryDirectory(prefix="prnn_tvm_") as tmp:
            Path(tmp, "kernel.cu").write_text(source)
            # run in the folder, named relatively: the log names "kernel.cu", the same for one source in every run
            proc = subprocess.run(
                [nvcc, "-cubin", *flags, "kernel.cu", "-o", "kernel.cubin"], capture_output=True, text=True, cwd=tmp
            )
            if proc.returncode != 0:
                errors = [ln for ln in proc.stderr.splitlines() if "error" in ln] or proc.stderr.splitlines()
                raise NvccError(f"nvcc failed for {arch}:\n" + "\n".join(errors[:20]))
            found = Path(tmp, "kernel.cubin").read_bytes(), proc.stderr + proc.stdout
        on_disk.store(source, arch, flags, *found)
    result = found[0], parse_report(found[1], arch)
    _CACHE[key] = result
    return result


def report(source: str, arch: str) -> PtxasReport:
    """ptxas's report of ``source`` for ``arch`` where the cubin is not wanted (a CUDA build without a GPU).

    A table of known reports (:mod:`prnn_tvm.cache.ptxas_table`, ``PRNN_TVM_PTXAS_TABLE``) answers first, keyed by
    the source's hash, the arch, the flags and nvcc's version, so nvcc runs only for a source it does not hold; a
    sample of its answers is compiled anyway and compared (a differing one raises ``PtxasTableError``).
    """
    from ..cache import ptxas_table as table

    cached = _CACHE.get((hashlib.sha256(source.encode()).hexdigest(), arch))
    if cached is not None:
        return cached[1]
    flags = [f"-arch={arch}", *FLAGS]
    key = table.key(source, arch, flags)
    known = table.lookup(key)
    if known is not None and not table.should_check():
        return parse_report(known, arch)
    compiled = compile_cuda(source, arch)[1]
    settle_table(key, arch, known, compiled.log)
    return compiled


def settle_table(key: str | None, arch: str, known: str | None, log: str) -> None:
    """After nvcc compiled what the table keys as ``key`` (:mod:`prnn_tvm.cache.ptxas_table`), its output ``log``:
    where the table holds ``known`` (a hit compiled anyway) and ptxas's figures differ, ``PtxasTableError``; where
    it holds none, the report is recorded (``PRNN_TVM_PTXAS_TABLE_RECORD=1``)."""
    from ..cache import ptxas_table as table

    if known is not None and parse_report(known, arch).functions != parse_report(log, arch).functions:
        raise table.PtxasTableError(
            f"{table.table_path()}: the entry {key} (arch {arch}) differs from ptxas's report of its source:\n"
            f"table:\n{known}\nptxas:\n{log}\nthe table is stale or edited: run `make ptxas-table`"
        )
    if known is None:
        table.record(key, arch, log)

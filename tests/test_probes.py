"""The standalone CUDA probes in ``bench/probes/`` (their figures are in ``bench/results/``) still build with the
command at the top of each file (nvcc only; running them needs the GPU).

A probe whose inputs built before is known to build: the suite's table of ptxas reports
(:mod:`prnn_tvm.cache.ptxas_table`, ``tests/data/ptxas-reports.jsonl``) holds an entry per probe, keyed by its file
and every project file it includes, its own command (with ``-Xptxas -v``, which adds ptxas's report to nvcc's output
and leaves the kernels' machine code as it was), nvcc's version text and the host compiler's. A probe the table does
not hold under that key is built, and fails its test with nvcc's errors if it does not build; a hit is built anyway at
the table's check rate (``PRNN_TVM_PTXAS_TABLE_CHECK``), and a binary a test runs is always built.
"""

import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from prnn_tvm.cache import ptxas_table
from prnn_tvm.codegen import ptxas

# one worker runs this module (`make test` distributes by group): the session form's test runs the binary the build
# test built, not a second build of it
pytestmark = pytest.mark.xdist_group("probes")

ROOT = Path(__file__).resolve().parent.parent
PROBES = sorted((ROOT / "bench" / "probes").glob("*.cu"))
_INCLUDE = re.compile(r"^\s*#\s*include\s*(.*?)\s*$", re.MULTILINE)


def test_there_are_probes():
    assert len(PROBES) >= 4


def command(probe: Path) -> list[str]:
    """The probe's own command (the line at its top), ``-Xptxas -v`` added."""
    line = re.search(r"^//\s+(nvcc .*)$", probe.read_text(), re.MULTILINE)
    assert line, f"{probe.name} says at its top how to build it"
    argv = shlex.split(line.group(1))
    return [argv[0], "-Xptxas", "-v", *argv[1:]]


def inputs(probe: Path) -> str | None:
    """The probe's file and every project file it includes (quoted includes, found beside the file that includes
    them, as nvcc finds them), by path in the repository: what the table's key hashes as the probe's source. None
    where an include is neither quoted nor angled, or is not found (no key: the probe is built)."""
    root = probe.resolve().parents[2]  # the repository's (bench/probes/ is two folders down)
    texts, todo = {}, [probe.resolve()]
    while todo:
        path = todo.pop()
        name = str(path.relative_to(root))
        if name in texts:
            continue
        texts[name] = path.read_text()
        for target in _INCLUDE.findall(texts[name]):
            if target.startswith("<"):
                continue  # the toolkit's or the host compiler's: their version texts are in the key
            if not target.startswith('"'):
                return None
            found = (path.parent / target.split('"')[1]).resolve()
            if not found.is_file() or not found.is_relative_to(root):
                return None
            todo.append(found)
    return json.dumps(texts, sort_keys=True)


@dataclass(frozen=True)
class Built:
    """A probe's build: ptxas's report (nvcc's output, or the table's entry), and the binary where nvcc ran."""

    log: str
    binary: Path | None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(probe, run=False)``: the probe's :class:`Built` (an AssertionError with nvcc's errors where it does
    not build); the table answers for a probe it holds unless ``run`` (the binary wanted) or the entry is sampled for
    a check. Built once in this module's run (a test that runs a probe's binary takes the one its build test built)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    folder, builds = tmp_path_factory.mktemp("probes"), {}

    def build(probe: Path, run: bool = False) -> Built:
        if probe in builds and (builds[probe].binary or not run):
            return builds[probe]
        argv = command(probe)
        arch = re.search(r"(?:-arch=|code=)(sm_\w+)", " ".join(argv))
        assert arch, f"{probe.name}'s command names no sm_ arch"
        host = argv[argv.index("-ccbin") + 1] if "-ccbin" in argv else "gcc"  # nvcc's host compiler
        source = inputs(probe)
        key = None if source is None else ptxas_table.key(source, arch.group(1), argv, host=host)
        known = ptxas_table.lookup(key)
        if known is not None and not run and not ptxas_table.should_check():
            builds[probe] = Built(known, None)
            return builds[probe]
        argv[argv.index("-o") + 1] = str(folder / probe.stem)
        argv[-1] = str(probe)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        ptxas.settle_table(key, arch.group(1), known, done.stderr + done.stdout)
        builds[probe] = Built(ptxas_table.ptxas_lines(done.stderr + done.stdout), folder / probe.stem)
        return builds[probe]

    return build


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_a_probe_builds_with_its_own_command(probe, built):
    build = built(probe)
    assert ptxas.parse_report(build.log, "sm_90").functions, build.log  # its kernels, compiled by ptxas
    assert build.binary is None or build.binary.stat().st_size > 0


def test_the_session_form_refuses_a_shape_it_cannot_time(built):
    """``session_transport session ...`` checks its shape before it touches the GPU: a collect of more than 16384
    response words, or a grid of threads that is not whole warps, is refused with the ranges (exit status 2). The
    binary is the one its own command builds (``nvcc -O3 -std=c++17 -arch=sm_90``), built here whatever the table
    holds."""
    binary = built(next(p for p in PROBES if p.stem == "session_transport"), run=True).binary
    for shape in (["128", "0", "16385", "64", "384"], ["128", "0", "512", "64", "100"], ["128", "0", "512"]):
        done = subprocess.run([str(binary), "session", *shape], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stdout
        assert "THREADS" in done.stdout


def test_the_inputs_of_a_probe_are_its_file_and_the_project_files_it_includes():
    """The key's source: a probe and its quoted includes, followed through the files they include (so a change to a
    barrier of the project's that a probe pastes is a miss); the toolkit's headers are covered by nvcc's version."""
    texts = json.loads(inputs(next(p for p in PROBES if p.stem == "exchange_groups")))
    assert sorted(texts) == [
        "bench/probes/exchange_groups.cu",
        "bench/probes/probe_common.cuh",
        "bench/probes/state_exchange.cuh",
        "prnn_tvm/codegen/barriers/common.cuh",
        "prnn_tvm/codegen/barriers/counter.cuh",
        "prnn_tvm/codegen/barriers/sentinel.cuh",
    ]


def test_a_probe_whose_inputs_changed_is_built_and_fails_loudly(built, tmp_path):
    """A probe the table does not hold under its key (here: one of a copy of the repository's probes and barriers,
    with an error that no run recorded) is built, and its test fails with nvcc's error."""
    for folder in ("bench/probes", "prnn_tvm/codegen/barriers"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    broken = tmp_path / "bench" / "probes" / "tagged_pairs.cu"
    broken.write_text(broken.read_text().replace("#include", "int this_is_not_cuda = ;\n#include", 1))
    assert inputs(broken) is not None  # a key the table does not hold
    with pytest.raises(AssertionError, match="error"):
        built(broken)

"""The standalone CUDA probes in ``bench/probes/`` (their figures are in ``bench/results/``) still build with the
command at the top of each file (nvcc only; running them needs the GPU)."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

# one worker runs this module (`make test` distributes by group): the session form's test runs the binary the build
# test built, not a second build of it
pytestmark = pytest.mark.xdist_group("probes")

PROBES = sorted((Path(__file__).parent.parent / "bench" / "probes").glob("*.cu"))


def test_there_are_probes():
    assert len(PROBES) >= 4


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(probe)``: the binary its own command builds (an AssertionError with nvcc's errors where it does not),
    built once in this module's run (a test that runs a probe's binary takes the one its build test built)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    folder, binaries = tmp_path_factory.mktemp("probes"), {}

    def build(probe: Path) -> Path:
        if probe not in binaries:
            line = re.search(r"^//\s+(nvcc .*)$", probe.read_text(), re.MULTILINE)
            assert line, f"{probe.name} says at its top how to build it"
            argv = shlex.split(line.group(1))
            argv[argv.index("-o") + 1] = str(folder / probe.stem)
            argv[-1] = str(probe)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            binaries[probe] = folder / probe.stem
        return binaries[probe]

    return build


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_a_probe_builds_with_its_own_command(probe, built):
    assert built(probe).stat().st_size > 0


def test_the_session_form_refuses_a_shape_it_cannot_time(built):
    """``session_transport session ...`` checks its shape before it touches the GPU: a collect of more than 16384
    response words, or a grid of threads that is not whole warps, is refused with the ranges (exit status 2). The
    binary is the one its own command builds (``nvcc -O3 -std=c++17 -arch=sm_90``)."""
    binary = built(next(p for p in PROBES if p.stem == "session_transport"))
    for shape in (["128", "0", "16385", "64", "384"], ["128", "0", "512", "64", "100"], ["128", "0", "512"]):
        done = subprocess.run([str(binary), "session", *shape], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stdout
        assert "THREADS" in done.stdout

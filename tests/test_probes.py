"""The standalone CUDA probes in ``bench/probes/`` (their figures are in ``bench/results/``) still build with the
command at the top of each file (nvcc only; running them needs the GPU)."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

PROBES = sorted((Path(__file__).parent.parent / "bench" / "probes").glob("*.cu"))


def test_there_are_probes():
    assert len(PROBES) >= 4


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_a_probe_builds_with_its_own_command(probe, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    line = re.search(r"^//\s+(nvcc .*)$", probe.read_text(), re.MULTILINE)
    assert line, f"{probe.name} says at its top how to build it"
    argv = shlex.split(line.group(1))
    argv[argv.index("-o") + 1] = str(tmp_path / probe.stem)
    argv[-1] = str(probe)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / probe.stem).stat().st_size > 0


def test_the_session_form_refuses_a_shape_it_cannot_time(tmp_path):
    """``session_transport session ...`` checks its shape before it touches the GPU: a collect of more than 16384
    response words, or a grid of threads that is not whole warps, is refused with the ranges (exit status 2)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    probe = next(p for p in PROBES if p.stem == "session_transport")
    binary = tmp_path / probe.stem
    built = subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-o", str(binary), str(probe)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    for shape in (["128", "0", "16385", "64", "384"], ["128", "0", "512", "64", "100"], ["128", "0", "512"]):
        done = subprocess.run([str(binary), "session", *shape], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stdout
        assert "THREADS" in done.stdout

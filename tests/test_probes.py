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

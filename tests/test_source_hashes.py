"""The generated CUDA of a few kernels of every kind (``bench/source_hashes.py --only smoke``: LSTM's first defaults
and projection, a stack's, a tuning record of each template and exchange, the training kernels, two barrier
probes) is byte-identical to what ``tests/data/source_hashes.json`` recorded: a refactor of the code generator
shows here when it changes a kernel. A change meant to change kernels writes the file again:

    python bench/source_hashes.py --only smoke --out tests/data/source_hashes.json
"""

import json
from pathlib import Path

from .cli_run import run_script

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "source_hashes.json"


def test_the_smoke_kernels_are_the_recorded_ones():
    recorded = json.loads(RECORDED.read_text())
    assert len(recorded) >= 20 and not any(v.startswith("refused") for v in recorded.values())
    # in this process (tests/cli_run.py): a process of its own imports TVM again (~3 s of CPU)
    done = run_script(ROOT / "bench" / "source_hashes.py", "--only", "smoke", "--compare", str(RECORDED))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(recorded)} compared with" in done.stdout and ": 0 differ" in done.stdout

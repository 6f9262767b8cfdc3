"""What importing costs: ``prnn-tvm --help`` and ``import prnn_tvm.torch`` do not wait for TVM (and the help not
for torch or xgboost either); the optional dependencies say how to install them when missing."""

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def _imported_by(code: str) -> set:
    done = _python(textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))")
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


HEAVY = {"tvm", "tvm_ffi", "torch", "xgboost", "matplotlib", "prnn_tvm.compiler"}


def test_the_help_imports_neither_tvm_nor_torch_nor_xgboost():
    seen = _imported_by("""
        from prnn_tvm.cli import main
        try:
            main(["--help"])
        except SystemExit as done:
            assert done.code == 0
    """)
    assert "prnn_tvm.cli" in seen and not seen & HEAVY, seen & HEAVY


@pytest.mark.parametrize("command", [["--help"], ["cache", "info"], ["tune", "--help"], ["bench", "--help"]])
def test_the_command_line_answers_without_tvm_torch_or_xgboost(command):
    """``prnn-tvm`` answers these without the heavy imports (the CPU time each took is printed: the target is a
    second; a figure, not an assertion)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = f"from prnn_tvm.cli import main; raise SystemExit(main({command!r}))"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0 and done.stdout, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "prnn_tvm.cli" in imported and not imported & HEAVY, imported & HEAVY
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"prnn-tvm {' '.join(command)}: {cpu:.2f} s of CPU")


def test_import_prnn_tvm_torch_imports_torch_but_not_tvm():
    pytest.importorskip("torch")
    seen = _imported_by("import prnn_tvm.torch")
    assert "torch" in seen and "prnn_tvm.torch" in seen
    assert not seen & {"tvm", "prnn_tvm.compiler", "xgboost", "torch._dynamo"}, seen & {
        "tvm",
        "prnn_tvm.compiler",
        "xgboost",
        "torch._dynamo",
    }


def test_the_package_names_its_api_and_imports_it_when_used():
    seen = _imported_by("""
        import prnn_tvm
        assert {"compile_cell", "export", "load", "LoadError"} <= set(dir(prnn_tvm))
    """)
    assert "prnn_tvm" in seen and not seen & HEAVY
    done = _python("import prnn_tvm; print(prnn_tvm.compile_cell.__module__, 'compile_cell' in prnn_tvm.__all__)")
    assert done.stdout.split() == ["prnn_tvm.compiler", "True"], done.stderr
    done = _python("import prnn_tvm; prnn_tvm.no_such_thing")
    assert "module 'prnn_tvm' has no attribute 'no_such_thing'" in done.stderr


def test_without_torch_prnn_tvm_torch_says_how_to_install_it():
    done = _python("""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import prnn_tvm.torch
    """)
    assert "ModuleNotFoundError" in done.stderr and "pip install 'prnn-tvm[torch]'" in done.stderr
    assert "pip install -e '.[torch]'" in done.stderr


def test_without_xgboost_the_cost_model_says_how_to_install_it():
    done = _python("""
        import sys
        sys.modules["xgboost"] = None  # as if xgboost were not installed
        from prnn_tvm.tune.model import XGBoostCostModel
        from prnn_tvm.tune.search import STRATEGIES
        STRATEGIES["random"]()  # the searches without a model need no xgboost
        XGBoostCostModel()
    """)
    assert "PrnnError" in done.stderr and "pip install 'prnn-tvm[tune]'" in done.stderr
    assert "--search random" in done.stderr


def test_the_package_carries_its_license():
    root = Path(__file__).resolve().parents[1]
    text = (root / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert 'license-files = ["LICENSE"]' in (root / "pyproject.toml").read_text()

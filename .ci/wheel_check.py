"""The installed wheel, used from outside the repository (``make wheel-test``): the command line, a CPU compile
checked against NumPy, an export loaded back, a CUDA build (the package's barrier sources and tuning logs), the
layer cache across processes, and the hints for the optional dependencies it was installed without.

Run with the wheel's virtualenv's python, in an empty folder: ``python wheel_check.py path/to/prnn-tvm``.
"""

import subprocess
import sys
from pathlib import Path

PRNN_TVM = sys.argv[1]
HERE = Path.cwd()


def run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stderr}"
    return done.stdout


def main() -> None:
    import prnn_tvm

    installed = Path(prnn_tvm.__file__).resolve()
    assert Path(sys.prefix).resolve() in installed.parents, f"prnn_tvm comes from {installed}, not the wheel"
    assert "lstm" in run(PRNN_TVM, "cells") and "usage" in run(PRNN_TVM, "--help")

    from prnn_tvm.checks import check_against_reference
    from prnn_tvm.dtypes import tolerance

    layer = prnn_tvm.compile_cell("lstm", 32, 2, input_size=8, target="llvm")
    result = check_against_reference(layer, 16, tolerance=tolerance("float32", 16))
    assert result.ok, f"CPU compile: max abs error {result.max_abs_error} vs NumPy"
    assert layer.library is not None, "the layer cache stored nothing"
    found = run(sys.executable, "-c", "import prnn_tvm; print(prnn_tvm.compile_cell('lstm', 32, 2, input_size=8, "
                                      "target='llvm').library is not None)")
    assert found.strip() == "True", "a second process did not find the layer in the cache"
    assert "lstm" in run(PRNN_TVM, "cache", "list")

    run(PRNN_TVM, "export", "gru", "--hidden", "16", "--batch", "2", "--cpu", "-o", str(HERE / "gru.so"))
    loaded = prnn_tvm.load(HERE / "gru.so")
    assert loaded.metadata["cell"] == "gru" and loaded.metadata["target"] == "llvm"

    from prnn_tvm import records

    cuda = prnn_tvm.compile_cell("lstm", 64, 4, arch="sm_90", cache=False)  # the package's .cuh sources
    assert "prnn_barrier_begin" in cuda.cuda_source and records.default_log("sm_90").is_file()

    for module, extra in (("prnn_tvm.torch", "prnn-tvm[torch]"), ("xgboost", "prnn-tvm[tune]")):
        try:
            if module == "xgboost":
                from prnn_tvm.tune.model import XGBoostCostModel

                XGBoostCostModel()
            else:
                __import__(module)
        except (ImportError, prnn_tvm.PrnnError) as err:
            assert extra in str(err), f"{module} missing, and the error does not say how to install it: {err}"
        else:
            print(f"{module} is installed here: its hint is not checked")
    print(f"wheel check passed: prnn-tvm {prnn_tvm.__version__} from {installed.parent}")


if __name__ == "__main__":
    main()

"""The README's "Define your own cell" tutorial runs as written."""

import pathlib
import re

import prnn_tvm
from prnn_tvm.checks import check_against_reference
from prnn_tvm.dtypes import tolerance

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_tutorial_cell_compiles_and_matches_its_reference(tmp_path):
    text = README.read_text()
    section = text[text.index("## Define your own cell"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    path = tmp_path / "my_cell.py"
    path.write_text(code)
    layer = prnn_tvm.compile_cell(str(path), hidden=24, batch=3, target="llvm")
    assert layer.plan.phases == 2  # as the tutorial says
    res = check_against_reference(layer, 9, tolerance("float32", 9))
    assert res.ok, res
    cuda = prnn_tvm.compile_cell(str(path), hidden=256, batch=4, target="cuda", arch="sm_90")
    assert cuda.report.spill_bytes == 0

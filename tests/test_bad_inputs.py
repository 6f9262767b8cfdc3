"""The bad-input table of docs/bad-inputs.md, row by row: each bad input gives its clear error, before
anything is launched, and leaves the layer usable for the next good call.

The table is the specification: every row's first column names a bad input, its second column is an
excerpt of the error the user sees (in backquotes) or, for an input that now gets the right answer,
what happens, and its third the test that checks it. Every row whose test is this file's names a case
below; a row without a case, a case without a row, or a row naming a test that does not exist fails.
"""

import json
import logging
import math
import os
import pathlib
import pickle
import re
import textwrap

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import InputError, PrnnError, records
from prnn_tvm.checks import max_error
from prnn_tvm.cli import main
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.target import local_gpu

TABLE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md"
THIS = pathlib.Path(__file__).name


def table_rows() -> dict:
    """Bad input -> (what the user sees: an excerpt of the error, or None for a right answer, the test that checks
    it), from the table of docs/bad-inputs.md."""
    rows = {}
    for line in TABLE.read_text().splitlines():
        m = re.fullmatch(r"\| (.+?) \| (`(.+)`|[^`|].*?) \| `([\w./]+)(::\w+)?` \|", line.strip())
        if m:
            rows[m.group(1)] = (m.group(3) and m.group(3).replace("\\|", "|"), m.group(4) + (m.group(5) or ""))
    return rows


ALL_ROWS = table_rows()
ROWS = {what: excerpt for what, (excerpt, test) in ALL_ROWS.items() if test == THIS}
CASES = {}


def case(what):
    def register(fn):
        CASES[what] = fn
        return fn

    return register


@pytest.fixture(scope="module")
def lstm():
    return prnn_tvm.compile_cell("lstm", 8, 2, target="llvm")


@pytest.fixture
def good(lstm):
    return random_inputs(lstm.plan, 3, 8)


def _call_with(lstm, good, **changes):
    args = {**good, **changes}
    return lstm(**{k: v for k, v in args.items() if v is not _DROP})


_DROP = object()


def _cell_file(tmp_path, body):
    path = tmp_path / "cell.py"
    path.write_text(body)
    return str(path)


_GOOD_CELL = textwrap.dedent("""
    import numpy as np
    from tvm import te
    from prnn_tvm import Cell

    def step(c):
        x, h, W = c.input(), c.state("h"), c.weight("W")
        hw = c.matvec(h, W, "hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")}
""")


# ---------------------------------------------------------------- compile_cell and cells
@case("`compile_cell` with `hidden=0`")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 0, 2, target="llvm")


@case("an unsupported `dtype`")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, dtype="int8", target="llvm")


@case("an unknown `target`")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="vulkan")


@case("an unknown `arch`")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_99")


@case("a config dict with an unknown knob")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90", config={"units_per_cta": 1, "bogus": 1})


@case("a config knob of the wrong type")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        "lstm",
        8,
        2,
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 1, "k_split": 8, "rows_per_thread": 1, "batch_tile": "2"},
    )


@case("a config that cannot fit")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        "lstm",
        1024,
        4,
        target="cuda",
        arch="sm_90",
        config={"units_per_cta": 8, "k_split": 4, "rows_per_thread": 16, "batch_tile": 4},
    )


@case("a config whose grid does not fit once compiled")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        "lstm",
        1024,
        16,
        dtype="float16",
        arch="sm_90",
        bidirectional=True,
        config={"units_per_cta": 8, "k_groups": 4, "n_tiles": 2, "barrier": "counter", "layout": "split"},
    )


@case("a config for the CPU build")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", config={"vec": 4})


@case("a weight of 2^31 elements or more")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("rnn_tanh", 100_000, 1, target="llvm")


@case("a misspelled cell name")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstmm", 8, 2, target="llvm")


@case("a cell file that does not exist")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(str(tmp_path / "nope.py"), 8, 2, target="llvm")


@case("a cell file with a syntax error")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(_cell_file(tmp_path, "def step(c:\n"), 8, 2, target="llvm")


@case("a cell file whose import fails")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(_cell_file(tmp_path, "import no_such_module_here\n"), 8, 2, target="llvm")


@case("a cell mixing hidden units")
def _(lstm, good, tmp_path):
    path = _cell_file(
        tmp_path,
        _GOOD_CELL.replace("x[n, j] + hw[n, j]", "x[n, j] + hw[n, (j + 1) % 8]")
        + "\nCELL = Cell('shift', step, lambda x, s, p: s)\n",
    )
    prnn_tvm.compile_cell(path, 8, 2, target="llvm")


@case("a state update of the wrong shape")
def _(lstm, good, tmp_path):
    body = _GOOD_CELL.replace(
        'c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")',
        'c.pointwise(lambda n, j: te.tanh(x[n, j % 8] + hw[n, j % 8]), "h_new", slices=2)',
    )
    prnn_tvm.compile_cell(
        _cell_file(tmp_path, body + "\nCELL = Cell('wide', step, lambda x, s, p: s)\n"), 8, 2, target="llvm"
    )


@case("a reference that returns the wrong shape")
def _(lstm, good, tmp_path):
    path = _cell_file(tmp_path, _GOOD_CELL + "\nCELL = Cell('bad_ref', step, lambda x, s, p: {'h': np.zeros(3)})\n")
    layer = prnn_tvm.compile_cell(path, 8, 2, target="llvm")
    reference_layer(layer.plan, random_inputs(layer.plan, 2, 8))


# ---------------------------------------------------------------- calling a layer
@case("`x` of the wrong batch")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, x=good["x"][:, :1])


@case("a weight of the wrong dtype")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, W_hh=good["W_hh"].astype(np.float64))


@case("a sequence of zero steps")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, x=good["x"][:0])


@case("`x` without a time axis")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, x=good["x"][0])


@case("a list instead of an array")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, h0=good["h0"].tolist())


@case("a missing argument")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, W_hh=_DROP)


@case("an unknown keyword argument")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, bias=good["b_hh"])


@case("too many positional arguments")
def _(lstm, good, tmp_path):
    lstm(*[good.get(n) for n in lstm.arg_names], good["h0"])


@case("a row length past the sequence")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, lengths=np.array([1, 4]))


@case("row lengths that are not integers")
def _(lstm, good, tmp_path):
    _call_with(lstm, good, lengths=np.array([1.0, 2.0]))


@case("an argument given twice")
def _(lstm, good, tmp_path):
    lstm(good["x"], x=good["x"])


@case("a non-contiguous DLPack tensor")
def _(lstm, good, tmp_path):
    import tvm_ffi

    strided = np.zeros((32, 16), np.float32)[:, ::2]
    _call_with(lstm, good, W_hh=tvm_ffi.from_dlpack(strided, require_alignment=0))


@case("a CUDA layer called on a machine without a GPU")
def _(lstm, good, tmp_path):
    if local_gpu() is not None:
        pytest.skip("checks the GPU-less behaviour")
    prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90")(**good)


@case("GPU training of a layer whose backward does not fit")
def _(lstm, good, tmp_path):
    layer = prnn_tvm.compile_cell("lstm", 1152, 2, target="cuda", arch="sm_90", tuning_logs=[])
    prnn_tvm.compile_training(layer)


# ---------------------------------------------------------------- tuning logs
def _log_with(tmp_path, **change):
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 2, 8)
    from prnn_tvm.target import gpu_spec

    key = records.key_for(plan, gpu_spec("sm_90"), "persistent_cuda")
    cfg = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90", tuning_logs=[]).report.config
    line = json.loads(records.Record(key, cfg, (1e-3,), 16).to_json())
    for k, v in change.items():
        if k == "tvm":
            line["key"]["tvm"] = v
        else:
            line[k] = v
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(line) + "\n")
    return path


def _compile_with_log(path):
    rep = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90", tuning_logs=[path]).report
    raise PrnnError(rep.config_detail)  # what the report says is what this row checks


@case("a tuning record with a NaN time")
def _(lstm, good, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        records.load(_log_with(tmp_path, costs=[math.nan]))
    raise PrnnError(caplog.text)


@case("a tuning record with a negative time")
def _(lstm, good, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        records.load(_log_with(tmp_path, costs=[-3.9]))
    raise PrnnError(caplog.text)


@case("a tuning record with `seq_len: 0`")
def _(lstm, good, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        records.load(_log_with(tmp_path, seq_len=0))
    raise PrnnError(caplog.text)


@case("a truncated line in a tuning log")
def _(lstm, good, tmp_path, caplog):
    path = _log_with(tmp_path)
    path.write_text(path.read_text()[:40])
    with caplog.at_level(logging.WARNING):
        records.load(path)
    raise PrnnError(caplog.text)


@case("a tuning record from another TVM version")
def _(lstm, good, tmp_path):
    _compile_with_log(_log_with(tmp_path, tvm="0.26.0"))


@case("a tuning log path that is a directory")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90", tuning_logs=[tmp_path])


# ---------------------------------------------------------------- export and load
@case("exporting into a folder that does not exist")
def _(lstm, good, tmp_path):
    prnn_tvm.export(lstm, tmp_path / "missing" / "lstm.so")


@case("loading a directory")
def _(lstm, good, tmp_path):
    prnn_tvm.load(tmp_path)


@case("loading a file that does not exist")
def _(lstm, good, tmp_path):
    prnn_tvm.load(tmp_path / "lstm.so")


@case("loading a file that is not a library")
def _(lstm, good, tmp_path):
    (tmp_path / "junk.so").write_bytes(b"not a library" * 100)
    prnn_tvm.load(tmp_path / "junk.so")


@case("loading an export with bytes changed")
def _(lstm, good, tmp_path):
    path = prnn_tvm.export(lstm, tmp_path / "lstm.so")
    data = bytearray(path.read_bytes())
    for i in range(1000, len(data) - 100, len(data) // 7):  # a few bytes flipped, same size
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    prnn_tvm.load(path)


@case("loading an export cut short")
def _(lstm, good, tmp_path):
    path = prnn_tvm.export(lstm, tmp_path / "lstm.so")
    path.write_bytes(path.read_bytes()[:-1000])
    prnn_tvm.load(path)


@case("loading a TVM library without prnn-tvm's metadata")
def _(lstm, good, tmp_path):
    lstm.compiled_module().export_library(str(tmp_path / "plain.so"))
    prnn_tvm.load(tmp_path / "plain.so")


# ---------------------------------------------------------------- the command line
def _cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse's refusal of an argument
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err  # one line, no traceback
    raise PrnnError(err)


@case("`prnn-tvm compile` of a cell file with a syntax error")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "compile", _cell_file(tmp_path, "def step(c:\n"), "--hidden", "8", "--batch", "2")


@case("`prnn-tvm bench --from-csv` of a missing file")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "bench", "--from-csv", str(tmp_path / "none.csv"))


@case("`prnn-tvm bench --from-csv` of a CSV with other columns")
def _(lstm, good, tmp_path, capsys):
    (tmp_path / "other.csv").write_text("name,time\nlstm,3\n")
    _cli(capsys, "bench", "--from-csv", str(tmp_path / "other.csv"))


@case("`prnn-tvm records show --log` of a directory")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "records", "show", "--log", str(tmp_path))


# ---------------------------------------------------------------- prnn_tvm.torch
def _torch():
    return pytest.importorskip("torch")


@case("a `prnn_tvm.torch` module of an integer dtype")
def _(lstm, good, tmp_path):
    import prnn_tvm.torch as pt

    pt.GRU(4, 8, dtype=_torch().int32)


@case("a float64 layer for the GPU")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, dtype="float64", target="cuda", arch="sm_90")


@case("a half module called with a float32 input")
def _(lstm, good, tmp_path):
    import prnn_tvm.torch as pt

    torch = _torch()
    with torch.no_grad():
        pt.from_torch(torch.nn.LSTM(4, 8).half())(torch.randn(3, 2, 4))


@case("a half `dtype` for a GPU before sm_80")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, dtype="float16", target="cuda", arch="sm_75")


@case("a module call with a wrong initial state")
def _(lstm, good, tmp_path):
    import prnn_tvm.torch as pt

    torch = _torch()
    with torch.no_grad():
        pt.from_torch(torch.nn.GRU(4, 8))(torch.randn(3, 2, 4), torch.zeros(1, 5, 8))


@case("a module call on a 4-d input")
def _(lstm, good, tmp_path):
    import prnn_tvm.torch as pt

    torch = _torch()
    with torch.no_grad():
        pt.from_torch(torch.nn.RNN(4, 8))(torch.randn(3, 2, 4, 1))


# ---------------------------------------------------------------- a cell's names and its author's code
def _step_file(tmp_path, body: str, reference: str = "lambda x, s, p: s") -> str:
    """A cell file whose step is ``body`` (indented, ``x, h, W`` declared; it returns the new state)."""
    step = textwrap.indent(textwrap.dedent(body).strip(), "    ")
    return _cell_file(
        tmp_path,
        textwrap.dedent("""
        import sys
        import numpy as np
        from tvm import te
        from prnn_tvm import Cell

        def step(c):
            x, h, W = c.input(), c.state("h"), c.weight("W")
    """)
        + step
        + f"\n\nCELL = Cell('mine', step, {reference})\n",
    )


@case("two stages with the same `name=`")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _step_file(
            tmp_path,
            """
        hw = c.matvec(h, W, "hw")
        a = c.pointwise(lambda n, j: x[n, j] + hw[n, j], "t")
        b = c.pointwise(lambda n, j: te.tanh(a[n, j]), "t")
        return {"h": b}
    """,
        ),
        8,
        2,
        target="llvm",
    )


@case("two products with the same name")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _step_file(
            tmp_path,
            """
        U = c.weight("U")
        a, b = c.matvec(h, W, "hw"), c.matvec(h, U, "hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + a[n, j] + b[n, j]), "h_new")}
    """,
        ),
        8,
        2,
        target="llvm",
    )


@case('a param named like the layer\'s own argument (`c.param("b_ih")`, `"lengths"`, `c.weight("W_ih")`)')
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _step_file(
            tmp_path,
            """
        hw, b = c.matvec(h, W, "hw"), c.param("b_ih")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + b[j]), "h_new")}
    """,
        ),
        8,
        2,
        target="llvm",
    )


@case('a weight named like a state\'s argument (`c.weight("h0")`)')
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _step_file(
            tmp_path,
            """
        hw, hv = c.matvec(h, W, "hw"), c.matvec(h, c.weight("h0"), "hv")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + hv[n, j]), "h_new")}
    """,
        ),
        8,
        2,
        target="llvm",
    )


@case('a stage name that is no identifier (`"h w-1"`)')
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _step_file(
            tmp_path,
            """
        hw = c.matvec(h, W, "hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h w-1")}
    """,
        ),
        8,
        2,
        target="cuda",
        arch="sm_90",
    )


def _delayed(delays):
    base = prnn_tvm.resolve("rnn_tanh")
    return prnn_tvm.compile_cell(
        prnn_tvm.Cell("delayed", base.step, base.reference, delays=delays), 8, 2, target="llvm"
    )


@case("a negative delay")
def _(lstm, good, tmp_path):
    _delayed((("h", -1),))


@case("a delay of a state the cell does not declare")
def _(lstm, good, tmp_path):
    _delayed((("nope", 1),))


@case("a `Cell` field of the wrong type")
def _(lstm, good, tmp_path):
    base = prnn_tvm.resolve("rnn_tanh")
    prnn_tvm.Cell("odd", base.step, base.reference, output=3)


@case("an input slice the step never reads (`c.input(3)`, two read)")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(
        _cell_file(
            tmp_path,
            textwrap.dedent("""
        import numpy as np
        from tvm import te
        from prnn_tvm import Cell

        def step(c):
            x, h, W = c.input(3), c.state("h"), c.weight("W", 2)
            hw = c.matvec(h, W, "hw")
            z = c.pointwise(lambda n, j: te.sigmoid(x[n, j] + hw[n, j]), "z")
            return {"h": c.pointwise(lambda n, j: z[n, j] * te.tanh(x[n, c.hidden + j] + hw[n, c.hidden + j]), "h_new")}

        CELL = Cell("two_of_three", step, lambda x, s, p: s)
    """),
        ),
        8,
        2,
        target="llvm",
    )


@case("an exception in the cell's step")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(_step_file(tmp_path, "return {'h': 1 / 0}"), 8, 2, target="llvm")


@case("an exception in the cell's reference")
def _(lstm, good, tmp_path):
    path = _step_file(
        tmp_path,
        """
        hw = c.matvec(h, W, "hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")}
    """,
        reference="lambda x, s, p: {'h': x + s['h'] @ p['Wrong'].T}",
    )
    layer = prnn_tvm.compile_cell(path, 8, 2, target="llvm")
    reference_layer(layer.plan, random_inputs(layer.plan, 2, 8))


@case("a cell file that calls `sys.exit(0)` at import")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell(_cell_file(tmp_path, "import sys\nsys.exit(0)\n"), 8, 2, target="llvm")


@case("a cell file that is a device (a symlink to `/dev/zero`)")
def _(lstm, good, tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.py")
    prnn_tvm.compile_cell(str(tmp_path / "zero.py"), 8, 2, target="llvm")


@case("a wavefront stack of more layers than one launch runs (`lstm_x200`)")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm_x200", 1, 1, target="cuda", arch="sm_90")


@case("a stack of a bidirectional cell (`lstm_bi --layers 2`)")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm_bi", 8, 2, target="llvm", layers=2)


@case("a `hidden` past 32-bit integers")
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 2**31, 1, target="llvm")


@case('an `arch` for the CPU build (`target="llvm", arch="sm_90"`)')
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", arch="sm_90")


@case('`compile_cell(..., bidirectional="no")`')
def _(lstm, good, tmp_path):
    prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", bidirectional="no")


@case("a negative `barrier_timeout_us`")
def _(lstm, good, tmp_path):
    layer = prnn_tvm.compile_cell("lstm", 8, 2, target="cuda", arch="sm_90")
    layer.barrier_timeout_us = -5


# ---------------------------------------------------------------- exports, loads, logs
@case('loading with a `device` that is no TVM device (`"cuda"`)')
def _(lstm, good, tmp_path):
    prnn_tvm.load(prnn_tvm.export(lstm, tmp_path / "lstm.so"), device="cuda")


@case("exporting to a name that does not end in `.so`")
def _(lstm, good, tmp_path):
    prnn_tvm.export(lstm, tmp_path / "layer.bin")


@case("exporting into a folder that is not writable")
def _(lstm, good, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a non-root user sees a read-only folder
    prnn_tvm.export(lstm, tmp_path / "lstm.so")


@case("loading an export whose metadata lacks a key")
def _(lstm, good, tmp_path, monkeypatch):
    from prnn_tvm.runtime import exporting

    metadata = exporting.layer_metadata(lstm)
    del metadata["target"]
    monkeypatch.setattr(exporting, "layer_metadata", lambda _layer: metadata)
    prnn_tvm.load(prnn_tvm.export(lstm, tmp_path / "lstm.so"))


@case("loading a FIFO")
def _(lstm, good, tmp_path):
    os.mkfifo(tmp_path / "pipe.so")
    prnn_tvm.load(tmp_path / "pipe.so")


@case("pickling a compiled layer")
def _(lstm, good, tmp_path):
    pickle.dumps(lstm)


@case("a tuning log that is a device (`/dev/urandom`)")
def _(lstm, good, tmp_path):
    records.load("/dev/urandom")


def _warned(caplog, path):
    with caplog.at_level(logging.WARNING):
        records.load(path)
    raise PrnnError(caplog.text)


@case('a tuning record with `"costs": "123"`')
def _(lstm, good, tmp_path, caplog):
    _warned(caplog, _log_with(tmp_path, costs="123"))


@case("a tuning record with `seq_len` 10^18")
def _(lstm, good, tmp_path, caplog):
    _warned(caplog, _log_with(tmp_path, seq_len=10**18))


@case("a tuning record of 1e-12 s per step")
def _(lstm, good, tmp_path, caplog):
    _warned(caplog, _log_with(tmp_path, costs=[1e-12], seq_len=1))


@case("a tuning log of a later schema")
def _(lstm, good, tmp_path, caplog):
    path = _log_with(tmp_path, schema=2)
    path.write_text(path.read_text() * 3)
    _warned(caplog, path)
    assert caplog.text.count("schema") == 2  # one warning for the file


# ---------------------------------------------------------------- the command line's option conflicts
@case("`prnn-tvm compile --default-config --log log.jsonl`")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "compile", "lstm", "--hidden", "8", "--batch", "2", "--default-config", "--log", "log.jsonl")


@case("`prnn-tvm records show --log log.jsonl --arch sm_80`")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "records", "show", "--log", "log.jsonl", "--arch", "sm_80")


@case("`prnn-tvm export --cpu --arch sm_90`")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "export", "lstm", "--hidden", "8", "--batch", "2", "--cpu", "--arch", "sm_90", "-o", "x.so")


@case("`prnn-tvm bench --from-csv` with other options")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "bench", "--from-csv", str(tmp_path / "none.csv"), "--cells", "gru")


@case("`prnn-tvm compile --hidden 99999999999999999999`")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "compile", "lstm", "--hidden", "99999999999999999999", "--batch", "1")


@case("`prnn-tvm compile` of a cell whose step raises")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "compile", _step_file(tmp_path, "return {'h': 1 / 0}"), "--hidden", "8", "--batch", "2")


@case("`prnn-tvm records show --log /dev/urandom`")
def _(lstm, good, tmp_path, capsys):
    _cli(capsys, "records", "show", "--log", "/dev/urandom")


# ---------------------------------------------------------------- prnn_tvm.torch's arguments
def _pt():
    _torch()
    import prnn_tvm.torch as pt

    return pt


@case("`prnn_tvm.torch.LSTM(4, 8.0)`")
def _(lstm, good, tmp_path):
    _pt().LSTM(4, 8.0)


@case('`dropout="0.5"`')
def _(lstm, good, tmp_path):
    _pt().GRU(4, 8, dropout="0.5")


@case('`bidirectional="no"`')
def _(lstm, good, tmp_path):
    _pt().LSTM(4, 8, bidirectional="no")


@case("`input_size=0`")
def _(lstm, good, tmp_path):
    _pt().RNN(0, 8)


@case("`batch_buckets=[0, 8]`")
def _(lstm, good, tmp_path):
    _pt().LSTM(4, 8).batch_buckets = [0, 8]


@case("`kept_batch_sizes=0`")
def _(lstm, good, tmp_path):
    _pt().GRU(4, 8).kept_batch_sizes = 0


@case("a module parameter replaced by one of another shape")
def _(lstm, good, tmp_path):
    torch, pt = _torch(), _pt()
    fast = pt.LSTM(4, 8)
    fast.weight_hh_l0 = torch.nn.Parameter(torch.zeros(3, 3))
    with torch.no_grad():
        fast(torch.randn(3, 2, 4))


@case("a module parameter of another dtype")
def _(lstm, good, tmp_path):
    torch, pt = _torch(), _pt()
    fast = pt.GRU(4, 8)
    fast.bias_hh_l0.data = fast.bias_hh_l0.data.double()
    with torch.no_grad():
        fast(torch.randn(3, 2, 4))


@case("`torch.jit.trace` of a module")
def _(lstm, good, tmp_path):
    torch, pt = _torch(), _pt()
    torch.jit.trace(pt.LSTM(4, 8), torch.randn(3, 2, 4))


@case("`torch.export.export` of a module whose cell is a `Cell` object")
def _(lstm, good, tmp_path):
    from prnn_tvm.deferred import resolve

    torch, pt = _torch(), _pt()
    torch.export.export(pt.Recurrent(resolve("gru_cho"), 4, 8), (torch.randn(3, 2, 4),))


@case("double backward (`create_graph=True`, then a gradient of the gradient)")
def _(lstm, good, tmp_path):
    torch, pt = _torch(), _pt()
    fast = pt.LSTM(4, 8)
    x = torch.randn(3, 2, 4, requires_grad=True)
    (g,) = torch.autograd.grad(fast(x)[0].sum(), x, create_graph=True)
    (g**2).sum().backward()


@case("CPU torch `lengths` outside [0, T]")
def _(lstm, good, tmp_path):
    torch = _torch()
    _call_with(lstm, good, lengths=torch.tensor([1, 4], dtype=torch.int32))


# ---------------------------------------------------------------- the checks
def test_every_row_has_a_case_and_every_case_a_row():
    assert len(ROWS) >= 80
    assert set(ROWS) == set(CASES), set(ROWS) ^ set(CASES)
    assert all(ROWS.values()), [what for what, excerpt in ROWS.items() if not excerpt]  # an error, in backquotes


def test_every_row_names_a_test_that_exists():
    assert len(ALL_ROWS) > len(ROWS)
    for what, (_, test) in ALL_ROWS.items():
        path, _, name = test.partition("::")
        source = (pathlib.Path(__file__).parent / path).read_text()
        assert not name or f"def {name}(" in source, f"{what}: {test} does not exist"


@pytest.mark.parametrize("what", sorted(CASES))
def test_bad_input_gives_its_error_and_the_layer_stays_usable(what, lstm, good, tmp_path, request):
    fn = CASES[what]
    extra = {name: request.getfixturevalue(name) for name in fn.__code__.co_varnames[3 : fn.__code__.co_argcount]}
    with pytest.raises(PrnnError) as raised:
        fn(lstm, good, tmp_path, **extra)
    assert ROWS[what] in str(raised.value), f"{what}: got {raised.value}"
    assert "Traceback" not in str(raised.value)
    assert_next_call_is_right(lstm, good)


def assert_next_call_is_right(lstm, good):
    out, (h_n, c_n) = lstm(**good)
    ref, ref_finals = reference_layer(lstm.plan, good)
    assert max_error([(out, ref), (h_n, ref_finals["h"]), (c_n, ref_finals["c"])]) <= tolerance("float32", 3)


@pytest.mark.parametrize("lengths", [[-1, 2], [3, -7], [-128, 0]])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_row_lengths_below_zero_are_refused_like_those_past_the_sequence(lstm, good, lengths, dtype):
    """The table's row is a length past the sequence; one below 0 is refused with the same words (the kernels
    would run it as no step at all, silently)."""
    lengths = np.array(lengths).astype(dtype)
    with pytest.raises(
        InputError,
        match=re.escape(
            f"lengths must lie in [0, 3] (the sequence's 3 steps), got values from {lengths.min()} to {lengths.max()}"
        ),
    ):
        _call_with(lstm, good, lengths=lengths)
    assert_next_call_is_right(lstm, good)

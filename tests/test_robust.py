"""Robustness on the CPU: chunked long sequences, validated tuning records, the input_size=1
projection, checksummed exports, misaligned torch parameters."""

import json
import logging
import math
import re

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm import records
from prnn_tvm.records import Record, TuneKey
from prnn_tvm.reference import random_inputs, reference_layer
from prnn_tvm.runtime import binding, limits
from prnn_tvm.runtime.loading import CHECKSUM_BYTES, CHECKSUM_MAGIC, read_metadata


# ---------------------------------------------------------------- sequences past 32-bit indexing
@pytest.mark.parametrize("cell", ["lstm", "gru_cho", "indrnn"])
@pytest.mark.parametrize("limit", [3 * 32, 3 * 32 * 64 + 7, 3 * 32 * 999])
def test_a_chunked_sequence_is_bitwise_one_launch(cell, limit, monkeypatch):
    """With the element limit lowered, a 1000-step sequence runs in chunks carrying the states;
    the output and final states are bitwise those of one launch (and of the ``recurrent`` entry)."""
    layer = prnn_tvm.compile_cell(cell, 8, 3, input_size=5, target="llvm")
    inputs = random_inputs(layer.plan, 1000, 5, seed=1)
    out, finals = layer(**inputs)
    xp = (inputs["x"] @ inputs["W_ih"].T + inputs["b_ih"]).astype(np.float32)
    whole, _ = layer.recurrent(xp, *[inputs.get(n) for n in layer.arg_names[3:]])
    monkeypatch.setattr(limits, "MAX_ELEMENTS", limit)
    call = layer.bind(**inputs)
    per_step = 3 * layer.plan.input.slices * 8  # the projection's row is the largest
    assert call.chunks == math.ceil(1000 / (limit // per_step))
    assert sum(name != binding.COPY for name, _ in call.launches) == 2 * call.chunks
    out2, finals2 = layer(**inputs)
    assert np.array_equal(out, out2) and all(np.array_equal(a, b) for a, b in zip(finals, finals2))
    chunked, _ = layer.recurrent(xp, *[inputs.get(n) for n in layer.arg_names[3:]])
    assert np.array_equal(whole, chunked)
    # per-row lengths count from each chunk's start: rows that end in an early, a middle or the last chunk
    lengths = np.array([1, 517, 1000], np.int32)
    out3, finals3 = layer(**inputs, lengths=lengths)
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2**31 - 1)
    out4, finals4 = layer(**inputs, lengths=lengths)
    assert np.array_equal(out3, out4) and all(np.array_equal(a, b) for a, b in zip(finals3, finals4))
    ref, ref_finals = reference_layer(layer.plan, {**inputs, "lengths": lengths})
    assert np.abs(out4 - ref).max() < 1e-4 and not out4[517:, 1].any() and out4[516, 1].any()
    assert all(np.abs(f - ref_finals[s.name]).max() < 1e-4 for f, s in zip(finals4, layer.plan.states))


def test_one_launch_up_to_the_limit(monkeypatch):
    layer = prnn_tvm.compile_cell("rnn_tanh", 4, 2, target="llvm")
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 2 * 4 * 10)
    assert layer.bind(**random_inputs(layer.plan, 10, 4)).chunks == 1
    assert layer.bind(**random_inputs(layer.plan, 11, 4)).chunks == 2


# ---------------------------------------------------------------- tuning records
KEY = TuneKey("abc", 4, 64, "float32", "sm_90", 132, "persistent_cuda", "0.27.0.post1")


@pytest.mark.parametrize(
    "record, reason",
    [
        (Record(KEY, {}, (math.nan,), 1), "times must be positive"),
        (Record(KEY, {}, (math.inf,), 1), "times must be positive"),
        (Record(KEY, {}, (0.0,), 1), "times must be positive"),
        (Record(KEY, {}, (1.0,), 0), "sequence length"),
        (Record(TuneKey("abc", 0, 64, "float32", "sm_90", 132, "t", "v"), {}, (1.0,), 1), "positive integers"),
        (Record(KEY, [1, 2], (1.0,), 1), "a config is a dict"),
    ],
)
def test_records_no_measurement_gives_are_refused(record, reason):
    with pytest.raises(ValueError, match=reason):
        Record.from_json(record.to_json())


GOOD = json.loads(
    Record(
        KEY,
        {"vec": 4, "barrier": "tags"},
        (1e-3,),
        256,
        cell="lstm",
        registers=80,
        spill_bytes=0,
        max_abs_error=1e-6,
        device="H100",
    ).to_json()
)


@pytest.mark.parametrize(
    "field, value",
    [
        ("costs", "123"),
        ("costs", [True]),
        ("costs", ["1e-3"]),
        ("costs", 1e-3),
        ("seq_len", 1e18),
        ("seq_len", True),
        ("seq_len", "256"),
        ("seq_len", 10**18),
        ("error", "exploded"),
        ("error", 3),
        ("detail", 3),
        ("cell", None),
        ("device", ["H100"]),
        ("config", {"vec": [4]}),
        ("config", {"vec": {"a": 1}}),
        ("registers", -1),
        ("registers", 8.5),
        ("spill_bytes", "0"),
        ("max_abs_error", "small"),
        ("build_s", None),
        ("timestamp", "now"),
        ("key", "abc"),
        ("key", {**vars(KEY), "batch": "4"}),
        ("key", {**vars(KEY), "arch": 90}),
        ("key", {**vars(KEY), "extra": 1}),
        ("unknown", 1),
        ("schema", None),
    ],
)
def test_every_record_field_is_typed(field, value):
    """A field of the wrong type is no record: refused with its name, never read as something else (a string of
    costs was three times, a float sequence length a step of 0.00 us)."""
    assert Record.from_dict(GOOD).cell == "lstm"
    with pytest.raises((ValueError, TypeError), match=field if field not in ("schema",) else "schema"):
        Record.from_dict({**GOOD, field: value})


def test_corrupt_lines_past_ten_are_counted_not_warned(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    path.write_text("not json\n" * 15 + json.dumps(GOOD) + "\n")
    with caplog.at_level(logging.WARNING):
        assert len(records.load(path)) == 1
    assert caplog.text.count("skipping a corrupt tuning record") == records.WARNED_LINES
    assert "skipped 5 more corrupt lines" in caplog.text


def test_a_failed_record_needs_no_time():
    failed = Record(KEY, {"vec": 4}, (), 0, records.ErrorKind.TIMEOUT)
    assert Record.from_json(failed.to_json()) == failed


def test_unmatched_says_which_keys_a_log_has():
    other = Record(TuneKey("abc", 4, 64, "float32", "sm_80", 108, "persistent_cuda", "0.27.0.post1"), {}, (1.0,), 1)
    assert "sm_80 with 108 SMs" in records.unmatched([other], KEY)
    assert records.unmatched([other], TuneKey("xyz", *list(vars(KEY).values())[1:])) == ""


# ---------------------------------------------------------------- the projection at input_size=1
def test_the_input_size_1_projection_adds_the_bias_once():
    """TVM's dlight fallback turned a reduction of extent 1 into bias + (bias + x * W)."""
    layer = prnn_tvm.compile_cell("lstm", 5, 3, input_size=1, target="cuda", arch="sm_90")
    src = layer.cuda_source
    body = src[src.index("projection_kernel(", src.index("projection_kernel(") + 1) :]
    body = body[: body.index("\n}\n")]
    assert body.count("b_ih_ptr[") == 1, body


@pytest.mark.parametrize(
    "hidden, batch, dtype, threads, tiles",
    [
        (1024, 4, "float32", 256, [8 * 132, 8 * 132]),  # 128x128, k steps of 8, rows padded by 4
        (1000, 3, "float32", 256, [8 * 132, 8 * 132]),  # padded to the tile: any size
        (1024, 1, "float32", 256, [16 * 68, 16 * 132]),  # 64x128, k steps of 16
        (256, 1, "float32", 256, [16 * 68, 16 * 68]),  # batch x width 1024 < 4096: 64x64, k steps of 16
        (512, 1, "float32", 256, [16 * 68, 16 * 68]),
        (1024, 4, "float16", 128, None),
    ],
)
def test_the_projection_takes_the_tiles_measured_fastest(hidden, batch, dtype, threads, tiles):
    """float32 projections use 16x16-thread blocks and k-major shared tiles (``[k][row]``) sized by batch x
    width; half precision is the tensor-core GEMM, with no k-major tile (see ``prnn_tvm.codegen.projection``)."""
    layer = prnn_tvm.compile_cell("lstm", hidden, batch, dtype=dtype, target="cuda", arch="sm_90")
    src = layer.cuda_source
    assert re.search(rf"__launch_bounds__\({threads}\b[^)]*\) projection_kernel", src)
    body = src[src.index("projection_kernel(", src.index("projection_kernel(") + 1) :]
    shared = [int(n) for n in re.findall(r"__shared__[^;]*\[(\d+)\];", body[: body.index("\n}\n")])]
    if tiles is not None:
        assert shared == tiles
    else:  # row-major tiles, never a k-major [k][row] one
        assert all(n % 68 and n % 132 for n in shared), shared


# ---------------------------------------------------------------- exports carry a checksum
def test_an_export_ends_with_the_checksum_of_its_contents(tmp_path):
    import hashlib

    layer = prnn_tvm.compile_cell("rnn_tanh", 8, 2, target="llvm")
    data = prnn_tvm.export(layer, tmp_path / "rnn.so").read_bytes()
    body, trailer = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    assert trailer == CHECKSUM_MAGIC + hashlib.sha256(body).digest()
    assert read_metadata(tmp_path / "rnn.so")["checksum"] == "sha256 trailer"


def test_a_library_without_checksum_still_loads_with_a_warning(tmp_path, caplog):
    """What prnn-tvm 0.1.0 exported: no trailer, no checksum field in the metadata."""
    from prnn_tvm.runtime import exporting

    layer = prnn_tvm.compile_cell("rnn_tanh", 8, 2, target="llvm")
    meta = exporting.layer_metadata(layer)
    del meta["checksum"]
    path = tmp_path / "old.so"
    original = exporting.layer_metadata
    exporting.layer_metadata = lambda _layer: meta
    try:
        prnn_tvm.export(layer, path)
    finally:
        exporting.layer_metadata = original
    path.write_bytes(path.read_bytes()[:-CHECKSUM_BYTES])
    loaded = prnn_tvm.load(path)
    assert "carries no checksum" in caplog.text
    inputs = random_inputs(layer.plan, 4, 8)
    assert np.array_equal(loaded(**inputs)[0], layer(**inputs)[0])
    assert json.loads(loaded.module["prnn_tvm_metadata"]())["cell"] == "rnn_tanh"


# ---------------------------------------------------------------- misaligned torch parameters
def test_misaligned_parameters_are_copied_once_per_version():
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    ref = torch.nn.GRU(6, 5).eval()
    storage = torch.zeros(1 + ref.bias_hh_l0.numel())
    misaligned = torch.nn.Parameter(storage[1:])  # 4 bytes past an allocation's start
    with torch.no_grad():
        misaligned.copy_(ref.bias_hh_l0)
    ref.bias_hh_l0 = misaligned
    assert ref.bias_hh_l0.data_ptr() % 64
    fast = pt.from_torch(ref)
    x = torch.randn(4, 2, 6)
    with torch.no_grad():
        assert torch.allclose(fast(x)[0], ref(x)[0], atol=1e-5)
        copy = fast._aligned_copies["bias_hh_l0"][1]
        fast(x)
        assert fast._aligned_copies["bias_hh_l0"][1] is copy  # kept while the parameter is unchanged
        ref.bias_hh_l0.add_(0.25)
        assert torch.allclose(fast(x)[0], ref(x)[0], atol=1e-5)  # an update makes a fresh copy
    assert fast._aligned_copies["bias_hh_l0"][1] is not copy

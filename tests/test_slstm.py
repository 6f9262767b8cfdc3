"""sLSTM (``cells/slstm.py``): its float64 reference against FlashRNN's forward as FlashRNN writes it (transcribed
below, on FlashRNN's layouts through ``prnn_tvm.bench.flashrnn``), the CPU build over awkward sizes and heads, the
stabilizer at pre-activations that overflow exp, the derived backward, and the float32 CUDA kernels and training
kernels as emitted. GPU runs: ``test_gpu_heads.py``."""

import math
import re

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.bench import flashrnn
from prnn_tvm.checks import check_gradients, relative_error, worst
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.verify import emulator

from . import test_emulated
from .test_backward import compare
from .test_emulated import T, emulated, knobs
from .test_heads import assert_cpu_build_matches
from .test_ptxas import assert_launchable

emulates = pytest.mark.skipif(not emulator.available(), reason="emulating a kernel needs g++")


def _logsigmoid(v):
    return np.minimum(v, 0.0) - np.log1p(np.exp(-np.abs(v)))


def flashrnn_slstm(Wx, R, b):
    """FlashRNN 1.0.8's ``vanilla`` sLSTM forward from zero states (``vanilla/__init__.py``'s loop, ``vanilla/
    slstm.py``'s pointwise; f' bounded by 1 as ``fused/slstm_fused_pointwise.cuh`` bounds it), in NumPy float64:
    ``[4 states, B, T, heads, D]``."""
    B, T, G, heads, D = Wx.shape
    y, c, n, m = (np.zeros((B, heads, D)) for _ in range(4))
    R_int = R.transpose(1, 3, 0, 2)  # its internal [heads, P, gates, D] from the caller's [gates, heads, D, P]
    out = np.zeros((4, B, T, heads, D))
    for t in range(T):
        Ry = np.einsum("bhp,hpgd->bghd", y, R_int)
        i, f, z, o = np.moveaxis(Wx[:, t] + Ry + b[None], 1, 0)
        logfplusm = _logsigmoid(f) + m
        m_new = i if np.all(n == 0.0) else np.maximum(i, logfplusm)
        igate, fgate = np.exp(i - m_new), np.minimum(1.0, np.exp(logfplusm - m_new))  # as its CUDA kernels bound it
        c = fgate * c + igate * np.tanh(z)
        n = np.maximum(fgate * n + igate, 1.0)
        y, m = 1.0 / (1.0 + np.exp(-o)) * c / n, m_new
        out[:, :, t] = y, c, n, m
    return out


@pytest.mark.parametrize("heads, D, batch", [(4, 8, 3), (1, 5, 2), (6, 1, 1)])
def test_the_cell_is_flashrnns_slstm_on_its_layouts(heads, D, batch):
    rng = np.random.default_rng(heads)
    hidden, steps = heads * D, 7
    Wx = rng.standard_normal((batch, steps, 4, heads, D))
    R = rng.uniform(-0.5, 0.5, (4, heads, D, D))
    b = rng.uniform(-0.5, 0.5, (4, heads, D))
    want = flashrnn_slstm(Wx, R, b)
    layer = prnn_tvm.compile_cell(f"slstm_h{heads}", hidden, batch, dtype="float64", target="llvm")
    zeros = np.zeros((batch, hidden))
    out, finals = layer.recurrent(
        np.ascontiguousarray(flashrnn.projection(Wx)),
        R=flashrnn.recurrent(R),
        b_hh=flashrnn.bias(b),
        h0=zeros,
        c0=zeros,
        n0=zeros,
        m0=zeros,
    )
    assert np.abs(out - flashrnn.states(want, 0)).max() < 1e-12
    for k, final in enumerate(finals):  # h, c, n, m: FlashRNN's y, c, n, m
        assert np.abs(final - flashrnn.states(want, k)[-1]).max() < 1e-12


# awkward sizes: hidden 1, heads of one unit (hidden 7, prime), a batch of one, input size apart from hidden
SIZES = [("slstm", 1, 1, 3), ("slstm", 7, 3, 2), ("slstm_h7", 7, 2, 7), ("slstm_h4", 16, 1, 5), ("slstm_h3", 9, 4, 9)]


@pytest.mark.parametrize("cell, hidden, batch, input_size", SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_cpu_build_matches_the_float64_reference(cell, hidden, batch, input_size, dtype):
    assert_cpu_build_matches(cell, hidden, batch, input_size, dtype)


def test_zero_states_start_the_stabilizer_at_the_input_gate_and_huge_inputs_stay_finite():
    """From zero states the first step takes m = i~ (so n = 1); pre-activations of +-300, where exp overflows
    float32 (and float64 past 709), stay finite: the stabilizer keeps every exponent at most 0."""
    layer = prnn_tvm.compile_cell("slstm_h2", 8, 3, input_size=4, target="llvm")
    inputs = random_inputs(layer.plan, 6, 4)
    inputs["x"] = 300.0 * np.sign(inputs["x"]).astype(np.float32)
    for s in ("h0", "c0", "n0", "m0"):
        inputs[s][:] = 0.0
    out, (h, c, n, m) = layer(**inputs)
    want, finals = reference_layer(layer.plan, inputs)
    assert np.isfinite(out).all() and np.isfinite(m).all() and (n >= 1.0).all()
    assert np.abs(out - want).max() <= tolerance("float32", 6) and np.abs(n - finals["n"]).max() < 1e-3
    first, _ = layer(**{**inputs, "x": inputs["x"][:1]})
    _, one = reference_layer(layer.plan, {**inputs, "x": inputs["x"][:1]})
    assert (one["n"] == 1.0).all() and np.abs(first[0] - one["h"]).max() <= tolerance("float32", 1)


@pytest.mark.parametrize("cell, hidden, batch, input_size", SIZES)
def test_the_derived_backward_equals_the_plans(cell, hidden, batch, input_size):
    assert compare(cell, hidden, batch, 6, input_size, "float64", lengths=random_lengths(batch, 6, seed=3)) < 1e-12


@pytest.mark.parametrize("cell, hidden", [("slstm", None), ("slstm_h2", 6)])
def test_the_derived_backward_matches_central_differences(cell, hidden):
    res = check_gradients(cell, hidden=hidden)
    assert res.ok and res.max_abs_error < 1e-7, res.max_abs_error


@emulates
@pytest.mark.parametrize(
    "cell, hidden, batch, config",
    [
        ("slstm", 8, 3, knobs(4, 4, 2, 2)),
        ("slstm_h4", 16, 3, knobs(4, 4, 4, 3, barrier="block")),  # a head a block
        ("slstm_h2", 16, 2, knobs(4, 2, 2, 2, vec=4, barrier="tags")),  # two blocks a head
        ("slstm_h7", 7, 1, knobs(7, 1, 1, 1, vec=1, barrier="block")),
    ],
)
def test_the_kernels_as_emitted(cell, hidden, batch, config):
    err, layer = emulated(cell, hidden, batch, config)
    assert err <= tolerance("float32", T), (err, layer.report.config)


@emulates
@pytest.mark.parametrize(
    "cell, hidden, config", [("slstm", 8, knobs(4, 4, 2, 2)), ("slstm_h4", 16, knobs(4, 4, 4, 3, barrier="block"))]
)
def test_the_training_kernels_as_emitted(cell, hidden, config):
    layer = prnn_tvm.compile_cell(
        cell, hidden, 3, input_size=3, target="cuda", arch="sm_90", tuning_logs=[], config=config
    )
    got, want = test_emulated.emulated_gradients(layer)
    assert set(got) == set(want)
    assert worst(relative_error(got[n], want[n]) for n in want) <= 1e-5


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("slstm_h12", 768, 16, "bfloat16"),
        ("slstm_h12", 768, 16, "float32"),
        ("slstm_h4", 1024, 8, "float16"),
        ("slstm", 256, 4, "float32"),
    ],
)
def test_defaults_build_without_spills(cell, hidden, batch, dtype):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    rep = layer.report
    assert rep.spill_store_bytes == 0 and rep.spill_load_bytes == 0 and rep.stack_bytes == 0, rep.format()
    assert_launchable(layer)


@pytest.mark.parametrize("cell, dtype", [("slstm_h12", "bfloat16"), ("slstm", "bfloat16"), ("slstm_h12", "float32")])
def test_the_backward_computes_each_value_of_a_step_once(cell, dtype):
    """The backward step's CUDA binds every recomputed stage and every adjoint once (``pointwise.bind_kept``): TVM's
    simplifier had copied each into every expression that read it, and sLSTM's stages read each other so often that
    its kernel at 768 x 16 bf16 was 850 KB of source with ~1000 exp and ~550 logf calls an item (56 us a step on the
    H100). Now an item computes a handful of each, as an LSTM's does."""
    layer = prnn_tvm.compile_cell(cell, 768, 16, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    training = prnn_tvm.compile_training(layer)
    source = training.backward.module.imports[0].inspect_source()
    body = source[source.index("recurrent_backward_kernel(", source.index("recurrent_backward_kernel(") + 1) :]
    grid = training.backward.signature.launches[0].grid
    per_item = math.ceil(16 * 768 / (grid.ctas * grid.threads))  # (batch row, unit) items a thread, at most
    exps, logs = len(re.findall(r"\bexpf\(|__expf\(", body)), body.count("logf(")
    assert exps <= 16 * per_item and logs <= 2 * per_item, (exps, logs, per_item)


@pytest.mark.parametrize("dtype, fast", [("bfloat16", True), ("float16", True), ("float32", False)])
def test_half_kernels_take_the_log_and_divisions_on_the_approximate_units(dtype, fast):
    """A half layer's kernels (fast math: ``pointwise.fast_transcendentals``) compute the forget gate's log on the
    log2 unit (``__logf``) and every division (``h = o c / n``, the backward's adjoints through it) on the reciprocal
    unit (``__fdividef``), forward, saving forward and backward alike; float32 kernels keep IEEE ``logf`` and
    divisions. Their error (2^-21 or less, ``pointwise._FAST``) is checked on the GPU at the dtype's tolerance
    (``test_gpu_heads.py``)."""
    layer = prnn_tvm.compile_cell("slstm_h12", 768, 16, dtype=dtype, target="cuda", arch="sm_90", tuning_logs=[])
    training = prnn_tvm.compile_training(layer)
    trained = training.backward.module.imports[0].inspect_source()
    for name, source in (("recurrent", layer.cuda_source), ("recurrent_save", trained),
                         ("recurrent_backward", trained)):
        start = source.index(f"{name}_kernel(", source.index(f"{name}_kernel(") + 1)
        body = source[start : source.index("\n}\n", start)]
        ieee_logs = len(re.findall(r"(?<!__)logf\(", body))
        divided_by_n = re.findall(r"/ \(?n_new", body)  # h = o c / n, d h / d c = o / n, d h / d n = -o c / n^2
        assert (ieee_logs == 0 and not divided_by_n) == fast, (name, ieee_logs, divided_by_n)
        assert ("__logf(" in body and "__fdividef(" in body) == fast, name

"""Never a crash, never a wrong answer, on the GPU (``pytest -m gpu``): awkward sizes, sequences past
2^31 elements, misaligned parameters, and property-based fuzzing of cells, sizes and configs."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prnn_tvm
from prnn_tvm.checks import abs_error, max_error, worst
from prnn_tvm.dtypes import GPU_DTYPES, tolerance
from prnn_tvm.errors import ConfigError
from prnn_tvm.reference import random_inputs, random_lengths
from prnn_tvm.runtime import binding
from prnn_tvm.target import gpu_spec

from .test_gpu_numerics import run_and_compare
from .test_ptxas import config_at

pytestmark = pytest.mark.gpu
CELLS = sorted(prnn_tvm.builtin_cells())


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("batch", [1, 7])
def test_hidden_1_and_input_1(cell, batch):
    """Regression: every cell was wrong at input_size=1 (so at nn.LSTM(1, 1)): the projection's
    reduction of extent 1 added the bias twice (see prnn_tvm.codegen.projection)."""
    for hidden, input_size in ((1, 1), (9, 1)):
        layer = prnn_tvm.compile_cell(cell, hidden, batch, input_size=input_size, target="cuda")
        assert run_and_compare(layer, 20, seed=batch) <= tolerance("float32", 20), (hidden, input_size)


def test_a_grid_just_under_48_kb_of_shared_memory_runs():
    """Regression, found by the fuzz test of torch modules below: 49,096 B of dynamic shared memory plus the
    barrier's 64 B of static failed at launch (TVM lifts the 48 KB limit only where the dynamic part reaches
    it); such a kernel now allocates 48 KB (``prnn_tvm.target.launchable_smem``)."""
    layer = prnn_tvm.compile_cell(
        "rnn_tanh",
        289,
        38,
        input_size=1,
        target="cuda",
        config={
            "units_per_cta": 3,
            "k_split": 32,
            "rows_per_thread": 1,
            "batch_tile": 38,
            "vec": 2,
            "barrier": "counter",
        },
    )
    assert layer.report.dynamic_smem_bytes == 48 * 1024, layer.report.format()
    for seq_len in (1, 30):
        assert run_and_compare(layer, seq_len, seed=seq_len) <= tolerance("float32", seq_len)


@pytest.mark.slow
@pytest.mark.parametrize("kind, hidden, batch, seq_len", [("lstm", 1024, 4, 140_000), ("gru", 768, 8, 120_000)])
def test_sequences_past_2_31_elements_run_in_chunks(kind, hidden, batch, seq_len, no_tf32):
    """T * batch * gates * hidden of the projection passes 2^31: the layer runs in chunks, carrying its
    states; cuDNN, run by hand in chunks of 10,000 steps carrying its states, is the reference."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.manual_seed(0)
    ref = getattr(torch.nn, kind.upper())(hidden, hidden).cuda().eval()
    fast = pt.from_torch(ref)
    x = torch.randn(seq_len, batch, hidden, device="cuda")
    gates = 4 if kind == "lstm" else 3
    assert seq_len * batch * gates * hidden > 2**31
    with torch.no_grad():
        got, got_h = fast(x)
        want, state = [], None
        for t0 in range(0, seq_len, 10_000):
            out, state = ref(x[t0 : t0 + 10_000], state)
            want.append(out)
        want = torch.cat(want)
    err = max_error([(got, want), *zip(*((got_h, state) if kind == "lstm" else ((got_h,), (state,))))])
    assert err <= tolerance("float32", seq_len), err


def test_a_sequence_that_does_not_fit_is_refused_before_launch():
    layer = prnn_tvm.compile_cell("lstm", 1024, 64, target="cuda")
    inputs = random_inputs(layer.plan, 1, 1024)
    steps = binding._free_memory(layer.device) // (64 * 1024 * 4) + 1  # the output sequence alone is too big
    inputs["x"] = np.broadcast_to(inputs["x"], (steps, 64, 1024))  # never materialized: refused first
    with pytest.raises(prnn_tvm.InputError, match=r"needs .* GiB .* GiB are free"):
        layer.bind(**inputs)


# ---------------------------------------------------------------- fuzz: any config the tuner may pick
STACKS = ["lstm_x2", "gru_x3", "gru_cho_x2"]  # wavefront stacks: their space holds the split layout too


@st.composite
def cases(draw):
    cell = draw(st.sampled_from(CELLS + STACKS))
    hidden = draw(st.one_of(st.integers(1, 64), st.integers(65, 1400)))
    batch = draw(st.one_of(st.integers(1, 8), st.integers(9, 70)))
    input_size = draw(st.integers(1, 300).filter(lambda i: i != hidden))
    # T up to 300, as far as the float64 reference stays within a few seconds (~4 GFLOP)
    seq_len = min(draw(st.integers(1, 300)), max(1, int(5e8 // (batch * hidden * hidden))))
    pick = draw(st.floats(0, 1, exclude_max=True) | st.none())  # None: the default config
    dtype = draw(st.sampled_from(sorted(GPU_DTYPES)))
    lengths = random_lengths(batch, seq_len, seed=seq_len) if draw(st.booleans()) else None
    return cell, hidden, batch, input_size, seq_len, pick, dtype, lengths


@settings(max_examples=45, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cases())
def test_fuzz_cells_sizes_and_tuning_configs(case):
    cell, hidden, batch, input_size, seq_len, pick, dtype, lengths = case
    try:
        layer = prnn_tvm.compile_cell(
            cell,
            hidden,
            batch,
            input_size=input_size,
            dtype=dtype,
            target="cuda",
            config=config_at(pick, cell, hidden, batch, dtype, gpu_spec()),
        )
    except ConfigError as err:  # a refusal with its reason is allowed where nothing fits; a wrong answer never
        assert "fit" in str(err) or "registers" in str(err), err
        return
    if layer.report.spill_bytes:  # the tuner records a spilling config as an error, never runs it
        return
    err = run_and_compare(layer, seq_len, seed=hidden, lengths=lengths)
    assert err <= tolerance(dtype, seq_len), layer.report.format()


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["lstm", "gru", "rnn_tanh", "rnn_relu"]),
    hidden=st.integers(1, 600),
    input_size=st.integers(1, 600),
    batch=st.integers(1, 40),
    seq_len=st.integers(1, 100),
    batch_first=st.booleans(),
    with_state=st.booleans(),
)
def test_fuzz_torch_modules_against_torch_nn(
    no_tf32, kind, hidden, input_size, batch, seq_len, batch_first, with_state
):
    """Modules on the GPU (cuDNN flattens their parameters: views, biases not 64-byte aligned)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    torch.manual_seed(hidden)
    ctor = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(kind, torch.nn.RNN)
    kw = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    ref = ctor(input_size, hidden, batch_first=batch_first, **kw).cuda().eval()
    fast = pt.from_torch(ref)
    shape = (batch, seq_len, input_size) if batch_first else (seq_len, batch, input_size)
    x = torch.randn(*shape, device="cuda")
    hx = None
    if with_state:
        h0 = 0.5 * torch.randn(1, batch, hidden, device="cuda")
        hx = (h0, 0.5 * torch.randn(1, batch, hidden, device="cuda")) if kind == "lstm" else h0
    with torch.no_grad():
        (want, want_h), (got, got_h) = ref(x, hx), fast(x, hx)
    err = max_error([(got, want), *zip(*((got_h, want_h) if kind == "lstm" else ((got_h,), (want_h,))))])
    assert err <= tolerance("float32", seq_len) + 1e-5, err  # + cuDNN's own rounding


def test_misaligned_parameters_are_copied_not_refused(no_tf32):
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    ref = torch.nn.GRU(520, 520).cuda().eval()  # cuDNN's flat buffer: bias_hh starts off a 64-byte boundary
    assert any(p.data_ptr() % 64 for p in ref.parameters())
    fast = pt.from_torch(ref)
    x = torch.randn(7, 3, 520, device="cuda")
    with torch.no_grad():
        first = abs_error(fast(x)[0], ref(x)[0])
        copies = dict(fast._aligned_copies)
        fast(x)
        assert all(fast._aligned_copies[k][1] is v[1] for k, v in copies.items())  # kept, not remade
        ref.bias_hh_l0.add_(0.5)  # a weight update makes a fresh copy
        err = worst([first, abs_error(fast(x)[0], ref(x)[0])])
    assert copies and err <= tolerance("float32", 7) + 1e-5, err

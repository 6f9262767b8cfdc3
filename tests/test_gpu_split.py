"""One layer split over the GPUs of one host, on the GPUs (``pytest -m gpu``; each test says how many it needs and
skips with fewer): peer access, each step's states stored into the peers' copies over NVLink, against the float64
reference; calls after a timeout; the refusals that need a GPU to say. The same kernels on the CPU:
``test_split.py``."""

import numpy as np
import pytest

import prnn_tvm
from prnn_tvm.checks import max_abs_error, plan_tolerance
from prnn_tvm.dtypes import tolerance
from prnn_tvm.errors import BarrierTimeout, LaunchError
from prnn_tvm.reference import random_inputs, random_lengths, reference_layer
from prnn_tvm.runtime.peers import current_device_kept

pytestmark = pytest.mark.gpu
_LAYERS = {}


@pytest.fixture(autouse=True)
def _current_device_unchanged():
    """Each test leaves the CUDA runtime's current device where it found it (TVM's copies and launches on a GPU leave
    it there; torch's next ``.cuda()`` would then put the next test's module on that GPU): set back, then failed."""
    before = _current_device()
    yield
    after = _current_device()
    if after != before:
        from prnn_tvm.runtime.peers import cudart

        cudart().cudaSetDevice(before)
        pytest.fail(f"the test left the current CUDA device at {after} (it was {before})")


def split_layer(hidden: int, batch: int, dtype: str, gpus: int, cell: str = "lstm"):
    key = (cell, hidden, batch, dtype, gpus)
    if key not in _LAYERS:
        _LAYERS[key] = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, devices=list(range(gpus)), cache=False)
    return _LAYERS[key]


def error_of(layer, seq_len: int, seed: int = 0, lengths=None) -> float:
    inputs = random_inputs(layer.plan, seq_len, layer.signature.input_size, seed=seed)
    if lengths is not None:
        inputs["lengths"] = lengths
    return max_abs_error(layer.plan, layer(**inputs), reference_layer(layer.plan, inputs))


def matches_the_reference(layer, seq_lens) -> None:
    """No spills; against float64 at each of ``seq_lens`` steps and with rows of their own lengths."""
    assert layer.report.spill_store_bytes == 0, layer.report.format()
    for seq_len in seq_lens:
        err = error_of(layer, seq_len, seed=seq_len)
        assert err <= plan_tolerance(layer.plan, seq_len), f"T={seq_len}: {err:.2e}\n{layer.report.format()}"
    lengths = random_lengths(layer.signature.batch, 9, seed=1)
    assert error_of(layer, 9, lengths=lengths) <= plan_tolerance(layer.plan, 9)


@pytest.mark.gpus(2)
@pytest.mark.parametrize(
    "cell, hidden, batch, dtype",
    [
        ("lstm", 256, 3, "float32"),
        ("gru", 512, 1, "float32"),
        ("lstm", 1024, 8, "float16"),
        ("lstm", 2048, 8, "float16"),  # refused on one H100: the layer the split is for
        ("lstm", 1024, 5, "bfloat16"),
    ],
)
def test_two_gpus_match_the_reference(cell, hidden, batch, dtype):
    matches_the_reference(split_layer(hidden, batch, dtype, 2, cell), (1, 7, 256))


def hop_layer(hidden: int, batch: int, dtype: str, gpus: int, hop: str, **knobs):
    """LSTM split over ``gpus`` GPUs with the split's knob ``hop`` (16 units a CTA, two k groups unless ``knobs``)."""
    config = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "hop": hop, **knobs}
    return prnn_tvm.compile_cell("lstm", hidden, batch, dtype=dtype, devices=list(range(gpus)), config=config,
                                 cache=False)


@pytest.mark.gpus(2)
@pytest.mark.parametrize(
    "hidden, batch, dtype, knobs",
    [
        (192, 5, "float16", {}),
        (192, 5, "float16", {"smem_k_tiles": 2}),  # a warp's last two k tiles in shared memory
        (192, 11, "float16", {}),  # two batch tiles (8 rows, then 3)
        (320, 3, "bfloat16", {}),
        (1024, 8, "float16", {"units_per_cta": 8, "k_groups": 4}),
    ],
)
def test_the_exposed_hop_matches_the_reference_on_two_gpus(hidden, batch, dtype, knobs):
    """``exposed`` (the default: the whole state polled before the product), named as the knob, in single words (the
    default words' own test: ``test_packed_words_match_the_reference_on_two_gpus``), against float64 at awkward
    batches, a few steps and rows of their own lengths."""
    layer = hop_layer(hidden, batch, dtype, 2, "exposed", words="single", **knobs)
    assert "hop exposed" in layer.report.format() and "words single" in layer.report.format()
    matches_the_reference(layer, (1, 7, 64))


@pytest.mark.gpus(2)
@pytest.mark.parametrize("words", ["single", "packed"])
@pytest.mark.parametrize("hop", ["floor", "floor_own"])
def test_a_floor_runs_each_gpu_alone_and_ends(hop, words):
    """The floors (timing only): each GPU polls a peer's part from its own copy (``floor``; ``floor_own``: its own
    part alone) and stores the peer's words there, so no GPU waits for another and a call ends without a timeout;
    its outputs are finite (wrong: a peer's part of each product is this GPU's own values, or the initial state's)."""
    layer = hop_layer(192, 5, "float16", 2, hop, words=words)
    assert f"hop {hop}:" in layer.report.format() and f"words {words}" in layer.report.format()
    layer.barrier_timeout_us = 200_000
    out, finals = layer(**random_inputs(layer.plan, 16, 192))
    assert np.isfinite(out).all() and all(np.isfinite(f).all() for f in finals)


@pytest.mark.gpus(2)
@pytest.mark.parametrize(
    "hidden, batch, dtype, knobs",
    [
        (192, 5, "float16", {}),  # 12 CTAs of 16 units: 6 words each
        (192, 11, "float16", {}),  # two batch tiles (8 rows, then 3)
        (120, 3, "float16", {}),  # the last CTA's 8 units: 3 words, the last holding 2
        (320, 3, "bfloat16", {}),
        (240, 4, "float16", {"units_per_cta": 8}),  # 30 CTAs of 3 words: one word a load
        (192, 5, "float16", {"smem_k_tiles": 2}),  # a warp's last two k tiles in shared memory
        (2048, 8, "float16", {"units_per_cta": 8, "k_groups": 4}),  # the layer packed words are for
    ],
)
def test_packed_words_match_the_reference_on_two_gpus(hidden, batch, dtype, knobs):
    """``words="packed"`` (three values and a 16-bit tag a word) against float64 at awkward sizes, a few steps and rows
    of their own lengths, no spills."""
    layer = hop_layer(hidden, batch, dtype, 2, "exposed", words="packed", **knobs)
    assert "words packed" in layer.report.format()
    matches_the_reference(layer, (1, 7, 64))


@pytest.mark.gpus(2)
def test_packed_words_carry_a_gru_whose_step_reads_its_previous_state():
    """GRU (its new state reads the old one, which a thread takes from the CTA's staging tile) with packed words."""
    layer = prnn_tvm.compile_cell("gru", 192, 5, dtype="float16", devices=[0, 1], cache=False,
                                  config={"units_per_cta": 8, "k_groups": 2, "n_tiles": 1, "words": "packed"})
    assert "words packed" in layer.report.format()
    matches_the_reference(layer, (1, 7, 64))


def start_at(layer, base: int) -> None:
    """Every GPU's step base (word 2 of its barrier state) set to ``base``, its workspace as fresh (zeros); the
    caller's current device kept (TVM's copies leave it at the last GPU copied on, where torch's next module goes)."""
    with current_device_kept():
        for part in layer.parts:
            sync = part.launch_state(part.stream)["sync"]
            words = sync.numpy()
            words[2] = base
            sync.copyfrom(words)


@pytest.mark.gpus(2)
def test_packed_words_across_the_16_bit_tags_wrap():
    """A layer whose step base starts 5 short of 65536: its steps' 16-bit tags wrap to 0 inside the first call, and
    the calls after run on, against float64 (the same numbers as a layer started at 0)."""
    fresh, wrapped = (hop_layer(192, 5, "float16", 2, "exposed", words="packed") for _ in range(2))
    start_at(wrapped, 65_531)
    for seed in range(3):
        inputs = random_inputs(wrapped.plan, 16, 192, seed=seed)
        got, want = wrapped(**inputs), fresh(**inputs)
        np.testing.assert_array_equal(got[0], want[0])
        assert max_abs_error(wrapped.plan, got, reference_layer(wrapped.plan, inputs)) <= plan_tolerance(
            wrapped.plan, 16)


@pytest.mark.gpus(2)
def test_packed_words_stall_raises_and_the_next_call_is_clean():
    layer = hop_layer(192, 5, "float16", 2, "exposed", words="packed")
    first = error_of(layer, 16)
    layer.debug_stall_step, layer.barrier_timeout_us = 3, 20_000
    with pytest.raises(BarrierTimeout, match="after step 3"):
        error_of(layer, 16)
    layer.debug_stall_step = -1
    assert error_of(layer, 16) == first
    assert error_of(layer, 16) == first


@pytest.mark.gpus(4)
@pytest.mark.parametrize("hidden, batch, dtype", [(512, 3, "float32"), (2048, 4, "float16")])
def test_four_gpus_match_the_reference(hidden, batch, dtype):
    layer = split_layer(hidden, batch, dtype, 4)
    for seq_len in (1, 64):
        assert error_of(layer, seq_len) <= plan_tolerance(layer.plan, seq_len)


@pytest.mark.gpus(2)
def test_a_stall_raises_on_the_call_and_the_next_call_is_clean():
    layer = split_layer(256, 3, "float32", 2)
    first = error_of(layer, 16)
    layer.debug_stall_step, layer.barrier_timeout_us = 3, 20_000
    with pytest.raises(BarrierTimeout, match="GPU 0 after step 3"):
        error_of(layer, 16)
    layer.debug_stall_step = -1
    assert error_of(layer, 16) == first  # every GPU's exchange was reset: the same numbers as before
    assert error_of(layer, 16) == first  # and the step base advanced alike on both


@pytest.mark.gpus(1)
def test_more_gpus_than_the_host_has_is_refused_naming_them():
    import tvm

    missing = next(i for i in range(64) if not tvm.cuda(i).exist)
    layer = prnn_tvm.compile_cell("lstm", 64, 2, devices=[0, missing], cache=False)
    with pytest.raises(LaunchError, match=f"devices \\[{missing}\\] are not there"):
        layer(**random_inputs(layer.plan, 2, 64))


def _current_device() -> int:
    import ctypes

    from prnn_tvm.runtime.peers import cudart

    current = ctypes.c_int(-1)
    assert cudart().cudaGetDevice(ctypes.byref(current)) == 0
    return current.value


@pytest.mark.gpus(2)
def test_outputs_come_back_whole_from_every_gpu():
    layer = split_layer(256, 3, "float32", 2)
    inputs = random_inputs(layer.plan, 5, 256)
    before = _current_device()
    out, (h_n, c_n) = layer(**inputs)
    assert _current_device() == before  # TVM's launches set the device; the call gives the caller's back
    assert out.shape == (5, 3, 256) and h_n.shape == c_n.shape == (3, 256)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[-1], h_n)


@pytest.mark.gpus(2)
@pytest.mark.parametrize("hidden, batch, dtype", [(256, 3, "float32"), (1024, 8, "float16"), (2048, 8, "float16")])
def test_torch_module_over_two_gpus_against_float64(hidden, batch, dtype):
    """``from_torch(m, devices=[0, 1])``: error against the same module in float64 at most 1.5x cuDNN's own (or the
    tolerance), outputs on the first GPU, the caller's current device kept."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    from .test_gpu_half import errors_against_float64

    before = _current_device()
    ours_err, cudnn_err = errors_against_float64(torch.nn.LSTM, hidden, hidden, 32, batch, dtype,
                                                 lambda m: pt.from_torch(m, devices=[0, 1]))
    assert ours_err <= max(1.5 * cudnn_err, tolerance(dtype, 32)), f"ours {ours_err:.2e}, cuDNN {cudnn_err:.2e}"
    assert _current_device() == before


@pytest.mark.gpus(4)
def test_torch_module_over_four_gpus_past_registers():
    """LSTM fp16 hidden 4096 batch 4 over four GPUs (part of each CTA's weights in shared memory) through
    ``from_torch``, against float64."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    from .test_gpu_half import errors_against_float64

    ours_err, cudnn_err = errors_against_float64(torch.nn.LSTM, 4096, 4096, 16, 4, "float16",
                                                 lambda m: pt.from_torch(m, devices=[0, 1, 2, 3]))
    assert ours_err <= max(1.5 * cudnn_err, tolerance("float16", 16)), f"ours {ours_err:.2e}, cuDNN {cudnn_err:.2e}"


@pytest.mark.gpus(2)
def test_torch_stack_with_states_and_packed_rows_over_two_gpus():
    """Two layers, given initial states, a PackedSequence (rows stop at their lengths), then a parameter updated in
    place (the copies on GPU 1 follow it): each against torch.nn in float64."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.rnn import pack_padded_sequence

    import prnn_tvm.torch as pt

    torch.manual_seed(0)
    module = torch.nn.LSTM(64, 128, num_layers=2).cuda().eval()
    exact = torch.nn.LSTM(64, 128, num_layers=2).cuda().double().eval()
    ours = pt.from_torch(module, devices=[0, 1])
    x = torch.randn(9, 5, 64, device="cuda")
    h0, c0 = torch.randn(2, 5, 128, device="cuda"), torch.randn(2, 5, 128, device="cuda")
    packed = pack_padded_sequence(x, torch.tensor([9, 3, 7, 1, 5]), enforce_sorted=False)
    for _ in range(2):
        exact.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
        with torch.no_grad():
            got, (h_n, c_n) = ours(packed, (h0, c0))
            want, (h_w, c_w) = exact(packed.to(torch.float64), (h0.double(), c0.double()))
            module.weight_hh_l1.mul_(0.5)
        assert got.data.device == torch.device("cuda", 0)
        for a, b in ((got.data, want.data), (h_n, h_w), (c_n, c_w)):
            assert (a.double() - b).abs().max().item() <= tolerance("float32", 9)


@pytest.mark.gpus(2)
def test_a_torch_call_over_two_gpus_does_not_wait_for_them():
    """The public call issues every GPU's work and returns (its outputs from torch's caching allocator: TVM's would
    be freed with cudaFree, which waits for the GPU): with GPU 0 busy for about a second ahead of it, the call comes
    back long before, and gives what it gives on idle GPUs. Then ``b_ih`` (folded into ``b_hh`` for the half
    projection, kept between calls) and ``W_ih`` (each GPU's rows kept) updated in place: the next call follows
    them, against torch.nn in float64."""
    torch = pytest.importorskip("torch")
    import copy
    import time

    import prnn_tvm.torch as pt

    torch.manual_seed(0)
    module = torch.nn.LSTM(1024, 1024).cuda().half().eval()
    ours = pt.from_torch(module, devices=[0, 1])
    x = torch.randn(64, 8, 1024, device="cuda", dtype=torch.float16)

    def every_gpu():
        for d in (0, 1):
            torch.cuda.synchronize(d)

    with torch.no_grad():
        want = ours(x)[0].clone()  # compiles, on idle GPUs
        for _ in range(2):  # the caching allocator holds every buffer a call takes
            ours(x)
        every_gpu()
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU 0 (H100 clocks), ahead of the call
        start = time.perf_counter()
        got = ours(x)[0]
        issued = time.perf_counter() - start
        every_gpu()
        waited = time.perf_counter() - start
        assert issued < 0.25 * waited, f"the call took {issued:.3f} s of the {waited:.3f} s the GPUs did"
        assert torch.equal(got, want)
        module.bias_ih_l0.add_(0.5)
        module.weight_ih_l0.mul_(0.5)
        exact = copy.deepcopy(module).double()
        ours_out, cudnn_out, exact_out = ours(x)[0], module(x)[0], exact(x.double())[0]
    ours_err = (ours_out.double() - exact_out).abs().max().item()
    cudnn_err = (cudnn_out.double() - exact_out).abs().max().item()
    assert ours_err <= max(1.5 * cudnn_err, tolerance("float16", 64)), f"ours {ours_err:.2e}, cuDNN {cudnn_err:.2e}"

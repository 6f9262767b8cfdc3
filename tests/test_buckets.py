"""Batch buckets of ``prnn_tvm.torch`` modules: a call's rows padded up to a bucket, only the caller's coming back,
a bounded number of batch sizes kept (CPU build here; CUDA with ``-m gpu``)."""

import gc
import random
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402 - after the skip
import prnn_tvm.torch.dispatch as dispatch  # noqa: E402
from prnn_tvm import ConfigError  # noqa: E402
from prnn_tvm.checks import max_error  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch.buckets import KeptShapes, bucket, row_tile  # noqa: E402

from .test_torch import _gradient_error, _gradients, _lengths, _reference  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def compiles(monkeypatch):
    """The batch sizes the modules compile layers for (the dispatch's compile, counted and then run)."""
    seen = []

    def counted(cell, hidden, batch, **options):
        seen.append(batch)
        return real(cell, hidden, batch, **options)

    real = dispatch.compile_cell
    monkeypatch.setattr(dispatch, "compile_cell", counted)
    return seen


def test_the_default_buckets():
    assert sorted({bucket(b, True) for b in range(1, 65)}) == [1, 2, 4, 8, 16, 32, 64]
    assert [bucket(b, True) for b in (3, 63, 64, 65, 128, 129, 200)] == [4, 64, 64, 128, 128, 192, 256]
    assert [bucket(b, True, tile=8) for b in (1, 7, 8, 9, 65)] == [8, 8, 8, 16, 128]  # a half layer's tile
    assert [bucket(b, False) for b in (1, 3, 65)] == [1, 3, 65]
    assert [bucket(b, (3, 10)) for b in (1, 3, 4, 10, 11, 21)] == [3, 3, 10, 10, 20, 30]
    assert row_tile(torch.device("cuda"), torch.float16) == row_tile(torch.device("cuda"), torch.bfloat16) == 8
    assert row_tile(torch.device("cuda"), torch.float32) == row_tile(CPU, torch.float16) == 1


def test_a_modules_rows_follow_its_option():
    module = pt.LSTM(3, 8)
    assert module.batch_buckets is True and module.rows_for(5, CPU) == 8
    assert module.half().rows_for(3, torch.device("cuda")) == 8 and module.rows_for(3, CPU) == 4
    module.batch_buckets = [16, 4, 4]
    assert module.batch_buckets == (4, 16) and module.rows_for(5, CPU) == 16 and module.rows_for(17, CPU) == 32
    module.batch_buckets = False
    assert module.rows_for(5, CPU) == 5


@pytest.mark.parametrize("value", [[0, 4], [], "8", [2.0], None, [True]])
def test_bad_bucket_options_are_refused(value):
    with pytest.raises(ConfigError, match="batch_buckets must be"):
        pt.GRU(3, 8).batch_buckets = value


@pytest.mark.parametrize("value", [0, -1, 2.5, True, None])
def test_a_bad_bound_is_refused(value):
    with pytest.raises(ConfigError, match="kept_batch_sizes must be"):
        pt.GRU(3, 8).kept_batch_sizes = value


def test_a_module_serving_batches_1_to_64_compiles_7_layers(compiles):
    """Batch sizes 1..64 in random order: 7 layers compiled, every call equal to torch.nn's."""
    ref = _reference("lstm", input_size=3, hidden_size=8)
    fast = pt.from_torch(ref)
    batches = list(range(1, 65))
    random.Random(0).shuffle(batches)
    errors = []
    with torch.no_grad():
        for B in batches:
            x, h0, c0 = torch.randn(3, B, 3), torch.randn(1, B, 8), torch.randn(1, B, 8)
            (out, (h, c)), (want, (wh, wc)) = fast(x, (h0, c0)), ref(x, (h0, c0))
            assert out.shape == want.shape and out.is_contiguous() and h.shape == wh.shape == c.shape
            errors.append(max_error([(out, want), (h, wh), (c, wc)]))
    assert max(errors) <= tolerance("float32", 3)
    assert sorted(compiles) == [1, 2, 4, 8, 16, 32, 64]
    assert len(fast._layers) == 7


@pytest.mark.parametrize("packed", [False, True])
def test_padded_rows_do_not_reach_the_callers_rows(packed):
    """5 rows run as 8 (stacked, bidirectional, initial states given, batch-first): the same as the exact batch's
    layers and as torch.nn, and nothing of the padded rows comes back."""
    ref = _reference("gru", input_size=4, hidden_size=6, num_layers=2, bidirectional=True, batch_first=True)
    padded, exact = pt.from_torch(ref), pt.from_torch(ref)
    exact.batch_buckets = False
    x, h0 = torch.randn(5, 7, 4), torch.randn(4, 5, 6)
    if packed:
        x = torch.nn.utils.rnn.pack_padded_sequence(x, _lengths(5, 7), batch_first=True, enforce_sorted=False)
    with torch.no_grad():
        results = [module(x, h0) for module in (padded, exact, ref)]
    if packed:
        results = [(torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0], h) for out, h in results]
    assert {key[0] for key in padded._layers} == {8} and {key[0] for key in exact._layers} == {5}
    (out, h), (exact_out, exact_h), (want, want_h) = results
    assert out.shape == want.shape == (5, 7, 12) and h.shape == want_h.shape == (4, 5, 6)
    assert max_error([(out, exact_out), (h, exact_h)]) <= 1e-6
    assert max_error([(out, want), (h, want_h)]) <= tolerance("float32", 7)


@pytest.mark.parametrize("packed", [False, True])
def test_training_with_buckets_matches_torch_nn(packed):
    """3 rows trained as 4 (2 layers, bidirectional): gradients of the input, initial states and every parameter
    equal torch.nn's (the padded rows add nothing to the weights' gradients)."""
    torch.manual_seed(2)
    ref = _reference("lstm", input_size=5, hidden_size=6, num_layers=2, bidirectional=True).train()
    fast = pt.from_torch(ref)
    x = torch.randn(9, 3, 5, requires_grad=True)
    hx = [(0.5 * torch.randn(4, 3, 6)).requires_grad_() for _ in range(2)]
    lengths = _lengths(3, 9) if packed else None
    want = _gradients(ref, x, hx, list(ref.parameters()), lengths)
    got = _gradients(fast, x, hx, list(ref.parameters()), lengths)
    assert {key[0] for key in fast._layers} == {4}
    assert _gradient_error(want, got) <= 1e-5


def test_the_least_recently_called_batch_sizes_are_dropped(compiles):
    """Two batch sizes kept: a third drops the least recently called one's layers (their memory with them), and
    calling it again compiles it again."""
    ref = _reference("rnn_tanh", input_size=3, hidden_size=4)
    fast = pt.from_torch(ref)
    fast.kept_batch_sizes = 2
    with torch.no_grad():
        for B in (1, 2, 1):
            fast(torch.randn(2, B, 3))
        two = weakref.ref(fast._layers[2, "cpu", None, torch.float32, 3])
        fast(torch.randn(2, 4, 3))
        gc.collect()
        assert two() is None  # nothing holds the dropped layer
        assert sorted(key[0] for key in fast._layers) == [1, 4]
        assert {key[0] for key in fast._arguments} == {id(layer) for layer in fast._layers.values()}
        x = torch.randn(2, 2, 3)
        assert max_error([(fast(x)[0], ref(x)[0])]) <= tolerance("float32", 2)
    assert compiles == [1, 2, 4, 2] and sorted(key[0] for key in fast._layers) == [2, 4]


def test_a_dropped_batch_size_takes_its_training_kernels_launchers_along():
    """The launchers of a dropped layer's training kernels and projected launch (keyed by their own ids) go with it;
    another batch size's stay."""
    module = pt.LSTM(3, 4)
    layers = {}
    for batch in (1, 2):
        training = SimpleNamespace(forward=object(), backward=object())
        projected = SimpleNamespace(runtime=object())
        derived = [training.forward, training.backward, projected.runtime]
        layers[batch] = SimpleNamespace(_training=training, _projected=projected, _derived_runtimes=derived.copy)
        module._layers[batch, "cpu", None, torch.float32, 3] = layers[batch]
        for kernel, function in (
            (training.forward, "recurrent_save"),
            (training.backward, "recurrent_backward"),
            (layers[batch]._projected.runtime, "recurrent_projected"),
        ):
            module._launchers[id(kernel), function] = object()
    module._forget((1, "cpu", None, torch.float32))
    assert list(module._layers) == [(2, "cpu", None, torch.float32, 3)]
    kept = layers[2]._training.forward, layers[2]._training.backward, layers[2]._projected.runtime
    assert {key[0] for key in module._launchers} == {id(kernel) for kernel in kept}


def test_kept_shapes_keep_pinned_and_recent_ones():
    kept = KeptShapes()
    assert kept.use("a", 2) == [] and kept.use("b", 2, pinned=True) == [] and kept.use("a", 2) == []
    assert kept.use("c", 2) == ["a"]  # b is pinned: a, the least recently used of the others, goes
    assert kept.use("d", 1) == ["c"] and "b" in kept and "d" in kept and len(kept) == 2
    assert kept.pinned()


def test_buckets_off_compile_each_batch_exactly(compiles):
    fast = pt.from_torch(_reference("gru", input_size=3, hidden_size=4))
    fast.batch_buckets = False
    with torch.no_grad():
        for B in (3, 5, 3):
            assert fast(torch.randn(2, B, 3))[0].shape == (2, B, 4)
    assert compiles == [3, 5]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cuda_buckets_match_torch_nn(kind, dtype, no_tf32):
    """On the GPU: batch sizes 3, 5 and 13 (float32 as 4, 8 and 16; half as 8, 8 and 16), inference and training,
    equal to torch.nn's within the dtype's bound."""
    ref = _reference(kind, input_size=16, hidden_size=64, num_layers=2, bidirectional=True).cuda().to(dtype).train()
    fast = pt.from_torch(ref)
    bound = 1e-4 if dtype == torch.float32 else 4e-2
    for B in (3, 5, 13):
        x = torch.randn(11, B, 16, device="cuda", dtype=dtype, requires_grad=True)
        hx = [(0.5 * torch.randn(4, B, 64, device="cuda", dtype=dtype)).requires_grad_() for _ in range(2)]
        hx = hx if kind == "lstm" else hx[:1]
        with torch.no_grad():
            (out, _), (want, _) = (module(x, tuple(hx) if kind == "lstm" else hx[0]) for module in (fast, ref))
        assert max_error([(out, want)]) <= tolerance(str(dtype).removeprefix("torch."), 11)
        assert _gradient_error(*(_gradients(m, x, hx, list(ref.parameters())) for m in (ref, fast))) <= bound
    assert {key[0] for key in fast._layers} == ({4, 8, 16} if dtype == torch.float32 else {8, 16})

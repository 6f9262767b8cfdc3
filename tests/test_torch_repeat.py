"""A prnn_tvm.torch module's repeated call (:mod:`prnn_tvm.torch.repeat`), on the CPU build: from its second call a
key is planned, the plan gives the module's own results, and everything that must invalidate it does (a parameter
changed in place or replaced, dtype, batch, grad mode, autocast, options); wrong input is still refused."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402
from prnn_tvm import InputError  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.torch import repeat  # noqa: E402
from prnn_tvm.torch.modules import _Recurrent  # noqa: E402

H, B = 16, 4  # B: a bucket's own size (a padded batch is not planned)


def _pair(kind=torch.nn.LSTM, layers=1, **kw):
    torch.manual_seed(0)
    reference = kind(H, H, layers, **kw).eval()
    return reference, pt.from_torch(reference).eval()  # the same Parameter objects


@pytest.fixture
def own_path(monkeypatch):
    """Counts the calls the module's own path ran (:meth:`_Recurrent._call`; patched on the class, as setting an
    attribute of a module forgets its plans)."""
    calls = []
    real = _Recurrent._call

    def counted(self, input, hx):
        calls.append(1)
        return real(self, input, hx)

    monkeypatch.setattr(_Recurrent, "_call", counted)
    return calls


def _state(layers=1, batch=B):
    return (torch.randn(layers, batch, H), torch.randn(layers, batch, H))


def _close(got, want, dtype="float32"):
    got, want = got.detach().double().cpu().numpy(), want.detach().double().cpu().numpy()
    assert np.abs(got - want).max() <= tolerance(dtype, 1), np.abs(got - want).max()


def _compare(reference, ours, x, state):
    (want, (h, c)), (got, (gh, gc)) = reference(x, state), ours(x, state)
    for g, w in ((got, want), (gh, h), (gc, c)):
        assert g.shape == w.shape and g.dtype == w.dtype
        _close(g, w, str(w.dtype).removeprefix("torch."))
    return got, (gh, gc)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("form", ["time-major", "batch_first", "unbatched", "no states"])
def test_the_third_call_runs_the_plan_and_gives_the_modules_own_results(own_path, layers, form):
    reference, ours = _pair(layers=layers, batch_first=form == "batch_first")
    x, state = torch.randn(1, B, H), _state(layers)
    if form == "batch_first":
        x = x.transpose(0, 1).contiguous()
    elif form == "unbatched":
        x, state = x[:, 0], tuple(t[:, 0] for t in state)
    elif form == "no states":
        state = None
    with torch.no_grad():
        first = ours(x, state)
        second = ours(x, state)
        assert len(own_path) == 2 and type(ours._plans[repeat.call_key(ours, x, state)]) is repeat.Plan
        planned = ours(x, state)
        assert len(own_path) == 2  # the plan served it
        want = reference(x, state)
    for a, b, c in ((first[0], second[0], planned[0]), *zip(first[1], second[1], planned[1])):
        assert torch.equal(a, c) and torch.equal(b, c) and a.shape == c.shape  # the same kernels, the same values
    _close(planned[0], want[0])
    for g, w in zip(planned[1], want[1]):
        _close(g, w)


def _planned(ours, x, state):
    with torch.no_grad():
        for _ in range(2):
            ours(x, state)
    assert type(ours._plans.get(repeat.call_key(ours, x, state))) is repeat.Plan


@pytest.mark.parametrize("name", ["weight_hh_l0", "bias_ih_l0", "weight_ih_l1"])
def test_a_parameter_changed_in_place_is_seen_by_the_next_call(own_path, name):
    reference, ours = _pair(layers=2)
    x, state = torch.randn(1, B, H), _state(2)
    _planned(ours, x, state)
    with torch.no_grad():
        getattr(reference, name).mul_(-0.5)  # the module's own parameter: its version counter moves
        calls = len(own_path)
        _compare(reference, ours, x, state)
        assert len(own_path) == calls + 1  # the plan no longer held: the module's own path, and a new plan
        _compare(reference, ours, x, state)
        assert len(own_path) == calls + 1


def test_a_replaced_parameter_is_seen_and_a_wrong_one_refused(own_path):
    reference, ours = _pair()
    x, state = torch.randn(1, B, H), _state()
    _planned(ours, x, state)
    replaced = torch.nn.Parameter(torch.randn(4 * H, H) * 0.2)
    reference.weight_hh_l0 = ours.weight_hh_l0 = replaced
    with torch.no_grad():
        _compare(reference, ours, x, state)
        _compare(reference, ours, x, state)
        _compare(reference, ours, x, state)
    ours.weight_hh_l0 = torch.nn.Parameter(torch.randn(H, H))
    with pytest.raises(InputError, match="parameter weight_hh_l0 has shape"), torch.no_grad():
        ours(x, state)


def test_dtype_and_batch_changes_are_keys_of_their_own(own_path):
    reference, ours = _pair()
    x, state = torch.randn(1, B, H), _state()
    _planned(ours, x, state)
    with torch.no_grad():
        x8, state8 = torch.randn(1, 2 * B, H), _state(batch=2 * B)
        for _ in range(3):
            _compare(reference, ours, x8, state8)
        reference.double(), ours.double()
        x64, state64 = x.double(), tuple(t.double() for t in state)
        for _ in range(3):
            _compare(reference, ours, x64, state64)
        with pytest.raises(InputError, match="input is torch.float32"):
            ours(x, state64)  # float32 input to a float64 module: refused, as by the module's own path
        with pytest.raises(InputError, match="initial state has shape"):
            ours(x64, tuple(t[:, :2] for t in state64))


def test_a_call_autograd_tracks_runs_the_modules_own_path(own_path):
    reference, ours = _pair()
    x, state = torch.randn(1, B, H), _state()
    _planned(ours, x, state)
    calls = len(own_path)
    got, _ = ours(x, state)  # grad mode on, parameters that require gradients
    assert got.requires_grad and len(own_path) == calls + 1
    got.sum().backward()
    assert ours.weight_hh_l0.grad is not None
    with torch.no_grad():
        assert not ours(x, state)[0].requires_grad
    assert len(own_path) == calls + 1  # the plan still held


def test_autocast_runs_the_modules_own_path(own_path):
    reference, ours = _pair()
    x, state = torch.randn(1, B, H), _state()
    _planned(ours, x, state)
    calls = len(own_path)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        got, (h, _) = ours(x, state)
        want, (wh, _) = reference(x, state)
    assert got.dtype == want.dtype == torch.bfloat16 and h.dtype == wh.dtype and len(own_path) == calls + 1
    _close(got, want, "bfloat16")


@pytest.mark.parametrize("change", ["train", "batch_first", "wavefront"])
def test_setting_an_attribute_forgets_every_plan(own_path, change):
    reference, ours = _pair(layers=2)
    x, state = torch.randn(1, B, H), _state(2)
    _planned(ours, x, state)
    if change == "train":
        ours.train()
    elif change == "batch_first":
        ours.batch_first = reference.batch_first = True
        x = x.transpose(0, 1).contiguous()
    else:
        ours.wavefront = False  # layer by layer
    assert not ours._plans
    with torch.no_grad():
        calls = len(own_path)
        for _ in range(3):
            _compare(reference, ours, x, state)
        assert len(own_path) == calls + 2


@pytest.mark.parametrize("kind", [torch.nn.GRU, torch.nn.RNN])
def test_gru_and_rnn_plans_give_torch_nns_results(own_path, kind):
    reference, ours = _pair(kind, layers=2)
    x, h = torch.randn(1, B, H), torch.randn(2, B, H)
    with torch.no_grad():
        for _ in range(4):
            (want, wh), (got, gh) = reference(x, h), ours(x, h)
            _close(got, want)
            _close(gh, wh)
            h = gh
    assert len(own_path) == 2


def test_a_padded_batch_is_not_planned(own_path):
    reference, ours = _pair()
    x, state = torch.randn(1, 3, H), _state(batch=3)  # padded up to the bucket of 4
    with torch.no_grad():
        for _ in range(3):
            _compare(reference, ours, x, state)
    assert len(own_path) == 3 and ours._plans[repeat.call_key(ours, x, state)] == repeat.UNPLANNED


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_plans_follow_parameters_and_leave_a_captured_call_to_the_modules_path(own_path, dtype, no_tf32):
    torch.manual_seed(0)
    reference = torch.nn.LSTM(H, H, 2).cuda().to(dtype).eval()
    ours = pt.from_torch(reference).eval()
    x, state = torch.randn(1, 8, H, device="cuda", dtype=dtype), _state(2, 8)
    state = tuple(t.cuda().to(dtype) for t in state)
    with torch.no_grad():
        for _ in range(3):
            _compare(reference, ours, x, state)
        assert len(own_path) == 2
        reference.weight_hh_l1.mul_(-0.5)
        _compare(reference, ours, x, state)
        assert len(own_path) == 3
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ours(x, state)  # warm-up on the capturing stream
        torch.cuda.current_stream().wait_stream(stream)
        calls = len(own_path)
        with torch.cuda.graph(graph):
            out, _ = ours(x, state)
        assert len(own_path) == calls + 1  # captured by the module's own path (its graph-owned launch state)
        graph.replay()
        want, _ = reference(x, state)
        torch.cuda.synchronize()
        _close(out, want, str(dtype).removeprefix("torch."))


def test_keys_past_the_most_a_module_remembers_start_again(monkeypatch):
    """Shapes that keep changing (a sequence's length) do not grow the module's keys without end."""
    monkeypatch.setattr(repeat, "MOST_KEYS", 4)
    reference, ours = _pair()
    with torch.no_grad():
        for T in range(1, 8):
            x = torch.randn(T, B, H)
            _compare(reference, ours, x, _state())
            assert len(ours._plans) <= 4


def test_the_call_key_is_the_shapes_dtypes_and_devices_of_the_input_and_states():
    """The key a plan is kept under: the same for states given as a tuple or a list, a state of its own for a single
    tensor (a GRU's), None (the module's own path) for states that are not all tensors."""
    _, ours = _pair(layers=2)
    x, (h, c) = torch.randn(1, B, H), _state(2)
    part = (h.shape, h.dtype, h.device)
    assert repeat.call_key(ours, x, None) == (x.shape, x.dtype, x.device)
    key = (x.shape, x.dtype, x.device, part, part)
    assert repeat.call_key(ours, x, (h, c)) == repeat.call_key(ours, x, [h, c]) == key
    assert repeat.call_key(ours, x, h) == (x.shape, x.dtype, x.device, part)
    assert repeat.call_key(ours, x, (h, c.numpy())) is None and repeat.call_key(ours, x.numpy(), (h, c)) is None
    assert repeat.call_key(ours, x, (h, c.double()))[-1] == (c.shape, torch.float64, c.device)

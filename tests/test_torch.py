"""``prnn_tvm.torch``: the modules against ``torch.nn`` (CPU build here; CUDA with ``-m gpu``)."""

import pathlib

import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

import prnn_tvm  # noqa: E402
import prnn_tvm.torch as pt  # noqa: E402 - after the skip
from prnn_tvm import ConfigError, InputError  # noqa: E402
from prnn_tvm.checks import max_error, relative_error, worst  # noqa: E402
from prnn_tvm.dtypes import tolerance  # noqa: E402
from prnn_tvm.reference import random_lengths, reference_layer, reference_stack  # noqa: E402

from .cli_run import run_script  # noqa: E402
from .two_state_cell import TWO_STATE  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _reference(kind, **kw):
    torch.manual_seed(0)
    ctor = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN, "rnn_relu": torch.nn.RNN}[kind]
    if kind.startswith("rnn"):
        kw["nonlinearity"] = kind[4:]
    return ctor(**kw).eval()


def _lengths(B, T, seed=0):
    """Unsorted per-row lengths with a full-length row and, from two rows up, a length-1 row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[torch.randperm(B, generator=g)[:2]] = torch.tensor([T, 1])[: min(B, 2)]
    return lengths


def _compare(
    kind,
    device,
    batch_first=False,
    bias=True,
    T=6,
    B=3,
    n_in=10,
    H=16,
    hx=True,
    layers=1,
    bidirectional=False,
    packed=False,
):
    ref = _reference(
        kind,
        input_size=n_in,
        hidden_size=H,
        batch_first=batch_first,
        bias=bias,
        num_layers=layers,
        bidirectional=bidirectional,
    ).to(device)
    fast = pt.from_torch(ref)
    assert all(p is q for p, q in zip(fast.parameters(), ref.parameters()))  # shared, not copied
    assert [n for n, _ in fast.named_parameters()] == [n for n, _ in ref.named_parameters()]
    shape = (B, T, n_in) if batch_first else (T, B, n_in)
    x = torch.randn(*shape, device=device)
    state, slots = None, layers * (2 if bidirectional else 1)
    if hx:
        h0 = 0.5 * torch.randn(slots, B, H, device=device)
        state = (h0, 0.5 * torch.randn(slots, B, H, device=device)) if kind == "lstm" else h0
    if packed:  # PackedSequence in, PackedSequence out, packed the same way
        x = pack_padded_sequence(x, _lengths(B, T), batch_first=batch_first, enforce_sorted=False)
    with torch.no_grad():
        want_out, want_h = ref(x, state)
        got_out, got_h = fast(x, state)
    if packed:
        assert torch.equal(got_out.batch_sizes, want_out.batch_sizes)
        assert torch.equal(got_out.sorted_indices, want_out.sorted_indices)
        assert torch.equal(got_out.unsorted_indices, want_out.unsorted_indices)
        (got_out, got_steps), (want_out, want_steps) = pad_packed_sequence(got_out), pad_packed_sequence(want_out)
        assert torch.equal(got_steps, want_steps)
    assert got_out.shape == want_out.shape and got_out.device == want_out.device
    pairs = [(got_out, want_out), *zip(*((got_h, want_h) if kind == "lstm" else ((got_h,), (want_h,))))]
    assert all(a.shape == b.shape == (slots, B, H) for a, b in pairs[1:])
    err = max_error(pairs)
    assert err <= tolerance("float32", T), f"{kind}: max abs error {err:.2e}"  # TF32 off on the GPU
    return fast


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_cpu_matches_torch(kind):
    _compare(kind, "cpu")


def test_batch_first_no_bias_and_zero_state():
    _compare("gru", "cpu", batch_first=True, bias=False, hx=False)


@pytest.mark.parametrize(
    "kind, layers, bidirectional, kw",
    [
        ("lstm", 3, False, {}),
        ("lstm", 2, True, {"batch_first": True}),
        ("gru", 1, True, {"hx": False, "B": 1, "T": 1}),
        ("rnn_relu", 2, True, {"bias": False, "n_in": 5, "H": 7}),
    ],
)
def test_stacked_and_bidirectional_match_torch(kind, layers, bidirectional, kw):
    """One launch per layer and direction, each on the one before; outputs and h_n laid out as PyTorch's."""
    _compare(kind, "cpu", layers=layers, bidirectional=bidirectional, **kw)


@pytest.mark.parametrize(
    "kind, layers, bidirectional, kw",
    [
        ("lstm", 1, False, {}),
        ("lstm", 2, True, {"B": 5, "T": 9}),
        ("gru", 1, True, {"hx": False, "batch_first": True}),
        ("rnn_tanh", 2, False, {"B": 1}),
        ("rnn_relu", 1, True, {"bias": False, "B": 2, "T": 1}),
    ],
)
def test_packed_sequences_match_torch(kind, layers, bidirectional, kw):
    """Unsorted lengths (a full-length row, a length-1 row): each row stops at its length, the reverse
    direction reads each row from its own end, h_n holds each row's state at its length."""
    _compare(kind, "cpu", layers=layers, bidirectional=bidirectional, packed=True, **kw)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_float64_module_runs_the_float64_cpu_build(kind):
    ref = _reference(kind, input_size=5, hidden_size=7, num_layers=2, bidirectional=True).double()
    fast = pt.from_torch(ref)
    x = torch.randn(9, 3, 5, dtype=torch.float64)
    with torch.no_grad():
        got, want = fast(x), ref(x)
    assert got[0].dtype == torch.float64 and all(key[3] == torch.float64 for key in fast._layers)
    assert (got[0] - want[0]).abs().max().item() <= tolerance("float64", 9)


@pytest.mark.parametrize("hidden, batch, fit", [(1024, 4, 1), (512, 8, 1), (256, 1, 16), (512, 4, 4)])
def test_two_grids_fit_together_only_where_the_gpu_holds_both(hidden, batch, fit):
    """A bidirectional inference call runs its directions side by side where two recurrent grids are resident
    at once (on the H100: 132 SMs; 128 CTAs of 239 registers x 256 threads take one SM each, so only one)."""
    from prnn_tvm.target import gpu_spec

    layer = prnn_tvm.compile_cell("lstm", hidden, batch, target="cuda", arch="sm_90")
    assert layer.grids_that_fit(gpu=gpu_spec("sm_90")) == fit, layer.signature.launch("recurrent").grid


@pytest.mark.parametrize(
    "hidden, batch, dtype, picks",
    [
        (512, 8, torch.float32, "one launch: 128 CTAs"),
        (1024, 16, torch.float16, "one launch: 128 CTAs"),
        (512, 4, torch.float32, "one launch: 128 CTAs"),
        (1024, 4, torch.float32, "a launch per direction: together their weights fit on chip only with"),
        (1536, 4, torch.float32, "a launch per direction: no persistent config fits cell 'lstm_bi'"),
    ],
)
def test_both_directions_run_in_one_launch_where_they_fit_on_chip(hidden, batch, dtype, picks, monkeypatch):
    """Measured on the H100 (bench/results/bidirectional-h100.md): one launch of both directions is 1.07-1.91x
    the two launches in float32 and 1.60-1.71x where one direction's grid takes every SM, 0.97x at two float16
    shapes where two grids run side by side. Hidden 1024 float32: 32 MB of recurrent weights fit together only
    with weights in shared memory, so each direction runs apart with its own in registers; hidden 1536: 75 MB do
    not fit on chip at all (registers and shared memory: about 63 MB). No GPU needed: the H100's spec stands in for
    the local one, ptxas gives the figures."""
    from prnn_tvm.runtime import base
    from prnn_tvm.target import gpu_spec

    monkeypatch.setattr(base, "gpu_spec", lambda arch=None: gpu_spec("sm_90"))
    module = pt.Recurrent("lstm", hidden, hidden, bidirectional=True, arch="sm_90", dtype=dtype)
    cuda, key = torch.device("cuda"), (batch, "cuda", dtype, hidden)
    both = module.directions_for(batch, cuda, dtype, hidden)
    assert (both is not None) == picks.startswith("one launch") and module.direction_notes[key].startswith(picks)
    assert module.directions_for(batch, cuda, dtype, hidden) is both  # compiled (or refused) once
    module.one_launch_directions = False
    assert module.directions_for(batch, cuda, dtype, hidden) is None


@pytest.mark.parametrize("one_launch", [True, False])
def test_a_stack_compiles_one_layer_per_input_width(one_launch):
    fast = pt.from_torch(_reference("gru", input_size=10, hidden_size=8, num_layers=3, bidirectional=True))
    fast.one_launch_directions = one_launch
    with torch.no_grad():
        fast(torch.randn(4, 2, 10))
    assert sorted(key[4] for key in fast._layers) == [10, 16]  # layer 0 reads x, the others both directions
    assert all((key[-1] == "bidirectional") == one_launch for key in fast._layers)


def test_stacked_unbatched_input():
    ref = _reference("lstm", input_size=4, hidden_size=6, num_layers=2, bidirectional=True)
    fast = pt.from_torch(ref)
    x, h0, c0 = torch.randn(5, 4), torch.randn(4, 6), torch.randn(4, 6)
    with torch.no_grad():
        got, (h, c) = fast(x, (h0, c0))
        want, (wh, wc) = ref(x, (h0, c0))
    assert got.shape == want.shape == (5, 12) and h.shape == wh.shape == (4, 6)
    err = max_error([(got, want), (h, wh), (c, wc)])
    assert err <= tolerance("float32", 5)


def test_unbatched_input_and_batch_cache():
    ref = _reference("rnn_tanh", input_size=4, hidden_size=8)
    fast = pt.from_torch(ref)
    with torch.no_grad():
        out, h = fast(torch.randn(5, 4))
        fast(torch.randn(5, 4))
        want, _ = ref(torch.randn(5, 4))
    assert out.shape == want.shape == (5, 8) and h.shape == (1, 8)
    assert len(fast._layers) == 1  # one batch size, compiled once


@pytest.mark.parametrize(
    "device, dtype, bound, bias_in_gemm",
    [
        ("cpu", torch.float32, 1e-5, None),
        pytest.param("cuda", torch.float32, 1e-5, None, marks=pytest.mark.gpu),
        *(pytest.param("cuda", torch.float16, 4e-3, at, marks=pytest.mark.gpu) for at in (0, pt.BIAS_IN_GEMM)),
    ],
)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_calls_follow_parameter_updates(device, dtype, bound, bias_in_gemm, bidirectional, no_tf32, monkeypatch):
    """Inference calls keep each parameter's detached view (or, where it is not 64-byte aligned, a
    copy) between calls, both directions' ``W_ih`` and ``b_ih`` joined (one launch), and a half module on
    the GPU its ``[W_ih | b_ih]`` GEMM operand (made from the smallest projection when ``bias_in_gemm`` is
    0): they must see in-place updates, replaced parameters and replaced storage."""
    if bias_in_gemm is not None:
        monkeypatch.setattr("prnn_tvm.torch.projection.BIAS_IN_GEMM", bias_in_gemm)  # where the projection reads it
    ref = _reference("gru", input_size=6, hidden_size=8, bidirectional=bidirectional).to(device, dtype)
    flat = torch.zeros(3 * 8 + 1, device=device, dtype=dtype)  # a bias one element into a buffer, as cuDNN's
    flat[1:] = ref.bias_hh_l0.detach()  # flat weights give
    ref.bias_hh_l0 = torch.nn.Parameter(flat[1:])
    fast = pt.from_torch(ref)
    x = torch.randn(5, 2, 6, device=device, dtype=dtype)

    def check(what):
        with torch.no_grad():
            got, want = fast(x)[0], ref(x)[0]
        assert (got - want).abs().max().item() <= bound, f"{what}: {(got - want).abs().max().item()}"

    check("first call")
    with torch.no_grad():
        ref.weight_hh_l0.mul_(0.5)  # aligned: the kept view sees it
        ref.bias_hh_l0.add_(0.25)  # unaligned: the kept copy is stale, its version counter says so
        ref.weight_ih_l0.mul_(-1.5)  # the projection's operands
        ref.bias_ih_l0.add_(0.5)
    check("in-place updates")
    fast.weight_hh_l0 = ref.weight_hh_l0 = torch.nn.Parameter(torch.randn_like(ref.weight_hh_l0))
    check("a replaced parameter")
    ref.weight_ih_l0.data = torch.randn_like(ref.weight_ih_l0)  # the same Parameter, new storage
    check("replaced storage")
    fast.bias_ih_l0 = ref.bias_ih_l0 = torch.nn.Parameter(torch.randn_like(ref.bias_ih_l0))
    check("a replaced bias")


def test_the_biased_gemm_operand_is_kept_while_its_tensors_live(monkeypatch):
    """``[W_ih | b_ih]`` (a half projection's GEMM operand) is made once per weight update and dropped with the
    tensors it was made from: a bidirectional layer's joined ``W_ih`` is remade after every in-place update, so
    keeping every operand would hold one more matrix per optimizer step. No GPU needed: the cache is host-side."""
    import gc

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    module = pt.GRU(3, 4, bidirectional=True)
    W = module._joined_parameters(("weight_ih_l0", "weight_ih_l0_reverse"))
    b = module._joined_parameters(("bias_ih_l0", "bias_ih_l0_reverse"))
    first = module._biased_weight(W, b)
    assert module._biased_weight(W, b) is first and torch.equal(first[:, :3], W) and torch.equal(first[:, 3], b)
    with torch.no_grad():
        module.weight_ih_l0.mul_(2)
    again = module._joined_parameters(("weight_ih_l0", "weight_ih_l0_reverse"))
    assert again is not W and torch.equal(module._biased_weight(again, b)[:, :3], again)
    del W, first
    gc.collect()
    assert len(module._derived) == 1  # the operand of the joined W_ih remade above


@pytest.mark.parametrize(
    "kind, layers, bidirectional", [("lstm", 1, False), ("lstm", 2, False), ("rnn_tanh", 1, True), ("gru", 1, False)]
)
def test_a_half_call_folds_the_input_bias_into_the_recurrent_one(kind, layers, bidirectional, monkeypatch):
    """LSTM and RNN only ever add ``b_ih`` and ``b_hh``: a half inference call on the GPU passes their sum as the
    recurrent bias, for every direction whose projection torch makes (a stack's upper layers project in the
    kernel: theirs stay), and runs the projection without one. GRU keeps both (its n gate multiplies
    ``b_hn`` by r). No GPU needed: the layers are the CPU build's, whose launches have the same arguments."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    module = pt.from_torch(
        _reference(kind, input_size=3, hidden_size=4, num_layers=layers, bidirectional=bidirectional)
    )
    cpu = torch.device("cpu")
    launch = (
        module.stack_for(2, cpu, torch.float32)
        if layers > 1
        else module.directions_for(2, cpu, torch.float32, 3)
        if bidirectional
        else module.layer_for(2, cpu)
    )
    suffix = None if layers > 1 else "_l0"
    entries = module._parameter_arguments(launch, suffix)
    weights = [
        module._aligned(name) if isinstance(name, str) else module._joined_parameters(name) for _, name, _ in entries
    ]
    if kind == "gru":
        assert not module._FOLDS_INPUT_BIAS
        return
    folded = module._folded_input_bias(launch, suffix, weights)
    summed = {"b_hh": "_l0", "l0_b_hh": "_l0", "fwd_b_hh": "_l0", "rev_b_hh": "_l0_reverse"}
    for (arg, _, _), weight, got in zip(entries, weights, folded):
        if arg == "b_ih":
            assert got is None
        elif arg in summed:
            p = summed[arg]
            assert torch.equal(got, getattr(module, "bias_hh" + p) + getattr(module, "bias_ih" + p)), arg
        else:  # the weights, and a stack's upper layers' biases
            assert got is weight, arg
    args = [arg for arg, _, _ in entries]
    assert sum(arg in summed for arg in args) == (2 if bidirectional else 1)
    assert layers == 1 or {"l1_b_ih", "l1_b_hh"} <= set(args)
    assert all(a is b for a, b in zip(module._folded_input_bias(launch, suffix, weights), folded))  # once per update


def test_a_call_that_trains_folds_the_input_bias_with_its_gradient():
    """A call that trains on the GPU folds ``b_ih`` too, made anew at each call from the tracked parameters: autograd
    gives ``b_ih`` and ``b_hh`` the carrier's gradient (which the backward kernel sums over steps and rows), and no
    sum over the projection's gradient runs. No GPU needed: the CPU build's launch has the same arguments."""
    module = pt.from_torch(_reference("lstm", input_size=3, hidden_size=4))
    launch = module.layer_for(2, torch.device("cpu"))
    entries = module._parameter_arguments(launch, "_l0")
    args = [arg for arg, _, _ in entries]
    weights = [module._tracked(name) for _, name, _ in entries]
    folded = module._folded_input_bias(launch, "_l0", weights, grad=True)
    carrier = folded[args.index("b_hh")]
    assert folded[args.index("b_ih")] is None and carrier.requires_grad
    assert torch.equal(carrier, module.bias_hh_l0 + module.bias_ih_l0)
    assert module._folded_input_bias(launch, "_l0", weights, grad=True)[args.index("b_hh")] is not carrier  # anew
    g = torch.randn_like(carrier)
    (carrier * g).sum().backward()
    assert torch.equal(module.bias_ih_l0.grad, g) and torch.equal(module.bias_hh_l0.grad, g)
    assert module.weight_ih_l0.grad is None and module.weight_hh_l0.grad is None


def test_a_compiled_module_copies_and_pickles():
    import copy
    import io

    fast = pt.from_torch(_reference("lstm", input_size=4, hidden_size=8))
    x = torch.randn(5, 2, 4)
    with torch.no_grad():
        want, _ = fast(x)  # compiles: the copies must leave the TVM modules behind and compile their own
        buffer = io.BytesIO()
        torch.save(fast, buffer)
        buffer.seek(0)
        for other in (copy.deepcopy(fast), torch.load(buffer, weights_only=False)):
            assert not other._layers and other.weight_hh_l0.data_ptr() != fast.weight_hh_l0.data_ptr()
            assert torch.equal(other(x)[0], want)
    assert len(fast._layers) == 1


def test_new_module_has_torch_layout():
    m = pt.LSTM(10, 16, batch_first=True)
    assert [n for n, _ in m.named_parameters()] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]
    assert m.weight_ih_l0.shape == (64, 10)
    m.load_state_dict(torch.nn.LSTM(10, 16).state_dict())


@pytest.mark.parametrize(
    "module, message",
    [
        (torch.nn.LSTM(4, 8, proj_size=4), "proj_size=4"),
        (torch.nn.Linear(4, 8), "takes a torch.nn.LSTM, GRU or RNN"),
    ],
)
def test_unsupported_modules_are_refused(module, message):
    with pytest.raises(ConfigError, match=message):
        pt.from_torch(module)


@pytest.mark.parametrize(
    "kind, layers, bidirectional, packed",
    [
        ("lstm", 1, False, False),
        ("gru", 1, False, False),
        ("rnn_tanh", 2, True, False),
        ("rnn_relu", 1, False, False),
        ("lstm", 2, True, False),
        ("lstm", 2, True, True),
        ("gru", 1, True, True),
    ],
)
def test_gradcheck_on_the_float64_cpu_build(kind, layers, bidirectional, packed):
    """Gradients of input, initial states and every parameter: the derived backward against torch's
    numerical differentiation of the compiled float64 forward (packed: rows of lengths 3 and 1)."""
    fast = pt.from_torch(
        _reference(kind, input_size=3, hidden_size=4, num_layers=layers, bidirectional=bidirectional).double()
    )
    slots, names = layers * (2 if bidirectional else 1), [n for n, _ in fast.named_parameters()]
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    states = [0.5 * torch.randn(slots, 2, 4, dtype=torch.float64) for _ in range(2 if kind == "lstm" else 1)]
    for s in states:
        s.requires_grad_()

    def run(x, *flat):
        params, hx = dict(zip(names, flat[: len(names)])), flat[len(names) :]
        sequence = pack_padded_sequence(x, [1, 3], enforce_sorted=False) if packed else x
        out, finals = torch.func.functional_call(fast, params, (sequence, tuple(hx) if kind == "lstm" else hx[0]))
        return (out.data if packed else out, *(finals if kind == "lstm" else (finals,)))

    params = [p.detach().clone().requires_grad_() for p in fast.parameters()]
    assert torch.autograd.gradcheck(run, (x, *params, *states), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    "kind, layers, T, H", [("lstm", 2, 16, 6), ("lstm", 1, 256, 16), ("gru", 1, 256, 16), ("rnn_tanh", 1, 256, 16)]
)
def test_float32_gradients_match_torch_nn(kind, layers, T, H):
    """Within 1e-4 of torch.nn's gradients for input, states and every parameter at T=256, relative to a
    gradient's largest entry where that passes 1 (the loss sums T steps: W_hh's gradient reaches ~500, where
    torch's own float32 result is 1.1e-4 away from float64's)."""
    torch.manual_seed(1)
    ref = _reference(kind, input_size=5, hidden_size=H, num_layers=layers).train()
    fast = pt.from_torch(ref)
    x = torch.randn(T, 3, 5, requires_grad=True)
    hx = [(0.5 * torch.randn(layers, 3, H)).requires_grad_() for _ in range(2 if kind == "lstm" else 1)]
    grads = []
    for module in (ref, fast):
        for t in (x, *hx, *ref.parameters()):
            t.grad = None
        out, finals = module(x, tuple(hx) if kind == "lstm" else hx[0])
        finals = finals if kind == "lstm" else (finals,)
        (out.square().sum() + sum((k + 1) * f.sum() for k, f in enumerate(finals))).backward()
        grads.append([t.grad.clone() for t in (x, *hx, *ref.parameters())])
    err = worst(relative_error(got, want) for want, got in zip(*grads))
    assert err <= (1e-5 if T < 100 else 1e-4), err


@pytest.mark.parametrize("kind, bidirectional, batch", [("lstm", False, 2), ("gru", True, 2), ("lstm", False, 3)])
def test_dropout_between_layers_trains_like_torch_nn(kind, bidirectional, batch):
    """Training mode, dropout=0.5 between 3 layers: from one seed the same masks as torch.nn's CPU module,
    so the same outputs and gradients (3 rows run padded to 4: masks drawn for the caller's rows alone); in
    eval mode no dropout."""
    torch.manual_seed(6)
    ref = _reference(kind, input_size=4, hidden_size=6, num_layers=3, dropout=0.5, bidirectional=bidirectional)
    fast = pt.from_torch(ref.train())
    x = torch.randn(7, batch, 4, requires_grad=True)
    results = []
    for module in (ref, fast):
        for t in (x, *ref.parameters()):
            t.grad = None
        torch.manual_seed(11)
        out, _ = module(x)
        out.square().sum().backward()
        results.append([out.detach(), x.grad.clone(), *(p.grad.clone() for p in ref.parameters())])
    assert max_error(zip(*results)) <= 1e-5
    with torch.no_grad():
        assert not torch.equal(results[1][0], fast.eval()(x)[0])  # the masks did something; eval has none
        assert (fast(x)[0] - ref.eval()(x)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_modules_train_on_the_cpu(dtype, bound):
    """Half storage, float32 math and gradients: against torch.nn in float32 on the same rounded weights."""
    torch.manual_seed(2)
    fast = pt.from_torch(torch.nn.GRU(5, 6).to(dtype))
    ref = torch.nn.GRU(5, 6)
    ref.load_state_dict({k: v.float() for k, v in fast.state_dict().items()})
    x = torch.randn(7, 3, 5).to(dtype)
    grads = []
    for module, inp in ((fast, x.clone().requires_grad_()), (ref, x.float().requires_grad_())):
        out, h = module(inp)
        (out.float().square().sum() + h.float().sum()).backward()
        grads.append([inp.grad.float(), *(p.grad.float() for p in module.parameters())])
    assert max_error(zip(*grads)) < bound


def _any_cell_inputs(module, x, hx, layer_suffix="_l0"):
    """A generic module's first layer's arguments by name, as NumPy (what ``reference_layer`` takes)."""
    return {
        "x": x.numpy(),
        **_parameters_of(module, layer_suffix),
        **{f"{s}0": h[0].numpy() for s, h in zip(module._states, hx)},
    }


def _parameters_of(module, layer_suffix: str) -> dict:
    """One layer and direction's parameters (``_l1``, ``_l1_reverse``), named as the cell's arguments, as NumPy."""
    return {
        name[: -len(layer_suffix)]: p.detach().cpu().numpy()
        for name, p in module.named_parameters()
        if name.endswith(layer_suffix)
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("one_launch", [True, False])
@pytest.mark.parametrize("cell", sorted(prnn_tvm.builtin_cells()))
def test_every_cell_stacked_bidirectional_and_packed_matches_its_float64_reference(cell, one_launch, device, no_tf32):
    """Stacking, both directions and variable lengths are options of any cell, not of three: two layers, both
    directions (each layer's in one launch, or a launch per direction), a packed batch in no order (a
    full-length row, a length-1 row), initial states given, against the cell's own NumPy reference stacked
    the way torch.nn stacks (``prnn_tvm.reference.reference_stack``)."""
    torch.manual_seed(5)
    T, B, n_in, H, layers = 7, 4, 5, 6, 2
    module = pt.Recurrent(cell, n_in, H, num_layers=layers, bidirectional=True).to(device)
    module.one_launch_directions = one_launch
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), B, H)
    x = torch.randn(T, B, n_in)
    hx = tuple(0.5 * torch.randn(2 * layers, B, H) for _ in plan.states)
    lengths = random_lengths(B, T, seed=1)
    packed = pack_padded_sequence(x.to(device), torch.from_numpy(lengths).long(), enforce_sorted=False)
    with torch.no_grad():
        out, finals = module(packed, tuple(h.to(device) for h in hx) if len(hx) > 1 else hx[0].to(device))
    out = pad_packed_sequence(out)[0].cpu()  # zeros past each row's length, in the caller's batch order
    finals = [f.cpu() for f in (finals if len(hx) > 1 else (finals,))]
    arguments = [
        [
            {
                **_parameters_of(module, f"_l{layer}" + ("_reverse" if d else "")),
                **{f"{s.name}0": h[2 * layer + d].numpy() for s, h in zip(plan.states, hx)},
            }
            for d in range(2)
        ]
        for layer in range(layers)
    ]
    want, want_finals = reference_stack(plan, x.numpy(), arguments, lengths)
    notes = module.direction_notes.values()  # one per input width (layer 0's, the later layers')
    assert len(notes) == 2 * one_launch and all(note.startswith("one launch") for note in notes), notes
    assert out.shape == want.shape
    err = max_error([(out, want), *((f, want_finals[s.name]) for f, s in zip(finals, plan.states))])
    assert err <= tolerance("float32", T), err


@pytest.mark.parametrize("cell", [TWO_STATE, "gru_cho", "lstm_peephole"])
def test_any_cell_runs_as_a_module(cell):
    """A user-defined cell (two states, two products), a two-phase and a peephole built-in through the generic
    module: parameters named after the cell's arguments, states in its order, against the cell's reference."""
    torch.manual_seed(3)
    module = pt.Recurrent(cell, 5, 7)
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 3, 7)
    names = [n for n, _ in module.named_parameters()]
    assert names[:2] == ["W_ih_l0", "b_ih_l0"] and names[2:] == [f"{s.name}_l0" for s in (*plan.weights, *plan.params)]
    x = torch.randn(6, 3, 5)
    hx = tuple(0.5 * torch.randn(1, 3, 7) for _ in plan.states)
    with torch.no_grad():
        out, finals = module(x, hx if len(hx) > 1 else hx[0])
    finals = finals if len(hx) > 1 else (finals,)
    ref, ref_finals = reference_layer(plan, _any_cell_inputs(module, x, hx))
    err = max_error([(out, ref), *((f[0], ref_finals[s.name]) for f, s in zip(finals, plan.states))])
    assert err <= tolerance("float32", 6)


def test_a_generic_lstm_equals_torch_nn_stacked_and_bidirectional():
    """The generic module's naming path, stacked and bidirectional, against torch.nn with the same weights."""
    torch.manual_seed(4)
    ref = torch.nn.LSTM(5, 6, num_layers=2, bidirectional=True)
    module = pt.Recurrent("lstm", 5, 6, num_layers=2, bidirectional=True)
    torch_names = {"weight_ih": "W_ih", "weight_hh": "W_hh", "bias_ih": "b_ih", "bias_hh": "b_hh"}
    with torch.no_grad():
        for name, p in ref.named_parameters():
            kind, suffix = name.rsplit("_l", 1)
            getattr(module, f"{torch_names[kind]}_l{suffix}").copy_(p)
        x = torch.randn(8, 3, 5)
        (out, (h, c)), (want, (wh, wc)) = module(x), ref(x)
    assert max_error([(out, want), (h, wh), (c, wc)]) <= tolerance("float32", 8)


@pytest.mark.parametrize(
    "cell, layers, bidirectional", [(TWO_STATE, 1, False), ("gru_cho", 2, True), ("lstm_h2", 2, False)]
)  # head-wise weights
def test_a_user_defined_cell_trains_with_no_extra_code(cell, layers, bidirectional):
    """gradcheck of input, states and every parameter through the backward derived from the cell's plan."""
    torch.manual_seed(5)
    module = pt.Recurrent(cell, 3, 4, num_layers=layers, bidirectional=bidirectional, dtype=torch.float64)
    names = [n for n, _ in module.named_parameters()]
    slots = layers * (2 if bidirectional else 1)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    states = [(0.5 * torch.randn(slots, 2, 4, dtype=torch.float64)).requires_grad_() for _ in module._states]

    def run(x, *flat):
        params, hx = dict(zip(names, flat[: len(names)])), flat[len(names) :]
        out, finals = torch.func.functional_call(module, params, (x, tuple(hx) if len(hx) > 1 else hx[0]))
        return (out, *(finals if len(hx) > 1 else (finals,)))

    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    assert torch.autograd.gradcheck(run, (x, *params, *states), eps=1e-6, atol=1e-8)


def test_bad_states_and_input():
    fast = pt.from_torch(_reference("lstm", input_size=4, hidden_size=8))
    x = torch.randn(3, 2, 4)
    with torch.no_grad(), pytest.raises(InputError, match=r"initial state has shape \(2, 2, 8\)"):
        fast(x, (torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)))
    with torch.no_grad(), pytest.raises(InputError, match=r"input must be \(T, B, 4\).*\(3, 2, 5\)"):
        fast(torch.randn(3, 2, 5))
    stacked = pt.from_torch(_reference("gru", input_size=4, hidden_size=8, num_layers=2, bidirectional=True))
    with torch.no_grad(), pytest.raises(InputError, match=r"initial state has shape \(1, 2, 8\), expected \(4, 2, 8\)"):
        stacked(x, torch.zeros(1, 2, 8))
    with torch.no_grad(), pytest.raises(InputError, match=r"GRU: the input has no timesteps \(shape \(0, 2, 4\)\)"):
        stacked(torch.randn(0, 2, 4))


@pytest.mark.parametrize("batch_first", [False, True])
def test_an_empty_batch_gives_empty_results_like_torch_nn(batch_first):
    ref = _reference("lstm", input_size=4, hidden_size=8, num_layers=2, bidirectional=True, batch_first=batch_first)
    fast = pt.from_torch(ref)
    x = torch.randn(0, 3, 4) if batch_first else torch.randn(3, 0, 4)
    with torch.no_grad():
        (out, (h, c)), (want, (wh, wc)) = fast(x), ref(x)
    assert out.shape == want.shape and h.shape == wh.shape and c.shape == wc.shape
    assert fast._layers == {}  # nothing compiled


def test_readme_pytorch_example_runs():
    """As written in README.md: the difference it prints is within float32's bound, the shapes its comment gives."""
    from .test_export import readme_block

    printed = []
    scope = {"print": printed.append}
    exec(compile(readme_block("## PyTorch"), "README.md", "exec"), scope)
    assert len(printed) == 1 and float(printed[0]) <= tolerance("float32", 16), printed
    with torch.no_grad():
        assert max_error([(scope["out"], scope["lstm"](scope["x"])[0])]) <= tolerance("float32", 16)
    assert scope["out"].shape == (4, 16, 64) and scope["h_n"].shape == scope["c_n"].shape == (1, 4, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_cuda_matches_torch(kind, batch_first, no_tf32):
    _compare(kind, "cuda", batch_first=batch_first, T=32, B=4, n_in=256, H=256)


@pytest.mark.gpu
@pytest.mark.parametrize("cell", [TWO_STATE, "gru_cho", "lstm_peephole"])
def test_cuda_any_cell_runs_as_a_module(cell, no_tf32):
    torch.manual_seed(3)
    module = pt.Recurrent(cell, 100, 256, device="cuda")
    plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), 4, 256)
    x = torch.randn(32, 4, 100, device="cuda")
    hx = tuple(0.5 * torch.randn(1, 4, 256, device="cuda") for _ in plan.states)
    with torch.no_grad():
        out, finals = module(x, hx if len(hx) > 1 else hx[0])
    finals = finals if len(hx) > 1 else (finals,)
    ref, ref_finals = reference_layer(plan, _any_cell_inputs(module.cpu(), x.cpu(), [h.cpu() for h in hx]))
    err = max_error([(out, ref), *((f[0], ref_finals[s.name]) for f, s in zip(finals, plan.states))])
    assert err <= tolerance("float32", 32)


def _gradients(module, x, hx, params, packed_lengths=None):
    """Gradients of x, the initial states and ``params`` of a loss over every output and final state."""
    for t in (x, *hx, *params):
        t.grad = None
    sequence = x if packed_lengths is None else pack_padded_sequence(x, packed_lengths, enforce_sorted=False)
    out, finals = module(sequence, tuple(hx) if len(hx) > 1 else hx[0])
    out = out if packed_lengths is None else pad_packed_sequence(out)[0]
    finals = finals if len(hx) > 1 else (finals,)
    (out.square().sum() + sum((k + 1) * f.sum() for k, f in enumerate(finals))).backward()
    return [t.grad.detach().cpu().double() for t in (x, *hx, *params)]


def _gradient_error(want, got) -> float:
    """Largest difference over gradients, relative to a gradient's largest entry where that passes 1."""
    return worst(relative_error(g, w) for w, g in zip(want, got))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kind, layers, bidirectional, packed, T, B, H, n_in",
    [
        ("lstm", 1, False, False, 256, 4, 1024, 64),
        ("lstm", 1, False, False, 1, 1, 1, 3),
        ("gru", 1, False, False, 33, 5, 127, 9),
        ("rnn_tanh", 2, True, False, 17, 3, 64, 8),
        ("rnn_relu", 1, False, False, 256, 2, 256, 16),
        ("lstm", 2, True, True, 40, 6, 96, 12),
        ("gru", 1, False, True, 256, 16, 512, 32),
    ],
)
def test_cuda_gradients_match_torch_nn(kind, layers, bidirectional, packed, T, B, H, n_in):
    """The persistent backward through prnn_tvm.torch on the GPU (float32) against torch.nn's autograd in
    float64 on the CPU, same weights: input, initial states and every parameter, within 1e-4 (relative to
    a gradient's largest entry where that passes 1); stacked, bidirectional, packed with unsorted lengths."""
    torch.manual_seed(7)
    ref = _reference(kind, input_size=n_in, hidden_size=H, num_layers=layers, bidirectional=bidirectional).double()
    fast = pt.from_torch(
        _reference(kind, input_size=n_in, hidden_size=H, num_layers=layers, bidirectional=bidirectional).cuda().train()
    )
    with torch.no_grad():
        for p, q in zip(ref.parameters(), fast.parameters()):
            p.copy_(q)
    slots = layers * (2 if bidirectional else 1)
    x = torch.randn(T, B, n_in, dtype=torch.float64)
    hx = [0.5 * torch.randn(slots, B, H, dtype=torch.float64) for _ in range(2 if kind == "lstm" else 1)]
    lengths = _lengths(B, T) if packed else None
    want = _gradients(ref, x.requires_grad_(), [h.requires_grad_() for h in hx], list(ref.parameters()), lengths)
    x32 = x.detach().float().cuda().requires_grad_()
    hx32 = [h.detach().float().cuda().requires_grad_() for h in hx]
    got = _gradients(fast, x32, hx32, list(fast.parameters()), lengths)
    fast.check()
    assert _gradient_error(want, got) <= 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cell, packed",
    [
        (TWO_STATE, False),
        ("lstm_peephole", False),
        ("indrnn", False),
        ("gru_cho", False),
        ("mgu", False),
        ("stacked_rnn", False),
        ("gru_cho", True),
    ],
)
def test_cuda_gradients_of_any_cell_match_the_float64_cpu_build(cell, packed):
    """A user-defined cell (two exchanged states, two products), one with params (peepholes), one without a
    product, and the cells of two phases per step (a product over a stage of the same step; the stacked RNN
    with two exchanged states too), one of them packed (rows of their own lengths): the GPU backward against
    the float64 CPU build's (itself checked by gradcheck)."""
    torch.manual_seed(8)
    fast = pt.Recurrent(cell, 6, 37).cuda()
    ref = pt.Recurrent(cell, 6, 37, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), fast.parameters()):
            p.copy_(q)
    x = torch.randn(50, 3, 6, dtype=torch.float64)
    hx = [0.5 * torch.randn(1, 3, 37, dtype=torch.float64) for _ in fast._states]
    lengths = _lengths(3, 50) if packed else None
    want = _gradients(ref, x.requires_grad_(), [h.requires_grad_() for h in hx], list(ref.parameters()), lengths)
    got = _gradients(
        fast,
        x.detach().float().cuda().requires_grad_(),
        [h.detach().float().cuda().requires_grad_() for h in hx],
        list(fast.parameters()),
        lengths,
    )
    assert _gradient_error(want, got) <= 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("dtype, bound", [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)])
@pytest.mark.parametrize(
    "config",
    [None, {"units_per_cta": 8, "k_groups": 2, "n_tiles": 1, "barrier": "counter", "m_tiles_per_warp": 2}],
    ids=["default", "two_row_tiles_per_warp"],
)
def test_cuda_half_modules_train(kind, dtype, bound, config):
    """Half storage on the GPU (the forward on tensor cores, saving in float32; the backward on tensor cores too,
    its gate gradients rounded to the half type):
    gradients against torch.nn's float64 autograd on the same half-rounded weights, inputs and states,
    relative to a gradient's largest entry where that passes 1; the gradients come back in the half type.
    The saving forward takes the layer's config: a tuned one may hold two row tiles per warp."""
    torch.manual_seed(9)
    fast = pt.from_torch(_reference(kind, input_size=24, hidden_size=128).to(dtype).cuda().train(), config=config)
    ref = _reference(kind, input_size=24, hidden_size=128).double()
    with torch.no_grad():
        for p, q in zip(ref.parameters(), fast.parameters()):
            p.copy_(q)
    x = torch.randn(64, 5, 24).to(dtype)
    hx = [(0.5 * torch.randn(1, 5, 128)).to(dtype) for _ in range(2 if kind == "lstm" else 1)]
    want = _gradients(
        ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx], list(ref.parameters())
    )
    params = list(fast.parameters())
    got = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx], params)
    assert all(p.grad.dtype == dtype for p in params)
    assert _gradient_error(want, got) <= bound


@pytest.mark.gpu
@pytest.mark.parametrize(
    "module, where",
    [
        (lambda: pt.from_torch(torch.nn.GRU(8, 64)), "after step 5"),
        (lambda: pt.Recurrent("gru_cho", 8, 64), "after phase 0 of step 5"),
    ],
)
def test_a_cuda_backward_that_times_out_fills_nan_and_raises(module, where):
    """A stalled barrier (backward step 5, counted from the end; of a two-phase cell its first barrier)."""
    fast = module().cuda()
    x = torch.randn(20, 2, 8, device="cuda", requires_grad=True)
    out, _ = fast(x)
    backward = fast.layer_for(2, x.device)._training.backward
    backward.debug_stall_step, backward.barrier_timeout_us = 5, 2000
    out.sum().backward()
    assert torch.isnan(x.grad).all() and all(torch.isnan(p.grad).all() for p in fast.parameters())
    with pytest.raises(prnn_tvm.BarrierTimeout, match=where):
        fast.check()
    backward.debug_stall_step = -1
    x.grad = None
    out, _ = fast(x)
    out.sum().backward()
    fast.check()
    assert torch.isfinite(x.grad).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "kind, layers, bidirectional",
    [("lstm", 1, False), ("lstm", 2, False), ("lstm", 1, True), ("rnn_tanh", 2, True), ("gru", 1, True)],
)
def test_cuda_half_modules_match_float64(kind, layers, bidirectional, dtype):
    """Half inference calls, stacked and bidirectional, against torch.nn in float64 on the same half-rounded
    parameters and inputs; LSTM and RNN run with the input bias folded into the recurrent one."""
    import copy

    T, B, H, n_in = 64, 8, 256, 96
    half = (
        _reference(kind, input_size=n_in, hidden_size=H, num_layers=layers, bidirectional=bidirectional)
        .cuda()
        .to(dtype)
    )
    exact = copy.deepcopy(half).double()
    fast = pt.from_torch(half)
    x = torch.randn(T, B, n_in, device="cuda").to(dtype)
    with torch.no_grad():
        (want, want_h), (got, got_h) = exact(x.double()), fast(x)
    want_h, got_h = (want_h, got_h) if kind == "lstm" else ((want_h,), (got_h,))
    err = max_error(zip((got, *got_h), (want, *want_h)))
    assert err <= tolerance(pt.DTYPES[dtype], T), f"max abs error {err:.2e}"
    assert any(key[0] == "folded" for key in fast._derived) == (kind != "gru")


@pytest.mark.gpu
@pytest.mark.parametrize("kind, layers, bidirectional", [("lstm", 3, False), ("gru", 2, True), ("rnn_tanh", 1, True)])
def test_cuda_stacked_and_bidirectional_match_torch(kind, layers, bidirectional, no_tf32):
    _compare(kind, "cuda", T=32, B=4, n_in=100, H=256, layers=layers, bidirectional=bidirectional)


@pytest.mark.parametrize(
    "device, kind, layers, hidden, batch, packed, fits",
    [
        ("cpu", "lstm", 3, 16, 4, False, True),
        ("cpu", "gru", 4, 8, 5, True, True),
        pytest.param("cuda", "lstm", 3, 256, 4, False, True, marks=pytest.mark.gpu),
        pytest.param("cuda", "gru", 4, 128, 5, True, True, marks=pytest.mark.gpu),
        pytest.param("cuda", "rnn_relu", 2, 64, 1, True, True, marks=pytest.mark.gpu),
        # 50 MB of float32 weights: more than the registers hold
        pytest.param("cuda", "lstm", 2, 1024, 4, False, False, marks=pytest.mark.gpu),
    ],
)
def test_stacks_run_as_one_wavefront_launch_where_they_fit(device, kind, layers, hidden, batch, packed, fits, no_tf32):
    """A one-directional stack in inference: one launch (initial states given, lengths in no order), equal to
    torch.nn; where it does not fit, layer by layer, and the module says why."""
    fast = _compare(kind, device, T=40, B=batch, n_in=100, H=hidden, layers=layers, packed=packed)
    (note,) = fast.stack_notes.values()
    assert note.startswith("one wavefront launch" if fits else "layer by layer"), note
    assert any(key[-1] == "stack" for key in fast._layers) == fits


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kind, layers, bidirectional, B", [("lstm", 2, True, 5), ("gru", 1, False, 1), ("rnn_relu", 1, True, 33)]
)
def test_cuda_packed_sequences_match_torch(kind, layers, bidirectional, B, no_tf32):
    _compare(kind, "cuda", T=40, B=B, n_in=100, H=256, layers=layers, bidirectional=bidirectional, packed=True)


def test_custom_cell_example_trains_like_the_same_cell_in_torch_ops():
    """examples/custom_cell.py, shortened: a cell prnn-tvm does not ship, its backward derived, trains like the
    same cell written in PyTorch ops (the script exits 1 when the curves differ). Run in this process
    (``tests/cli_run.py``: a process of its own imports torch and TVM again, ~4 s of CPU)."""
    sizes = ["--steps", "10", "--hidden", "16", "--seq", "8", "--tolerance", "1e-4"]
    run = run_script(EXAMPLES / "custom_cell.py", *sizes)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| 10 |" in run.stdout and "largest difference over all steps" in run.stdout


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_char_model_example_trains_like_torch(device):
    """examples/char_lstm.py, shortened: the two loss curves agree (it exits 1 otherwise); on the GPU
    against cuDNN, through the training kernels. Run in this process (``tests/cli_run.py``)."""
    sizes = ["--steps", "10", "--hidden", "16", "--seq", "8", "--tolerance", "1e-4"]
    run = run_script(EXAMPLES / "char_lstm.py", *sizes, "--device", device)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| 10 |" in run.stdout and "largest difference over all steps" in run.stdout


@pytest.mark.parametrize("grad", [False, True])
def test_a_strided_parameter_gives_torch_nns_answer(grad):
    """torch.nn takes a parameter made strided by ``.t().contiguous().t()``; so does the module (on a compact copy),
    in inference and in training, gradients included."""
    ref = _reference("lstm", input_size=5, hidden_size=6).double()
    strided = ref.weight_hh_l0.detach().t().contiguous().t()
    assert not strided.is_contiguous()
    ref.weight_hh_l0 = torch.nn.Parameter(strided)
    fast = pt.from_torch(ref)
    x = torch.randn(4, 3, 5, dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        want, got = ref(x)[0], fast(x)[0]
    assert torch.allclose(got, want, atol=1e-10)
    if grad:
        (w_ref,) = torch.autograd.grad(want.square().sum(), ref.weight_hh_l0)
        (w_fast,) = torch.autograd.grad(got.square().sum(), ref.weight_hh_l0)
        assert torch.allclose(w_fast, w_ref, atol=1e-10)


def test_first_derivatives_with_create_graph_off_still_match_torch_nn():
    """What the double-backward refusal leaves alone: gradients of the input taken as first derivatives."""
    ref = _reference("gru", input_size=4, hidden_size=5).double()
    fast = pt.from_torch(ref)
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    (g_ref,) = torch.autograd.grad(ref(x)[0].sum(), x)
    (g_fast,) = torch.autograd.grad(fast(x)[0].sum(), x)
    assert torch.allclose(g_fast, g_ref, atol=1e-10)


@pytest.mark.gpu
def test_double_backward_is_refused_on_the_gpu():
    """The GPU backward (``_CudaBackprop``) refuses a gradient penalty as the CPU one does (torch.nn gives 0.194 on
    weight_hh where a silent double backward gave 0)."""
    from prnn_tvm.errors import UnsupportedError

    fast = pt.LSTM(4, 32).cuda()
    x = torch.randn(3, 2, 4, device="cuda", requires_grad=True)
    with pytest.raises(UnsupportedError, match="double backward through 'lstm'"):  # refused as the graph is made
        torch.autograd.grad(fast(x)[0].sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(fast(x)[0].sum(), x)  # first derivatives still run
    assert g.shape == x.shape and torch.isfinite(g).all()


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_torch_compile_runs_a_module_as_it_is(device, no_tf32):
    """``torch.compile`` of a model holding a module: Dynamo records its layers as the operator ``prnn_tvm::layers``
    (tests/test_torch_op.py: no graph break); outputs and gradients equal the eager model's, call after call. On the
    CPU the eager backend (inductor's C++ code generation takes a minute here and is not what is tested); on the
    GPU the default one."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.head = torch.nn.Linear(3, 6), pt.LSTM(6, 8), torch.nn.Linear(8, 2)

        def forward(self, x):
            out, _ = self.rnn(torch.tanh(self.embed(x)))
            return self.head(out)

    torch.manual_seed(0)
    model = Model().to(device)
    compiled = torch.compile(model, backend="eager" if device == "cpu" else "inductor")
    with torch.no_grad():
        for T in (5, 5, 7):
            x = torch.randn(T, 2, 3, device=device)
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
    compiled(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    assert all(torch.allclose(p.grad, g, atol=1e-5) for p, g in zip(model.parameters(), want))

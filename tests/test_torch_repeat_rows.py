"""The rows of a planned call's states kept for the next call (:mod:`prnn_tvm.torch.state_rows`), on the CPU build:
a decoder passing the returned states back, or the same states again, gets the module's own path's results bit for
bit; a state written in place, moved (``t.data = ...``) or not on a 64-byte boundary is read as it is now."""

import pytest

torch = pytest.importorskip("torch")

import prnn_tvm.torch as pt  # noqa: E402
from prnn_tvm.torch import dispatch, repeat  # noqa: E402


def _module(layers, hidden, wavefront=True):
    torch.manual_seed(3)
    ours = pt.from_torch(torch.nn.LSTM(hidden, hidden, layers)).eval()
    ours.wavefront = wavefront
    return ours


def _own(ours, x, hx, monkeypatch):
    """The call by the module's own path (plans off)."""
    with monkeypatch.context() as plans_off:
        plans_off.setattr(repeat, "call_key", lambda *_: None)
        return ours(x, hx)


def _equal(got, want):
    (out, (h, c)), (out2, (h2, c2)) = got, want
    return torch.equal(out, out2) and torch.equal(h, h2) and torch.equal(c, c2)


def _same(kept, states):
    return len(kept) == len(states) and all(a is b for a, b in zip(kept, states))


def _plan(ours, x, hx):
    plan = ours._plans[repeat.call_key(ours, x, hx)]
    assert type(plan) is repeat.Plan
    return plan


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("wavefront", [True, False])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_states_passed_back_give_the_own_paths_results(layers, wavefront, in_place, monkeypatch):
    """A decoder's loop: each call given the states the last returned; ``in_place`` (the final states written into
    the tensors returned, as on the GPU): the next call takes the rows its launch wrote."""
    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu") if in_place else ("cuda",))
    ours = _module(layers, 16, wavefront)  # rows of 64 bytes
    xs = torch.randn(8, 1, 2, 16)
    state = (torch.randn(layers, 2, 16), torch.randn(layers, 2, 16))
    with torch.no_grad():
        for step, x in enumerate(xs):
            want = _own(ours, x, state, monkeypatch)
            got = ours(x, state)
            assert _equal(got, want), step
            state = got[1]
        plan = _plan(ours, xs[0], state)
        if in_place:
            assert plan.whole and _same(plan.rows.returned[0], state)  # the rows the next call takes
        else:
            assert plan.rows.returned is None


@pytest.mark.parametrize("passed_back", [False, True])
def test_a_state_written_in_place_is_read_by_the_next_call(passed_back, monkeypatch):
    """Rows kept for the states given (``passed_back``: returned by the last call) are views of them: a write into
    a state between calls is what the next call reads."""
    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu"))
    ours, x = _module(2, 16), torch.randn(1, 1, 16)
    state = (torch.randn(2, 1, 16), torch.randn(2, 1, 16))
    with torch.no_grad():
        for _ in range(4):
            got = ours(x, state)
            if passed_back:
                state = got[1]
        kept = _plan(ours, x, state).rows
        assert _same((kept.returned if passed_back else kept.given)[0], state)
        state[0][1].mul_(-2.0)
        state[1].add_(0.5)
        want = _own(ours, x, state, monkeypatch)
        assert _equal(ours(x, state), want)


def test_a_moved_state_is_read_where_it_is_now(monkeypatch):
    """``t.data = ...`` keeps the tensor object and moves its memory: the rows are taken again."""
    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu"))
    ours, x = _module(2, 16), torch.randn(1, 1, 16)
    state = (torch.randn(2, 1, 16), torch.randn(2, 1, 16))
    with torch.no_grad():
        for _ in range(3):
            ours(x, state)
        before = _plan(ours, x, state).rows.given
        assert before is not None and _same(before[0], state)
        state[0].data = torch.randn(2, 1, 16)
        want = _own(ours, x, state, monkeypatch)
        assert _equal(ours(x, state), want)
        assert _plan(ours, x, state).rows.given[1][0] == state[0].data_ptr()


@pytest.mark.parametrize("odd", ["offset", "strided"])
def test_rows_that_need_a_copy_are_not_kept(odd, monkeypatch):
    """A state off a 64-byte boundary (its rows copied as kernels take them) or not contiguous: no rows kept (a kept
    copy would go stale), and a write into it is read by the next call."""
    monkeypatch.setattr(dispatch, "WRITTEN_IN_PLACE", ("cuda", "cpu"))
    ours, x = _module(2, 16), torch.randn(1, 1, 16)
    if odd == "offset":
        h = torch.randn(2 * 16 + 1)[1:].view(2, 1, 16)  # one element past the allocation's start
    else:
        h = torch.randn(16, 1, 2).transpose(0, 2)  # (2, 1, 16), not contiguous
    state = (h, torch.randn(2, 1, 16))
    with torch.no_grad():
        for _ in range(3):
            ours(x, state)
        assert _plan(ours, x, state).rows.given is None
        h.add_(1.0)
        want = _own(ours, x, state, monkeypatch)
        assert _equal(ours(x, state), want)


@pytest.mark.gpu
@pytest.mark.parametrize("layers", [1, 2])
def test_gpu_states_passed_back_give_the_own_paths_results(layers, monkeypatch, no_tf32):
    """The decoder's loop on the GPU (each layer one launch where it projects its own input, the final states written
    into the returned tensors): every step within float32's tolerance of the own path given the same states, and
    the rows the next call takes are the returned states'."""
    from prnn_tvm.dtypes import tolerance

    ours = _module(layers, 128).cuda()
    xs = torch.randn(8, 1, 1, 128, device="cuda")
    state = (torch.randn(layers, 1, 128, device="cuda"), torch.randn(layers, 1, 128, device="cuda"))
    with torch.no_grad():
        for step, x in enumerate(xs):
            want = _own(ours, x, state, monkeypatch)
            got = ours(x, state)
            for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
                assert (a - b).abs().max().item() <= tolerance("float32", layers), step
            state = got[1]
        plan = _plan(ours, xs[0], state)
        assert plan.whole and _same(plan.rows.returned[0], state)

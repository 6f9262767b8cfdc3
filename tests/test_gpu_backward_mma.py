"""The tensor-core backward of half layers on the GPU (``pytest -m gpu``): every gradient of a training step
through ``prnn_tvm.torch`` (the training forward, the backward on the tensor cores, the weights' gradients as
half GEMMs) against float64 on the same half-rounded weights, inputs and states, within the layer's tolerance
(``checks.plan_tolerance``) relative to a gradient's largest entry where that passes 1. The gate gradients
are rounded to the half type once per step before the tensor cores multiply them; the bound is the one the
forward's rounding of each step's state is held to."""

import copy
import dataclasses

import pytest
import torch

import prnn_tvm
import prnn_tvm.dtypes
import prnn_tvm.torch as pt
from prnn_tvm.checks import plan_tolerance

from .test_torch import _gradient_error, _gradients, _lengths

pytestmark = pytest.mark.gpu
NN = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN}


def modules(cell, n_in, hidden, dtype, **shape):
    """The half module on the GPU and its float64 reference on the CPU with the same (rounded) parameters:
    torch.nn's own module for its cells, else the CPU build's in float64."""
    torch.manual_seed(3)
    if cell in NN:
        base = NN[cell](n_in, hidden, **shape)
        fast = pt.from_torch(copy.deepcopy(base).to(dtype).cuda().train())
        ref = base.double()
    else:
        fast = pt.Recurrent(cell, n_in, hidden, dtype=dtype, device="cuda")
        ref = pt.Recurrent(cell, n_in, hidden, dtype=torch.float64)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), fast.parameters(), strict=True):
            p.copy_(q)
    return fast, ref


def _trained_layer(fast):
    """The one compiled layer of ``fast`` that trained (its batch is the call's bucket, its device cuda:N)."""
    found = [layer for layer in fast._layers.values() if layer._training is not None]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "cell, T, B, H, n_in, packed",
    [
        ("lstm", 1, 1, 37, 5, False),  # one step, one row, odd hidden
        ("lstm", 64, 5, 128, 24, False),
        ("lstm", 40, 6, 96, 12, True),  # rows of their own lengths
        ("gru", 17, 3, 33, 7, False),  # odd gate rows (3 x 33)
        ("rnn_tanh", 32, 8, 64, 16, False),
        ("gru_cho", 20, 4, 48, 8, False),  # two operands, two phases backwards
        ("lstm", 256, 16, 1024, 64, False),  # the benchmark's shape
        ("lstm", 32, 16, 1536, 32, False),  # a third of the fragments in shared memory
    ],
)
def test_half_gradients_on_tensor_cores_match_float64(cell, T, B, H, n_in, packed, dtype):
    fast, ref = modules(cell, n_in, H, dtype)
    x = torch.randn(T, B, n_in).to(dtype)
    hx = [(0.5 * torch.randn(1, B, H)).to(dtype) for _ in fast._states]
    lengths = _lengths(B, T) if packed else None
    want = _gradients(ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx],
                      list(ref.parameters()), lengths)
    params = list(fast.parameters())
    got = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx], params, lengths)
    layer = _trained_layer(fast)
    assert "k_groups=" in layer._training.report.splitlines()[-1], layer._training.report  # the tensor cores
    assert all(p.grad.dtype == dtype for p in params)
    assert _gradient_error(want, got) <= plan_tolerance(layer.plan, T)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_stack_both_ways_trains_on_tensor_cores(dtype):
    """Two layers, both directions: each layer and direction's backward on the tensor cores, in turn."""
    T, B, H, n_in = 48, 8, 128, 20
    fast, ref = modules("lstm", n_in, H, dtype, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, n_in).to(dtype)
    hx = [(0.5 * torch.randn(4, B, H)).to(dtype) for _ in range(2)]
    want = _gradients(ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx],
                      list(ref.parameters()))
    got = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx],
                     list(fast.parameters()))
    assert _gradient_error(want, got) <= prnn_tvm.dtypes.tolerance(pt.DTYPES[dtype], 2 * T)


@pytest.mark.parametrize("copy_stages", [0, 1, 2, 4])
@pytest.mark.parametrize("cell, T, B, H, n_in", [("lstm", 48, 16, 256, 32), ("gru", 17, 3, 33, 7)])
def test_each_copy_of_the_gate_gradients_gives_the_same_gradients(copy_stages, cell, T, B, H, n_in, monkeypatch):
    """One copy per CTA (``cluster`` 1): the block's whole-tile copy (0) and each warp's own columns in 1, 2 or 4
    stages (the GRU's warps have 2 k tiles: 4 stages are 2): within the tolerance of float64, each config built anew
    (the layer cache keys the layer, not the backward's config)."""
    from prnn_tvm import compiler, schedules
    from prnn_tvm.schedules import backward_mma_config as bc

    def built_with(plan, gpu):  # the layer's (its batch is the call's bucket) first ranked config, that copy
        cfg = dataclasses.replace(bc.ranked_configs(plan, gpu)[0], cluster=1, copy_stages=copy_stages)
        return iter([schedules.backward_kernel(plan, gpu, cfg)])

    monkeypatch.setenv("PRNN_TVM_CACHE", "0")
    monkeypatch.setattr(compiler, "gpu_backward", built_with)
    fast, ref = modules(cell, n_in, H, torch.float16)
    x = torch.randn(T, B, n_in).half()
    hx = [(0.5 * torch.randn(1, B, H)).half() for _ in fast._states]
    want = _gradients(ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx],
                      list(ref.parameters()))
    got = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx],
                     list(fast.parameters()))
    layer = _trained_layer(fast)
    assert f"copy_stages={copy_stages}" in layer._training.report or copy_stages == 2, layer._training.report
    assert _gradient_error(want, got) <= plan_tolerance(layer.plan, T)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_layer_trains_its_projection_in_its_type(dtype):
    """The input projection of a half layer that trains runs in the kernels' autograd Function (CudaBackprop, half
    GEMMs from the kernel's d_xp in the half type), not as float32 GEMMs on CUDA cores nor as a node of its own; its
    gradients arrive in the parameters' type."""
    fast = pt.from_torch(torch.nn.LSTM(16, 64)).to(dtype).cuda()
    x = torch.randn(10, 8, 16, device="cuda", dtype=dtype, requires_grad=True)
    out, _ = fast(x)
    seen, todo = set(), [out.grad_fn]
    while todo:  # every node of the backward graph
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(n for n, _ in node.next_functions)
    names = {n.name() for n in seen}
    assert "CudaBackpropBackward" in names and not any("mm" in n.lower() for n in names), names
    out.float().square().sum().backward()
    assert x.grad.dtype == dtype and fast.weight_ih_l0.grad.dtype == dtype and fast.bias_ih_l0.grad.dtype == dtype
    assert torch.isfinite(fast.weight_ih_l0.grad).all() and fast.weight_ih_l0.grad.abs().max() > 0


def test_a_half_backward_that_times_out_fills_nan_and_raises():
    """The half gate gradients of a stalled backward are NaN too, so every weight's gradient is."""
    fast = pt.from_torch(torch.nn.LSTM(8, 64)).half().cuda()
    x = torch.randn(20, 2, 8, device="cuda", dtype=torch.float16, requires_grad=True)
    out, _ = fast(x)
    backward = _trained_layer(fast)._training.backward
    backward.debug_stall_step, backward.barrier_timeout_us = 5, 2000
    out.float().sum().backward()
    assert torch.isnan(x.grad).all() and all(torch.isnan(p.grad).all() for p in fast.parameters())
    with pytest.raises(prnn_tvm.BarrierTimeout, match="after step 5"):
        fast.check()


def _built_with(changes: dict):
    """What a training build asks for its backward: the layer's (its batch is the call's bucket) first ranked config
    with ``changes``."""
    from prnn_tvm import schedules
    from prnn_tvm.schedules import backward_mma_config as bc

    def built(plan, gpu):
        cfg = dataclasses.replace(bc.ranked_configs(plan, gpu)[0], **changes)
        return iter([schedules.backward_kernel(plan, gpu, cfg)])

    return built


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "T, B, H, n_in, units, copy_stages",
    [
        (64, 16, 1024, 64, None, 0),  # the block waits for the whole tile
        (64, 16, 1024, 64, None, 1),  # each warp for its own k group's columns
        (1, 3, 136, 9, 17, 0),  # 8 CTAs; rows of 68 granules split unevenly; two row tiles: the block's wait
        (9, 3, 128, 9, 16, 1),  # 8 CTAs of one row tile: each warp's own wait
    ],
)
def test_clusters_give_the_gradients_of_one_cta_each(T, B, H, n_in, units, copy_stages, dtype, monkeypatch):
    """The gate gradients through a cluster's shared copy (``cluster`` 2, 4, 8: ``schedules/cluster_copy.py``) are
    the bytes each CTA copied itself (cluster 1, the same knobs otherwise): every gradient bitwise the same, and within
    the tolerance of float64."""
    from prnn_tvm import compiler

    monkeypatch.setenv("PRNN_TVM_CACHE", "0")
    fast, ref = modules("lstm", n_in, H, dtype)
    x = torch.randn(T, B, n_in).to(dtype)
    hx = [(0.5 * torch.randn(1, B, H)).to(dtype) for _ in fast._states]
    want = _gradients(ref, x.double().requires_grad_(), [h.double().requires_grad_() for h in hx],
                      list(ref.parameters()))
    got = {}
    for cluster in (1, 2, 4, 8):
        changes = {"cluster": cluster, "copy_stages": copy_stages, **({"units_per_cta": units} if units else {})}
        monkeypatch.setattr(compiler, "gpu_backward", _built_with(changes))
        fast, _ = modules("lstm", n_in, H, dtype)  # built anew: the layer cache keys the layer, not the backward
        got[cluster] = _gradients(fast, x.cuda().requires_grad_(), [h.cuda().requires_grad_() for h in hx],
                                  list(fast.parameters()))
        layer = _trained_layer(fast)
        assert (f"cluster={cluster}" in layer._training.report) == (cluster > 1), layer._training.report
        assert _gradient_error(want, got[cluster]) <= plan_tolerance(layer.plan, T), cluster
        for one, shared in zip(got[1], got[cluster], strict=True):
            assert torch.equal(one, shared), cluster


def test_a_clustered_backward_that_times_out_fills_nan_and_raises(monkeypatch):
    """A stalled block: its cluster's peers give up at the grid barrier (or their copy's wait), none hangs."""
    from prnn_tvm import compiler

    monkeypatch.setenv("PRNN_TVM_CACHE", "0")
    monkeypatch.setattr(compiler, "gpu_backward", _built_with({"cluster": 2, "copy_stages": 0}))
    fast = pt.from_torch(torch.nn.LSTM(8, 64)).half().cuda()
    x = torch.randn(20, 2, 8, device="cuda", dtype=torch.float16, requires_grad=True)
    out, _ = fast(x)
    backward = _trained_layer(fast)._training.backward
    assert "cluster=2" in _trained_layer(fast)._training.report
    backward.debug_stall_step, backward.barrier_timeout_us = 5, 2000
    out.float().sum().backward()
    assert torch.isnan(x.grad).all() and all(torch.isnan(p.grad).all() for p in fast.parameters())
    with pytest.raises(prnn_tvm.BarrierTimeout, match="after step 5"):
        fast.check()

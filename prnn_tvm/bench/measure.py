"""One benchmark case on the GPU: check prnn-tvm against cuDNN, then time everything the same way.

For a compiled layer, on the weights of the matching ``torch.nn`` module:

1. check: prnn-tvm's output sequence and final states against cuDNN's (TF32 off);
2. time, with CUDA events (median and minimum over repeats, after warm-up): prnn-tvm's
   public call (``from_torch(m)(x)``) like cuDNN's ``m(x)``, and that call captured in a CUDA
   graph and replayed; prnn-tvm's whole layer (projection + persistent kernel) and the
   kernel alone, launched on DLPack-wrapped torch tensors; cuDNN's whole layer; the graph
   loop, whole and recurrent. The host time of a public call (and of cuDNN's), GPU work
   excluded, by the wall clock over calls issued back to back;
3. the floor: the barrier alone for the layer's own grid (``barrier_probe``, every CTA
   reading every CTA's value, timed by TVM's time_evaluator, minimum over repeats) and
   the FLOP time at the GPU's peak (no barrier and no floor for a ``sentinel`` kernel);
4. check again after timing (a barrier timeout in any timed launch raises here).
"""

from __future__ import annotations

import logging

import torch

from .. import torch as prnn_torch
from ..checks import abs_error, worst
from ..codegen import barriers
from ..dtypes import policy, tolerance
from ..errors import PrnnError
from ..runtime.layer import Layer
from ..target import GpuSpec
from . import baselines
from .barrier_probe import Probe
from .matrix import Case, flops

log = logging.getLogger(__name__)

PROBE_STEPS = 1000


class Mismatch(PrnnError):
    """prnn-tvm's output differs from cuDNN's on the same weights by more than the tolerance."""


def barrier_seconds_per_step(layer: Layer, probes: dict) -> float | None:
    """The barrier alone for this layer's grid and barrier (probes are cached by grid); None for a kind the
    probe cannot run (``sentinel``, which crosses no barrier per step: its exchange is the output sequence
    itself, measured alone by bench/probes/sentinel_exchange.cu), so it has no barrier floor."""
    launch = layer.kernel.launch
    kind = barriers.of_launch(launch)
    if kind.probe_problem(all_to_all=True):
        return None
    key = (kind.name, launch.grid.ctas, launch.grid.threads)
    if key not in probes:
        probes[key] = Probe(*key, all_to_all=True)
        wrong = probes[key].run(steps=200)
        if wrong:
            raise PrnnError(f"barrier probe {key}: {wrong} wrong values; the barrier is broken")
    return probes[key].seconds_per_step(PROBE_STEPS)


def measure(case: Case, layer: Layer, gpu: GpuSpec, repeats: int, number: int, probes: dict) -> dict:
    """Every figure of one case, as CSV columns (see :mod:`prnn_tvm.bench.table`).

    Raises on anything that makes the case's figures meaningless: no baseline for the
    cell, a mismatch with cuDNN, a failed launch or a barrier timeout.
    """
    base = baselines.BASELINES.get(case.cell)
    if base is None:
        raise PrnnError(f"no PyTorch baseline for cell '{case.cell}' (have: {', '.join(baselines.BASELINES)})")
    if layer.arg_names[:5] != ["x", "W_ih", "b_ih", "W_hh", "b_hh"] or len(layer.plan.states) != len(base.states):
        raise PrnnError(f"cell '{case.cell}' does not take PyTorch's weights (W_hh, b_hh) and states")
    T, B, H = case.seq_len, case.batch, case.hidden
    dev, dt = torch.device("cuda"), getattr(torch, case.dtype)
    torch.manual_seed(0)
    module = base.module(layer.input_size, H).to(dev, dt).eval()
    w = baselines.weights(module)
    x = torch.randn(T, B, layer.input_size, device=dev, dtype=dt)
    states = [0.5 * torch.randn(B, H, device=dev, dtype=dt) for _ in base.states]
    args = [x, w["W_ih"], w["b_ih"], w["W_hh"], w["b_hh"], *states]  # the order of layer.arg_names
    row: dict = {}
    with torch.no_grad():
        ref_out, ref_finals = baselines.run_cudnn(module, x, states)
        row["max_abs_err"] = _check(layer, args, ref_out, ref_finals, tolerance(case.dtype, T))
        # The two launches with every argument bound once, so only the kernels run between events.
        funcs = {name: (layer.module[name], a) for name, a in layer.bind(*args).launches}
        proj, rec = funcs["projection"], funcs["recurrent"]
        row["prnn_layer_ms"], row["prnn_layer_min_ms"] = _ms(
            lambda: (proj[0](*proj[1]), rec[0](*rec[1])), repeats, number
        )
        row["prnn_kernel_ms"], row["prnn_kernel_min_ms"] = _ms(lambda: rec[0](*rec[1]), repeats, number)
        again = _check(layer, args, ref_out, ref_finals, tolerance(case.dtype, T))
        row["max_abs_err"] = worst([row["max_abs_err"], again])
        initial = baselines.hx(states)
        row["cudnn_ms"], row["cudnn_min_ms"] = _ms(lambda: module(x, initial), repeats, number)
        public = prnn_torch.from_torch(module, arch=gpu.arch)  # what a user calls: module call for module call
        public.batch_buckets = False  # the layer above's batch itself, not its bucket's (no padded rows)
        public.layer_for(B, dev)  # compiled once, outside the timing (as the layer above)
        row["prnn_call_ms"], row["prnn_call_min_ms"] = _ms(lambda: public(x, initial), repeats, number)
        row["prnn_host_us"] = baselines.host_seconds(lambda: public(x, initial), repeats, number) * 1e6
        row["cudnn_host_us"] = baselines.host_seconds(lambda: module(x, initial), repeats, number) * 1e6
        graph, (graph_out, _) = baselines.captured(lambda: public(x, initial))
        row["prnn_graph_ms"], row["prnn_graph_min_ms"] = _ms(graph.replay, repeats, number)
        public.check()  # a timeout in any timed call or replay raises here
        row["max_abs_err"] = worst([row["max_abs_err"], _differs(graph_out, ref_out, tolerance(case.dtype, T))])
        del graph
        loop = baselines.GraphLoop(base, w, x, states)
        row["graph_layer_ms"], row["graph_layer_min_ms"] = _ms(loop.replay_layer, repeats, number)
        row["graph_recurrent_ms"], row["graph_recurrent_min_ms"] = _ms(loop.replay_recurrent, repeats, number)
        loop.replay_layer()
        row["graph_max_err"] = float((loop.out - ref_out).abs().max())
        del loop
    flop_layer, flop_rec = flops(layer.plan, layer.input_size, T)
    barrier_s = barrier_seconds_per_step(layer, probes)
    row.update(repeats=repeats, barrier_us=None if barrier_s is None else barrier_s * 1e6)
    peak = gpu.peak_half_flops if policy(case.dtype).mma is not None else gpu.peak_fp32_flops
    if peak:  # unknown clock: no FLOP floor rather than a wrong one
        row.update(flop_layer_ms=flop_layer / peak * 1e3, flop_recurrent_ms=flop_rec / peak * 1e3)
    if peak and barrier_s is not None:
        row.update(floor_step_us=(barrier_s + flop_rec / T / peak) * 1e6)
    return row


def _ms(fn, repeats: int, number: int) -> tuple[float, float]:
    median, best = baselines.cuda_event_times(fn, repeats, number)
    return median * 1e3, best * 1e3


def _check(layer: Layer, args: list, ref_out: torch.Tensor, ref_finals: list[torch.Tensor], bound: float) -> float:
    """Run the layer through its public call and return the max abs difference to cuDNN (at most ``bound``)."""
    out, finals = layer(*args)
    layer.check()  # a timed-out launch (of this call or a timed one before) is a timeout, not a mismatch
    return worst(
        [
            _differs(torch.from_dlpack(out), ref_out, bound),
            *(_differs(torch.from_dlpack(got), ref, bound) for got, ref in zip(finals, ref_finals)),
        ]
    )


def _differs(got: torch.Tensor, ref: torch.Tensor, bound: float) -> float:
    """The max abs difference, at most ``bound`` (else :class:`Mismatch`)."""
    err = abs_error(got, ref)
    if not err <= bound:  # NaN anywhere: an infinite error
        raise Mismatch(f"prnn-tvm differs from cuDNN by {err:.2e} (tolerance {bound:.1e})")
    return err

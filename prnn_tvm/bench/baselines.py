"""What prnn-tvm is measured against, in PyTorch: cuDNN's layers and a GEMM-per-step loop as a CUDA graph.

Both baselines know PyTorch's cells (``torch.nn.RNN/LSTM/GRU``, their gate order and
semantics), which the built-in cells of the same names follow; a cell without an entry in
:data:`BASELINES` has no baseline to be measured against. The weights are those of the
``torch.nn`` module, passed to prnn-tvm as they are (PyTorch's layout is the project's).

The graph loop is the fair non-persistent baseline: one input-projection GEMM over all
steps, then per step a GEMM with the recurrent weights and the cell's pointwise math,
captured once and replayed as a CUDA graph, so no launch overhead is left in it.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch


def _rnn_step(act):
    def step(xp, gh, state):
        h = act(xp + gh)
        return h, (h,)

    return step


def _lstm_step(xp, gh, state):
    i, f, g, o = (xp + gh).chunk(4, dim=1)
    c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, (h, c)


def _gru_step(xp, gh, state):
    xr, xz, xn = xp.chunk(3, dim=1)
    hr, hz, hn = gh.chunk(3, dim=1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    h = (1 - z) * n + z * state[0]
    return h, (h,)


@dataclass(frozen=True)
class Baseline:
    """PyTorch's version of a cell: the cuDNN module and the same step for the graph loop.

    ``step(xp_t, gh_t, states) -> (h, new_states)`` takes this step's input projection
    ``x W_ih^T + b_ih`` and recurrent product ``h W_hh^T + b_hh`` (B, gates*H); states are
    in the cell's declaration order (``h``, then ``c`` for the LSTM).
    """

    module: Callable[[int, int], torch.nn.Module]
    step: Callable
    states: tuple[str, ...] = ("h",)


BASELINES = {
    "rnn_tanh": Baseline(lambda i, h: torch.nn.RNN(i, h, nonlinearity="tanh"), _rnn_step(torch.tanh)),
    "rnn_relu": Baseline(lambda i, h: torch.nn.RNN(i, h, nonlinearity="relu"), _rnn_step(torch.relu)),
    "lstm": Baseline(lambda i, h: torch.nn.LSTM(i, h), _lstm_step, ("h", "c")),
    "gru": Baseline(lambda i, h: torch.nn.GRU(i, h), _gru_step),
}


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The layer's weights as fresh, compact tensors (DLPack-ready): W_ih, b_ih, W_hh, b_hh."""
    return {
        name: getattr(module, attr).detach().clone()
        for name, attr in (
            ("W_ih", "weight_ih_l0"),
            ("b_ih", "bias_ih_l0"),
            ("W_hh", "weight_hh_l0"),
            ("b_hh", "bias_hh_l0"),
        )
    }


def hx(states: list[torch.Tensor]):
    """The initial states, (B, H) each, as ``torch.nn`` modules take them: ``h0`` or ``(h0, c0)``."""
    hx = tuple(s.unsqueeze(0) for s in states)
    return hx if len(hx) > 1 else hx[0]


def run_cudnn(module: torch.nn.Module, x: torch.Tensor, states: list[torch.Tensor]):
    """``module(x, hx)`` with states (B, H) each; returns (out, [final states in declaration order])."""
    out, finals = module(x, hx(states))
    finals = finals if isinstance(finals, tuple) else (finals,)
    return out, [f[0] for f in finals]


def project(w: dict[str, torch.Tensor], x: torch.Tensor, xp: torch.Tensor) -> None:
    """``xp = x W_ih^T + b_ih`` for every step at once, written into ``xp`` (T, B, gates*H)."""
    T, B, n_in = x.shape
    torch.addmm(w["b_ih"], x.view(T * B, n_in), w["W_ih"].t(), out=xp.view(T * B, -1))


def recur(
    baseline: Baseline, w: dict[str, torch.Tensor], xp: torch.Tensor, states: list[torch.Tensor], out: torch.Tensor
) -> None:
    """The recurrence, one GEMM and the cell's pointwise math per step, writing h of every step into ``out``."""
    state = tuple(states)
    w_hh_t = w["W_hh"].t()
    for t in range(xp.shape[0]):
        h, state = baseline.step(xp[t], torch.addmm(w["b_hh"], state[0], w_hh_t), state)
        out[t].copy_(h)


class GraphLoop:
    """The GEMM-per-step loop (:func:`project`, :func:`recur`) captured as two CUDA graphs: the
    whole layer, and the recurrence alone.

    Inputs are copied into static tensors once; ``replay_layer()`` / ``replay_recurrent()``
    run a captured graph; ``out`` holds the last output sequence (T, B, H).
    """

    def __init__(self, baseline: Baseline, w: dict[str, torch.Tensor], x: torch.Tensor, states: list[torch.Tensor]):
        x, states = x.clone(), [s.clone() for s in states]
        T, B, _ = x.shape
        xp = torch.empty(T, B, w["W_ih"].shape[0], device=x.device, dtype=x.dtype)
        self.out = torch.empty(T, B, w["W_hh"].shape[1], device=x.device, dtype=x.dtype)
        self._static = (x, states, xp)  # the graphs read and write these very tensors
        self.layer_graph = _capture(lambda: (project(w, x, xp), recur(baseline, w, xp, states, self.out)))
        self.recurrent_graph = _capture(lambda: recur(baseline, w, xp, states, self.out))

    def replay_layer(self) -> None:
        self.layer_graph.replay()

    def replay_recurrent(self) -> None:
        self.recurrent_graph.replay()


def _capture(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch recommends
        fn()
    torch.cuda.current_stream().wait_stream(side)
    free_before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


HELD_BY_CYCLES = ("Tensor", "Module", "Layer", "Launcher")  # type names whose freeing reaches the CUDA API


def free_before_capture() -> dict[str, int]:
    """Free what unreachable reference cycles hold, then wait for the GPU: call before ``torch.cuda.graph``. Returns
    how many objects the collection freed whose type names a tensor, a module, a layer or a launcher (TVM's and
    prnn-tvm's), by type, so that a benchmark can say what it would have crashed on.

    torch no longer collects garbage when a capture begins (``torch.compiler.config.force_cudagraph_gc`` is off by
    default), so an unreachable cycle holding a TVM tensor (a compiled layer's call returns tensors TVM allocated)
    or a TVM module is freed by whichever collection runs next. During a capture (torch's default capture mode,
    ``"global"``) that ``cudaFree`` is refused, and TVM, raising from a destructor, aborts the process with
    ``cudaErrorStreamCaptureUnsupported``."""
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # the unreachable objects are kept in gc.garbage, to be named, then freed
    try:
        gc.collect()
        found = Counter(
            f"{type(o).__module__}.{type(o).__qualname__}"
            for o in gc.garbage
            if type(o).__module__.split(".")[0] in ("tvm", "tvm_ffi", "prnn_tvm")
            and any(word in type(o).__qualname__ for word in HELD_BY_CYCLES)
        )
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    gc.collect()  # the cycles, no longer kept, freed now: outside any capture
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return dict(found)


def cuda_event_times(fn: Callable[[], object], repeats: int, number: int, warmup: int = 3) -> tuple[float, float]:
    """(median, minimum) seconds per call of ``fn`` over ``repeats`` runs of ``number`` calls.

    Each run is bracketed by CUDA events on the current stream, after ``warmup`` calls;
    this is how every implementation in the benchmark is timed.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(repeats):
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) * 1e-3 / number)
    return statistics.median(runs), min(runs)


def host_seconds(fn: Callable[[], object], repeats: int, number: int, warmup: int = 3) -> float:
    """Minimum host (Python-side) seconds per call of ``fn``: ``number`` calls issued back to back
    without waiting for the GPU, the GPU drained between runs; what a call costs the CPU, GPU work
    excluded as long as the calls only enqueue it."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
        torch.cuda.synchronize()
    return min(runs)


def captured(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream, as torch asks):
    ``(graph, what the captured call returned)``; ``graph.replay()`` runs it again."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    free_before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


def script_arguments(number: int, **options) -> argparse.Namespace:
    """The command line of a benchmark script under ``bench/``: ``--seq`` (256), ``--repeats`` (7), ``--number``
    (``number``) and an option per entry of ``options``, of its default's type (a list: one or more values of its
    first's type). Also sets what every figure is measured under: TF32 off for cuBLAS and cuDNN, torch's seed 0."""
    p = argparse.ArgumentParser()
    for name, default in {"seq": 256, **options, "repeats": 7, "number": number}.items():
        if isinstance(default, list):
            p.add_argument(f"--{name}", nargs="+", type=type(default[0]), default=default)
        else:
            p.add_argument(f"--{name}", type=type(default), default=default)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    return p.parse_args()

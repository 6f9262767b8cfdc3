"""The measuring half of ``prnn-tvm bench --step-latency``: one timestep per call on the GPU, a resident session
against cuDNN, every mode of a model in one process.

Per model (a ``torch.nn.LSTM`` and the same weights in a session of the deep stack ``lstm_d<layers>``), the
microseconds per step of each mode of :data:`~prnn_tvm.bench.step_table.MODES`, after a warm-up of 100 steps:

- input on the host, the latency the host sees from writing a step's input (NumPy) to reading its output: our
  ``session.step(x)`` (its host step native where it is built, and in Python in a second session); our module's
  plain call at T=1 (``from_torch(lstm)(x, (h, c))``, no session); cuDNN's eager step (``lstm(x, (h, c))`` on a
  copy of x, the output copied back); cuDNN's step replayed from a CUDA graph (x copied into the graph's input, a
  replay, the output copied back);
- input on the GPU, made by the step before (each step's input is the last step's output, as a decoder's next
  token), the host waiting for each step: our ``session.post``; our module's plain call; cuDNN's eager step; its
  graph's replay;
- a chain: ``chain`` dependent steps captured in one CUDA graph, each of :data:`~.step_cases.CHAIN_REPLAYS`
  replays a sample of its time per step: our ``session.post`` against cuDNN's step.

TF32 off. A model whose session cannot be built (its weights do not fit on chip) keeps its cuDNN rows and our module's
plain call (which runs layer by layer, or on torch.nn's kernels where a layer does not fit), and its session rows say
why.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import tvm_ffi

from ..compiler import compile_cell, compile_session
from ..errors import ConfigError, PrnnError
from ..target import gpu_spec
from . import step_table
from .baselines import captured, free_before_capture
from .runner import environment, missing_requirements, recover
from .step_cases import CHAIN_REPLAYS, StepModel

log = logging.getLogger(__name__)

WARM_UP = 100


def session_weights(lstm: torch.nn.LSTM) -> dict:
    """A torch.nn.LSTM's parameters by the names a session of ``lstm_d<layers>`` (or ``lstm``) takes."""
    found = {"W_ih": lstm.weight_ih_l0, "b_ih": lstm.bias_ih_l0}
    for k in range(lstm.num_layers):
        prefix = f"l{k}_" if lstm.num_layers > 1 else ""
        names = {"W_hh": "weight_hh", "b_hh": "bias_hh", **({"W_ih": "weight_ih", "b_ih": "bias_ih"} if k else {})}
        found.update({prefix + ours: getattr(lstm, f"{theirs}_l{k}") for ours, theirs in names.items()})
    return {name: p.detach().contiguous() for name, p in found.items()}


def latencies(step, xs) -> np.ndarray:
    """Microseconds of each ``step(x)`` over ``xs``, by the host's clock (after a warm-up of :data:`WARM_UP`)."""
    for x in xs[:WARM_UP]:
        step(x)
    found = np.empty(len(xs))
    for i, x in enumerate(xs):
        t0 = time.perf_counter()
        step(x)
        found[i] = (time.perf_counter() - t0) * 1e6
    return found


def chain_samples(step, chain: int, replays: int = CHAIN_REPLAYS, warm_up: bool = True) -> np.ndarray:
    """Microseconds per step of ``chain`` dependent calls of ``step()`` replayed from one CUDA graph, one sample per
    replay (CUDA events); ``warm_up``: run them on a side stream before the capture (``baselines.captured``)."""
    if warm_up:
        graph, _ = captured(lambda: [step() for _ in range(chain)])
    else:
        free_before_capture()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(chain):
                step()
    graph.replay()
    found = np.empty(replays)
    for i in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        found[i] = start.elapsed_time(end) * 1e3 / chain
    return found


def eager_samples(lstm: torch.nn.LSTM, xs: np.ndarray, start: list) -> dict:
    """Our module's plain call (``prnn_tvm.torch.from_torch(lstm)``, no session), one timestep (T=1) per call as
    cuDNN's eager modes call ``lstm``: input on the host (copied in, the output copied back) and on the GPU (each
    step's input the last step's output, the host waiting for each step). The module compiles on its first call,
    in the warm-up."""
    from ..torch import from_torch

    ours = from_torch(lstm).eval()
    state = [t.clone() for t in start]
    x = torch.zeros(1, *xs.shape[1:], device="cuda", dtype=start[0].dtype)
    wait = torch.cuda.current_stream().synchronize

    def host(x_t):
        out, (state[0], state[1]) = ours(torch.from_numpy(x_t).cuda()[None], (state[0], state[1]))
        return out.cpu()

    def on_gpu(_x_t):
        out, (state[0], state[1]) = ours(x, (state[0], state[1]))
        x.copy_(out)  # the next step's input
        wait()

    return {"ours eager host": latencies(host, xs), "ours eager gpu": latencies(on_gpu, xs)}


def measure(model: StepModel, steps: int, chain: int) -> tuple[dict, str | None, str | None]:
    """Every mode of ``model``: ``(samples by mode, the session kernels' report, why our modes are missing)``."""
    dtype = getattr(torch, model.dtype)
    L, H, B = model.layers, model.hidden, model.batch
    lstm = torch.nn.LSTM(H, H, L).cuda().to(dtype).eval()
    xs = np.random.default_rng(0).standard_normal((steps, B, H)).astype(model.dtype)
    state = [torch.zeros(L, B, H, device="cuda", dtype=dtype) for _ in range(2)]
    wait = torch.cuda.current_stream().synchronize
    samples = {}
    with torch.no_grad():

        def cudnn_eager_host(x):
            out, (state[0], state[1]) = lstm(torch.from_numpy(x).cuda()[None], (state[0], state[1]))
            return out.cpu()

        static_x = torch.zeros(1, B, H, device="cuda", dtype=dtype)

        def cudnn_step():
            out, (h, c) = lstm(static_x, (state[0], state[1]))
            state[0].copy_(h)
            state[1].copy_(c)
            static_x.copy_(out)  # the next step's input: a chain of dependent steps
            return out

        graph, graph_out = captured(cudnn_step)

        def cudnn_graph_host(x):
            static_x.copy_(torch.from_numpy(x)[None])
            graph.replay()
            return graph_out.cpu()

        samples["cudnn eager host"] = latencies(cudnn_eager_host, xs)
        samples["cudnn graph host"] = latencies(cudnn_graph_host, xs)
        samples["cudnn eager gpu"] = latencies(lambda _x: (cudnn_step(), wait()), xs)
        samples["cudnn graph gpu"] = latencies(lambda _x: (graph.replay(), wait()), xs)
        samples["cudnn chain"] = chain_samples(cudnn_step, chain)
        samples.update(eager_samples(lstm, xs, state))
        try:
            layer = compile_cell(model.cell, H, B, dtype=model.dtype)
            report = compile_session(layer).report
            session = layer.session(**session_weights(lstm), release_after=None)
        except ConfigError as err:
            return samples, None, f"not built: {err}"
        missing = None
        try:
            samples["ours host"] = latencies(session.step, xs)
            x = torch.zeros(B, H, device="cuda", dtype=dtype)
            out = torch.empty(len(session.state_names), B, H, device="cuda", dtype=dtype)
            k = session.output_index

            def ours_step():
                with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
                    session.post(x, out)
                x.copy_(out[k])  # the next step's input
                return out

            samples["ours gpu"] = latencies(lambda _x: (ours_step(), wait()), xs)
            try:  # torch's capture synchronizes the device: released first, relaunched inside the capture
                session.release()
                samples["ours chain"] = chain_samples(ours_step, chain, warm_up=False)
            except (PrnnError, RuntimeError) as err:
                missing = f"chain not measured: {err}"
        finally:
            session.close()
        with layer.session(**session_weights(lstm), release_after=None, host_step="python") as session:
            samples["ours host python"] = latencies(session.step, xs)
    return samples, report, missing


def run(models, steps: int, chain: int, progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Measure every model (:func:`measure`): the rows of :mod:`.step_table` and the histogram rows. A model that
    fails is a row saying why, and the run goes on."""
    from tqdm import tqdm

    problem = missing_requirements()
    if problem:
        raise RuntimeError(problem)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    env = environment(gpu_spec())
    rows, histograms = [], []
    for model in tqdm(models, desc="step latency", unit="model", disable=not progress, dynamic_ncols=True):
        described = {**model.as_dict(), **env}
        try:
            samples, report, missing = measure(model, steps, chain)
        except Exception as err:  # noqa: BLE001 - a failed model is a result; the run goes on
            rows.append(step_table.failure(described, f"{type(err).__name__}: {err}"))
            log.warning("%s: %s", model.name, rows[-1]["error"].splitlines()[0])
            recover(torch)
            continue
        first = len(rows)
        for mode in step_table.MODES:
            if mode in samples:
                rows.append({**step_table.summary(described, mode, samples[mode]), "session": report})
                if step_table.MODES[mode] != "graph":
                    histograms += step_table.histogram(model.name, mode, samples[mode])
            else:
                rows.append({**described, "mode": mode, "input": step_table.MODES[mode], "status": "error"})
                rows[-1]["error"] = missing
        log.info(
            "%s p50 us: %s",
            model.name,
            ", ".join(f"{r['mode']} {r['p50_us']}" for r in rows[first:] if r.get("p50_us")),
        )
    return rows, histograms

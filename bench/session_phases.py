"""Where a session step's time goes: the host's share of a host step (CPU only), and on the GPU the parts of an
in-graph step (a chain of dependent ``session.post`` steps replayed from a CUDA graph, as ``prnn-tvm bench
--step-latency`` times it) told apart by what changes between runs of the same model.

    python bench/session_phases.py [--hidden 640 --batch 8 --half 1 --layers 1 --chain 100 --steps 10000]
    python bench/session_phases.py --hidden 128 --batch 1 --half 0 --layers 2 --steps 100000   # 2x128's host share
    python bench/session_phases.py --hidden 480 --batch 1 --half 0 --layers 3 --chains 0       # the floors alone

1. Host share (no GPU): the host transport's work per step (``prnn_tvm.runtime.session_host``) with rings in
   ordinary memory and every response already tagged, as the resident kernel would leave them: the floor the host
   puts under a host step. In Python (``host_step="python"``): pack the request, spin on the responses, copy the
   states out; natively (the default, ``prnn_tvm.runtime.session_native``): the one call that does all three. Then
   the return (a step's ``(y, states)``), and all of it with the output's allocation. ``--layers`` sets the states
   of a deep stack (two a layer: an LSTM's).
2. On the GPU, us per step (medians of CUDA-event replays), of the deep stack of ``--layers`` (``lstm_d<layers>``;
   one layer: ``lstm``):
   - two dependent small kernels per step in a graph (torch's): what the publish and the collect cost as nodes;
   - the layer's own recurrent kernel over ``chain`` steps of a projected input (no take, no projection, no
     publish or collect, no transport): the recurrence's floor, the step of a session whose input is already on the
     device with nothing to wait for;
   - with ``--chains 1`` (the default): the chain at input sizes K = hidden, hidden / 4 and 16: the take (a CTA
     takes all B x K words) and the projection (B x K x 4 units per CTA) scale with K, nothing else does; the slope
     is their cost per input; then ``session.step`` (host to host) and ``session.post`` with the caller waiting, p50
     over ``--steps``. ``--chains 0`` leaves them out (no session compiled: the floors alone, in seconds).

The transport's floor, a session's own transport around a step that does nothing, is
``bench/probes/session_transport.cu``'s ``session`` form.
"""

import time

import numpy as np
import torch
import tvm_ffi

import prnn_tvm
from prnn_tvm.bench import baselines
from prnn_tvm.bench.step_latency import chain_samples, latencies, session_weights
from prnn_tvm.runtime import session_words
from prnn_tvm.runtime.session_host import HostRings
from prnn_tvm.signature import request_words

args = baselines.script_arguments(number=1, hidden=640, batch=8, half=1, chain=100, steps=10_000, layers=1, chains=1)
H, B, CHAIN, L = args.hidden, args.batch, args.chain, args.layers
CELL = f"lstm_d{L}" if L > 1 else "lstm"
DTYPE = "float16" if args.half else "float32"


def host_share(input_size: int, states: int, native: bool) -> dict:
    """Microseconds (p50 and p99 over ``--steps``) of each part of a host step's own work, on this CPU."""
    requests = np.zeros((2, request_words(B * input_size, DTYPE)), np.uint64)  # two half values a word
    responses = np.zeros((2, states, B, H), np.uint64)
    error = np.zeros(1, np.uint32)
    rings = HostRings(requests, responses, B * input_size, DTYPE, DTYPE, error.ctypes.data, native)
    if rings.native != native:
        return {"not built": "see the warning"}
    x = np.random.default_rng(0).standard_normal((B, input_size)).astype(DTYPE)
    names = [f"s{k}" for k in range(states)]
    values = session_words.values(responses, DTYPE)
    parts = ("step", "return", "all") if native else ("pack", "spin", "copy", "return", "all")
    found = {part: np.empty(args.steps) for part in parts}
    for step in range(args.steps):
        tag = step + 1
        responses.view(np.uint32)[step % 2, ..., 1::2] = tag  # the kernel's answer, already there
        start = time.perf_counter_ns()
        got = np.empty((states, B, H), DTYPE)  # a step's output, the caller's to keep
        t0 = time.perf_counter_ns()
        if native:
            rings.step(x, got, step, tag, 10**9)
            t1 = t2 = time.perf_counter_ns()
        else:
            rings.post(x, step, tag)
            t1 = time.perf_counter_ns()
            rings.wait(step, tag, 10**9)
            t2 = time.perf_counter_ns()
            got[...] = values[step % 2]  # what the Python collect copies after its wait
        t3 = time.perf_counter_ns()
        _ = got[0], dict(zip(names, got))
        t4 = time.perf_counter_ns()
        times = {"pack": t1 - t0, "spin": t2 - t1, "copy": t3 - t2, "step": t3 - t0, "return": t4 - t3,
                 "all": t4 - start}
        for part in parts:
            found[part][step] = times[part] / 1e3
    return {part: (round(float(np.median(v)), 2), round(float(np.percentile(v, 99)), 2)) for part, v in found.items()}


def chain_us(input_size: int) -> float:
    """Per step, a chain of ``--chain`` dependent session steps of an LSTM with ``input_size`` inputs."""
    lstm = torch.nn.LSTM(input_size, H, L).cuda().to(getattr(torch, DTYPE)).eval()
    layer = prnn_tvm.compile_cell(CELL, H, B, input_size=input_size, dtype=DTYPE)
    session = layer.session(**session_weights(lstm), release_after=None)
    x = torch.zeros(B, input_size, device="cuda", dtype=lstm.weight_ih_l0.dtype)
    out = torch.empty(len(session.state_names), B, H, device="cuda", dtype=x.dtype)
    k = session.output_index
    width = min(input_size, H)

    def step():
        with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
            session.post(x, out)
        x[:, :width].copy_(out[k][:, :width])  # the next step's input: a chain of dependent steps

    try:
        step()  # the session's own kernels loaded, outside the capture
        torch.cuda.current_stream().synchronize()
        session.release()  # torch's capture synchronizes the device: relaunched inside the capture
        return float(np.median(chain_samples(step, CHAIN, warm_up=False)))
    finally:
        session.close()


def recurrence_us() -> float:
    """Per step, the layer's own recurrent kernel (a deep stack's: every layer, the first one's input projected)
    over ``--chain`` steps of a projected input."""
    layer = prnn_tvm.compile_cell(CELL, H, B, dtype=DTYPE)
    dtype = getattr(torch, DTYPE)
    launch = layer.signature.launch("recurrent")
    xp = torch.randn(CHAIN, B, 4 * H, device="cuda", dtype=getattr(torch, launch.arg("xp").dtype))  # float32 or half
    weights = {  # W_hh and b_hh, and each layer above the first one's W_ih and b_ih
        name: torch.randn(*launch.arg(name).shape, device="cuda", dtype=dtype) / H**0.5
        for name in layer.signature.starting_at("recurrent").arg_names
        if name.split("_")[-2:-1] in (["W"], ["b"])
    }
    ((name, bound),) = layer.bind_recurrent(xp, **weights).launches
    function = layer.module[name]
    return baselines.cuda_event_times(lambda: function(*bound), args.repeats, 10)[0] * 1e6 / CHAIN


def two_nodes_us() -> float:
    """Per step, two dependent small torch kernels per step in a graph (a publish and a collect's place)."""
    a, b = torch.zeros(B, H, device="cuda"), torch.zeros(B, H, device="cuda")

    def step():
        a.add_(b)
        b.copy_(a)

    return float(np.median(chain_samples(step, CHAIN)))


print(f"LSTM {L}x{H} B={B} {DTYPE}")
for native in (False, True):
    print(f"host share, {'native' if native else 'Python'}, us (p50, p99) on this CPU:",
          host_share(H, 2 * L, native))
if torch.cuda.is_available():
    with torch.no_grad():
        print("two small kernels per step in a graph, us/step:", round(two_nodes_us(), 2))
        print(f"recurrent kernel alone ({CELL}), us/step:", round(recurrence_us(), 2))
    if not args.chains:
        raise SystemExit(0)
    with torch.no_grad():
        for K in dict.fromkeys((H, max(H // 4, 1), 16)):
            print(f"session chain at input size {K}, us/step:", round(chain_us(K), 2))
        lstm = torch.nn.LSTM(H, H, L).cuda().to(getattr(torch, DTYPE)).eval()
        layer = prnn_tvm.compile_cell(CELL, H, B, dtype=DTYPE)
        xs = np.random.default_rng(0).standard_normal((args.steps, B, H)).astype(DTYPE)
        with layer.session(**session_weights(lstm), release_after=None) as session:
            print("session.step (host to host) p50 us:", round(float(np.median(latencies(session.step, xs))), 2))
            x = torch.zeros(B, H, device="cuda", dtype=getattr(torch, DTYPE))
            out = torch.empty(len(session.state_names), B, H, device="cuda", dtype=x.dtype)
            wait = torch.cuda.current_stream().synchronize

            def posted(_x):
                with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
                    session.post(x, out)
                wait()

            print("session.post, caller waiting, p50 us:", round(float(np.median(latencies(posted, xs))), 2))

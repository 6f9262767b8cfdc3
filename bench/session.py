"""One timestep per call: resident sessions against cuDNN, on the GPU (issue 47's models).

    python bench/session.py [--steps 10000] [--chain 100] [--name session-h100]

Per model (a torch.nn.LSTM and the same weights in a session of the deep stack ``lstm_d<layers>``), in one
process:

- *host* modes, the latency the host sees from writing a step's input (NumPy) to reading its output, p50 and p99
  over ``--steps`` steps: our ``session.step(x)``; cuDNN's eager step (``lstm(x, (h, c))`` on a copy of x, the
  output copied back); cuDNN's step replayed from a CUDA graph (x copied into the graph's input, replay, output
  copied back);
- *GPU* modes, a chain of ``--chain`` dependent steps (each step's input is the last step's output, as a decoder's
  next token) captured in one CUDA graph, microseconds per step: our ``session.post`` against cuDNN's step.

Writes ``bench/results/<name>.md`` (the table), ``.csv`` and ``.png`` (the host modes' latency histograms).
TF32 off. A model whose weights do not fit on chip as a session says so in its row.
"""

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import torch
import tvm_ffi

import prnn_tvm
from prnn_tvm.bench.baselines import captured
from prnn_tvm.errors import ConfigError

MODELS = [  # layers, hidden, batch, dtype: issue 47's rows
    (2, 128, 1, "float32"),
    (3, 480, 1, "float32"),
    (3, 960, 1, "float16"),
    (3, 960, 1, "float32"),
    (1, 640, 8, "float16"),
]
RESULTS = Path(__file__).parent / "results"


def session_weights(lstm: torch.nn.LSTM) -> dict:
    """A torch.nn.LSTM's parameters by the names a session of ``lstm_d<layers>`` (or ``lstm``) takes."""
    found = {"W_ih": lstm.weight_ih_l0, "b_ih": lstm.bias_ih_l0}
    for k in range(lstm.num_layers):
        prefix = f"l{k}_" if lstm.num_layers > 1 else ""
        names = {"W_hh": "weight_hh", "b_hh": "bias_hh", **({"W_ih": "weight_ih", "b_ih": "bias_ih"} if k else {})}
        found.update({prefix + ours: getattr(lstm, f"{theirs}_l{k}") for ours, theirs in names.items()})
    return {name: p.detach().contiguous() for name, p in found.items()}


def latencies(step, xs) -> np.ndarray:
    """Microseconds of each ``step(x)`` over ``xs`` (after a warm-up of 100)."""
    for x in xs[:100]:
        step(x)
    found = np.empty(len(xs))
    for i, x in enumerate(xs):
        t0 = time.perf_counter()
        step(x)
        found[i] = (time.perf_counter() - t0) * 1e6
    return found


def chain_us(step, chain: int, repeats: int = 5, warm_up: bool = True) -> float:
    """Microseconds per step of ``chain`` dependent calls of ``step()`` replayed from one CUDA graph (best of
    ``repeats``); ``warm_up``: run them on a side stream before the capture (``baselines.captured``)."""
    if warm_up:
        graph, _ = captured(lambda: [step() for _ in range(chain)])
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(chain):
                step()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / chain)
    return best


def measure(layers: int, hidden: int, batch: int, dtype: str, steps: int, chain: int) -> dict:
    torch_dtype = getattr(torch, dtype)
    lstm = torch.nn.LSTM(hidden, hidden, layers).cuda().to(torch_dtype).eval()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, batch, hidden)).astype(dtype)
    row = {
        "model": f"LSTM {layers}x{hidden} B={batch} {dtype}",
        "layers": layers,
        "hidden": hidden,
        "batch": batch,
        "dtype": dtype,
    }
    state = [torch.zeros(layers, batch, hidden, device="cuda", dtype=torch_dtype) for _ in range(2)]

    with torch.no_grad():

        def cudnn_eager(x):
            out, (state[0], state[1]) = lstm(torch.from_numpy(x).cuda()[None], (state[0], state[1]))
            return out.cpu()

        static_x = torch.zeros(1, batch, hidden, device="cuda", dtype=torch_dtype)

        def cudnn_step():
            out, (h, c) = lstm(static_x, (state[0], state[1]))
            state[0].copy_(h)
            state[1].copy_(c)
            static_x.copy_(out)  # the next step's input: a chain of dependent steps
            return out

        replay_graph, replay_out = captured(cudnn_step)

        def cudnn_graph(x):
            static_x.copy_(torch.from_numpy(x)[None])
            replay_graph.replay()
            return replay_out.cpu()

        found = {"cudnn eager": latencies(cudnn_eager, xs), "cudnn graph": latencies(cudnn_graph, xs)}
        row["cudnn chain us"] = chain_us(cudnn_step, chain)

        cell = f"lstm_d{layers}" if layers > 1 else "lstm"
        try:
            layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype)
            weights = session_weights(lstm)
            session = layer.session(**weights, release_after=None)
        except ConfigError as err:
            row["ours"] = f"not built: {err}"
            return row, found
        try:
            found["ours host"] = latencies(session.step, xs)
            x = torch.zeros(batch, hidden, device="cuda", dtype=torch_dtype)
            out = torch.empty(len(session.state_names), batch, hidden, device="cuda", dtype=torch_dtype)
            k = session.output_index

            def ours_step():
                with tvm_ffi.use_raw_stream(session.device, torch.cuda.current_stream().cuda_stream):
                    session.post(x, out)
                x.copy_(out[k])  # the next step's input
                return out

            def ours_gpu(_x):
                ours_step()
                torch.cuda.current_stream().synchronize()

            found["ours gpu eager"] = latencies(ours_gpu, xs)
            row["ours"] = session.kernels.report
            try:  # torch's capture synchronizes the device: released first, relaunched inside the capture
                session.release()
                row["ours chain us"] = chain_us(ours_step, chain, warm_up=False)
            except Exception as err:  # noqa: BLE001 - reported in the table
                row["ours"] += f"; chain not measured: {err}"
        finally:
            session.close()
    return row, found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--chain", type=int, default=100)
    p.add_argument("--name", default="session-h100")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    rows, histograms = [], {}
    for model in MODELS:
        try:
            row, found = measure(*model, args.steps, args.chain)
        except Exception as err:  # noqa: BLE001 - one model's failure is a row of the table, not the end of the run
            print(f"{model}: {type(err).__name__}: {err}", flush=True)
            continue
        for name, values in found.items():
            row[f"{name} p50"], row[f"{name} p99"] = np.percentile(values, 50), np.percentile(values, 99)
        rows.append(row)
        histograms[row["model"]] = found
        print(row, flush=True)
    write(rows, histograms, args)


def write(rows: list, histograms: dict, args) -> None:
    RESULTS.mkdir(exist_ok=True)
    names = sorted(
        {k for r in rows for k in r}, key=lambda k: (k not in ("model", "layers", "hidden", "batch", "dtype"), k)
    )
    with open(RESULTS / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, names)
        w.writeheader()
        w.writerows(rows)
    device = torch.cuda.get_device_name()
    lines = [
        f"# One timestep per call: resident sessions against cuDNN ({device}, {time.strftime('%Y-%m-%d')})",
        "",
        f"`python bench/session.py --steps {args.steps} --chain {args.chain} --name {args.name}`. Host modes: "
        "microseconds from writing the step's input (NumPy) to reading its output, p50 / p99 over "
        f"{args.steps} steps. Chain: a CUDA graph of {args.chain} dependent steps, us per step.",
        "",
        "| model | ours host | cuDNN eager | cuDNN graph | ours GPU eager | ours chain | cuDNN chain | "
        "cuDNN graph / ours host (p50) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def pair(r, name):
        return f"{r[name + ' p50']:.1f} / {r[name + ' p99']:.1f}" if name + " p50" in r else "—"

    for r in rows:
        if "ours host p50" not in r:
            lines.append(
                f"| {r['model']} | {r['ours']} | {pair(r, 'cudnn eager')} | {pair(r, 'cudnn graph')} | — | "
                f"— | {r['cudnn chain us']:.2f} | — |"
            )
            continue
        ours_chain = f"{r['ours chain us']:.2f}" if "ours chain us" in r else "—"
        lines.append(
            f"| {r['model']} | {pair(r, 'ours host')} | {pair(r, 'cudnn eager')} | {pair(r, 'cudnn graph')} "
            f"| {pair(r, 'ours gpu eager')} | {ours_chain} | {r['cudnn chain us']:.2f} | "
            f"{r['cudnn graph p50'] / r['ours host p50']:.2f}x |"
        )
    lines += ["", "Session kernels:", ""] + [f"- {r['model']}: {r['ours']}" for r in rows]
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(histograms), 1, figsize=(8, 2.2 * len(histograms)), squeeze=False)
    for ax, (model, found) in zip(axes[:, 0], histograms.items()):
        for name in ("ours host", "cudnn eager", "cudnn graph"):
            if name in found:
                values = found[name]
                ax.hist(values, bins=np.logspace(0, 3.5, 120), alpha=0.6, label=name)
        ax.set_xscale("log")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("microseconds per step, host to host")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=110)


if __name__ == "__main__":
    main()

"""A model holding a prnn-tvm LSTM (Linear, tanh, LSTM, Linear), eager against ``torch.compile(fullgraph=True)``
(the LSTM recorded as the operator ``prnn_tvm::layers``), warm calls under ``torch.no_grad()``, on the CPU or GPU.

    python bench/compiled.py [--device cpu --hidden 64 --batch 4 --seq 16 --layers 1 --backends eager,inductor]
                             [--threads 1]

The callers are timed in alternating rounds of ``--calls`` calls each (a shared machine's load falls on all); each
figure is the best and the median round, microseconds per call: on the CPU this thread's CPU time (another
process's load on a shared machine does not count), on the GPU wall time. ``compiled(eager)`` is Dynamo's graph
run as it is, ``compiled(inductor)`` the default backend. ``--threads N``: torch's and TVM's CPU thread pools of N
threads (default: theirs, a thread per core). On a loaded machine a pool's threads spin waiting for each other, and
that spinning is this thread's CPU time too: a tiny GEMM took 33-62 us with torch's two threads and 4.5 us with one
(2 cores shared by other processes); one thread each measures the host's own work.
"""

import argparse
import os
import statistics
import time

import torch

import prnn_tvm.torch as pt

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", default="cpu")
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--layers", type=int, default=1)
parser.add_argument("--calls", type=int, default=200)
parser.add_argument("--rounds", type=int, default=15)
parser.add_argument("--backends", default="eager,inductor", help="torch.compile backends, comma-separated")
parser.add_argument("--threads", type=int, help="torch's and TVM's CPU threads (default: theirs)")
args = parser.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # read when TVM's pool starts, at the first CPU launch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(16, args.hidden)
        self.rnn = pt.LSTM(args.hidden, args.hidden, num_layers=args.layers)
        self.head = torch.nn.Linear(args.hidden, 2)

    def forward(self, x):
        return self.head(self.rnn(torch.tanh(self.embed(x)))[0])


model = Model().to(args.device).eval()
x = torch.randn(args.seq, args.batch, 16, device=args.device)
callers = {"eager": model}
for backend in args.backends.split(","):
    callers[f"compiled({backend})"] = torch.compile(model, fullgraph=True, backend=backend)
clock = time.thread_time if args.device == "cpu" else time.perf_counter


def round_us(call) -> float:
    if args.device == "cuda":
        torch.cuda.synchronize()
    start = clock()
    for _ in range(args.calls):
        call(x)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) / args.calls * 1e6


with torch.no_grad():
    want = model(x)
    for name, call in callers.items():  # warm: compiled, checked
        for _ in range(20):
            got = call(x)
        assert (got - want).abs().max() < 1e-4, name
    rounds = {name: [] for name in callers}
    for _ in range(args.rounds):
        for name, call in callers.items():
            rounds[name].append(round_us(call))
threads = f", {args.threads} CPU threads" if args.threads else ""
print(f"H={args.hidden} B={args.batch} T={args.seq} layers={args.layers} on {args.device}{threads}, us per call:")
for name, times in rounds.items():
    print(f"  {name:20s} best {min(times):8.1f}  median {statistics.median(times):8.1f}")

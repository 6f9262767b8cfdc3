"""Train a small character-level LSTM on this repository's README, twice from the same initialization:
once with ``torch.nn.LSTM``, once with ``prnn_tvm.torch.LSTM`` sharing nothing but the initial weights,
and print both loss curves side by side (CPU, float32).

    python examples/char_lstm.py [--steps 200 --hidden 64 --batch 8 --seq 32]

prnn-tvm's forward is the compiled CPU build and its backward the one the compiler derives from
the cell's plan; the two curves agree to float32 rounding (the script exits with status 1 if they
differ by more than --tolerance anywhere).
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

import prnn_tvm.torch as pt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--tolerance", type=float, default=1e-3, help="largest allowed loss difference")
args = p.parse_args()

text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
vocab = sorted(set(text))
data = torch.tensor([vocab.index(ch) for ch in text])


class CharModel(torch.nn.Module):
    def __init__(self, rnn: torch.nn.Module):
        super().__init__()
        self.embed = torch.nn.Embedding(len(vocab), args.hidden)
        self.rnn = rnn
        self.head = torch.nn.Linear(args.hidden, len(vocab))

    def forward(self, x):  # x (T, B) of character ids
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


torch.manual_seed(0)
reference = CharModel(torch.nn.LSTM(args.hidden, args.hidden))
ours = copy.deepcopy(reference)
ours.rnn = pt.from_torch(ours.rnn)  # the deep copy's parameters, now run by prnn-tvm

batches = torch.Generator().manual_seed(1)
starts = [torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=batches) for _ in range(args.steps)]
curves, seconds = {}, {}
for name, model in (("torch.nn.LSTM", reference), ("prnn_tvm.torch.LSTM", ours)):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        window = torch.stack([data[s:s + args.seq + 1] for s in starts[step]], dim=1)  # (T + 1, B)
        logits = model(window[:-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, len(vocab)), window[1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    curves[name], seconds[name] = losses, time.perf_counter() - start

diff = max(abs(a - b) for a, b in zip(*curves.values()))
print(f"# char LSTM on README.md: vocab {len(vocab)}, hidden {args.hidden}, batch {args.batch}, T {args.seq}, "
      f"{args.steps} Adam steps, CPU float32\n")
print("| step | torch.nn.LSTM loss | prnn_tvm.torch.LSTM loss |\n|---|---|---|")
for step in sorted({0, *range(args.steps // 10 - 1, args.steps, args.steps // 10)}):
    print(f"| {step + 1} | {curves['torch.nn.LSTM'][step]:.4f} | {curves['prnn_tvm.torch.LSTM'][step]:.4f} |")
print(f"\nlargest difference over all steps: {diff:.2e} (tolerance {args.tolerance:.0e}); "
      + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
sys.exit(0 if diff <= args.tolerance else 1)

"""What the training examples share: a character model on this repository's README, trained by two
recurrent layers from one initialization and compared loss for loss (float32, on the CPU or with
``--device cuda`` on the GPU).

    charmodel.compare(description, {name: CharModel(rnn, hidden), ...}, args)  # exits 1 if they differ
"""

import argparse
import sys
import time
from pathlib import Path

import torch

TEXT = (Path(__file__).resolve().parent.parent / "README.md").read_text()
VOCAB = sorted(set(TEXT))
DATA = torch.tensor([VOCAB.index(ch) for ch in TEXT])


def arguments(doc: str, steps: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--tolerance", type=float, default=1e-3, help="largest allowed loss difference")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the GPU's training kernels (TF32 off)")
    return p.parse_args()


class CharModel(torch.nn.Module):
    """Embedding, a recurrent layer, a linear head over the vocabulary."""

    def __init__(self, rnn: torch.nn.Module, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(len(VOCAB), hidden)
        self.rnn = rnn
        self.head = torch.nn.Linear(hidden, len(VOCAB))

    def forward(self, x):  # x (T, B) of character ids
        out, _ = self.rnn(self.embed(x))
        return self.head(out)


def compare(description: str, models: dict, args) -> None:
    """Train each of ``models`` (name: a CharModel, all from one initialization) on the same batches with Adam,
    print the loss curves side by side, and exit with status 1 when one differs from the first by more than
    ``args.tolerance`` at any step."""
    batches = torch.Generator().manual_seed(1)
    starts = [torch.randint(0, len(DATA) - args.seq - 1, (args.batch,), generator=batches) for _ in range(args.steps)]
    curves, seconds = {}, {}
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 on both sides
    for name, model in models.items():
        model.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses, start = [], time.perf_counter()
        for step in range(args.steps):
            window = torch.stack([DATA[s:s + args.seq + 1] for s in starts[step]], dim=1).to(device)  # (T + 1, B)
            loss = torch.nn.functional.cross_entropy(model(window[:-1]).reshape(-1, len(VOCAB)),
                                                     window[1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves[name], seconds[name] = losses, time.perf_counter() - start
    names = list(curves)
    diff = max(abs(a - b) for curve in curves.values() for a, b in zip(curve, curves[names[0]]))
    print(f"# {description} on README.md: vocab {len(VOCAB)}, hidden {args.hidden}, batch {args.batch}, "
          f"T {args.seq}, {args.steps} Adam steps, {device.type} float32\n")
    print("| step | " + " | ".join(f"{n} loss" for n in names) + " |\n|---|" + "---|" * len(names))
    every = max(1, args.steps // 10)
    for step in sorted({0, *range(every - 1, args.steps, every)}):
        print(f"| {step + 1} | " + " | ".join(f"{curves[n][step]:.4f}" for n in names) + " |")
    print(f"\nlargest difference over all steps: {diff:.2e} (tolerance {args.tolerance:.0e}); "
          + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    if diff > args.tolerance:
        sys.exit(1)

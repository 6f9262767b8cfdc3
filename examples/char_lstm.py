"""Train a small character-level LSTM on this repository's README, twice from the same initialization:
once with ``torch.nn.LSTM``, once with ``prnn_tvm.torch.LSTM`` sharing nothing but the initial weights,
and print both loss curves side by side (float32).

    python examples/char_lstm.py [--steps 200 --hidden 64 --batch 8 --seq 32 --device cpu|cuda]

On the CPU prnn-tvm's forward is the compiled CPU build and its backward the one the compiler
derives from the cell's plan; on the GPU (``--device cuda``, against cuDNN) the training kernels:
the persistent forward that saves each step, the persistent backward. The two curves agree to
float32 rounding (the script exits with status 1 if they differ by more than --tolerance anywhere).
"""

import copy

import torch
from charmodel import CharModel, arguments, compare

import prnn_tvm.torch as pt

args = arguments(__doc__, steps=200)
torch.manual_seed(0)
reference = CharModel(torch.nn.LSTM(args.hidden, args.hidden), args.hidden)
ours = copy.deepcopy(reference)
ours.rnn = pt.from_torch(ours.rnn)  # the deep copy's parameters, now run by prnn-tvm
compare("char LSTM", {"torch.nn.LSTM": reference, "prnn_tvm.torch.LSTM": ours}, args)

"""Packed sequences (unsorted lengths, a full-length and a length-1 row) through the public calls:
``prnn_tvm.torch.from_torch(lstm)(packed)`` against ``lstm(packed)`` (cuDNN), and the same modules
on the padded batch, on the GPU (TF32 off).

    python bench/packed.py [--seq 256]

Each figure is the median of CUDA-event runs in one process
(``prnn_tvm.bench.baselines.cuda_event_times``); the outputs (unpacked) and final states are
checked against cuDNN's first.
"""

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import prnn_tvm.torch as pt
from prnn_tvm.bench import baselines
from prnn_tvm.checks import max_error

# (layers, bidirectional, hidden, batch, dtype): issue 16's cases, and a half one
CASES = [
    (1, False, 1024, 4, torch.float32),
    (2, False, 1024, 4, torch.float32),
    (1, True, 512, 4, torch.float32),
    (2, True, 512, 8, torch.float32),
    (1, True, 512, 8, torch.float16),
]

args = baselines.script_arguments(number=20)
T = args.seq


def ms(module, sequence) -> float:
    """Median milliseconds of ``module(sequence)``."""
    return baselines.cuda_event_times(lambda: module(sequence), args.repeats, args.number)[0] * 1e3


print("case | packed: prnn-tvm ms, cuDNN ms, speedup | padded: prnn-tvm ms, cuDNN ms, speedup | max abs err")
for layers, bidirectional, H, B, dtype in CASES:
    ref = torch.nn.LSTM(H, H, num_layers=layers, bidirectional=bidirectional).cuda().to(dtype).eval()
    fast = pt.from_torch(ref)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(1))
    lengths[0], lengths[-1] = T, 1
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        (got, got_h), (want, want_h) = fast(packed), ref(packed)
        err = max_error([(pad_packed_sequence(got)[0], pad_packed_sequence(want)[0]), *zip(got_h, want_h)])
        ours, cudnn = ms(fast, packed), ms(ref, packed)
        ours_padded, cudnn_padded = ms(fast, x), ms(ref, x)
    name = f"LSTM x{layers}{' bidirectional' if bidirectional else ''} H={H} B={B} {str(dtype)[6:]} T={T}"
    print(
        f"{name} | {ours:.3f}, {cudnn:.3f}, {cudnn / ours:.2f}x | {ours_padded:.3f}, {cudnn_padded:.3f}, "
        f"{cudnn_padded / ours_padded:.2f}x | {err:.1e}",
        flush=True,
    )

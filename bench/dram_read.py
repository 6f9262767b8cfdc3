"""How fast the GPU reads its DRAM: torch's sum over a 4 GiB float16 tensor (far past L2), the best and the median
of 10 CUDA-event timings, in TB/s. The floor of a kernel that streams weights from DRAM every step (the weight
tiers' last one) is its bytes per step over this rate.

    python bench/dram_read.py
"""

import torch

x = torch.empty(1 << 31, dtype=torch.float16, device="cuda").normal_()
for _ in range(3):
    x.sum()
torch.cuda.synchronize()
times = []
for _ in range(10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    x.sum()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
nbytes = x.numel() * x.element_size()
print(
    f"DRAM read, torch sum over {nbytes / 1e9:.2f} GB fp16 on {torch.cuda.get_device_name()}: "
    f"best {nbytes / min(times) / 1e12:.2f} TB/s, median {nbytes / sorted(times)[5] / 1e12:.2f} TB/s"
)

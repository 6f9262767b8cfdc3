"""The third weight tier on a real GPU (``pytest -m gpu``): layers past registers and shared memory together, part of
each CTA's weights read from global memory (L2) every step, against the float64 NumPy reference, with and without the
L2 persistence window; ``from_torch`` of such a layer runs prnn-tvm's kernel, not torch.nn's. The same kernels run on
the host in ``tests/test_streamed_weights.py``."""

import pytest

import prnn_tvm
from prnn_tvm.dtypes import tolerance
from prnn_tvm.reference import random_lengths
from prnn_tvm.runtime import l2
from prnn_tvm.schedules.persistent_config import PersistentConfig
from prnn_tvm.target import gpu_spec

from .test_gpu_half import errors_against_float64
from .test_gpu_numerics import run_and_compare

pytestmark = pytest.mark.gpu
SEQ = 64


@pytest.mark.parametrize("batch", [4, 16])
def test_lstm_2048_streams_and_matches_reference(batch):
    layer = prnn_tvm.compile_cell("lstm", 2048, batch, target="cuda", tuning_logs=[])
    report = layer.report
    assert report.spill_bytes == 0 and report.weight_l2_bytes > 0, report.format()
    err = run_and_compare(layer, SEQ, seed=2048, lengths=random_lengths(batch, SEQ, seed=batch))
    assert err <= tolerance("float32", SEQ), f"max abs error {err:.2e}\n{report.format()}"


@pytest.mark.parametrize("smem_chunks, l2_chunks", [(0, 1), (3, 2), (0, 8)])  # 8: every chunk streamed
def test_forced_streaming(smem_chunks, l2_chunks):
    """Hidden 256, batch 5, CTAs of 6 units (a partial last one), k_split 8 x vec 4: 8 chunks per lane's row."""
    cfg = PersistentConfig(6, 8, 3, 3, 4, smem_chunks=smem_chunks, l2_chunks=l2_chunks)
    layer = prnn_tvm.compile_cell("lstm", 256, 5, target="cuda", arch=gpu_spec().arch, config=cfg)
    assert layer.report.weight_l2_bytes > 0
    assert run_and_compare(layer, 33) <= tolerance("float32", 33), layer.report.format()


def test_with_the_window_same_numbers():
    """The L2 persistence window (off by default) changes where lines live, never a value."""
    layer = prnn_tvm.compile_cell("lstm", 2048, 4, target="cuda", tuning_logs=[])
    l2.use_window(True)
    try:
        err = run_and_compare(layer, 16, seed=3)
    finally:
        l2.use_window(False)
    assert err <= tolerance("float32", 16)


@pytest.mark.parametrize("hidden, dtype", [(2048, "float32"), (4096, "float16")])  # fp16: the tensor cores' tier
def test_from_torch_lstm_past_the_chip_runs_our_kernel(hidden, dtype):
    """``from_torch(nn.LSTM(2048, 2048))`` in float32, ``nn.LSTM(4096, 4096).half()``: our kernel with the streamed
    tier (no torch.nn fallback) for inference, error against float64 at most 1.5x cuDNN's own (or the bound)."""
    torch = pytest.importorskip("torch")
    import prnn_tvm.torch as pt

    made = []

    def convert(module):
        made.append(pt.from_torch(module))
        return made[-1]

    T = 32
    ours, cudnn = errors_against_float64(torch.nn.LSTM, hidden, hidden, T, 4, dtype, convert)
    assert ours <= max(1.5 * cudnn, tolerance(dtype, T)), f"ours {ours:.2e}, cuDNN {cudnn:.2e}"
    assert made and not made[0].fallback_notes, made[0].fallback_notes

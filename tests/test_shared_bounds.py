"""Shared memory from the kernel's own TIR (``prnn_tvm.verify.bounds``): every access of every thread, at every step
of a short sequence, inside the buffer it names, and the buffers inside what the launch allocates; for each
template, the training forward and the GPU backward. No figure of a template's geometry enters the check: it is
what the kernel does against what it declares and what the runtime launches it with."""

import pytest
from tvm.script import tirx as T

import prnn_tvm
from prnn_tvm.errors import PrnnError
from prnn_tvm.schedules import gpu_backward, saving_forward
from prnn_tvm.signature import Grid
from prnn_tvm.target import gpu_spec
from prnn_tvm.verify import bounds

from .two_state_cell import TWO_STATE

CUDA = dict(target="cuda", arch="sm_90", tuning_logs=[])


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, options",
    [
        (
            "lstm",
            10,
            3,
            "float32",
            {"config": dict(units_per_cta=4, k_split=4, rows_per_thread=3, batch_tile=2, vec=2)},
        ),
        ("gru_cho", 64, 8, "float32", {}),
        (TWO_STATE, 33, 5, "float32", {}),
        ("lstm", 512, 4, "float32", {}),
        ("lstm", 24, 3, "float32", {"layers": 3}),
        ("gru", 40, 2, "float32", {"bidirectional": True}),
        ("lstm", 64, 8, "float16", {}),
        ("gru", 256, 16, "bfloat16", {}),
        ("lstm", 128, 24, "float16", {"layers": 2}),
        ("rnn_tanh", 96, 16, "float16", {"bidirectional": True}),
        ("lstm", 64, 3, "float16", {}),  # operand tiles of the batch's 3 rows, not the pass's 8
        ("gru", 48, 12, "float16", {"config": dict(units_per_cta=16, k_groups=1, n_tiles=2)}),  # 12 rows of 16
        ("lstm_d3", 40, 1, "float16", {}),  # a deep stack at batch 1: five operand tiles of one row
    ],
)
def test_every_shared_access_is_inside_what_the_launch_allocates(cell, hidden, batch, dtype, options):
    layer = prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, **CUDA, **options)
    uses = bounds.shared_uses(layer.kernel.func)
    assert uses and all(use.end is not None for use in uses)  # the kernel's shared memory, and accesses to it
    assert bounds.launch_problems(layer.kernel.func, layer.kernel.launch.grid) == [], layer.report.format()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_training_forward_and_the_gpu_backward_stay_inside_their_shared_memory(dtype):
    layer = prnn_tvm.compile_cell("lstm", 48, 4, dtype=dtype, **CUDA)
    save = saving_forward(layer.plan, layer.target, layer.gpu, layer.kernel.config)
    backward = next(iter(gpu_backward(layer.plan, gpu_spec("sm_90"))))
    for kernel in (save, backward):
        assert bounds.launch_problems(kernel.func, kernel.launch.grid) == [], kernel.launch.function


def test_an_access_past_a_buffer_and_a_launch_short_of_the_buffers_are_problems():
    @T.prim_func
    def kernel(out: T.Buffer((8,), "float32")):
        bx = T.launch_thread("blockIdx.x", 2)
        tx = T.launch_thread("threadIdx.x", 32)
        smem = T.alloc_buffer((40,), scope="shared.dyn")
        if tx < 24 or bx == 1:
            smem[tx + 8] = T.float32(0)  # block 1's threads 24..31 reach element 39: inside
        if tx < 8:
            out[tx] = smem[tx * 5 + 5]  # element 40: one past the end

    found = bounds.launch_problems(kernel, Grid(2, 32, 120, True))
    assert len(found) == 2, found
    assert "is 160 bytes and accessed up to byte 164" in found[0]
    assert "declares 160 bytes of dynamic shared memory, the launch allocates 120" in found[1]
    (use,) = bounds.shared_uses(kernel)
    assert (use.declared, use.lowest, use.end) == (160, 20, 164)  # element 5 (thread 0's load) to 40 (its end)


def test_an_index_that_reads_data_is_refused_not_guessed():
    @T.prim_func
    def kernel(where: T.Buffer((1,), "int32")):
        tx = T.launch_thread("threadIdx.x", 32)
        smem = T.alloc_buffer((32,), scope="shared.dyn")
        smem[where[0] + tx] = T.float32(0)

    with pytest.raises(PrnnError, match="reads data"):
        bounds.shared_uses(kernel)

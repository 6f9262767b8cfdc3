"""The training step's breakdown (``prnn_tvm.bench.training_parts``, ``bench/training_parts.py``): the kinds it
gives kernels' names and its tables need no GPU; on the GPU, the profiled step's kernels come back with the part
that launched them."""

import pytest

from prnn_tvm.bench import training_parts as tp


@pytest.mark.parametrize(
    "name, kind",
    [
        ("recurrent_save_kernel", "prnn forward (saving)"),
        ("recurrent_backward_kernel", "prnn backward (recurrent)"),
        ("RNN_blockPersist_bp_LSTM<__half, __half, float, 128>", "cuDNN RNN"),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "GEMM"),
        ("nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "GEMM"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
        ("Memcpy DtoD (Device -> Device)", "copy / set"),
        ("some_kernel", "other"),
    ],
)
def test_kernels_are_given_their_kind(name, kind):
    assert tp.kind_of(name) == kind


def test_the_tables_add_up_per_step():
    records = [
        ("backward", "recurrent_backward_kernel", 3000.0),
        ("backward", "sm90_xmma_gemm_a", 400.0),
        ("backward", "sm90_xmma_gemm_b", 200.0),
        ("forward", "recurrent_save_kernel", 1400.0),
    ]
    lines = tp.kernel_table(records, steps=2)
    assert lines[1].split()[:3] == ["backward", "1500.0", "60.0%"]  # largest first: 3000 us over 2 steps
    assert lines[-1].split()[-1] == "2500.0"  # every kernel, per step
    kinds = tp.category_table(records, steps=2)
    assert kinds[0].split()[0] == "backward" and "1500.0" in kinds[0]
    assert any(line.startswith("backward") and "GEMM" in line and " 300.0 " in line for line in kinds)


def test_the_floor_puts_the_saving_forward_beside_the_inference_one():
    records = [
        ("backward", "recurrent_backward_kernel", 2560.0),
        ("backward", "nvjet_sm90_hsh_a", 300.0),
        ("forward", "recurrent_save_kernel", 1280.0),
        (tp.UNLAUNCHED, tp.RANGE + "forward", 2000.0),  # the profiler's range of a part, not a kernel
    ]
    inference = {"recurrent_kernel": 448.0, "nvjet_sm90_hsh_b": 100.0}  # per call
    lines = tp.floor_lines(records, 2, inference, seq=64)
    assert "saving forward 10.00 us, inference forward 7.00 us" in lines[0] and "backward 20.00 us" in lines[0]
    assert "every other kernel of a training step (GEMMs, elementwise, copies): 150.0 us" in lines[1]


@pytest.mark.gpu
def test_the_forward_without_gradients_runs_the_inference_kernel():
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import case

    ref, x, hx = case("LSTM", 128, 16, torch.float16, 32)
    kinds = {tp.kind_of(name) for name in tp.inference_kernels(pt.from_torch(ref), x, hx, calls=2)}
    assert "prnn recurrent" in kinds and "prnn forward (saving)" not in kinds, kinds


@pytest.mark.gpu
def test_a_profiled_step_names_the_parts_that_launch_the_kernels():
    import torch

    import prnn_tvm.torch as pt
    from prnn_tvm.bench.training_step import PARTS, case

    ref, x, hx = case("LSTM", 128, 16, torch.float16, 32)
    fast = pt.from_torch(ref)
    records = tp.kernel_records(fast, x, hx, steps=2)
    parts = {name: part for part, name, _ in records}
    assert parts.get("recurrent_save_kernel") == "forward" and parts.get("recurrent_backward_kernel") == "backward"
    times = tp.part_times(fast, x, hx, steps=3)
    assert set(times) == {*PARTS, "step"} and all(gpu >= 0 and host > 0 for gpu, host in times.values())
    assert times["step"][0] >= times["backward"][0]

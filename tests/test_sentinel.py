"""The ``sentinel`` exchange (``prnn_tvm.codegen.barrier``), without a GPU: what its kernels hold, where it
is refused, what the tuner and the training forward make of it. On the GPU: ``test_gpu_sentinel.py``."""

import dataclasses
import re

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.codegen.barrier import BARRIERS, polled_loads
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import template_for
from prnn_tvm.target import gpu_spec
from prnn_tvm.tune.space import ConfigSpace

SM90 = gpu_spec("sm_90")


def sentinel_layer(cell, hidden, batch, dtype, barrier="sentinel", **knobs):
    """A layer with the sentinel exchange (or ``barrier``): the given tensor-core knobs, or (float32) the
    default config's."""
    if dtype == "float32":
        plan = prnn_tvm.analyze(prnn_tvm.resolve(cell), batch, hidden)
        config = dataclasses.replace(pc.default_config(plan, SM90), barrier=barrier)
    else:
        config = {"k_groups": 1, "n_tiles": 1, **knobs, "barrier": barrier}
    return prnn_tvm.compile_cell(cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", config=config)


@pytest.mark.parametrize("cell, hidden, batch, dtype, knobs, load", [
    ("lstm", 256, 16, "float16", {"units_per_cta": 16, "k_groups": 4, "n_tiles": 2}, "half, 1, 16, 256, "),
    ("gru", 133, 11, "bfloat16", {"units_per_cta": 8}, "nv_bfloat16, 17, 2, 133, "),  # odd: 2-byte loads
    ("rnn_tanh", 1, 1, "float16", {"units_per_cta": 1}, "half, 1, 2, 1, "),
    ("lstm", 256, 4, "float32", {}, "float, 1, 16, 256, ")])
def test_a_sentinel_kernel_exchanges_through_its_output_sequence(cell, hidden, batch, dtype, knobs, load):
    """Before the first step every thread fills the output slots it will write, then one grid barrier; each
    step polls step t - 1's outputs (16-byte loads where a row allows) and publishes through the output; no
    tagged word, no barrier between steps; ``out`` not ``__restrict__`` (other blocks write it); no spills."""
    layer = sentinel_layer(cell, hidden, batch, dtype, **knobs)
    source = layer.cuda_source
    kernel = source[source.index("recurrent_kernel(", source.index("extern \"C\" __global__ void __launch_bounds__")
                                 + 1):]
    assert "prnn_sentinel_fill<" in kernel and "prnn_sentinel_store<" in kernel
    assert f"prnn_sentinel_copy<{load}" in kernel
    assert re.search(r"prnn_sentinel_copy<[^>]*>\(\(&\(out_ptr\[", kernel)  # polls the output sequence
    assert kernel.count("prnn_barrier_counter(") == 1 and "prnn_tag_" not in kernel
    assert re.search(r"\b(half|nv_bfloat16|float)\* out_ptr", source)  # no __restrict__
    assert layer.report.spill_bytes == 0, layer.report.format()


@pytest.mark.parametrize("cell, layers, bidirectional, why", [
    ("gru_cho", 1, False, "exchanges a stage within each step"),
    ("indrnn", 1, False, "its exchanged states are not its output"),
    ("lstm", 2, False, "runs parts"),
    ("lstm", 1, True, "runs parts")])
def test_sentinel_is_refused_where_the_output_is_not_the_exchange(cell, layers, bidirectional, why):
    with pytest.raises(ConfigError, match=f"barrier 'sentinel' exchanges each step's state through the output "
                                          f"sequence, and cell .* {why}"):
        prnn_tvm.compile_cell(cell, 64, 4, dtype="float16", target="cuda", arch="sm_90", layers=layers,
                              bidirectional=bidirectional, config={"units_per_cta": 4, "k_groups": 1,
                                                                   "n_tiles": 1, "barrier": "sentinel"})


def test_the_tuner_offers_sentinel_only_where_it_applies():
    def barriers(cell, layers=1):
        plan = prnn_tvm.analyze(prnn_tvm.resolve(cell) if layers == 1 else
                                prnn_tvm.frontend.stack.stacked(prnn_tvm.resolve(cell), layers), 8, 256, "float16")
        return {c.barrier for c in ConfigSpace(plan, SM90, template_for(plan, SM90.target())).configs}

    assert "sentinel" in barriers("lstm") and "sentinel" not in barriers("gru_cho")
    assert "sentinel" not in barriers("lstm", layers=2)


@pytest.mark.parametrize("knobs, cfg", [
    (mc, mc.MmaConfig(16, 2, 1, "sentinel")),
    (pc, None)])
def test_the_training_forward_exchanges_through_a_barrier(knobs, cfg):
    """``recurrent_save`` keeps the workspace exchange between barriers it was verified with: a layer built
    with ``sentinel`` trains with ``counter``, the rest of its config the same."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 8, 256, "float16" if knobs is mc else "float32")
    if cfg is None:
        cfg = dataclasses.replace(pc.default_config(plan, SM90), barrier="sentinel")
    assert knobs.saving_config(cfg, plan, SM90) == dataclasses.replace(cfg, barrier="counter")


def test_a_sentinel_poll_holds_fewer_registers_than_a_tagged_one():
    """A 16-byte load holds eight half values where a tagged one holds two: a quarter of the loads."""
    sentinel = polled_loads(BARRIERS["sentinel"], 16 * 256, 512, 256, 2)
    tags = polled_loads(BARRIERS["tags"], 16 * 256, 512, 256, 2)
    assert sentinel == (1, 6) and tags == (4, 6)
    assert polled_loads(BARRIERS["counter"], 16 * 256, 512, 256, 2) == (0, 0)


def test_the_benchmark_gives_a_sentinel_kernel_no_barrier_floor():
    """A ``sentinel`` kernel crosses no barrier per step: the benchmark's floor (barrier + FLOPs) does not
    apply, and the barrier probe (which refuses ``sentinel``) is never built for it."""
    from prnn_tvm.bench.measure import barrier_seconds_per_step

    probes = {}
    layer = sentinel_layer("lstm", 256, 8, "float16", units_per_cta=16, k_groups=2)
    assert barrier_seconds_per_step(layer, probes) is None and probes == {}

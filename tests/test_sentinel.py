"""The ``sentinel`` exchange (``prnn_tvm.codegen.barriers.sentinel``), without a GPU: what its kernels hold, where it
is refused, what the tuner and the training forward make of it. On the GPU: ``test_gpu_sentinel.py``."""

import dataclasses
import re

import pytest

import prnn_tvm
from prnn_tvm import ConfigError
from prnn_tvm.codegen.barriers import BARRIERS
from prnn_tvm.codegen.barriers.sentinel import SOURCES as SENTINEL_SOURCES
from prnn_tvm.schedules import persistent_config as pc
from prnn_tvm.schedules import persistent_mma_config as mc
from prnn_tvm.schedules import template_for
from prnn_tvm.signature import SEQ, Arg, ArgRole
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


@pytest.mark.parametrize(
    "cell, hidden, batch, dtype, knobs, load",
    [
        ("lstm", 256, 16, "float16", {"units_per_cta": 16, "k_groups": 4, "n_tiles": 2}, "half, 1, 16, 256, "),
        ("gru", 133, 11, "bfloat16", {"units_per_cta": 8}, "nv_bfloat16, 17, 2, 133, "),  # odd: 2-byte loads
        ("rnn_tanh", 1, 1, "float16", {"units_per_cta": 1}, "half, 1, 2, 1, "),
        ("lstm", 256, 4, "float32", {}, "float, 1, 16, 256, "),
    ],
)
def test_a_sentinel_kernel_exchanges_through_its_output_sequence(cell, hidden, batch, dtype, knobs, load):
    """Before the first step every thread fills the output slots it will write, then one grid barrier; each
    step polls step t - 1's outputs (16-byte loads where a row allows) and publishes through the output; no
    tagged word, no barrier between steps; ``out`` not ``__restrict__`` (other blocks write it); no spills."""
    layer = sentinel_layer(cell, hidden, batch, dtype, **knobs)
    source = layer.cuda_source
    kernel = source[
        source.index("recurrent_kernel(", source.index('extern "C" __global__ void __launch_bounds__') + 1) :
    ]
    assert "prnn_sentinel_fill<" in kernel and "prnn_sentinel_store<" in kernel
    assert f"prnn_sentinel_copy<{load}" in kernel
    assert re.search(r"prnn_sentinel_copy<[^>]*>\(\(&\(out_ptr\[", kernel)  # polls the output sequence
    assert kernel.count("prnn_barrier_counter(") == 1 and "prnn_tag_" not in kernel
    assert re.search(r"\b(half|nv_bfloat16|float)\* out_ptr", source)  # no __restrict__
    assert layer.report.spill_bytes == 0, layer.report.format()


@pytest.mark.parametrize(
    "cell, layers, bidirectional, why",
    [
        ("gru_cho", 1, False, "exchanges a stage within each step"),
        ("indrnn", 1, False, "its exchanged states are not its output"),
        ("gru_cho", 2, False, "exchanges a stage within each step"),
        ("lstm", 1, True, "runs both directions in one launch"),
    ],
)
def test_sentinel_is_refused_where_the_output_is_not_the_exchange(cell, layers, bidirectional, why):
    with pytest.raises(
        ConfigError,
        match=f"barrier 'sentinel' exchanges each step's state through the output sequence, and cell .* {why}",
    ):
        prnn_tvm.compile_cell(
            cell,
            64,
            4,
            dtype="float16",
            target="cuda",
            arch="sm_90",
            layers=layers,
            bidirectional=bidirectional,
            config={"units_per_cta": 4, "k_groups": 1, "n_tiles": 1, "barrier": "sentinel"},
        )


def test_the_tuner_offers_sentinel_only_where_it_applies():
    def barriers(cell, layers=1):
        plan = prnn_tvm.analyze(
            prnn_tvm.resolve(cell) if layers == 1 else prnn_tvm.frontend.stack.stacked(prnn_tvm.resolve(cell), layers),
            8,
            256,
            "float16",
        )
        return {c.barrier for c in ConfigSpace(plan, SM90, template_for(plan, SM90.target())).configs}

    assert "sentinel" in barriers("lstm") and "sentinel" not in barriers("gru_cho")
    assert "sentinel" in barriers("lstm", layers=2) and "sentinel" not in barriers("gru_cho", layers=2)
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_bi"), 8, 256, "float16")
    assert "sentinel" not in {c.barrier for c in ConfigSpace(plan, SM90, template_for(plan, SM90.target())).configs}


def stack_layer(cell, hidden, batch, layers, dtype, barrier="sentinel", **knobs):
    """A stack of ``layers`` with ``barrier``: the given tensor-core knobs, or (float32) the stack's default
    config's."""
    if dtype == "float32":
        plan = prnn_tvm.analyze(prnn_tvm.frontend.stack.stacked(prnn_tvm.resolve(cell), layers), batch, hidden)
        config = dataclasses.replace(pc.default_config(plan, SM90), barrier=barrier)
    else:
        config = {"k_groups": 1, "n_tiles": 1, "layout": "split", **knobs, "barrier": barrier}
    return prnn_tvm.compile_cell(
        cell, hidden, batch, dtype=dtype, target="cuda", arch="sm_90", layers=layers, config=config
    )


@pytest.mark.parametrize(
    "dtype, knobs",
    [("float16", {"units_per_cta": 8}), ("float32", {}), ("bfloat16", {"units_per_cta": 8, "layout": "shared"})],
)
def test_a_sentinel_stack_exchanges_each_layer_through_a_sequence_of_its_own(dtype, knobs):
    """Layer ``l`` (delay ``l``) publishes kernel step ``s``'s state at its own step ``s - l``: the lower layers
    in the call's ``exchange`` sequence, the last one in the output sequence. Step ``s`` polls each operand at
    its step before (``s - 1 - l``): a layer its own state and the one below's. The exchange is a scratch
    argument: allocated for each call, not returned, not ``__restrict__``."""
    layer = stack_layer("lstm", 256, 8, 3, dtype, **knobs)
    exchange = layer.signature.launch("recurrent").arg("exchange")
    assert exchange == Arg("exchange", ArgRole.SCRATCH, (SEQ, 2, 8, 256), dtype)
    assert layer.signature.scratch == (exchange,)
    assert [a.name for a in layer.signature.outputs] == [
        "out",
        "l0_h_n",
        "l0_c_n",
        "l1_h_n",
        "l1_c_n",
        "l2_h_n",
        "l2_c_n",
    ]
    source = layer.cuda_source
    assert re.search(r"\b(half|nv_bfloat16|float)\* exchange_ptr", source)  # no __restrict__
    source = source[
        source.index("recurrent_kernel(", source.index('extern "C" __global__ void __launch_bounds__') + 1) :
    ]
    for name, delay in (("l0_h", 0), ("l1_h", 1), ("l2_h", 2)):
        assert re.search(rf"int slot_{name}(_\d+)? = \(\w+ - {delay + 1}\);", source), name
    polls = {
        tuple(sorted(re.findall(r"\(&\((\w+)_ptr\[", call)[: int(sources)]))  # a group polled in two places
        for sources, call in re.findall(r"prnn_sentinel_copy<[^>]*, (\d+)>\((.*?)\);", source)
    }
    stores = re.findall(r"prnn_sentinel_store<[^>]*>\(\(&\((\w+)_ptr\[", source)
    fills = re.findall(r"prnn_sentinel_fill<[^>]*>\(\(&\((\w+)_ptr\[", source)
    # the sequences each poll waits on, split: layer 0 its own state, layers 1 and 2 theirs and the one below's
    # in one poll (layer 2's own from the output); shared: every CTA each layer's state once, two per poll
    split = layer.kernel.config.layout == "split"
    assert polls == (
        {("exchange",), ("exchange", "exchange"), ("exchange", "out")}
        if split
        else {("exchange", "exchange"), ("out",)}
    )
    assert sorted(stores) == sorted(fills) == ["exchange", "exchange", "out"]
    assert source.count("prnn_barrier_counter(") == 1  # the launch's one barrier, before the first step
    assert layer.report.spill_bytes == 0, layer.report.format()


def test_a_call_of_a_sentinel_stack_allocates_its_exchange_for_each_chunk(monkeypatch):
    """The binding allocates the scratch sequence with the call (a piece's length when the sequence runs in
    chunks) and returns only the output sequence and the final states."""
    import tvm

    from prnn_tvm.reference import random_inputs
    from prnn_tvm.runtime import binding, limits

    layer = stack_layer("gru", 64, 4, 2, "float16", units_per_cta=4)
    inputs = random_inputs(layer.plan, 12, 64, seed=0)
    at = [a.name for a in layer.signature.launch("recurrent").args].index("exchange")

    def bound():
        return binding.bind(
            layer.signature,
            (),
            inputs,
            tvm.cpu(0),
            lambda a: None,
            {"timeout_us": 1, "stall_step": -1, "error_host": 0},
        )

    call = bound()
    (recurrent,) = [args for name, args in call.launches if name == "recurrent"]
    assert recurrent[at].shape == (12, 1, 4, 64) and len(call.outputs) == 3
    monkeypatch.setattr(limits, "MAX_ELEMENTS", 4 * 3 * 64 * 5)  # the widest step (xp: 3 gates) x 5 steps
    call = bound()
    pieces = [args[at] for name, args in call.launches if name == "recurrent"]
    assert call.chunks == 3 and [p.shape for p in pieces] == [(5, 1, 4, 64)] * 2 + [(2, 1, 4, 64)]
    assert len(call.outputs) == 3


@pytest.mark.parametrize("knobs, cfg", [(mc, mc.MmaConfig(16, 2, 1, "sentinel")), (pc, None)])
def test_the_training_forward_exchanges_through_a_barrier(knobs, cfg):
    """``recurrent_save`` keeps the workspace exchange between barriers it was verified with: a layer built
    with ``sentinel`` trains with ``counter``, the rest of its config the same."""
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 8, 256, "float16" if knobs is mc else "float32")
    if cfg is None:
        cfg = dataclasses.replace(pc.default_config(plan, SM90), barrier="sentinel")
    assert knobs.saving_config(cfg, plan, SM90) == dataclasses.replace(cfg, barrier="counter")


def test_a_sentinel_poll_holds_fewer_registers_than_a_tagged_one():
    """A 16-byte load holds eight half values where a tagged one holds two: a quarter of the loads."""
    sentinel = BARRIERS["sentinel"].polled_loads(16 * 256, 512, 256, 2)
    tags = BARRIERS["tags"].polled_loads(16 * 256, 512, 256, 2)
    assert sentinel == (1, 6) and tags == (4, 6)
    assert BARRIERS["counter"].polled_loads(16 * 256, 512, 256, 2) == (0, 0)


def test_a_sentinel_poll_holds_the_loads_of_the_operands_it_waits_on_together():
    """A sentinel poll waits on up to SENTINEL_SOURCES operands at once (a stack layer's own state and the
    one below's), holding all their loads; tags poll one operand at a time."""
    one = BARRIERS["sentinel"].polled_loads(8 * 512, 256, 512, 2)
    assert one == (2, 6)
    for operands in (2, 3, 4):
        together = min(operands, SENTINEL_SOURCES)
        assert BARRIERS["sentinel"].polled_loads(8 * 512, 256, 512, 2, operands) == (2 * together, 6)
        tags = BARRIERS["tags"]
        assert tags.polled_loads(8 * 512, 256, 512, 2, operands) == tags.polled_loads(8 * 512, 256, 512, 2)


def test_a_stack_whose_two_operand_poll_holds_too_many_loads_is_refused():
    """Layer 1's poll waits on its own state and layer 0's at once: twice one operand's loads per thread (22
    each, under the limit of 32), and the config is refused, with the reason."""
    cfg = mc.MmaConfig(2, 1, 8, "sentinel")
    two = prnn_tvm.analyze(prnn_tvm.frontend.stack.stacked(prnn_tvm.resolve("lstm"), 2), 64, 256, "float16")
    assert mc.geometry(cfg, two).threads == 96
    assert BARRIERS["sentinel"].polled_loads(64 * 256, 96, 256, 2) == (22, 6)
    assert mc.geometry(cfg, two).tagged_per_thread == 44
    with pytest.raises(
        ConfigError,
        match=r"polls 44 state loads per thread \(batch tile 64 x hidden 256 over 96 "
        r"threads, for each operand one poll waits on\); at most 32",
    ):
        mc.validate(cfg, two, SM90)


def test_the_benchmark_gives_a_sentinel_kernel_no_barrier_floor():
    """A ``sentinel`` kernel crosses no barrier per step: the benchmark's floor (barrier + FLOPs) does not
    apply, and the barrier probe (which refuses ``sentinel``) is never built for it."""
    from prnn_tvm.bench.measure import barrier_seconds_per_step

    probes = {}
    layer = sentinel_layer("lstm", 256, 8, "float16", units_per_cta=16, k_groups=2)
    assert barrier_seconds_per_step(layer, probes) is None and probes == {}

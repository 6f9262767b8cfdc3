"""Packed tagged words (the split's knob ``words="packed"``, ``prnn_tvm/codegen/barriers/packed.py``), on the CPU: the
knob, the layout of three 16-bit values and a 16-bit tag a word, the tag's slot and why 16 bits do not alias, the
generated code (ptxas: no spills at the layer it is for) and the refusals. The numerics against float64 need the
tensor-core template, which the emulator does not run: ``test_gpu_split.py``."""

import random
import re

import pytest

import prnn_tvm
from prnn_tvm.codegen.barriers.packed import LANES, slot_of, words_of
from prnn_tvm.errors import ConfigError
from prnn_tvm.schedules import split
from prnn_tvm.verify.split import shared_problems


def packed_split(hidden: int, batch: int, gpus: int = 2, dtype: str = "float16", hop: str = "exposed", **knobs):
    config = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "words": "packed", "hop": hop, **knobs}
    return prnn_tvm.compile_cell("lstm", hidden, batch, dtype=dtype, arch="sm_90", tuning_logs=[],
                                 devices=list(range(gpus)), config=config, cache=False)


def kernel_body(layer) -> str:
    return layer.cuda_source.split("recurrent_kernel(")[-1].split(") {", 1)[1]


def polls(layer) -> list:
    """Each packed poll's template arguments: (loads a thread, vec, words a row, words a CTA, units a CTA, columns,
    row pad, sleep, words between rows)."""
    return [[int(v) for v in s.split(", ")] for s in re.findall(r"prnn_packed_copy<half, ([0-9, ]+)>\(",
                                                                  kernel_body(layer))]


def test_the_split_knobs_leave_the_templates_config():
    assert split.split_knobs({"words": "packed"}) == (None, split.SplitKnobs(words="packed"))
    assert split.split_knobs({"hop": "floor", "words": "packed", "k_groups": 4}) == (
        {"k_groups": 4}, split.SplitKnobs("floor", "packed"))
    assert split.split_knobs({"k_groups": 4}) == ({"k_groups": 4}, split.SplitKnobs("exposed", None))
    with pytest.raises(ConfigError, match="words='triple': one of single, packed"):
        split.SplitKnobs(words="triple")


@pytest.mark.parametrize("units, hidden, words", [(8, 2048, 768), (16, 192, 72), (16, 120, 45), (3, 12, 4),
                                                  (1, 10, 10)])
def test_a_ctas_units_take_a_third_of_the_words_the_last_partly_empty(units, hidden, words):
    """``W = ceil(U / 3)`` words a CTA: 8 units take 3 (the last holding 2), and a hidden size that ends inside a CTA
    only the words of its units (120 = 7 CTAs of 16 units, then 8 units: 42 + 3 words)."""
    assert words_of(hidden, units) == words
    assert words_of(units, units) * LANES >= units > (words_of(units, units) - 1) * LANES


def stale_tags(slot_rule, lengths) -> list:
    """``(wanted, found)`` tags of each poll over launches of ``lengths`` steps, each run from the base the one before
    ended at: a value tagged ``base + s`` goes to slot ``slot_rule(base, s)``; a reader at step ``s`` finds there what
    was stored before its writers' step ``s - 1`` (the writer is at most a step ahead: not yet step ``s``'s)."""
    base, slots, found = 0, [0, 0], []
    for steps in lengths:
        for s in range(1, steps):
            found.append((base + s, slots[slot_rule(base, s)]))
            slots[slot_rule(base, s)] = base + s  # the words of step s - 1 arrive
        slots[slot_rule(base, steps)] = base + steps  # the last step's
        base += steps
    return found


def test_sixteen_bits_of_tag_never_alias_in_the_slot_a_reader_polls():
    """``packed.py``'s argument, modelled: with the tag's parity for the slot (``slot_of``), over launches of random
    lengths (many of one step) a poll finds the words tagged two before the ones it waits for, never another, and 2
    is not 0 modulo 65536. With the step's parity (as the 32-bit tags have it), a launch of 2 steps, 65534 of one
    step (a session's calls) and one of 3 leave the slot step 2 polls holding a word whose 16 bits look fresh."""
    rng = random.Random(0)
    lengths = [rng.choice((1, 1, 1, 2, 3, 7)) for _ in range(70_000)]
    assert all(found == wanted - 2 for wanted, found in stale_tags(slot_of, lengths) if wanted > 2)
    polls = stale_tags(lambda base, step: step & 1, [2] + [1] * 65_534 + [3])
    assert any(found != wanted and found % 65536 == wanted % 65536 for wanted, found in polls)


def test_at_the_measured_layer_packed_polls_a_third_of_the_words_without_spills():
    """LSTM fp16 H=2048 B=8 over two GPUs, 8 units a CTA, 4 k groups: a row of 768 words (not 2048), so a poll holds
    four rows in the registers one row took (2 polls a step, not 8), each thread's words in 16-byte loads; the
    floors poll a GPU's 384 words of a row; each kernel without spills (ptxas); the workspace a third as big."""
    for hop, calls in (("exposed", 2), ("floor", 2), ("floor_own", 1)):
        layer = packed_split(2048, 8, hop=hop, units_per_cta=8, k_groups=4)
        assert layer.report.spill_store_bytes == 0 and layer.report.spill_load_bytes == 0, layer.report.format()
        assert f"hop {hop}" in layer.report.format() and "words packed" in layer.report.format()
        found = polls(layer)
        width = 768 if hop == "exposed" else 384
        assert len(found) == calls and all(p[1:7] == [2, width, 3, 8, width // 3 * 8, 2056] and p[-1] == 768
                                           for p in found), found
        assert layer.signature.launch("recurrent").arg("workspace").shape == (1, 2, 8, 768)


@pytest.mark.parametrize("hidden, batch, dtype, knobs", [
    (192, 5, "float16", {}),  # 12 CTAs of 16 units: 6 words each
    (192, 11, "float16", {}),  # two batch tiles (8 rows, then 3)
    (120, 3, "float16", {}),  # the last CTA's 8 units: 3 words, the last of them with 2 units
    (320, 3, "bfloat16", {}),
    (240, 4, "float16", {"units_per_cta": 8}),  # 30 CTAs of 3 words: odd words per GPU, one word a load
])
def test_awkward_layers_pack_their_units_and_stay_inside_shared_memory(hidden, batch, dtype, knobs):
    """Each CTA stores ``B x W`` packed words into its own copy and the peer's (one store each), and polls each row's
    ``words_of(hidden)`` words, no more (a word past hidden is never written); every shared access (the staging tile
    included) inside the launch's memory."""
    layer = packed_split(hidden, batch, dtype=dtype, **knobs)
    units = knobs.get("units_per_cta", 16)
    body = kernel_body(layer)
    ctype = "half" if dtype == "float16" else "nv_bfloat16"
    found = [[int(v) for v in s.split(", ")] for s in re.findall(rf"prnn_packed_copy<{ctype}, ([0-9, ]+)>\(", body)]
    assert found and all(p[2] == words_of(hidden, units) and p[5] == hidden for p in found), found
    assert all(p[1] == (2 if words_of(hidden, units) % 2 == 0 and p[-1] % 2 == 0 else 1) for p in found), found
    assert body.count("prnn_packed_store(") == body.count("prnn_packed_store_peer(") == 1
    assert "prnn_tag_store" not in body and "prnn_tag_copy" not in body
    assert shared_problems(layer) == [], layer.report.format()


def test_the_slot_a_step_polls_is_its_tags_parity():
    """The poll waits at slot ``(base + t) & 1`` for the words step ``t - 1`` stored at ``(base + (t - 1) + 1) & 1``."""
    body = kernel_body(packed_split(192, 5))
    assert re.search(r"prnn_packed_copy<[^>]*>\(\(&\(workspace_ptr\[\(\(\(barrier_base \+ v\) & 1\)", body), body
    assert "int packed_slot = (((barrier_base + v) + 1) & 1);" in body


@pytest.mark.parametrize("options, message", [
    (dict(dtype="float32"), "three 16-bit values a word: a float16 or bfloat16 layer, not float32"),
    (dict(batch=64), "stages a CTA's new states in 2048 bytes of static shared memory, more than 768"),
])
def test_what_cannot_be_packed_is_refused_naming_the_fix(options, message):
    knobs = {"units_per_cta": 16, "k_groups": 2, "n_tiles": 1, "words": "packed"}
    if options.get("dtype") == "float32":
        knobs = {"units_per_cta": 4, "k_split": 4, "rows_per_thread": 2, "batch_tile": 2, "vec": 2, "words": "packed"}
    with pytest.raises(ConfigError, match=re.escape(message) + ".*words='single'"):
        prnn_tvm.compile_cell("lstm", 64, options.get("batch", 4), dtype=options.get("dtype", "float16"),
                              arch="sm_90", tuning_logs=[], devices=[0, 1], config=knobs, cache=False)


def test_the_default_words_are_packed_where_a_config_can_run_them():
    """Packed words are the default (``DEFAULT_WORDS``): a half layer that names no words runs them, one whose
    config cannot (float32; a batch of 64 whose staging tile is past the limit) runs single words; a config that
    names packed words it cannot run is refused."""
    assert split.DEFAULT_WORDS == "packed"
    half = packed_split(192, 5, words=None)
    assert "words packed" in half.report.format() and polls(half)
    wide = packed_split(64, 64, words=None)
    assert "words single" in wide.report.format() and "prnn_tag_store_peer<half>(" in wide.cuda_source
    fp32 = {"units_per_cta": 3, "k_split": 4, "rows_per_thread": 2, "batch_tile": 2, "vec": 2}
    single = prnn_tvm.compile_cell("lstm", 12, 3, input_size=3, arch="sm_90", tuning_logs=[], devices=[0, 1],
                                   config=fp32, cache=False)
    assert "words single" in single.report.format() and "prnn_tag_store_peer<float>(" in single.cuda_source
    with pytest.raises(ConfigError, match="not float32"):
        prnn_tvm.compile_cell("lstm", 12, 3, input_size=3, arch="sm_90", tuning_logs=[], devices=[0, 1],
                              config={**fp32, "words": "packed"}, cache=False)


def test_over_more_gpus_than_packed_words_ran_on_the_default_is_single():
    """Packed words are the default over at most ``DEFAULT_WORDS_GPUS`` GPUs (where they ran); over four a config that
    names no words runs single words, and one that names packed words gets them."""
    assert split.DEFAULT_WORDS_GPUS == 2
    four = dict(dtype="float16", arch="sm_90", tuning_logs=[], devices=[0, 1, 2, 3], cache=False)
    assert "words single" in prnn_tvm.compile_cell("lstm", 192, 5, **four).report.format()
    assert "words packed" in prnn_tvm.compile_cell("lstm", 192, 5, config={"words": "packed"}, **four).report.format()


def test_without_a_config_packed_takes_a_default_that_packs():
    """``{"words": "packed"}`` alone: the ranked configs that can pack (fewer units where B x U stages too much)."""
    layer = prnn_tvm.compile_cell("lstm", 256, 32, dtype="float16", arch="sm_90", tuning_logs=[], devices=[0, 1],
                                  config={"words": "packed"}, cache=False)
    assert "words packed" in layer.report.format()
    assert 32 * layer.units_per_cta * 2 <= 768

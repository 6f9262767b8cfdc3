"""The contracts the layers meet at: templates, configs as dicts, the typed signature, config choice, dtypes."""

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from tvm import te

import prnn_tvm
import prnn_tvm.choice
from prnn_tvm import Cell, CellError, ConfigError
from prnn_tvm.choice import ConfigChoice, choose_and_build
from prnn_tvm.dtypes import itemsize, policy, tolerance
from prnn_tvm.report import ConfigOrigin
from prnn_tvm.schedules import TEMPLATES, by_name, knob_short_names, knob_text, template_for, templates_for
from prnn_tvm.signature import ArgRole, Signature
from prnn_tvm.target import gpu_spec

GPU = gpu_spec("sm_90")
CONTRACT = (
    "accepts",
    "apply",
    "default_configs",
    "space",
    "carried_over",
    "validate",
    "geometry",
    "features",
    "config_from_dict",
)


# ---------------------------------------------------------------- templates
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_every_template_provides_the_contract(template):
    assert all(callable(getattr(template, m)) for m in CONTRACT)
    assert by_name(template.name) is template
    if template.config_type is not None:
        assert dataclasses.is_dataclass(template.config_type)
        assert template.config_type.__dataclass_params__.frozen


def test_templates_are_picked_by_plan_and_target():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 4, 64)
    assert template_for(plan, GPU.target()).name == "persistent_cuda"
    assert template_for(plan, prnn_tvm.compile_cell("lstm", 4, 2, target="llvm").target).name == "cpu_reference"
    with pytest.raises(ConfigError, match="no schedule template named 'wgmma'; templates: persistent_cuda"):
        by_name("wgmma")


def test_a_template_says_why_it_does_not_place_a_plan():
    """``accepts`` answers true, or false with the reason; where no template places a plan, the error lists each
    template's reason."""
    half = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 4, 64, "float16")
    answers = {t.name: t.accepts(half, gpu_spec("sm_75").target()) for t in TEMPLATES}
    assert not any(answers.values())
    assert answers["persistent_cuda"].reason == "the persistent template places float32 cells, not float16"
    assert answers["persistent_mma"].reason == "float16 layers need mma.sync m16n8k16 (sm_80 or newer), not sm_75"
    assert answers["cpu_reference"].reason == "places CPU (llvm) kernels, not cuda"
    assert (
        by_name("persistent_mma").accepts(half, GPU.target())
        and by_name("persistent_mma").accepts(half, GPU.target()).reason is None
    )
    with pytest.raises(
        ConfigError,
        match=r"no schedule template places a float16 'lstm' cell on target cuda, which "
        r"takes float32 \(persistent_cuda: the persistent template places float32 "
        r"cells, not float16; persistent_mma: float16 layers need mma.sync "
        r"m16n8k16 \(sm_80 or newer\), not sm_75; cpu_reference: ",
    ):
        templates_for(half, gpu_spec("sm_75").target())
    assert [t.name for t in templates_for(half, GPU.target())] == ["persistent_mma"]


def test_a_template_without_knobs_refuses_a_config():
    with pytest.raises(ConfigError, match="the cpu_reference template has no knobs"):
        prnn_tvm.compile_cell("lstm", 8, 2, target="llvm", config={"vec": 4})


def test_knob_short_names_come_from_the_config_fields():
    assert knob_short_names() == {
        "units_per_cta": "U",
        "k_split": "ks",
        "rows_per_thread": "r",
        "batch_tile": "bt",
        "vec": "v",
        "barrier": "",
        "k_groups": "kg",
        "n_tiles": "nt",
        "layout": "",
        "m_tiles_per_warp": "mw",
        "k_chains": "kc",
        "batch_groups": "bg",
        "poll_sleep": "ps",
        "operand_path": "",
        "smem_chunks": "sc",
        "smem_k_tiles": "sk",
        "l2_chunks": "lc",
        "l2_k_tiles": "lk",
        "gate_layout": "",
        "batch_warps": "bw",
        "xp": "xp",
        "atomic_sums": "as",
    }
    knobs = {"units_per_cta": 8, "k_split": 16, "rows_per_thread": 2, "batch_tile": 4, "vec": 4, "barrier": "tags"}
    assert knob_text(knobs, knob_short_names()) == "U=8 ks=16 r=2 bt=4 v=4 tags"
    split = {"units_per_cta": 16, "k_groups": 1, "n_tiles": 1, "barrier": "counter", "layout": "split"}
    assert knob_text(split, knob_short_names()) == "U=16 kg=1 nt=1 counter split"
    assert knob_text({"vec": 4}) == "vec=4"


# ---------------------------------------------------------------- configs as dicts
@pytest.fixture(scope="module")
def default_knobs():
    return prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", tuning_logs=[]).report.config


def test_a_config_dict_builds_what_its_dataclass_builds(default_knobs):
    as_dict = prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config=default_knobs)
    numpy_ints = {k: np.int64(v) if isinstance(v, int) else v for k, v in default_knobs.items()}
    as_numpy = prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config=numpy_ints)
    cfg = by_name("persistent_cuda").config_from_dict(default_knobs)
    as_object = prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config=cfg)
    assert as_dict.report.config == as_numpy.report.config == as_object.report.config == default_knobs
    assert as_dict.cuda_source == as_object.cuda_source
    assert as_dict.report.config_origin is ConfigOrigin.USER and as_dict.report.config_detail == "user"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bogus": 1}, r"unknown knob\(s\) bogus for PersistentConfig; its knobs are units_per_cta, k_split"),
        ({"vec": "4"}, r"knob vec='4': expected a whole number"),
        ({"vec": 4.0}, r"knob vec=4.0: expected a whole number"),
        ({"vec": True}, r"knob vec=True: expected a whole number"),
        ({"barrier": 1}, r"knob barrier=1: expected a string"),
    ],
)
def test_bad_config_dicts_are_refused_with_the_knob_named(default_knobs, change, message):
    with pytest.raises(ConfigError, match=message):
        prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config={**default_knobs, **change})


def test_a_config_dict_missing_a_knob_is_refused(default_knobs):
    knobs = {k: v for k, v in default_knobs.items() if k != "k_split"}
    with pytest.raises(ConfigError, match="PersistentConfig needs the knob"):
        prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config=knobs)
    with pytest.raises(ConfigError, match="a config is a dict of knobs or a PersistentConfig, got list"):
        prnn_tvm.compile_cell("gru", 64, 3, target="cuda", arch="sm_90", config=[1, 2])


# ---------------------------------------------------------------- the typed signature
@pytest.fixture(scope="module")
def lstm_cuda():
    return prnn_tvm.compile_cell("lstm", 64, 2, input_size=24, target="cuda", arch="sm_90")


def test_the_signature_derives_inputs_outputs_and_intermediates(lstm_cuda):
    sig = lstm_cuda.signature
    assert [x.function for x in sig.launches] == ["projection", "recurrent"]
    assert sig.arg_names == ("x", "W_ih", "b_ih", "W_hh", "b_hh", "h0", "c0", "lengths") == tuple(lstm_cuda.arg_names)
    assert [a.name for a in sig.outputs] == ["out", "h_n", "c_n"]
    assert [a.name for a in sig.intermediates] == ["xp"]
    assert [a.name for a in sig.starting_at("recurrent").inputs] == ["xp", "W_hh", "b_hh", "h0", "c0", "lengths"]
    x, w_ih = sig.inputs[:2]
    assert x.shape == ("T", 2, 24) and w_ih.shape == (256, 24) and x.role is ArgRole.INPUT
    rec = sig.launch("recurrent")
    assert [a.role for a in rec.args][-5:] == [ArgRole.WORKSPACE, ArgRole.SYNC, *[ArgRole.SCALAR] * 3]
    assert [(a.name, a.dtype) for a in rec.args][-3:] == [
        ("timeout_us", "int32"),
        ("stall_step", "int32"),
        ("error_host", "int64"),
    ]
    assert rec.grid.ctas == lstm_cuda.report.ctas and rec.grid.registers == lstm_cuda.report.registers
    assert rec.sync.kind == lstm_cuda.report.config["barrier"] and rec.sync.state_words == 4


def test_the_signature_survives_json(lstm_cuda):
    sig = lstm_cuda.signature
    assert Signature.from_dict(json.loads(json.dumps(sig.as_dict()))) == sig


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_kernels_declare_exactly_the_signature_arguments(target):
    layer = prnn_tvm.compile_cell("gru_cho", 16, 3, target=target, arch="sm_90" if target == "cuda" else None)
    launch = layer.kernel.launch
    assert [p.name for p in layer.kernel.func.params] == [a.name for a in launch.args]
    header = layer.kernel.func.script().split("def recurrent(", 1)[1].split("):\n", 1)[0]
    for arg in launch.args:
        declared = f'"{arg.dtype}")' if arg.role is not ArgRole.SCALAR else arg.dtype
        assert re.search(rf"\b{arg.name}: T\.(Buffer\(\([^)]*\), )?{re.escape(declared)}", header), arg.name


def test_where_a_timeout_happened_is_told_from_the_sync_description():
    sync = prnn_tvm.compile_cell(
        "gru_cho",
        64,
        2,
        target="cuda",
        arch="sm_90",
        config={
            "units_per_cta": 1,
            "k_split": 32,
            "rows_per_thread": 1,
            "batch_tile": 2,
            "vec": 4,
            "barrier": "counter",
        },
    ).kernel.launch.sync
    assert (sync.counts, sync.phases) == ("barriers", 2)
    assert sync.where(7) == "after phase 1 of step 3"


# ---------------------------------------------------------------- config choice
class _FakeTemplate:
    """Configs a, b, c ranked in that order; each build "spills" what ``SPILLS`` says."""

    name = "fake"
    config_type = str

    def __init__(self, spills, fits=lambda c: True):
        self.spills, self.fits = spills, fits

    def default_configs(self, plan, target, gpu):
        return ["a", "b", "c"]

    def apply(self, plan, target, gpu, config=None):
        if not self.fits(config):
            raise ConfigError("does not fit")
        return config

    def config_from_dict(self, knobs):
        if "name" not in knobs:
            raise ConfigError(f"knobs {knobs} are not a config of {self.name}")
        return knobs["name"]


class _SecondTemplate(_FakeTemplate):
    """A second template, of integer configs ``{"n": ...}``."""

    name, config_type = "second", int

    def default_configs(self, plan, target, gpu):
        return [1, 2]

    def config_from_dict(self, knobs):
        if "n" not in knobs:
            raise ConfigError(f"knobs {knobs} are not a config of {self.name}")
        return knobs["n"]


def _choose(monkeypatch, template, tuned=None):
    tuned = [tuned] if isinstance(tuned, ConfigChoice) else tuned or []
    tuned = [dataclasses.replace(choice, template=template) for choice in tuned]
    monkeypatch.setattr(prnn_tvm.choice, "tuned_configs", lambda *a: (tuned, "" if tuned else "no tuning record"))
    build = lambda kernel: SimpleNamespace(spill_bytes=template.spills.get(kernel, 0), recurrent=None)  # noqa: E731
    return choose_and_build(SimpleNamespace(cell=SimpleNamespace(name="fake")), [template], None, GPU, build)


def test_the_choice_considers_every_template_that_accepts_the_plan(monkeypatch):
    """With two templates: a caller's config goes to the template whose config it is; the fastest tuned record wins
    whichever template it is of; where no default of the first template can launch, the second's are next."""
    first, second = _FakeTemplate({}), _SecondTemplate({})
    plan = SimpleNamespace(cell=SimpleNamespace(name="fake"))
    build = lambda kernel: SimpleNamespace(spill_bytes=0, recurrent=None)  # noqa: E731
    kernel, _, choice = choose_and_build(plan, [first, second], None, GPU, build, config={"n": 7})
    assert kernel == 7 and choice.template is second and choice.origin is ConfigOrigin.USER
    kernel, _, choice = choose_and_build(plan, [first, second], None, GPU, build, config={"name": "x"})
    assert kernel == "x" and choice.template is first
    with pytest.raises(ConfigError, match="no template that places this cell takes the config fake: .*; second: "):
        choose_and_build(plan, [first, second], None, GPU, build, config={"other": 1})
    tuned = [
        ConfigChoice("t", ConfigOrigin.TUNED, "2.00 us/step", template=first),
        ConfigChoice(5, ConfigOrigin.TUNED, "1.00 us/step", template=second),
    ]
    monkeypatch.setattr(
        prnn_tvm.choice, "tuned_configs", lambda p, templates, *a: (sorted(tuned, key=lambda c: c.reason), "")
    )
    kernel, _, choice = choose_and_build(plan, [first, second], None, GPU, build)
    assert kernel == 5 and choice.template is second
    monkeypatch.setattr(prnn_tvm.choice, "tuned_configs", lambda *a: ([], "no tuning record"))
    too_large = lambda kernel, built, gpu: "too large" * isinstance(kernel, str)  # noqa: E731  (the first's)
    monkeypatch.setattr(prnn_tvm.choice, "unlaunchable", too_large)
    kernel, _, choice = choose_and_build(plan, [first, second], None, GPU, build)
    assert kernel == 1 and choice.template is second and choice.origin is ConfigOrigin.DEFAULT
    assert choice.describe() == (
        "default: no tuning record; 3 ranked before it cannot be co-resident with ptxas's registers"
    )


def test_the_default_ladder_records_what_it_passed_over(monkeypatch):
    kernel, built, choice = _choose(monkeypatch, _FakeTemplate({"a": 96, "b": 8}))
    assert kernel == "c" and built.spill_bytes == 0 and choice.origin is ConfigOrigin.DEFAULT
    assert choice.passed_over == (96, 8)
    assert choice.describe() == "default: no tuning record (after 2 that spilled: 96 B, 8 B)"
    kernel, built, choice = _choose(monkeypatch, _FakeTemplate({"a": 96, "b": 8, "c": 4}))
    assert kernel == "c" and built.spill_bytes == 4 and choice.passed_over == (96, 8)  # the last one is kept


def test_a_tuned_config_that_spills_or_does_not_fit_falls_back(monkeypatch):
    tuned = ConfigChoice("t", ConfigOrigin.TUNED, "1.00 us/step measured on test GPU")
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({}), tuned)
    assert kernel == "t" and choice.origin is ConfigOrigin.TUNED and choice.describe() == tuned.describe()
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({"t": 40}), tuned)
    assert kernel == "a" and choice.describe() == "default: the tuned config spills 40 B here"
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({}, fits=lambda c: c != "t"), tuned)
    assert kernel == "a" and choice.describe() == "default: the tuned config does not fit this GPU"
    # ptxas's registers make its grid too large to be co-resident: never kept, whatever its origin
    monkeypatch.setattr(prnn_tvm.choice, "unlaunchable", lambda kernel, built, gpu: "too large" * (kernel in "ta"))
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({}), tuned)
    assert kernel == "b" and choice.describe() == (
        "default: the tuned config too large here; 1 ranked before it cannot be co-resident with ptxas's registers"
    )


def test_a_tuned_config_that_spills_gives_way_to_the_next_fastest(monkeypatch):
    """Records outlive kernel changes: where the fastest tuned config now spills, the next record is built
    before the defaults, and the report says why."""
    tuned = [
        ConfigChoice(name, ConfigOrigin.TUNED, f"{us} us/step measured on test GPU")
        for name, us in (("t", "1.00"), ("u", "1.10"), ("v", "1.20"))
    ]
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({"t": 12}), tuned)
    assert kernel == "u" and choice.origin is ConfigOrigin.TUNED
    assert choice.describe() == "tuned: 1.10 us/step measured on test GPU; the faster one: spills 12 B here"
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({"t": 12}, fits=lambda c: c != "u"), tuned)
    assert kernel == "v" and choice.describe() == (
        "tuned: 1.20 us/step measured on test GPU; the 2 faster ones: spills 12 B here, does not fit this GPU"
    )
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({"t": 12, "u": 8, "v": 4}), tuned)
    assert kernel == "a" and choice.describe() == (
        "default: the 3 fastest tuned configs: spills 12 B here, spills 8 B here, spills 4 B here"
    )


def test_a_carried_over_config_is_a_default_and_gives_way_like_a_tuned_one(monkeypatch):
    """Configs carried over from neighbouring hidden sizes' records (``prnn_tvm.neighbours``) are built before the
    ranked defaults, as default choices that name the record; one that spills gives way to the defaults."""
    why = "no tuning record; carried over from the record at hidden=512 (1.43 us/step there)"
    carried = ConfigChoice("t", ConfigOrigin.DEFAULT, why)
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({}), carried)
    assert kernel == "t" and choice.origin is ConfigOrigin.DEFAULT and choice.describe() == f"default: {why}"
    kernel, _, choice = _choose(monkeypatch, _FakeTemplate({"t": 40}), carried)
    assert kernel == "a" and choice.describe() == "default: the carried-over config spills 40 B here"


# ---------------------------------------------------------------- dtypes
def test_the_dtype_policy():
    p = policy("float32")
    assert (p.storage, p.accumulate, p.compute, p.itemsize) == ("float32", "float32", "float32", 4)
    assert tolerance("float32", 256) == pytest.approx(16 * tolerance("float32", 1))
    assert tolerance("float32", 0) == tolerance("float32", 1)
    assert (itemsize("uint64"), itemsize("bfloat16"), itemsize("int8")) == (8, 2, 1)
    for half in ("float16", "bfloat16"):  # half storage, float32 products and pointwise math
        assert (policy(half).storage, policy(half).accumulate, policy(half).compute) == (half, "float32", "float32")
    assert tolerance("float16", 256) == pytest.approx(1e-2) and tolerance("bfloat16", 256) == pytest.approx(4e-2)
    assert tolerance("float16", 1) == 2.0**-9  # the floor: half an ulp of an output of 4
    with pytest.raises(
        ConfigError, match="dtype int8 is not supported yet; supported: float32, float16, bfloat16, float64"
    ):
        policy("int8")
    assert (policy("float64").storage, policy("float64").compute) == ("float64", "float64")
    assert prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 2, 8).policy == p


def test_a_stage_outside_the_compute_type_is_refused():
    def step(c):
        x, h, w = c.input(), c.state("h"), c.weight("W")
        hw = c.matvec(h, w, "hw")
        wide = te.compute((c.batch, c.hidden), lambda n, j: (x[n, j] + hw[n, j]).astype("float64"), name="wide")
        return {"h": c.pointwise(lambda n, j: te.tanh(wide[n, j].astype("float32")), "h_new")}

    cell = Cell("wide", step, lambda x, s, p: {"h": np.tanh(x + s["h"] @ p["W"].T)})
    with pytest.raises(
        CellError,
        match="computes float64; every stage of a cell computes in float32, the compute type of a float32 layer",
    ):
        prnn_tvm.analyze(cell, 2, 8)


def test_sizes_may_be_numpy_integers():
    layer = prnn_tvm.compile_cell("rnn_tanh", np.int64(8), np.int32(2), target="llvm")
    assert (layer.plan.hidden, layer.plan.batch) == (8, 2) and isinstance(layer.plan.hidden, int)
    assert math.isclose(tolerance("float32", 4), 2e-5)

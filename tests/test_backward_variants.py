"""The variants a config-by-config backward benchmark adds (``prnn_tvm.bench.backward_variants``): the first config with
knobs changed, where the config has the knob and the template builds it; refusals printed with their reason."""

import dataclasses

import prnn_tvm
from prnn_tvm import schedules
from prnn_tvm.bench.backward_variants import add_variants
from prnn_tvm.target import gpu_spec


def test_variants_that_build_are_added_once_and_refusals_say_why(capsys):
    plan = prnn_tvm.analyze(prnn_tvm.resolve("slstm_h12"), 16, 768, dtype="bfloat16")
    gpu = gpu_spec("sm_90")
    configs = schedules.backward_configs(plan, gpu)
    first = configs[0]
    whole_batch = {"batch_groups": 1, "batch_tile": 16}  # whole heads of the whole batch: 12 blocks
    changes = [whole_batch, dict(whole_batch), {"k_groups": 2}, {"units_per_cta": 5}, {}]
    got = add_variants(first, changes, list(configs), plan, gpu)
    assert got == [*configs, dataclasses.replace(first, **whole_batch)]  # once; no k_groups knob; 5 refused
    printed = capsys.readouterr().out
    assert printed.count("skipped") == 1 and "units_per_cta=5 must be a multiple of the head size" in printed, printed

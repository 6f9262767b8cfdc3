"""SHA-256 hashes of the CUDA the templates generate: a refactor that must not change the kernels compares them.

    python bench/source_hashes.py --out hashes.json [--only records defaults stacks training probes]
                                  [--every N] [--compare before.json]
    python bench/source_hashes.py --only smoke --compare tests/data/source_hashes.json

Builds, for target ``cuda`` and arch ``sm_90``, source only (no GPU, no nvcc: about 0.3 s a kernel on one core):

- ``records``: the recurrent kernel of every config in the shipped tuning logs (``tuning_logs/*.jsonl``), one
  per (cell, shapes, dtype, template, config);
- ``defaults``: every built-in cell in every dtype a GPU template accepts, at a few shapes: the recurrent kernel
  of each ranked default config (the fallbacks a build takes when ptxas spills), and the input projection;
- ``stacks``: stacks of 2 and 3 layers and bidirectional layers of LSTM and GRU, their ranked defaults;
- ``training``: the training forward (``recurrent_save``) of the first default config and every ranked config
  of the GPU backward (``recurrent_backward``) of each built-in cell and dtype;
- ``probes``: the barrier probe kernel (``prnn_tvm.bench.barrier_probe``) of each barrier it runs;
- ``smoke``: a few entries of each of those, under the same keys (the CPU suite compares them with
  ``tests/data/source_hashes.json``: ``tests/test_source_hashes.py``). A change meant to change the generated
  code writes that file again with ``--only smoke --out tests/data/source_hashes.json``.

Each entry maps a readable key to the source's hash, or to ``refused: <reason>`` where the config is refused
before anything is built. ``--every N`` builds every N-th entry only (a quick check while editing; the keys
and hashes of the entries built are the same as a full run's). ``--compare`` prints the keys whose value
differs from an earlier run's (or is missing from either) and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import tvm

from prnn_tvm.codegen.build import PIPELINE, generated_source
from prnn_tvm.codegen.projection import projection_func
from prnn_tvm.errors import ConfigError
from prnn_tvm.frontend.analysis import analyze
from prnn_tvm.frontend.registry import builtin_cells, resolve
from prnn_tvm.schedules import by_name, gpu_backward, saving_forward, template_for
from prnn_tvm.target import gpu_spec

ROOT = Path(__file__).resolve().parents[1]
ARCH = "sm_90"
DTYPES = ("float32", "float16", "bfloat16")
SHAPES = ((256, 4), (1024, 1), (512, 16), (133, 11))  # (hidden, batch): small, batch 1, a larger batch, odd sizes
STACKS = (("lstm_x2", 256, 4), ("lstm_x3", 512, 8), ("gru_x2", 256, 4), ("lstm_bi", 256, 4), ("gru_bi", 512, 8))
TRAINING_SHAPES = ((256, 4), (133, 11))
PROBES = (("counter", False), ("counter", True), ("tags", True), ("grid_sync", False), ("grid_sync", True))
PARTS = ("records", "defaults", "stacks", "training", "probes")
SMOKE_RECORDS = ("barrier", "operand_path", "layout")  # the first record of each template and these knobs


def digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def build(funcs: dict) -> str:
    """The hash of the CUDA source of ``{name: PrimFunc}`` built together (as a layer's module holds them)."""
    return digest(generated_source(funcs, gpu_spec(ARCH).target()))


def attempt(make) -> str:
    """``make()``'s hash, or ``refused: <reason>`` for a ConfigError."""
    try:
        return make()
    except ConfigError as err:
        return f"refused: {err}"


def record_entries():
    """``(key, make)`` for every distinct config of the shipped tuning logs."""
    gpu = gpu_spec(ARCH)
    seen = set()
    for log in sorted((ROOT / "tuning_logs").glob("*.jsonl")):
        for line in log.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            k = r["key"]
            if k["arch"] != ARCH:
                continue
            config = json.dumps(r["config"], sort_keys=True)
            key = f"record {r['cell']} {k['hidden']}x{k['batch']} {k['dtype']} {k['template']} {config}"
            if key in seen:
                continue
            seen.add(key)

            def make(r=r, k=k):
                plan = analyze(resolve(r["cell"]), k["batch"], k["hidden"], k["dtype"])
                if plan.fingerprint() != k["fingerprint"]:
                    return f"refused: the plan changed ({plan.fingerprint()}, record {k['fingerprint']})"
                template = by_name(k["template"])
                kernel = template.apply(plan, gpu.target(), gpu, template.config_from_dict(r["config"]))
                return build({"recurrent": kernel.func})

            yield key, make


def _default_entries(cell: str, hidden: int, batch: int, dtypes=DTYPES, projection: bool = True):
    gpu = gpu_spec(ARCH)
    target = gpu.target()
    for dtype in dtypes:
        plan = analyze(resolve(cell), batch, hidden, dtype)
        try:
            template = template_for(plan, target)
            configs = template.default_configs(plan, target, gpu)
        except ConfigError as err:
            yield f"default {cell} {hidden}x{batch} {dtype}", (lambda err=err: f"refused: {err}")
            continue
        for i, config in enumerate(configs):

            def make(plan=plan, template=template, config=config):
                return build({"recurrent": template.apply(plan, target, gpu, config).func})

            yield f"default {cell} {hidden}x{batch} {dtype} #{i} {json.dumps(config.as_dict(), sort_keys=True)}", make
        if projection:
            yield (
                f"projection {cell} {hidden}x{batch} {dtype}",
                lambda plan=plan: build({"projection": projection_func(plan, hidden, target)}),
            )


def default_entries():
    for cell in builtin_cells():
        for hidden, batch in SHAPES:
            yield from _default_entries(cell, hidden, batch)


def stack_entries():
    for cell, hidden, batch in STACKS:
        yield from _default_entries(cell, hidden, batch, projection=False)


def training_entries():
    gpu = gpu_spec(ARCH)
    target = gpu.target()
    for cell in builtin_cells():
        for hidden, batch in TRAINING_SHAPES:
            for dtype in DTYPES:
                plan = analyze(resolve(cell), batch, hidden, dtype)
                name = f"{cell} {hidden}x{batch} {dtype}"

                def save(plan=plan):
                    config = template_for(plan, target).default_configs(plan, target, gpu)[0]
                    return build({"recurrent_save": saving_forward(plan, target, gpu, config).func})

                yield f"save {name}", save

                def backward(plan=plan):
                    kernels = gpu_backward(plan, gpu)
                    return " ".join(build({"recurrent_backward": k.func}) for k in kernels)

                yield f"backward {name}", backward


def probe_entries():
    from prnn_tvm.bench.barrier_probe import probe_func

    target = gpu_spec(ARCH).target()
    for barrier, all_to_all in PROBES:

        def make(barrier=barrier, all_to_all=all_to_all):
            func = probe_func(barrier, 132, 128, all_to_all)
            mod = tvm.IRModule({"barrier_probe": func})
            with target:
                lib = tvm.tirx.build(mod, target=target, pipeline=PIPELINE)
            return digest(lib.imports[0].inspect_source())

        yield f"probe {barrier} {'all' if all_to_all else 'neighbour'}", make


def smoke_entries():
    """A few entries of each part: LSTM 256x4's first defaults and projection, a stack's, a record of each template
    and kind of exchange, LSTM's training kernels, two probes."""
    for key, make in _default_entries("lstm", 256, 4, ("float32", "float16")):
        if " #0 " in key or key.startswith("projection"):
            yield key, make
    for key, make in _default_entries("lstm_x2", 256, 4, ("float32",), projection=False):
        if " #0 " in key:
            yield key, make
    seen = set()
    for key, make in record_entries():
        template, config = key.split(" ", 5)[4:]
        kind = (template, *(json.loads(config).get(knob) for knob in SMOKE_RECORDS))
        if kind not in seen:
            seen.add(kind)
            yield key, make
    for key, make in training_entries():
        if " lstm 256x4 float" in key and "bfloat16" not in key:
            yield key, make
    for key, make in probe_entries():
        if key in ("probe counter all", "probe tags all"):
            yield key, make


ENTRIES = {
    "records": record_entries,
    "defaults": default_entries,
    "stacks": stack_entries,
    "training": training_entries,
    "probes": probe_entries,
    "smoke": smoke_entries,
}


def compare(got: dict, path: Path) -> int:
    """Print the keys whose value differs from the run saved at ``path`` (only keys this run built); 1 if any."""
    before = json.loads(path.read_text())
    differ = [k for k in got if before.get(k) != got[k]]
    for key in differ:
        print(f"DIFFERS {key}\n  before {before.get(key, '(missing)')}\n  now    {got[key]}")
    print(f"{len(got)} compared with {path}: {len(differ)} differ")
    return 1 if differ else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the hashes here (JSON: key -> hash)")
    p.add_argument("--only", nargs="+", choices=list(ENTRIES), default=list(PARTS))
    p.add_argument("--every", type=int, default=1, help="build every N-th entry only")
    p.add_argument("--compare", type=Path, help="an earlier run's JSON to compare with")
    args = p.parse_args()
    hashes, start = {}, time.time()
    for part in args.only:
        for i, (key, make) in enumerate(ENTRIES[part]()):
            if i % args.every:
                continue
            hashes[key] = attempt(make)
        print(f"{part}: {len(hashes)} entries so far, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text(json.dumps(hashes, indent=0, sort_keys=True) + "\n")
    everything = digest(json.dumps(hashes, sort_keys=True))
    refused = sum(v.startswith("refused") for v in hashes.values())
    print(f"{len(hashes)} entries ({refused} refused), digest of all {everything}")
    return compare(hashes, args.compare) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())

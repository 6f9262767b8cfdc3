"""``prnn-tvm``: a thin command line over the library.

    prnn-tvm compile lstm --hidden 1024 --batch 4 --seq 256 --arch sm_90
    prnn-tvm tune lstm --hidden 1024 --batch 4 --trials 64
    prnn-tvm records show
    prnn-tvm bench --cells lstm --hidden 1024 --batch 4 16
    prnn-tvm cells
    prnn-tvm cache list

Each command imports what it needs when it runs (TVM, the tuner, the benchmark): ``--help`` does not wait for them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import unicodedata
from pathlib import Path

from .dtypes import GPU_DTYPES
from .errors import CellError, ConfigError, PrnnError
from .target import gpu_spec, known_archs, local_gpu, parse_arch


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


LARGEST = 2**31 - 1  # sizes are 32-bit integers in the kernels


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    if value > LARGEST:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {LARGEST}, got {value}")
    return value


def printable(text) -> str:
    """``text`` on one line with its control characters escaped (``\\x1b``, ``\\n``): names from a log or a
    cell file are printed as they are, never as terminal escapes or extra lines."""
    return "".join(
        ch if ch == " " or unicodedata.category(ch)[0] not in "CZ" else ch.encode("unicode_escape").decode("ascii")
        for ch in str(text)
    )


def _arch(text: str) -> str:
    try:
        return parse_arch(text)
    except PrnnError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _add_dtype(parser) -> None:
    parser.add_argument(
        "--dtype",
        choices=sorted(GPU_DTYPES),
        default="float32",
        help="storage dtype: float32, or float16 / bfloat16 on tensor cores (default float32)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="prnn-tvm", description="Compile recurrent cells to persistent GPU kernels.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a cell, report the kernel, check it against NumPy")
    c.add_argument("cell", help="built-in cell name or path/to/cell.py")
    _add_layers(c)
    c.add_argument("--hidden", type=_positive, required=True)
    c.add_argument("--batch", type=_positive, required=True)
    c.add_argument("--seq", type=_positive, default=64, help="sequence length to check and time (default 64)")
    c.add_argument("--input-size", type=_positive, default=None, help="features per step (default: hidden)")
    _add_dtype(c)
    c.add_argument(
        "--arch",
        type=_arch,
        default=None,
        help=f"CUDA architecture ({', '.join(known_archs())}); default: the local GPU's, else sm_90",
    )
    c.add_argument("--no-check", action="store_true", help="skip the CPU reference check")
    records_or_not = c.add_mutually_exclusive_group()
    records_or_not.add_argument(
        "--log",
        type=Path,
        default=None,
        help="tuning log to take the config from (default: the shipped tuning_logs/<arch>.jsonl and the user's)",
    )
    records_or_not.add_argument("--default-config", action="store_true", help="ignore tuning records")
    c.set_defaults(func=cmd_compile)

    t = sub.add_parser("tune", help="auto-tune a cell's persistent kernel on this GPU, appending records")
    t.add_argument("cell", help="built-in cell name or path/to/cell.py")
    _add_layers(t)
    t.add_argument("--hidden", type=_positive, required=True)
    t.add_argument("--batch", type=_positive, required=True)
    t.add_argument("--seq", type=_positive, default=256, help="sequence length to time (default 256)")
    _add_dtype(t)
    t.add_argument("--trials", type=_positive, default=64, help="configs to measure (default 64)")
    t.add_argument("--batch-size", type=_positive, default=16, help="configs per search round (default 16)")
    t.add_argument(
        "--search",
        default="xgb",
        help="xgb (cost model, default; needs xgboost: pip install "
        "'prnn-tvm[tune]'), random, or grid (every valid config)",
    )
    t.add_argument("--workers", type=_positive, default=min(8, os.cpu_count() or 1), help="build processes")
    t.add_argument(
        "--log",
        type=Path,
        default=None,
        help="records file to append to (default: the user's "
        "$XDG_DATA_HOME/prnn-tvm/tuning_logs/<arch>.jsonl, which compile reads after the shipped log)",
    )
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=cmd_tune)

    r = sub.add_parser("records", help="inspect tuning records")
    r.add_argument("action", choices=["show", "best"], help="show: a summary per key; best: each key's best config")
    which = r.add_mutually_exclusive_group()
    which.add_argument(
        "--log",
        type=Path,
        default=None,
        help="records file (default: the shipped "
        "tuning_logs/<arch>.jsonl, then the user's, which prnn-tvm tune writes)",
    )
    which.add_argument("--arch", type=_arch, default=None, help="which logs (default sm_90)")
    r.add_argument("--cell", default=None, help="only this cell (name)")
    r.set_defaults(func=cmd_records)

    _add_bench_parser(sub)

    e = sub.add_parser("export", help="compile a cell and write it as one shared library for inference")
    e.add_argument("cell", help="built-in cell name or path/to/cell.py")
    _add_layers(e)
    e.add_argument("--hidden", type=_positive, required=True)
    e.add_argument("--batch", type=_positive, required=True)
    e.add_argument("--seq", type=_positive, default=None, help="the sequence length it is meant for (recorded)")
    e.add_argument("--input-size", type=_positive, default=None, help="features per step (default: hidden)")
    _add_dtype(e)
    where = e.add_mutually_exclusive_group()
    where.add_argument(
        "--arch",
        type=_arch,
        default=None,
        help="CUDA architecture of the inference GPU; default: the local GPU's (required without one)",
    )
    where.add_argument("--cpu", action="store_true", help="export the CPU (llvm) build instead of the CUDA one")
    e.add_argument("-o", "--output", type=Path, required=True, help="the library to write (.so)")
    e.add_argument(
        "--session",
        action="store_true",
        help="also carry a resident session's kernels (CUDA), so that the loaded layer offers .session()",
    )
    e.set_defaults(func=cmd_export)

    cells = sub.add_parser("cells", help="list the built-in cells")
    cells.set_defaults(func=cmd_cells)

    k = sub.add_parser("cache", help="inspect or empty the on-disk cache of compiled layers")
    k.add_argument(
        "action",
        choices=["list", "info", "clear"],
        help="list: an entry a line, most recently used "
        "first; info: where the cache is, its size and bound; clear: remove every entry",
    )
    k.set_defaults(func=cmd_cache)
    return parser


def _add_layers(parser) -> None:
    parser.add_argument(
        "--layers",
        type=_positive,
        default=1,
        help="stacked layers of the cell in one launch, run as a wavefront (default 1); the same as "
        "naming the cell <cell>_x<layers>",
    )
    parser.add_argument(
        "--bidirectional",
        action="store_true",
        help="both directions of the cell in one launch, as torch.nn's bidirectional=True; the "
        "same as naming the cell <cell>_bi",
    )


def _spec(args) -> str:
    """The cell as ``resolve`` takes it: ``--layers N`` makes ``<cell>_xN``, ``--bidirectional`` ``<cell>_bi``."""
    if args.bidirectional and args.layers > 1:
        raise ConfigError(
            "--bidirectional takes one layer: a layer above reads the whole of both directions, so "
            "a bidirectional stack is no wavefront"
        )
    spec = args.cell if args.layers == 1 else f"{args.cell}_x{args.layers}"
    return f"{spec}_bi" if args.bidirectional else spec


def cmd_compile(args) -> int:
    from .checks import check_against_reference, check_gradients, gradient_check_hidden, plan_tolerance, time_layer
    from .compiler import compile_cell

    args.cell = _spec(args)
    gpu = local_gpu()
    arch = args.arch or (None if gpu is not None else "sm_90")
    logs = [] if args.default_config else ([args.log] if args.log else None)
    layer = compile_cell(
        args.cell,
        args.hidden,
        args.batch,
        input_size=args.input_size,
        seq_len=args.seq,
        dtype=args.dtype,
        target="cuda",
        arch=arch,
        tuning_logs=logs,
    )
    print(layer.report.format())
    ok = True
    if not args.no_check:
        cpu = compile_cell(
            args.cell, args.hidden, args.batch, input_size=args.input_size, dtype=args.dtype, target="llvm"
        )
        res = check_against_reference(cpu, args.seq, tolerance=plan_tolerance(cpu.plan, args.seq))
        print(
            f"cpu check   max abs error {res.max_abs_error:.2e} vs float64 NumPy (tolerance "
            f"{res.tolerance:.1e}): {'ok' if res.ok else 'FAILED'} [{res.seconds:.2f} s]"
        )
        ok &= res.ok
        try:
            if cpu.plan.untrainable:
                raise CellError(cpu.plan.untrainable)
            res = check_gradients(args.cell, hidden=gradient_check_hidden(cpu.plan))
        except CellError as err:  # a cell fit for inference whose math has no derivative rule: no training
            print(f"grad check  not derivable: {err}")
        else:
            print(
                f"grad check  relative error {res.max_abs_error:.1e} of the derived backward vs central differences "
                f"(float64 CPU build; tolerance {res.tolerance:.0e}): {'ok' if res.ok else 'FAILED'} "
                f"[{res.seconds:.2f} s]"
            )
            ok &= res.ok
            _print_training(layer)
    if gpu is None:
        print("gpu         none here: CUDA source generated and inspected with ptxas, not run")
        return 0 if ok else 1
    res = check_against_reference(layer, args.seq, tolerance=plan_tolerance(layer.plan, args.seq))
    print(
        f"gpu check   max abs error {res.max_abs_error:.2e} vs float64 NumPy (tolerance {res.tolerance:.1e}): "
        f"{'ok' if res.ok else 'FAILED'}"
    )
    t = time_layer(layer, args.seq)
    parts = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in t.launches.items())
    print(
        f"gpu time    {t.total_s * 1e3:.3f} ms per sequence of {args.seq} ({parts}; recurrent "
        f"{t.per_step_s * 1e6:.2f} us per step) on {gpu.device_name}"
    )
    return 0 if ok and res.ok else 1


def _print_training(layer) -> None:
    """The GPU training kernels of ``layer`` (saving forward, persistent backward): ptxas's figures, or why
    there are none."""
    from .compiler import compile_training

    try:
        training = compile_training(layer)
    except ConfigError as err:
        print(f"training    not on the GPU: {err}")
        return
    for line in training.report.splitlines():
        print(f"training    {line}")


def cmd_tune(args) -> int:
    from .schedules import knob_text
    from .tune import tune

    args.cell = _spec(args)
    res = tune(
        args.cell,
        args.hidden,
        args.batch,
        seq_len=args.seq,
        dtype=args.dtype,
        trials=args.trials,
        batch_size=args.batch_size,
        strategy=args.search,
        log_path=args.log,
        workers=args.workers,
        seed=args.seed,
    )
    print(
        f"tuned {args.cell}: {len(res.new)} new trials ({res.errors} errors) of {res.space_size} valid configs "
        f"in {res.seconds:.0f} s; records in {res.log_path}"
    )
    if res.best is None:
        print("no config ran correctly: compile will use the default config")
        return 1
    print(f"best     {res.best.per_step_s * 1e6:.2f} us/step  {knob_text(res.best.config)}")
    if res.default is not None:
        print(
            f"default  {res.default.per_step_s * 1e6:.2f} us/step  {knob_text(res.default.config)}  "
            f"(tuned is {res.default.per_step_s / res.best.per_step_s:.2f}x faster)"
        )
    return 0


def cmd_records(args) -> int:
    from . import records

    arch = args.arch or "sm_90"
    for path in [args.log] if args.log else records.default_logs(arch):
        _show_records(args, path)
    return 0


def _show_records(args, path) -> None:
    """``prnn-tvm records`` of one log."""
    from . import records
    from .schedules import knob_text

    recs = [r for r in records.load(path) if args.cell in (None, r.cell)]
    if not recs:
        print(printable(f"no records in {path}" + (f" for cell {args.cell}" if args.cell else "")))
        return
    keys = list(dict.fromkeys(r.key for r in recs))
    print(printable(f"{path}: {len(recs)} records, {len(keys)} keys"))
    for key in keys:
        mine = records.for_key(recs, key)
        best = records.best(mine, key)
        what = f"{mine[0].cell:12s} batch={key.batch:<3d} hidden={key.hidden:<5d} {key.dtype:8s}"
        if args.action == "show":
            errors = sum(not r.ok for r in mine)
            best_text = f"best {best.per_step_s * 1e6:.2f} us/step" if best else "no successful trial"
            print(
                printable(
                    f"{what} {key.arch} ({key.sms} SMs, TVM {key.tvm}): {len(mine)} trials, {errors} errors, "
                    f"{best_text}"
                )
            )
        elif best is not None:
            print(printable(f"{what} {key.arch} {best.per_step_s * 1e6:7.2f} us/step  {knob_text(best.config)}"))


def _add_bench_parser(sub) -> None:
    from .bench import matrix, step_cases

    def hidden(text: str):
        return matrix.LARGEST if text == matrix.LARGEST else _positive(text)

    b = sub.add_parser("bench", help="time prnn-tvm against cuDNN, a CUDA-graph GEMM loop and the floor on this GPU")
    b.add_argument(
        "--cells",
        nargs="+",
        default=list(matrix.DEFAULT_CELLS),
        metavar="CELL",
        help=f"cells with a PyTorch counterpart (default: {' '.join(matrix.DEFAULT_CELLS)})",
    )
    b.add_argument(
        "--hidden",
        nargs="+",
        type=hidden,
        default=list(matrix.DEFAULT_HIDDEN),
        metavar="H",
        help=f"hidden sizes; '{matrix.LARGEST}' is the largest each cell supports here without spills "
        f"(default: {' '.join(map(str, matrix.DEFAULT_HIDDEN))})",
    )
    b.add_argument(
        "--batch",
        nargs="+",
        type=_positive,
        default=list(matrix.DEFAULT_BATCHES),
        metavar="B",
        help=f"batch sizes (default: {' '.join(map(str, matrix.DEFAULT_BATCHES))})",
    )
    b.add_argument(
        "--seq",
        type=_positive,
        default=matrix.DEFAULT_SEQ_LEN,
        help=f"steps per sequence (default {matrix.DEFAULT_SEQ_LEN})",
    )
    b.add_argument(
        "--dtype",
        nargs="+",
        choices=sorted(GPU_DTYPES),
        default=list(matrix.DEFAULT_DTYPES),
        help=f"{', '.join(GPU_DTYPES)} (default float32)",
    )
    b.add_argument(
        "--repeats",
        type=_positive,
        default=5,
        help="timed repeats per implementation; the median is reported (default 5)",
    )
    b.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default bench/results; with --from-csv, the current folder)",
    )
    b.add_argument(
        "--name",
        default=None,
        help="file stem: NAME.csv, NAME.md, NAME.png (default bench; with --from-csv, the CSV's stem)",
    )
    b.add_argument(
        "--from-csv",
        type=Path,
        default=None,
        metavar="CSV",
        help="only re-render the table and plot of an existing CSV (no GPU needed), into --out; never "
        "over the files beside the CSV",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument(
        "--l2-window",
        action="store_true",
        help="launch kernels that read part of their weights from global memory every step with an L2 "
        "persistence window over them (off by default: to measure what the window gives)",
    )
    b.add_argument(
        "--tiers",
        action="store_true",
        help="only print where each weight tier (registers, + shared memory, + L2, + DRAM) stops for --cells and "
        "--dtype at the largest --batch, from compile-time analysis (no GPU needed: name it with --arch); a run "
        f"with '{matrix.LARGEST}' in --hidden also times those sizes and prints the table with its timings",
    )
    b.add_argument("--arch", default=None, help="with --tiers: the GPU architecture (default: the local GPU's)")
    steps = b.add_argument_group("one timestep per call")
    steps.add_argument(
        "--step-latency",
        action="store_true",
        help="time LSTMs one step per call instead: a resident session's latency per step (p50, p99, a "
        "histogram), input on the host and on the GPU, against cuDNN's eager call and its step replayed from a "
        "CUDA graph (default --name step-latency)",
    )
    steps.add_argument(
        "--model",
        nargs=4,
        action="append",
        default=None,
        metavar=("LAYERS", "HIDDEN", "BATCH", "DTYPE"),
        help="with --step-latency, repeatable: an LSTM of LAYERS x HIDDEN at BATCH in DTYPE (float32 or float16; "
        f"default: {'; '.join(' '.join(map(str, vars(m).values())) for m in step_cases.DEFAULT_MODELS)})",
    )
    steps.add_argument(
        "--steps",
        type=_positive,
        default=step_cases.DEFAULT_STEPS,
        help=f"with --step-latency: steps timed per mode (default {step_cases.DEFAULT_STEPS})",
    )
    steps.add_argument(
        "--chain",
        type=_positive,
        default=step_cases.DEFAULT_CHAIN,
        help=f"with --step-latency: dependent steps in one CUDA graph (default {step_cases.DEFAULT_CHAIN})",
    )
    b.set_defaults(func=cmd_bench, parser=b)


SEQUENCE_OPTIONS = ("cells", "hidden", "batch", "seq", "dtype", "repeats")
STEP_OPTIONS = ("model", "steps", "chain")


def _given(args, dests) -> list[str]:
    """The options among ``dests`` given other values than their defaults, as the command line spells them."""
    return [
        a.option_strings[0]
        for a in args.parser._actions
        if a.option_strings and a.dest in dests and getattr(args, a.dest) != a.default
    ]


def cmd_bench(args) -> int:
    from .bench import matrix, outputs, runner, table, tiers

    if args.step_latency:
        return _bench_steps(args)
    wrong = _given(args, STEP_OPTIONS)
    if wrong:
        raise ConfigError(f"{', '.join(wrong)} choose what --step-latency times: add --step-latency, or drop them")
    if args.from_csv is not None:
        given = _given(args, {a.dest for a in args.parser._actions} - {"help", "from_csv", "out", "name"})
        if given:
            raise ConfigError(
                f"--from-csv re-renders the table and plot of a CSV into --out (as --name), with "
                f"nothing else to choose; drop {', '.join(given)}"
            )
        paths = outputs.render_csv(args.from_csv, args.out or Path("."), args.name)
        print(f"wrote {paths['md']} and {paths['png']}")
        return 0
    if args.tiers:
        return _bench_tiers(args)
    args.out, args.name = args.out or Path("bench/results"), args.name or "bench"
    problem = runner.missing_requirements()
    if problem:
        print(f"prnn-tvm: error: {problem}", file=sys.stderr)
        return 1
    command = " ".join(
        [
            "prnn-tvm bench --cells",
            *args.cells,
            "--hidden",
            *map(str, args.hidden),
            "--batch",
            *map(str, args.batch),
            "--seq",
            str(args.seq),
            "--dtype",
            *args.dtype,
            "--repeats",
            str(args.repeats),
            "--name",
            args.name,
            *(["--l2-window"] if args.l2_window else []),
        ]
    )
    if args.l2_window:
        from .runtime import l2

        l2.use_window(True)
    print(outputs.NOTES[0])
    if matrix.LARGEST in args.hidden:
        print("finding the largest hidden size of each cell (built at every batch to check for spills) ...")
    edges = tier_edges(args, gpu_spec()) if matrix.LARGEST in args.hidden else []
    extra = [matrix.Case(e.cell, e.hidden, e.batch, args.seq, e.dtype) for e in edges if e.hidden is not None]
    rows = runner.run(
        args.cells, args.hidden, args.batch, args.seq, args.dtype, repeats=args.repeats,
        progress=not args.no_progress, extra=extra,
    )
    paths = outputs.write_outputs(rows, args.out, args.name, command)
    print(table.markdown(rows, command=command))
    if edges:
        paths["tiers"] = args.out / f"{args.name}-tiers.md"
        paths["tiers"].write_text(tiers.markdown(edges, rows) + "\n")
        print(tiers.markdown(edges, rows))
    failed = sum(r.get("status") != "ok" for r in rows)
    print(
        f"{len(rows) - failed} of {len(rows)} cases measured, {failed} failed (error rows); wrote "
        f"{', '.join(str(p) for p in paths.values())}"
    )
    return 0


def tier_edges(args, gpu) -> list:
    """Where each weight tier stops for the run's cells and dtypes at its largest batch (``bench.tiers``)."""
    from .bench import tiers

    batch = max(args.batch)
    return [e for cell in args.cells for dtype in args.dtype for e in tiers.tier_edges(cell, dtype, batch, gpu)]


def _bench_tiers(args) -> int:
    """``prnn-tvm bench --tiers``: the tiers' edges from compile-time analysis, printed."""
    from .bench import tiers

    wrong = _given(args, ("hidden", "seq", "repeats", "from_csv", "l2_window"))
    if wrong:
        raise ConfigError(f"--tiers finds the hidden sizes itself and times nothing; drop {', '.join(wrong)}")
    gpu = gpu_spec(args.arch)
    print(f"where each weight tier stops on {gpu.arch} at batch {max(args.batch)} (untuned configs, no build):")
    print(tiers.markdown(tier_edges(args, gpu)))
    return 0


def _bench_steps(args) -> int:
    """``prnn-tvm bench --step-latency``: measure (a GPU), or re-render a run's CSV (``--from-csv``)."""
    from .bench import runner, step_cases, step_outputs

    wrong = _given(args, SEQUENCE_OPTIONS + (STEP_OPTIONS if args.from_csv is not None else ()))
    if wrong:
        what = "re-renders a run's table and plot" if args.from_csv is not None else "times the models of --model"
        raise ConfigError(f"--step-latency {what}; {', '.join(wrong)} do not apply: drop them")
    if args.from_csv is not None:
        paths = step_outputs.render_csv(args.from_csv, args.out or Path("."), args.name)
        print(f"wrote {paths['md']} and {paths['png']}")
        return 0
    models, steps = step_cases.models_from(args.model), step_cases.check_steps(args.steps)
    args.out, args.name = args.out or Path("bench/results"), args.name or "step-latency"
    problem = runner.missing_requirements()
    if problem:
        print(f"prnn-tvm: error: {problem}", file=sys.stderr)
        return 1
    chosen = " ".join(f"--model {m.layers} {m.hidden} {m.batch} {m.dtype}" for m in models)
    command = f"prnn-tvm bench --step-latency {chosen} --steps {steps} --chain {args.chain} --name {args.name}"
    from .bench import step_latency

    rows, histograms = step_latency.run(models, steps, args.chain, progress=not args.no_progress)
    paths = step_outputs.write_outputs(rows, histograms, args.out, args.name, command)
    print(paths["md"].read_text())
    failed = sum(r.get("status") != "ok" for r in rows)
    print(
        f"{len(rows) - failed} of {len(rows)} rows measured, {failed} not (error rows); wrote "
        f"{', '.join(str(p) for p in paths.values())}"
    )
    return 0


def cmd_export(args) -> int:
    from .compiler import compile_cell
    from .runtime.exporting import export

    args.cell = _spec(args)
    target = "llvm" if args.cpu else "cuda"
    if args.session and args.cpu:
        raise PrnnError("--session exports a resident session's kernels, which run on the GPU: drop --cpu or --session")
    if target == "cuda" and args.arch is None and local_gpu() is None:
        raise PrnnError("no GPU here: name the inference GPU's architecture with --arch (e.g. --arch sm_90)")
    layer = compile_cell(
        args.cell,
        args.hidden,
        args.batch,
        input_size=args.input_size,
        seq_len=args.seq,
        dtype=args.dtype,
        target=target,
        arch=args.arch,
    )
    path = export(layer, args.output, session=args.session)
    print(layer.report.format())
    print(f"exported    {path} ({path.stat().st_size} bytes; load it with prnn_tvm.load)")
    return 0


def cmd_cells(_args) -> int:
    from .frontend.registry import builtin_cells

    cells = builtin_cells()
    width = max(map(len, cells))
    for name, cell in cells.items():
        first = next((line.strip() for line in cell.doc.splitlines() if line.strip()), "")
        print(f"{name:{width}s}  {first.replace('``', '')}")  # the docstring's reST literals as plain text
    return 0


def cmd_cache(args) -> int:
    import time

    from .cache.nvcc import FOLDER as NVCC_FOLDER
    from .cache.settings import settings
    from .cache.store import Store

    config = settings()
    store = Store(config.folder, config.max_bytes)
    if args.action == "clear":
        nvcc = Store(config.folder / NVCC_FOLDER, config.max_bytes)  # nvcc's results by source go with the layers
        nvcc.clear()
        print(printable(f"removed {store.clear()} entries from {config.folder}"))
        return 0
    entries = store.entries()
    if args.action == "info":
        state = "on" if config.enabled else "off (PRNN_TVM_CACHE=0)"
        print(printable(f"folder      {config.folder}"))
        print(f"use         {state}")
        print(
            f"entries     {len(entries)}, {sum(e.size for e in entries) / 2**20:.1f} MB of "
            f"{config.max_bytes / 2**20:.0f} MB (PRNN_TVM_CACHE_MAX_MB; least recently used go first)"
        )
        return 0
    now = time.time()
    for e in entries:
        d = e.info.get("describes", {})
        shapes = f"batch={d.get('batch')} hidden={d.get('hidden')} input={d.get('input_size')}" if "batch" in d else ""
        print(
            printable(
                f"{e.digest[:12]}  {e.info.get('kind', '?'):8s} {d.get('cell', '?'):14s} {shapes:32s} "
                f"{d.get('dtype', '?'):8s} {d.get('target', '?'):22s} {e.size / 2**10:7.0f} KB  "
                f"used {_age(now - e.last_used)} ago"
            )
        )
    if not entries:
        print(printable(f"no compiled layers in {config.folder}"))
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = (
        logging.WARNING
        if args.quiet
        else (logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING)
    )
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (PrnnError, OSError) as err:  # OSError: the file system's refusal (a folder not writable, a disk full)
        print(f"prnn-tvm: error: {printable(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``prnn-tvm``: a thin command line over the library.

    prnn-tvm compile lstm --hidden 1024 --batch 4 --seq 256 --arch sm_90
    prnn-tvm cells
"""

from __future__ import annotations

import argparse
import logging
import math
import sys

from . import compile_cell
from .checks import check_against_reference, time_layer
from .errors import PrnnError
from .registry import builtin_cells
from .target import known_archs, local_gpu, parse_arch


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _arch(text: str) -> str:
    try:
        return parse_arch(text)
    except PrnnError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="prnn-tvm", description="Compile recurrent cells to persistent GPU kernels.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a cell, report the kernel, check it against NumPy")
    c.add_argument("cell", help="built-in cell name or path/to/cell.py")
    c.add_argument("--hidden", type=_positive, required=True)
    c.add_argument("--batch", type=_positive, required=True)
    c.add_argument("--seq", type=_positive, default=64, help="sequence length to check and time (default 64)")
    c.add_argument("--input-size", type=_positive, default=None, help="features per step (default: hidden)")
    c.add_argument("--arch", type=_arch, default=None,
                   help=f"CUDA architecture ({', '.join(known_archs())}); default: the local GPU's, else sm_90")
    c.add_argument("--no-check", action="store_true", help="skip the CPU reference check")
    c.set_defaults(func=cmd_compile)

    cells = sub.add_parser("cells", help="list the built-in cells")
    cells.set_defaults(func=cmd_cells)
    return parser


def cmd_compile(args) -> int:
    gpu = local_gpu()
    arch = args.arch or (None if gpu is not None else "sm_90")
    layer = compile_cell(args.cell, args.hidden, args.batch, input_size=args.input_size, seq_len=args.seq,
                         target="cuda", arch=arch)
    print(layer.report.format())
    ok = True
    if not args.no_check:
        cpu = compile_cell(args.cell, args.hidden, args.batch, input_size=args.input_size, target="llvm")
        res = check_against_reference(cpu, args.seq, tolerance=1e-5 * math.sqrt(args.seq))
        print(f"cpu check   max abs error {res.max_abs_error:.2e} vs float64 NumPy (tolerance "
              f"{res.tolerance:.1e}): {'ok' if res.ok else 'FAILED'} [{res.seconds:.2f} s]")
        ok &= res.ok
    if gpu is None:
        print("gpu         none here: CUDA source generated and inspected with ptxas, not run")
        return 0 if ok else 1
    res = check_against_reference(layer, args.seq, tolerance=1e-4)
    print(f"gpu check   max abs error {res.max_abs_error:.2e} vs float64 NumPy (tolerance {res.tolerance:.0e}): "
          f"{'ok' if res.ok else 'FAILED'}")
    t = time_layer(layer, args.seq)
    print(f"gpu time    {t.total_s * 1e3:.3f} ms per sequence of {args.seq} (projection {t.projection_s * 1e3:.3f} ms, "
          f"recurrent {t.recurrent_s * 1e3:.3f} ms = {t.per_step_s * 1e6:.2f} us per step) on {gpu.device_name}")
    return 0 if ok and res.ok else 1


def cmd_cells(_args) -> int:
    for name, cell in builtin_cells().items():
        first = next((line.strip() for line in cell.doc.splitlines() if line.strip()), "")
        print(f"{name:10s} {first}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.quiet else (logging.DEBUG if args.verbose > 1 else
                                                logging.INFO if args.verbose else logging.WARNING)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except PrnnError as err:
        print(f"prnn-tvm: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

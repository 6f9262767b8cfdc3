"""A/B of a change to the generated CUDA, before it is written into the code generator.

A :class:`SourceChange` is a list of (old, new) text pairs. :func:`layer_pair` builds a case's layer (its tuned or
default config, or one given) and the same config again with the change applied to the CUDA the build compiles
(``codegen.build.rewriting_sources``); :func:`compare` runs both on the same random inputs, compares their outputs
bitwise and times their recurrent kernels in interleaved rounds. Used by ``bench/ab_source.py``; without a GPU the
pair is still built and ptxas's figures compared.

Every old text must occur in the layer's source, and the changed layer's source must be exactly the first one's
with the change applied: a change the generated code no longer matches is refused, naming the text it misses,
rather than timing the same kernel twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..dtypes import GPU_DTYPES
from .matrix import Case


@dataclass(frozen=True)
class SourceChange:
    """``pairs``: (old, new) texts, each old one replaced (every occurrence) in order; ``why``: what it tries;
    ``cases``: the cases it was written for (``CELL:HIDDENxBATCH``), which ``bench/ab_source.py`` runs by default;
    ``config``: the config it was written for (a prototype written against one kernel's generated names), which
    :func:`layer_pair` builds unless given another; ``dtype``: the storage dtype it was written for (a prototype's
    names and types are one dtype's), which ``bench/ab_source.py`` builds unless given another."""

    name: str
    pairs: tuple[tuple[str, str], ...]
    why: str = ""
    cases: tuple[str, ...] = ()
    config: dict | None = None
    dtype: str | None = None

    @classmethod
    def load(cls, path) -> SourceChange:
        """From a JSON file ``{"why": "...", "cases": [...], "config": {...}, "dtype": "...", "replace": [[old, new],
        ...]}``, named after the file (all but ``replace`` optional)."""
        data = json.loads(Path(path).read_text())
        pairs = data.get("replace")
        if (
            not isinstance(pairs, list)
            or not pairs
            or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) and s for s in p) for p in pairs)
        ):
            raise ValueError(f"{path}: 'replace' must be a non-empty list of [old, new] pairs of non-empty strings")
        cases = data.get("cases", [])
        for spec in cases:
            Case.parse(spec)  # refused now, with the reason, rather than after the first case's builds
        config = data.get("config")
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"{path}: 'config' must be an object of knobs")
        dtype = data.get("dtype")
        if dtype is not None and dtype not in GPU_DTYPES:
            raise ValueError(f"{path}: 'dtype' must be one of {', '.join(GPU_DTYPES)}, not {dtype!r}")
        pairs = tuple((old, new) for old, new in pairs)
        return cls(Path(path).stem, pairs, data.get("why", ""), tuple(cases), config, dtype)

    def apply(self, source: str) -> str:
        for i, (old, new) in enumerate(self.pairs):
            if old not in source:
                raise ValueError(
                    f"change '{self.name}': text {i + 1} of {len(self.pairs)} is not in the generated "
                    f"source (the code generator moved on?): {old[:80]!r}"
                )
            source = source.replace(old, new)
        return source


def layer_pair(case: Case, change: SourceChange, config=None, arch=None):
    """``(as built, changed)``: ``case``'s layer with ``config`` (else the change's own, else its tuned or default
    one), and the same config built again with ``change`` applied to its CUDA."""
    from ..codegen.build import rewriting_sources
    from ..compiler import compile_cell

    def build(knobs):
        return compile_cell(case.cell, case.hidden, case.batch, dtype=case.dtype, config=knobs, arch=arch)

    built = build(config or change.config or None)
    want = change.apply(built.cuda_source)
    with rewriting_sources(change.apply):
        changed = build(built.kernel.config.as_dict())
    if changed.cuda_source != want:  # the same config must generate the same code
        raise RuntimeError(f"change '{change.name}': the rebuilt layer's source is not the first one's changed")
    return built, changed


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: recurrent kernel, us per step of each round (as built, changed), and how far
    apart their outputs and final states were on the same inputs (bitwise, and the largest absolute difference)."""

    built_us: tuple[float, ...]
    changed_us: tuple[float, ...]
    bitwise_equal: bool
    max_abs_diff: float

    @property
    def ratio(self) -> float:
        """The changed kernel's fastest round over the built one's (below 1: the change is faster)."""
        return min(self.changed_us) / min(self.built_us)


def compare(built, changed, seq_len: int, rounds: int = 3, seed: int = 0) -> Comparison:
    """Run both layers of a :func:`layer_pair` on the same random inputs, then time their recurrent kernels
    alone (``checks.time_layer``) in ``rounds`` interleaved rounds. Needs a GPU."""
    from ..checks import max_error, time_layer
    from ..reference import random_inputs

    inputs = random_inputs(built.plan, seq_len, built.input_size, seed=seed)
    a, b = built(**inputs), changed(**inputs)
    pairs = list(zip((a[0], *a[1]), (b[0], *b[1]), strict=True))
    equal = all(x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in pairs)
    diff = max_error(pairs)  # NaN on either side: infinite (Python's max would drop it)
    built_us, changed_us = [], []
    for _ in range(rounds):
        for layer, times in ((built, built_us), (changed, changed_us)):
            times.append(time_layer(layer, seq_len, seed=seed).recurrent_s / (seq_len + layer.plan.lag) * 1e6)
    return Comparison(tuple(built_us), tuple(changed_us), equal, diff)


def line(case: Case, built, changed, found: Comparison | None) -> str:
    """One line for a case: its config, both kernels' registers and spills, and the times where measured."""
    rb, rc = built.report, changed.report
    knobs = " ".join(f"{k}={v}" for k, v in rb.config.items())
    head = (
        f"{case.label} ({knobs}; {rb.config_detail}): registers {rb.registers} -> {rc.registers}, spill bytes "
        f"{rb.spill_bytes} -> {rc.spill_bytes}"
    )
    if found is None:
        return head + " (built only)"
    return (
        f"{head}; us per step, as built {min(found.built_us):.3f}-{max(found.built_us):.3f}, changed "
        f"{min(found.changed_us):.3f}-{max(found.changed_us):.3f} ({found.ratio:.3f}x); outputs "
        f"{'bitwise equal' if found.bitwise_equal else f'differ, by up to {found.max_abs_diff:.3g}'}"
    )

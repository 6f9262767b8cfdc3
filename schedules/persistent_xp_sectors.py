"""The input projection a block kernel's CTA will read some steps on, asked into L2 by one warp (issue 49).

Where a step's projection is loaded a step or two early (``PersistentBuilder.inputs_early``: blocks synchronizing
with themselves, ``block``), the step is shorter than DRAM's latency, and a projection past L2 (T=1024 at hidden 768,
batch 16) kept the loads waiting on DRAM. So the CTA asks the projection of the step ``XP_PREFETCH_EARLY_STEPS`` on
into L2: what it reads is one contiguous segment per batch row of its group and input leaf (the leaf's columns of the
CTA's units), and lane ``i`` of warp 0 issues one ``prefetch.global.L2`` for sector or line ``i`` of them
(``XP_PREFETCH_EARLY_BYTES`` each, :func:`~prnn_tvm.codegen.prefetch.lines_covering` of a segment), looping where
there are more than 32 (or ``XP_PREFETCH_EARLY_WARPS`` warps share them): a warp instruction or a few a step, rather
than one per word from every thread (``"word"``, ``PersistentBuilder.inputs_prefetched``). ``XP_PREFETCH_EARLY_AT``
places it with the loads of the projection (``"load"``, before the step's barrier) or after the barrier
(``"barrier"``). A prefetch changes no value. bench/xp_prefetch_block.py times the settings.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import StepTiming
from prnn_tvm.codegen.prefetch import lines_covering, prefetch_l2
from prnn_tvm.dtypes import itemsize

from .persistent_exchange import ceil_div

WARP = 32


class SectorPrefetch:
    """The early projection's prefetch from one warp, a mixin of ``PersistentBuilder`` (its ``a``, ``p``, ``c``, ``g``,
    ``B``, ``H``, ``part``, ``slots``, ``steps``, ``cta``, ``tx``, ``xp_column``, ``inputs_early``)."""

    # Steps on from the loaded step (0: none); how ("sector": :meth:`prefetch_sectors`; "word": each thread its words,
    # ``PersistentBuilder.inputs_prefetched``); where ("load": with the loads, before the step's barrier; "barrier":
    # after it); the bytes a lane asks for (a 32-byte sector; 64 or 128 where a prefetch fetches the whole line); and
    # the warps that share the sectors, at most the CTA's (1: warp 0 takes them in turns of 32)
    XP_PREFETCH_EARLY_STEPS = 0
    XP_PREFETCH_EARLY_BY = "sector"
    XP_PREFETCH_EARLY_AT = "barrier"
    XP_PREFETCH_EARLY_BYTES = 32
    XP_PREFETCH_EARLY_WARPS = 1

    @property
    def sectors_prefetched(self) -> int:
        """Where the projection is loaded early, how many steps on from the loaded step the CTA asks the projection
        it will read into L2 with :meth:`prefetch_sectors`, or 0."""
        if not self.inputs_early or self.XP_PREFETCH_EARLY_BY != "sector":
            return 0
        return self.XP_PREFETCH_EARLY_STEPS

    def early_leaves(self) -> list:
        """The input leaves the CTA's items of the part being emitted read, in a fixed order."""
        leaves = {leaf for group in self.part.groups for leaf in self.slots[group].x}
        return sorted(leaves, key=lambda leaf: (leaf.name, leaf.slice))

    def sectors_per_segment(self, leaves: list) -> int:
        """The prefetches that ask one segment into L2: the lines a CTA's units' bytes touch, where a segment starts
        at a multiple of the elements between the projection's rows, its leaves' column blocks and the CTA's first
        units (an allocation aligned to a line assumed: another costs time, never a value)."""
        starts = [self.a.xp.shape[-1], self.H, self.c.units_per_cta] + [self.xp_column(leaf, 0) for leaf in leaves]
        steps = [int(x) if isinstance(x, int | tirx.IntImm) else 1 for x in starts]  # a runtime column: any element
        size = itemsize(str(self.a.xp.dtype))
        return lines_covering(self.c.units_per_cta * size, math.gcd(*steps) * size, self.XP_PREFETCH_EARLY_BYTES)

    def prefetch_sectors(self, t):
        """Step ``t``'s input projection that the CTA's items of the part being emitted read, asked into L2 (unless
        ``t`` is past the steps): thread ``i`` of the first ``XP_PREFETCH_EARLY_WARPS`` warps asks for sector ``i`` (in
        turns, where there are more): segment ``i // per_segment`` (:meth:`sector_address`), its
        ``i % per_segment``-th line."""
        leaves = self.early_leaves()
        if not leaves or self.a.xp is None:
            return
        per_segment = self.sectors_per_segment(leaves)
        n = self.B * len(leaves) * per_segment
        with T.If(t < self.steps):
            with T.Then():
                lanes = min(WARP * self.XP_PREFETCH_EARLY_WARPS, self.g.threads)
                for k in range(ceil_div(n, lanes)):
                    with T.If(self.tx < min(lanes, n - k * lanes)):
                        with T.Then():
                            i = self.tx + k * lanes if k else self.tx
                            address = self.sector_address(t, i // per_segment, i % per_segment, leaves, per_segment)
                            T.evaluate(prefetch_l2(address))

    def sector_address(self, t, seg, line, leaves: list, per_segment: int):
        """An address in line ``line`` of segment ``seg`` of step ``t``'s projection (the segment's last element
        where ``per_segment`` lines reach past it): batch row ``seg // len(leaves)``, the CTA's units of leaf
        ``seg % len(leaves)``."""
        leaf_at, b, U = seg % len(leaves), seg // len(leaves), self.c.units_per_cta
        first = self.cta * U
        backwards = [lf.slice in self.p.reversed_slices for lf in leaves]
        timing = StepTiming(self.p, self.a, t, self.a.lengths[b] if self.a.lengths is not None and any(backwards)
                            else None)

        def of_leaf(value_of):  # leaf_at's value, a chain of selects
            value = value_of(leaves[-1])
            for i in range(len(leaves) - 2, -1, -1):
                value = T.if_then_else(leaf_at == i, value_of(leaves[i]), value)
            return value

        slices = [lf.slice for lf in leaves]
        mixed = any(backwards) and not all(backwards)  # a step of its own for each direction's leaves
        step = of_leaf(lambda lf: timing.input_step(lf.slice)) if mixed else timing.input_step(slices[0])
        if slices == list(range(slices[0], slices[0] + len(slices))):  # one input's slices, in a run
            column = self.xp_column(dataclasses.replace(leaves[0], slice=slices[0] + leaf_at), first)
        else:
            column = of_leaf(lambda lf: self.xp_column(lf, first))
        size = itemsize(str(self.a.xp.dtype))
        per_line = self.XP_PREFETCH_EARLY_BYTES // size
        if per_segment > 1:  # past the first line: clamped to the segment (the last CTA's units where the heads end)
            units = U if self.H % U == 0 else T.min(U, self.H - first)
            past = per_segment * self.XP_PREFETCH_EARLY_BYTES > U * size or self.H % U
            column = column + (T.min(line * per_line, units - 1) if past else line * per_line)
        return T.address_of(self.a.xp[step, b, column])

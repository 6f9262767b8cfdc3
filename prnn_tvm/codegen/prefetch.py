"""Cache prefetches for the generated kernels: a hint that a global word will be read soon, no value returned.

``prefetch.global.L2`` asks the line holding an address into L2 and returns at once (the thread waits for
nothing); the persistent tensor-core template issues it for the input projection a thread reads two steps
later (``schedules.persistent_cuda``, ``PersistentBuilder.inputs_prefetched``); ``prefetch.global.L1`` the persistent
float32 template issues for the weights it streams from L2 (``schedules.persistent_weights``).
The block kernels ask the projection a CTA will read some steps on into L2 from one warp, a lane a sector or line
of each contiguous run of it (``schedules.persistent_xp_sectors``; :func:`lines_covering` counts them).
"""

from __future__ import annotations

import math

from tvm.script.ir_builder import tirx as T

_SOURCE = r"""
#ifndef PRNN_PREFETCH_{level}
#define PRNN_PREFETCH_{level}
__device__ __forceinline__ void prnn_prefetch_{name}(const void* p) {{
  asm volatile("prefetch.global.{level} [%0];" :: "l"(p));
}}
#endif
"""


def prefetch(address, level: str):
    """A statement-level call asking the line at ``address`` (a global pointer, ``T.address_of(buf[...])``) into
    cache ``level`` (``"L1"`` or ``"L2"``): emit it with ``T.evaluate``."""
    name = level.lower()
    return T.cuda.func_call(f"prnn_prefetch_{name}", address, source_code=_SOURCE.format(level=level, name=name),
                            return_type="void")


def prefetch_l2(address):
    """:func:`prefetch` into L2."""
    return prefetch(address, "L2")


def lines_covering(nbytes: int, alignment: int, line: int) -> int:
    """The most ``line``-byte lines (aligned to ``line``) a run of ``nbytes`` bytes touches where it starts at a
    multiple of ``alignment`` bytes: one prefetch each asks the whole run into the cache."""
    step = math.gcd(alignment, line)  # the offsets within a line the run can start at
    return max(-(-(offset + nbytes) // line) for offset in range(0, line, step))

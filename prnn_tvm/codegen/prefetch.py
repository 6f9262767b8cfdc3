"""Cache prefetches for the generated kernels: a hint that a global word will be read soon, no value returned.

``prefetch.global.L2`` asks the line holding an address into L2 and returns at once (the thread waits for
nothing); the persistent tensor-core template issues it for the input projection a thread reads two steps
later (``schedules.persistent_cuda``, ``PersistentBuilder.inputs_prefetched``); ``prefetch.global.L1`` the persistent
float32 template issues for the weights it streams from L2 (``schedules.persistent_weights``).
"""

from __future__ import annotations

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

"""Cache prefetches for the generated kernels: a hint that a global word will be read soon, no value returned.

``prefetch.global.L2`` asks the line holding an address into L2 and returns at once (the thread waits for
nothing); the persistent tensor-core template issues it for the input projection a thread reads two steps
later (``schedules.persistent_cuda``, ``PersistentBuilder.inputs_prefetched``).
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

_L2_SOURCE = r"""
#ifndef PRNN_PREFETCH_L2
#define PRNN_PREFETCH_L2
__device__ __forceinline__ void prnn_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
#endif
"""


def prefetch_l2(address):
    """A statement-level call asking the line at ``address`` (a global pointer, ``T.address_of(buf[...])``) into
    L2: emit it with ``T.evaluate``."""
    return T.cuda.func_call("prnn_prefetch_l2", address, source_code=_L2_SOURCE, return_type="void")

"""Cache prefetches for the generated kernels: a hint that a global word will be read soon, no value returned.

``prefetch.global.L2`` asks the line holding an address into L2 and returns at once (the thread waits for
nothing); the persistent tensor-core template issues it for the input projection a thread reads two steps
later (``schedules.persistent_cuda``, ``PersistentBuilder.inputs_prefetched``); ``prefetch.global.L1`` the persistent
float32 template issues for the weights it streams from L2 (``schedules.persistent_weights``).
``cp.async.bulk.prefetch.L2`` (sm_90 and newer) asks a whole run of bytes into L2 in one instruction: the block
kernels issue one per contiguous run of the projection a CTA will read some steps on
(``PersistentBuilder.prefetch_segments``).
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


# The 16-byte granules holding [p, p + bytes) (the bulk prefetch's address and size must be multiples of 16; a granule
# holding a byte of an allocation lies in its page); before sm_90, one ``prefetch.global.L2`` per 128-byte line.
_BULK_SOURCE = r"""
#ifndef PRNN_PREFETCH_L2_BULK
#define PRNN_PREFETCH_L2_BULK
__device__ __forceinline__ void prnn_prefetch_l2_bulk(const void* p, unsigned int bytes) {
  unsigned long long lo = (unsigned long long)p & ~15ull;
  unsigned int size = (unsigned int)((((unsigned long long)p + bytes + 15ull) & ~15ull) - lo);
#if __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(lo), "r"(size));
#else
  for (unsigned int at = 0; at < size; at += 128) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(lo + at));
  }
#endif
}
#endif
"""


def prefetch_l2_bulk(address, nbytes):
    """A statement-level call asking the ``nbytes`` bytes from ``address`` (a global pointer) into L2 with one
    instruction (sm_90 and newer; before, one :func:`prefetch_l2` per line): emit it with ``T.evaluate``."""
    return T.cuda.func_call("prnn_prefetch_l2_bulk", address, nbytes, source_code=_BULK_SOURCE, return_type="void")

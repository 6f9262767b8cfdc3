"""One copy of a step's gate gradients shared by the CTAs of a thread-block cluster (sm_90+): the tensor-core
backward's ``cluster`` knob (``backward_mma``).

Each CTA of a cluster of ``c`` fetches ``1/c`` of every batch row of the gate gradients (whole 16-byte granules)
from L2 with TMA's bulk copy, multicast into the same place in every CTA's shared tile
(``cp.async.bulk...multicast::cluster``), each copy completing on each receiving CTA's mbarrier by its bytes
(``complete_tx``): the grid reads each pass's gate gradients once per cluster, not once per CTA.

The protocol, per CTA: its mbarrier (one arrival) is armed with the bytes of the next pass (``arrive.expect_tx``)
once the previous pass has landed, before this CTA arrives at the grid barrier that precedes the next pass; the
peers' multicasts, issued after that grid barrier, therefore find it armed (and a ``complete_tx`` that came first
would only take the transaction count below zero: the phase cannot complete before the arrival anyway). A thread
waits for the phase's parity. Every pass completes exactly one phase, so the parity flips each pass. With
``copy_stages`` 1 each k group's columns land on an mbarrier of their own, which only that k group's warp waits for
(and its lane 0 re-arms): a warp multiplies its columns while the others' land.

Memory ordering:

- The gate gradients were written by generic stores of every CTA and published by the grid barrier (release by
  the writers, acquire by this CTA's thread 0, then a block barrier). The bulk copy reads them through the async
  proxy, which those generic writes are not ordered with by the barrier alone: the PTX memory model asks for a
  proxy fence between a generic-proxy access and an async-proxy access to the same memory, so each issuing thread
  runs ``fence.proxy.async.global`` after the barrier and before its copy.
- The other way, each thread runs ``fence.proxy.async.shared::cta`` after its products' last reads of the shared
  tile (generic proxy) and before the block barrier and the grid barrier that precede the peers' next multicast
  into that tile (async proxy): the reads are ordered before those writes.
- The mbarrier's initialization is made visible to the cluster (``fence.mbarrier_init.release.cluster``) and every
  CTA of the cluster meets at a cluster barrier before any peer may signal it.
- Before exit the cluster meets again: no CTA leaves while a peer could still write into its shared memory.

A CTA that gives up (the grid barrier's error word is set, or its own wait ran past the timeout: it records it
there, as the grid barrier does) leaves the time loop as a barrier timeout does, so a peer that stopped issuing
its share never hangs the others.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.barriers.source import cuda_source

CLUSTERS = (1, 2, 4, 8)  # ``cluster``: 1 is no cluster; at most 8, the portable cluster size
GRANULE = 16  # bytes: the bulk copy's size and addresses are multiples of it

_SOURCE = r"""
#ifndef PRNN_CLUSTER_COPY
#define PRNN_CLUSTER_COPY
__device__ __forceinline__ unsigned prnn_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// One arrival (the arming thread's); the peers' multicasts complete_tx on it: the init made visible to the cluster
// (the cluster barrier that follows, prnn_cluster_sync, orders it before any peer's copy).
__device__ __forceinline__ void prnn_mbar_init(void* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(prnn_smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// The arming thread's arrival, expecting the next pass's bytes from every CTA of the cluster.
__device__ __forceinline__ void prnn_mbar_arm(void* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(prnn_smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ unsigned prnn_mbar_done(void* bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(prnn_smem_addr(bar)), "r"(parity) : "memory");
  return done;
}
__device__ __forceinline__ void prnn_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// BYTES bytes from global src into shared dst of every CTA of a cluster of CLUSTER (the same offset in each),
// completing on each one's mbarrier at bar. The fence: src was written by generic stores (other CTAs', published
// by the grid barrier this thread's CTA passed); the bulk copy reads it through the async proxy.
template <int CLUSTER>
__device__ __forceinline__ void prnn_cluster_copy(void* dst, const void* src, unsigned bytes, void* bar) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
               "[%0], [%1], %2, [%3], %4;"
               :: "r"(prnn_smem_addr(dst)), "l"(src), "r"(bytes), "r"(prnn_smem_addr(bar)),
                  "h"((unsigned short)((1u << CLUSTER) - 1u)) : "memory");
}
// This thread's reads of the shared tile (generic proxy) before the peers' next multicast into it (async proxy).
__device__ __forceinline__ void prnn_cluster_reads_done() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The pass of this parity landed: thread 0 waits, bounded as the grid barrier's waits are (prnn_give_up: the error
// word set by any block, or this wait past timeout_us, recorded as step), then every thread observes the completed
// phase itself (its own acquire of the copied bytes). 1: give up, as a barrier timeout does.
__device__ __forceinline__ int prnn_cluster_wait(void* bar, unsigned parity, unsigned* sync, int step, int timeout_us) {
  __shared__ int prnn_copy_abort;
  if (threadIdx.x == 0) {
    const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
    int abort = 0;
    for (unsigned polls = 1; !prnn_mbar_done(bar, parity); ++polls) {
      if (polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step, start, limit)) {
        abort = 1;
        break;
      }
    }
    prnn_copy_abort = abort;
  }
  __syncthreads();
  const int abort = prnn_copy_abort;
  if (!abort) {
    while (!prnn_mbar_done(bar, parity)) {
    }
  }
  return abort;
}
// The same for one warp, waiting for its own columns' mbarrier (lane 0 waits, bounded; then every lane observes the
// phase itself). Giving up sets *abort_flag (shared) for the block, which leaves the time loop after the products'
// block barrier: no warp leaves alone.
__device__ __forceinline__ void prnn_cluster_wait_warp(void* bar, unsigned parity, unsigned* sync, int step,
                                                       int timeout_us, int* abort_flag) {
  int abort = 0;
  if ((threadIdx.x & 31) == 0) {
    const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
    for (unsigned polls = 1; !prnn_mbar_done(bar, parity); ++polls) {
      if (polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step, start, limit)) {
        abort = 1;
        break;
      }
    }
  }
  abort = __shfl_sync(0xffffffffu, abort, 0);
  if (abort) {
    if ((threadIdx.x & 31) == 0) *(volatile int*)abort_flag = 1;
    return;
  }
  while (!prnn_mbar_done(bar, parity)) {
  }
}
#endif
"""


def source() -> str:
    """The device functions, after the barriers' common ones they use (``prnn_globaltimer``, ``prnn_give_up``)."""
    return cuda_source("common.cuh") + _SOURCE


def _call(name: str, *args, return_type: str = "void"):
    return T.cuda.func_call(name, *args, source_code=source(), return_type=return_type)


def share(granules, cluster: int, rank) -> tuple:
    """The first granule and the number of granules of a range of ``granules`` that CTA ``rank`` of a cluster
    fetches: ``[rank * n // cluster, (rank + 1) * n // cluster)``, none where ``n`` is less than the cluster."""
    first = rank * granules // cluster
    return first, (rank + 1) * granules // cluster - first


def begin(mbars, parity, bytes_of: list, tx, abort=None) -> None:
    """In the prologue, every thread: thread 0 initializes each mbarrier and arms it for the first pass (mbarrier
    ``i``: ``bytes_of[i]``), and clears the block's abort flag (``abort``, where warps wait alone); the parity
    starts at 0; the cluster meets (the inits visible to every peer before any copy)."""
    with T.If(tx == 0):
        with T.Then():
            for i, nbytes in enumerate(bytes_of):
                T.evaluate(_call("prnn_mbar_init", T.address_of(mbars[i])))
                arm(mbars, i, nbytes)
            if abort is not None:
                T.buffer_store(abort, tirx.const(0, "int32"), [0])
    T.buffer_store(parity, tirx.const(0, "int32"), [0])
    sync()


def arm(mbars, i, nbytes) -> None:
    """The arming thread's arrival on mbarrier ``i``, expecting ``nbytes`` of the next pass."""
    T.evaluate(_call("prnn_mbar_arm", T.address_of(mbars[i]), T.Cast("uint32", nbytes)))


def copy(cluster: int, dst, src, nbytes, mbar) -> None:
    """One thread's bulk copy of ``nbytes`` from ``src`` to ``dst`` (addresses) multicast to the cluster, landing
    on mbarrier ``mbar`` (an address) of each CTA."""
    T.evaluate(_call(f"prnn_cluster_copy<{cluster}>", dst, src, T.Cast("uint32", nbytes), mbar))


def wait(mbars, parity, sync_args, step, bytes_per_pass: int, tx) -> None:
    """Every thread: the pass landed (else leave the time loop, as a barrier timeout does), the parity flipped, and
    thread 0 arms the mbarrier for the next pass (before this CTA reaches the grid barrier that precedes it)."""
    done = _call("prnn_cluster_wait", T.address_of(mbars[0]), T.Cast("uint32", parity[0]), sync_args.sync.data,
                 step, sync_args.timeout_us, return_type="int32")
    abort = T.bind(done, var=tirx.Var("copy_abort", "int32"))
    with T.If(abort != 0):
        with T.Then():
            T.Break()
    T.buffer_store(parity, parity[0] ^ 1, [0])
    with T.If(tx == 0):
        with T.Then():
            arm(mbars, 0, bytes_per_pass)


def wait_warp(mbars, i, parity, sync_args, step, abort, nbytes, lane) -> None:
    """Every lane of a warp: its own columns (mbarrier ``i``) landed, else the block's ``abort`` flag set (see
    :func:`leave_if_aborted`); lane 0 arms mbarrier ``i`` for the next pass (``nbytes``)."""
    T.evaluate(_call("prnn_cluster_wait_warp", T.address_of(mbars[i]), T.Cast("uint32", parity[0]),
                     sync_args.sync.data, step, sync_args.timeout_us, T.address_of(abort[0])))
    with T.If(lane == 0):
        with T.Then():
            arm(mbars, i, nbytes)


def leave_if_aborted(abort, parity) -> None:
    """Every thread, after the block barrier that ends a pass whose warps waited alone: leave the time loop where
    one gave up, else flip the parity."""
    with T.If(abort[0] != 0):
        with T.Then():
            T.Break()
    T.buffer_store(parity, parity[0] ^ 1, [0])


def reads_done() -> None:
    """Every thread, after its last read of the shared tile in a pass (see the module's note on ordering)."""
    T.evaluate(_call("prnn_cluster_reads_done"))


def sync() -> None:
    """Every thread of every CTA of the cluster meets (release / acquire at cluster scope)."""
    T.evaluate(_call("prnn_cluster_sync"))

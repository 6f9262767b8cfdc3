#include "common.cuh"
#ifndef PRNN_BARRIER_COUNTER
#define PRNN_BARRIER_COUNTER
// One monotonic arrival counter: thread 0 adds with a release reduction and polls it.
__device__ __forceinline__ int prnn_barrier_counter(unsigned* sync, int base, int step, int timeout_us,
                                                 int stall_step) {
  __shared__ int prnn_abort;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (!(blockIdx.x == 0 && step == stall_step)) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync + 1) : "memory");
    }
    const unsigned target = ((unsigned)base + (unsigned)step + 1u) * gridDim.x;
    prnn_abort = prnn_wait_geq(sync + 1, target, sync, step, (unsigned long long)timeout_us * 1000ull,
                               prnn_globaltimer());
  }
  __syncthreads();
  return prnn_abort;
}
#endif

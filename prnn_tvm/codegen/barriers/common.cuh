#ifndef PRNN_BARRIER_COMMON
#define PRNN_BARRIER_COMMON
__device__ __forceinline__ unsigned prnn_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned prnn_ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long prnn_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Before poll number POLLS of a data-carried wait: with SLEEP_NS > 0, from the second poll on, sleep about
// SLEEP_NS nanoseconds (__nanosleep: sm_70+; the hardware picks a time up to twice it). Fewer polls of the
// same lines leave the L2 to the stores being waited for; each costs up to the sleep in latency.
template <int SLEEP_NS>
__device__ __forceinline__ void prnn_poll_pause(unsigned polls) {
#if __CUDA_ARCH__ >= 700
  if (SLEEP_NS > 0 && polls > 1) __nanosleep(SLEEP_NS);
#endif
}
// Barriers (or steps) all earlier launches passed, read once by every thread at the start (volatile:
// a plain load may be repeated later, when the last block out may have moved the base on).
__device__ __forceinline__ int prnn_barrier_begin(const unsigned* sync) { return (int)prnn_ld_relaxed(sync + 2); }
// The last block to leave records this launch's barriers in the base: each block counts itself out in
// word 3 (release: after its threads read the base; acquire: the last one sees every count before it).
__device__ __forceinline__ void prnn_barrier_end(unsigned* sync, int base, int barriers) {
  if (threadIdx.x != 0) return;
  unsigned left;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(left) : "l"(sync + 3) : "memory");
  if (left == gridDim.x - 1) {
    sync[3] = 0u;
    sync[2] = (unsigned)base + (unsigned)barriers;
  }
}
// Every PRNN_CHECK_EVERY polls a waiter looks at the error word and the clock: checking on
// every poll would put a second round trip into each one.
#define PRNN_CHECK_EVERY 32
// 1 when this wait must give up: another block reported a timeout, or this one timed out
// (then it records 1 + step in the error word, first one wins).
__device__ __forceinline__ int prnn_give_up(unsigned* sync, int step, unsigned long long start,
                                            unsigned long long limit_ns) {
  if (prnn_ld_relaxed(sync) != 0u) return 1;
  if (prnn_globaltimer() - start > limit_ns) {
    atomicCAS(sync, 0u, (unsigned)step + 1u);
    return 1;
  }
  return 0;
}
// At the end of a launch: the error word (0, or 1 + the step that timed out). When it is set,
// thread 0 copies it to the host-mapped word at error_host (0: none) with a system-scope store.
__device__ __forceinline__ unsigned prnn_report(const unsigned* sync, unsigned long long error_host) {
  const unsigned error = prnn_ld_relaxed(sync);
  if (error != 0u && threadIdx.x == 0 && error_host != 0ull) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(error_host), "r"(error) : "memory");
  }
  return error;
}
// Poll *p until it reaches target (wrap-safe); 0 when reached, 1 when giving up.
__device__ __forceinline__ int prnn_wait_geq(const unsigned* p, unsigned target, unsigned* sync, int step,
                                             unsigned long long limit_ns, unsigned long long start) {
  for (unsigned polls = 1; (int)(prnn_ld_acquire(p) - target) < 0; ++polls) {
    if (polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step, start, limit_ns)) return 1;
  }
  return 0;
}
#endif

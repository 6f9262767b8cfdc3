#ifndef PRNN_XP_READY_CUH
#define PRNN_XP_READY_CUH
// The input projection's chunks arriving during the launch (schedules/xp_ready.py): ``flags`` (a device address, 0:
// the projection was complete before the launch) holds the call's epoch in word 0 and, in word 1 + k, the epoch of
// the last call whose chunk k of steps (``chunk`` steps each, numbered from step 0) was written, stored in stream
// order after that chunk's GEMM. Before the first load of a chunk's first step, a thread waits until the chunk's word
// holds the call's epoch: an acquire load, bounded by ``timeout_us`` (%globaltimer, looked at every 64 polls). A wait
// that gives up copies 1 + the step to ``error_host`` (a word of page-locked host memory, 0: none) and returns it;
// ``gave_up`` set (1 + the step whose wait gave up), nothing is waited for again. Returns the new ``gave_up``.
__device__ __forceinline__ int prnn_xp_wait(long long flags, int chunk, int step, int timeout_us,
                                            long long error_host, int gave_up) {
  if (flags == 0 || gave_up || chunk <= 0 || step <= 0 || step % chunk != 0) return gave_up;
  const unsigned int* words = (const unsigned int*)flags;
  const unsigned int epoch = *(volatile const unsigned int*)words;
  const unsigned int* word = words + 1 + step / chunk;
  unsigned long long start = 0;
  for (unsigned int polls = 0;; ++polls) {
    unsigned int seen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    if (seen == epoch) return 0;
    if ((polls & 63u) == 0) {
      unsigned long long now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (polls == 0) {
        start = now;
      } else if (now - start > 1000ull * (unsigned long long)timeout_us) {
        if (error_host) *(volatile unsigned int*)error_host = 1u + (unsigned int)step;
        return 1 + step;
      }
    }
    __nanosleep(64);
  }
}
#endif

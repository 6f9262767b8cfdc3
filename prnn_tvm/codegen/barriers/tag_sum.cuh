#include "tags.cuh"
#ifndef PRNN_TAG_SUM
#define PRNN_TAG_SUM
// The sum of n tagged float values over a group of LANES lanes (a power of two dividing 32; a warp holds 32 / LANES
// groups, each with its own src, n and dst): lane g of the group takes src[g + LANES j] (j < PER) and polls until
// every tag is the one written at step - 1, adds its values in j order, then the group's lanes' sums meet through
// xor shuffles, so every lane of the group, and every block that reads the same values, gets the same total; the
// group's lane 0 stores it to *dst (n > 0). Every lane of the warp calls it (n = 0: a group with nothing to add).
// Returns 1 in every lane of the warp if a wait timed out or another block reported one (*dst is then not written).
template <int PER, int LANES>
__device__ __forceinline__ int prnn_tag_sum(const uint64_t* src, float* dst, int n, int base, int step,
                                            unsigned* sync, int timeout_us) {
  static_assert(PER <= 32 && LANES <= 32 && 32 % LANES == 0, "stale bits, lane groups");
  const unsigned tag = (unsigned)base + (unsigned)step;  // written at step - 1
  const int g = threadIdx.x % LANES;
  uint64_t v[PER];
  unsigned stale = 0;  // bit j: value j still carries an older tag; only those are polled again
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v[j] = 0;  // a value past n adds +0
    stale |= (g + j * LANES < n ? 1u : 0u) << j;
  }
  int failed = 0;
  const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
  for (unsigned polls = 1; stale; ++polls) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (stale & (1u << j)) {
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[j]) : "l"(src + g + j * LANES) : "memory");
      }
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if ((stale & (1u << j)) && (unsigned)(v[j] >> 32) == tag) stale &= ~(1u << j);
    }
    if (stale && polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step - 1, start, limit)) {
      failed = 1;
      break;
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < PER; ++j) sum += prnn_from_payload<float>((unsigned)v[j]);
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) failed |= __shfl_xor_sync(0xffffffffu, failed, offset);
  if (g == 0 && n > 0 && !failed) *dst = sum;
  return failed;
}
#endif

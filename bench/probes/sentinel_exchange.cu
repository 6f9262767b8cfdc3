// Probe: exchanging a B x H half state between steps without a barrier, as cuDNN's persistent LSTM does
// (its SASS has no atomics and no fences, only 16-byte strong loads: bench/results/exchange-probes-h100.md):
// every step writes into a slot of its own of a T-slot buffer, which starts filled with a sentinel value no
// step writes (here the half NaN 0xffff); a reader polls the whole slot with 16-byte relaxed loads until no
// element is the sentinel. Each value is its own flag, 2 bytes a value (the project's `tags` moves 8), and
// a slot is never written twice in a launch, so no tag and no reset are needed. Against plain stores + the
// project's counter barrier + 16-byte loads. CTAs x 256 threads, each CTA publishes its H / CTAs units of
// every row and copies the whole tile into shared memory each step; values are checked. The sentinel fill
// of the whole buffer (a memset before the launch) is inside the timed region. Variants: a back-off of 64 ns
// between polls; two polls in flight 100 ns apart after a first miss (staggered_poll); each CTA's values
// published as 16-byte stores of eight values (one store per 16 B instead of one per value); each value
// published into R = 2 or 4 replicas of the slot, CTA c polling replica c % R (a line polled by 1/R of the
// CTAs; the fill covers the replicas).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o sentinel_exchange sentinel_exchange.cu
//   ./sentinel_exchange
//
// H100 figures: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "state_exchange.cuh"
constexpr int THREADS = 256;


// MODE 4: after a first poll that finds the sentinel, two polls in flight at once, the second issued 100 ns after
// the first (half an L2 round trip under this load), each issued again as soon as it is checked: a value that
// lands is seen within about half a round trip instead of a whole one. Returns the loads still stale (none).
template <int PER, int N16>
__device__ __forceinline__ unsigned staggered_poll(const __half* slot, uint4* v, unsigned stale) {
  uint4 w[PER];
  const uint4* at = (const uint4*)slot + threadIdx.x;
#pragma unroll
  for (int j = 0; j < PER; ++j) if (stale & (1u << j)) v[j] = ld_relaxed_16(at + j * THREADS);
#pragma unroll
  for (int j = 0; j < PER; ++j) if ((stale & (1u << j)) && !has_sentinel(v[j])) stale &= ~(1u << j);
  if (!stale) return 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) if (stale & (1u << j)) w[j] = ld_relaxed_16(at + j * THREADS);
  __nanosleep(100);
#pragma unroll
  for (int j = 0; j < PER; ++j) if (stale & (1u << j)) v[j] = ld_relaxed_16(at + j * THREADS);
  unsigned from_w = 0;
  while (true) {  // check the older set, issue it again, then the same for the other
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if ((stale & (1u << j)) && !has_sentinel(w[j])) { stale &= ~(1u << j); from_w |= 1u << j; }
    if (!stale) break;
#pragma unroll
    for (int j = 0; j < PER; ++j) if (stale & (1u << j)) w[j] = ld_relaxed_16(at + j * THREADS);
#pragma unroll
    for (int j = 0; j < PER; ++j) if ((stale & (1u << j)) && !has_sentinel(v[j])) stale &= ~(1u << j);
    if (!stale) break;
#pragma unroll
    for (int j = 0; j < PER; ++j) if (stale & (1u << j)) v[j] = ld_relaxed_16(at + j * THREADS);
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) if (from_w & (1u << j)) v[j] = w[j];
  return 0;
}

// MODE 6 and 7: the slot in 2 and 4 replicas.
__host__ __device__ constexpr int replicas(int mode) { return mode == 6 ? 2 : mode == 7 ? 4 : 1; }

template <int MODE, int B, int H>
__global__ void __launch_bounds__(THREADS) k(unsigned* cnt, __half* ws, int steps, unsigned* bad) {
  extern __shared__ __half tile[];  // B rows of H (+8) halves
  constexpr int N16 = B * H / 8, PER = (N16 + THREADS - 1) / THREADS;
  const int U = H / gridDim.x;
  unsigned wrong = 0;
  for (int t = 0; t < steps; ++t) {
    if constexpr (MODE == 0) {
      counter_exchange<B, H, THREADS>(cnt, ws, tile, t);
    } else if constexpr (MODE == 3) {  // the project's tags: one half per tagged 64-bit word
      tags_exchange<1, B, H, THREADS>((uint64_t*)ws, tile, t);
    } else {  // the sentinel: slot t of the T-slot buffer, strong stores, 16-byte relaxed polls
      constexpr int R = replicas(MODE);
      __half* slot = ws + ((size_t)t * R + blockIdx.x % R) * B * H;  // the replica this CTA polls
      if (R > 1) {  // every replica gets every value
        for (int i = threadIdx.x; i < U * B * R; i += THREADS) {
          const int r = i / (U * B), b = i % (U * B) / U, u = blockIdx.x * U + i % U;
          asm volatile("st.relaxed.gpu.global.b16 [%0], %1;" :: "l"(ws + ((size_t)t * R + r) * B * H + b * H + u),
                       "h"(__half_as_ushort(probe_value(u, b, t))) : "memory");
        }
      } else if (MODE == 5 && U % 8 == 0) {  // eight values a thread, one 16-byte store
        for (int i = threadIdx.x; i < U / 8 * B; i += THREADS) {
          const int b = i / (U / 8), u = blockIdx.x * U + i % (U / 8) * 8;
          unsigned w[4];
#pragma unroll
          for (int e = 0; e < 4; ++e)
            w[e] = __half_as_ushort(probe_value(u + 2 * e, b, t)) |
                   (unsigned)__half_as_ushort(probe_value(u + 2 * e + 1, b, t)) << 16;
          asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(slot + b * H + u),
                       "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
        }
      } else {
        for (int i = threadIdx.x; i < U * B; i += THREADS) {
          const int b = i / U, u = blockIdx.x * U + i % U;
          asm volatile("st.relaxed.gpu.global.b16 [%0], %1;" :: "l"(slot + b * H + u),
                       "h"(__half_as_ushort(probe_value(u, b, t))) : "memory");
        }
      }
      uint4 v[PER];
      unsigned stale = own_loads<PER, THREADS, N16>();
      if (MODE == 4) stale = staggered_poll<PER, N16>(slot, v, stale);
      poll_until_fresh<PER, THREADS>(slot, v, stale, MODE == 2 ? 64 : 0);  // 2: back off, fewer requests in the L2
      copy_to_tile<PER, THREADS, N16, H>(tile, v);
    }
    __syncthreads();
    wrong += wrong_values<B, H, THREADS>(tile, t);
    __syncthreads();
  }
  if (wrong) atomicAdd(bad, wrong);
}

template <int MODE, int B, int H>
void run(int ctas, int steps) {
  constexpr bool SENTINEL = MODE == 1 || MODE == 2 || MODE >= 4;
  const size_t slots = SENTINEL ? (size_t)steps * replicas(MODE) : 2;
  const size_t bytes = slots * B * H * (MODE == 3 ? 8 : sizeof(__half));
  unsigned *cnt, *bad; __half* ws;
  CK(cudaMalloc(&cnt, 4)); CK(cudaMalloc(&bad, 4)); CK(cudaMalloc(&ws, bytes));
  // the sentinel fill (for the counter, nothing it needs) is part of each timed launch
  const float best = best_launch_ms<B, H>(k<MODE, B, H>, ctas, THREADS, cnt, ws, bytes, true, steps, bad);
  const char* names[] = {"counter", "sentinel", "sentinel+backoff", "tags", "sentinel+stagger", "sentinel+st16",
                         "sentinel x2", "sentinel x4"};
  printf("%-16s B=%2d H=%4d CTAs=%3d  %.3f us/step\n", names[MODE], B, H, ctas, best * 1000.f / steps);
  cudaFree(cnt); cudaFree(bad); cudaFree(ws);
}
template <int B, int H> void sweep(int steps) {
  for (int ctas = H / 16; ctas <= 128 && ctas <= H; ctas *= 2) {
    run<0, B, H>(ctas, steps); run<1, B, H>(ctas, steps); run<2, B, H>(ctas, steps); run<4, B, H>(ctas, steps);
    run<5, B, H>(ctas, steps); run<6, B, H>(ctas, steps); run<7, B, H>(ctas, steps);
    if constexpr (B * H / 2 / THREADS <= 32) run<3, B, H>(ctas, steps);
  }
}
int main() {
  const int steps = 2048;
  sweep<8, 256>(steps); sweep<16, 256>(steps); sweep<8, 512>(steps); sweep<16, 512>(steps);
  sweep<8, 1024>(steps); sweep<16, 1024>(steps); sweep<4, 1024>(steps);
  return 0;
}

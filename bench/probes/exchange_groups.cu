// Probe: G independent exchanges in one launch, each a group of C CTAs moving its own B x H half state (what
// `batch_groups` and a stack's layers do): how much do groups that never read each other's values slow each
// other down, and does a way of polling avoid it? Every CTA publishes its H / C units of its group's state
// with relaxed 16-bit stores and copies the whole state into shared memory each step; values are checked.
// Modes: the project's counter (a counter per group, then 16-byte loads); the sentinel exchange (a slot per
// step, each thread polling its 16-byte loads until none holds the sentinel, as `prnn_sentinel_copy`); the
// same with 128 ns between polls; polled by warp 0 alone, which copies the state for the block; and each
// thread waiting on its first load alone before it loads (and polls) the rest. The slots are filled with the
// sentinel before each launch, outside the timed region.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o exchange_groups exchange_groups.cu
//   ./exchange_groups
//
// H100 figures: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "state_exchange.cuh"
constexpr int THREADS = 256;

// grid_barrier (probe_common.cuh) over one group's counter
__device__ __forceinline__ void group_barrier(unsigned* cnt, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(cnt) : "memory");
    while ((int)(ld_acq(cnt) - target) < 0) {}
  }
  __syncthreads();
}

// MODE 0 counter; 1 sentinel (every thread polls its loads); 2 sentinel, 128 ns back-off; 3 sentinel polled
// by warp 0 alone (it copies the tile, the others wait at the block barrier); 4 sentinel, a thread polls its
// first load alone until it lands, then the rest. Group g's slots start at g * (slots per group).
template <int MODE, int B, int H, int G>
__global__ void __launch_bounds__(THREADS) k(unsigned* cnt, __half* ws, int steps, unsigned* bad) {
  extern __shared__ __half tile[];
  constexpr int STRIDE = H + 8, N16 = B * H / 8, PER = (N16 + THREADS - 1) / THREADS;
  const int C = gridDim.x / G, g = blockIdx.x / C, local = blockIdx.x % C, U = H / C;
  __half* mine = ws + (size_t)g * (MODE == 0 ? 2 : steps) * B * H;
  unsigned wrong = 0;
  for (int t = 0; t < steps; ++t) {
    __half* slot = mine + (size_t)(MODE == 0 ? (t & 1) : t) * B * H;
    for (int i = threadIdx.x; i < U * B; i += THREADS) {
      const int b = i / U, u = local * U + i % U;
      asm volatile("st.relaxed.gpu.global.b16 [%0], %1;" :: "l"(slot + b * H + u),
                   "h"(__half_as_ushort(probe_value(u, b, t))) : "memory");
    }
    if (MODE == 0) {
      group_barrier(cnt + g * 32, (unsigned)(t + 1) * C);  // a 128-byte line per group's counter
      for (int i = threadIdx.x; i < N16; i += THREADS)
        *(uint4*)&tile[(i * 8 / H) * STRIDE + (i * 8) % H] = ((const uint4*)slot)[i];
    } else if (MODE == 3) {
      constexpr int P3 = (N16 + 31) / 32;
      static_assert(P3 <= 32, "loads");
      if (threadIdx.x < 32) {
        uint4 v[P3];
        poll_until_fresh<P3, 32>(slot, v, own_loads<P3, 32, N16>());
        copy_to_tile<P3, 32, N16, H>(tile, v);
      }
    } else {
      uint4 v[PER];
      unsigned stale = own_loads<PER, THREADS, N16>();
      if (MODE == 4 && (stale & 1u)) {
        do v[0] = ld_relaxed_16((const uint4*)slot + threadIdx.x); while (has_sentinel(v[0]));
        stale &= ~1u;
      }
      poll_until_fresh<PER, THREADS>(slot, v, stale, MODE == 2 ? 128 : 0);
      copy_to_tile<PER, THREADS, N16, H>(tile, v);
    }
    __syncthreads();
    wrong += wrong_values<B, H, THREADS>(tile, t);
    __syncthreads();
  }
  if (wrong) atomicAdd(bad, wrong);
}

template <int MODE, int B, int H, int G>
void run(int C, int steps) {
  const size_t bytes = (size_t)G * (MODE == 0 ? 2 : steps) * B * H * 2;
  unsigned *cnt, *bad; __half* ws;
  CK(cudaMalloc(&cnt, 4096)); CK(cudaMalloc(&bad, 4)); CK(cudaMalloc(&ws, bytes));
  // a counter per group, 128 bytes apart; the sentinel fill outside the timed region
  const float best = best_launch_ms<B, H>(k<MODE, B, H, G>, G * C, THREADS, cnt, ws, bytes, false, steps, bad, 4096);
  const char* names[] = {"counter", "sentinel", "sentinel+sleep128", "sentinel, warp 0 polls", "sentinel, first load"};
  printf("%-24s B=%2d H=%4d %d group(s) of %3d CTAs  %.3f us/step\n", names[MODE], B, H, G, C, best * 1000.f / steps);
  cudaFree(cnt); cudaFree(bad); cudaFree(ws);
}
template <int B, int H, int G> void modes(int C, int steps) {
  run<0, B, H, G>(C, steps); run<1, B, H, G>(C, steps); run<2, B, H, G>(C, steps); run<3, B, H, G>(C, steps);
  run<4, B, H, G>(C, steps);
}
int main() {
  const int steps = 2048;
  modes<8, 512, 1>(32, steps); modes<8, 512, 2>(32, steps); modes<8, 512, 4>(32, steps);
  modes<4, 512, 1>(32, steps); modes<4, 512, 4>(32, steps);
  modes<8, 1024, 1>(64, steps); modes<8, 1024, 2>(64, steps);
  modes<8, 256, 1>(16, steps); modes<8, 256, 4>(16, steps); modes<8, 256, 8>(16, steps);
  return 0;
}

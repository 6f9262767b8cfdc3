// What the probes that move a B x H half state between steps share (tagged_pairs.cu, sentinel_exchange.cu,
// exchange_groups.cu):
// every CTA publishes its H / gridDim.x units of every row, the value (unit + b + t) & 1023, and copies the
// whole state into shared memory rows of H + 8 halves, which the probe then checks.
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include "probe_common.cuh"
#include "../../prnn_tvm/codegen/barriers/sentinel.cuh"  // the project's sentinel exchange: its loads and check

__device__ __forceinline__ __half probe_value(int unit, int b, int t) { return __int2half_rn((unit + b + t) & 1023); }

// Plain stores into slot t & 1 of ws, the counter grid barrier, 16-byte loads of the whole state.
template <int B, int H, int THREADS>
__device__ __forceinline__ void counter_exchange(unsigned* cnt, __half* ws, __half* tile, int t) {
  constexpr int STRIDE = H + 8, N16 = B * H / 8, PER = (N16 + THREADS - 1) / THREADS;
  const int U = H / gridDim.x;
  __half* slot = ws + (size_t)(t & 1) * B * H;
  for (int i = threadIdx.x; i < U * B; i += THREADS) {
    const int b = i / U, u = blockIdx.x * U + i % U;
    slot[b * H + u] = probe_value(u, b, t);
  }
  grid_barrier(cnt, (unsigned)(t + 1) * gridDim.x);
  uint4 v[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) { const int i = j * THREADS + threadIdx.x; if (i < N16) v[j] = ((const uint4*)slot)[i]; }
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = j * THREADS + threadIdx.x;
    if (i < N16) *(uint4*)&tile[(i * 8 / H) * STRIDE + (i * 8) % H] = v[j];
  }
}

// The project's `tags`: PACK halves (1, as the project moves them, or 2) beside the tag t + 1 in each 64-bit
// word of slot t & 1 of ws, relaxed stores; two words per volatile vector load, polled until every tag is current.
template <int PACK, int B, int H, int THREADS>
__device__ __forceinline__ void tags_exchange(uint64_t* ws, __half* tile, int t) {
  constexpr int STRIDE = H + 8, NW = B * H / PACK, PER = (NW / 2 + THREADS - 1) / THREADS;
  static_assert(PER <= 32, "too many");
  const int U = H / gridDim.x;
  uint64_t* slot = ws + (size_t)(t & 1) * B * H / PACK;
  const unsigned tag = t + 1;
  for (int i = threadIdx.x; i < U * B / PACK; i += THREADS) {
    const int b = i / (U / PACK), u = blockIdx.x * U + (i % (U / PACK)) * PACK;
    unsigned bits = __half_as_ushort(probe_value(u, b, t));
    if (PACK == 2) bits |= (unsigned)__half_as_ushort(probe_value(u + 1, b, t)) << 16;
    const unsigned long long word = ((unsigned long long)tag << 32) | bits;
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(slot + b * H / PACK + u / PACK), "l"(word) : "memory");
  }
  uint64_t v[PER][2];
  unsigned stale = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) stale |= ((j * THREADS + (int)threadIdx.x) * 2 < NW ? 1u : 0u) << j;
  while (stale) {
#pragma unroll
    for (int j = 0; j < PER; ++j) if (stale & (1u << j)) {
      const uint64_t* p = slot + (j * THREADS + threadIdx.x) * 2;
      asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v[j][0]), "=l"(v[j][1]) : "l"(p) : "memory");
    }
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if ((stale & (1u << j)) && (unsigned)(v[j][0] >> 32) == tag && (unsigned)(v[j][1] >> 32) == tag) stale &= ~(1u << j);
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int w = (j * THREADS + threadIdx.x) * 2;
    if (w < NW) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = (w + e) * PACK;
        if (PACK == 2) *(unsigned*)&tile[(i / H) * STRIDE + i % H] = (unsigned)v[j][e];
        else tile[(i / H) * STRIDE + i % H] = __ushort_as_half((unsigned short)v[j][e]);
      }
    }
  }
}

// The sentinel exchange (sentinel_exchange.cu, exchange_groups.cu): a slot per step filled with every bit set
// before the launch; a thread loads its 16-byte pieces of the state, load j the piece at j * LANES + threadIdx.x,
// with the project's relaxed load and sentinel check (prnn_tvm/codegen/barriers/sentinel.cuh).
__device__ __forceinline__ uint4 ld_relaxed_16(const void* p) {
  uint4 v;
  prnn_relaxed_load<16>(p, (unsigned*)&v);
  return v;
}
__device__ __forceinline__ bool has_sentinel(uint4 v) {  // any half of the 16 bytes is 0xffff
  return prnn_still_stale<__half, 4, 1>((const unsigned*)&v, 1u) != 0u;
}
// The loads this thread makes of a state of N16 pieces: bit j for load j.
template <int PER, int LANES, int N16>
__device__ __forceinline__ unsigned own_loads() {
  unsigned loads = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) loads |= (j * LANES + (int)threadIdx.x < N16 ? 1u : 0u) << j;
  return loads;
}
// Loads the pieces stale marks into v, round after round (sleep_ns apart after the first, 0: none), until none
// holds the sentinel.
template <int PER, int LANES>
__device__ __forceinline__ void poll_until_fresh(const __half* slot, uint4* v, unsigned stale, unsigned sleep_ns = 0) {
  for (bool first = true; stale; first = false) {
    if (sleep_ns && !first) __nanosleep(sleep_ns);
#pragma unroll
    for (int j = 0; j < PER; ++j)
      if (stale & (1u << j)) v[j] = ld_relaxed_16((const uint4*)slot + j * LANES + threadIdx.x);
    stale = prnn_still_stale<__half, 4, PER>((const unsigned*)v, stale);
  }
}
// This thread's pieces into the tile (rows of H + 8 halves).
template <int PER, int LANES, int N16, int H>
__device__ __forceinline__ void copy_to_tile(__half* tile, const uint4* v) {
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = j * LANES + threadIdx.x;
    if (i < N16) *(uint4*)&tile[(i * 8 / H) * (H + 8) + (i * 8) % H] = v[j];
  }
}
// After the block barrier that follows the copy: the values of every seventh element that are wrong.
template <int B, int H, int THREADS>
__device__ __forceinline__ unsigned wrong_values(const __half* tile, int t) {
  unsigned wrong = 0;
  for (int i = threadIdx.x; i < B * H; i += THREADS * 7) {
    const int b = i / H, u = i % H;
    if (__half2int_rn(tile[b * (H + 8) + u]) != ((u + b + t) & 1023)) ++wrong;
  }
  return wrong;
}

// Host side: kernel(cnt, ws, steps, bad) launched cooperatively on ctas x threads with the state tile's shared
// memory (B rows of H + 8 halves), 6 times, each after the cnt_bytes of cnt and bad are zeroed and the ws_bytes
// of ws filled with 0xff (inside the timed region where fill_timed: the sentinel fill is part of a step's cost).
// Prints each launch's wrong values; returns the milliseconds of the fastest of the last 5.
template <int B, int H, typename Kernel, typename Ws>
float best_launch_ms(Kernel kernel, int ctas, int threads, unsigned* cnt, Ws* ws, size_t ws_bytes, bool fill_timed,
                     int steps, unsigned* bad, size_t cnt_bytes = 4) {
  const int smem = B * (H + 8) * 2;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(ctas); cfg.blockDim = dim3(threads); cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute at; at.id = cudaLaunchAttributeCooperative; at.val.cooperative = 1; cfg.attrs = &at; cfg.numAttrs = 1;
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    CK(cudaMemset(cnt, 0, cnt_bytes)); CK(cudaMemset(bad, 0, 4));
    if (!fill_timed) CK(cudaMemset(ws, 0xff, ws_bytes));
    CK(cudaEventRecord(a));
    if (fill_timed) CK(cudaMemsetAsync(ws, 0xff, ws_bytes));
    CK(cudaLaunchKernelEx(&cfg, kernel, cnt, ws, steps, bad));
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep) best = ms < best ? ms : best;
    unsigned nbad; CK(cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost)); if (nbad) printf("  %u wrong\n", nbad);
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  return best;
}

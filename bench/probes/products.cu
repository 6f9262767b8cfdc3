// Probe: a batch tile's recurrent products as a persistent LSTM block at H=1024 runs them, timed alone on each
// block (no exchange): 64 rows (16 units x 4 gates) x 1024 k of half weights in registers times an N x 1024 half
// tile in shared memory, into float32 sums, then the k groups' partial sums reduced through shared memory (what
// precedes a block's pointwise math), ITERS times. Modes: mma.sync m16n8k16 (the project's template: 8 warps,
// each a k group of 128 with all four row tiles, B fragments by ldmatrix); Hopper's wgmma m64nNk16 with A from
// registers (2 warpgroups, each a k group of 512, B read by the tensor cores through a shared-memory descriptor:
// no swizzle, K-major core matrices, LBO the byte stride between core matrices along k, SBO along n); the same
// with four accumulator chains. Each mode also runs with the products alone and the reduction alone. The sums
// are checked against a float64 reference.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o products products.cu
//   ./products
//
// H100 figures: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "probe_common.cuh"

constexpr int THREADS = 256, ROWS = 64, K = 1024, ITERS = 2048;

// the tile in shared memory as core matrices (8 rows of 16 bytes, 128 contiguous bytes): value (n, k) at byte
// (k / 8 * NB + n / 8) * 128 + n % 8 * 16 + k % 8 * 2, NB = N / 8
template <int N> __host__ __device__ constexpr int tile_offset(int n, int k) {
  return (k / 8 * (N / 8) + n / 8) * 128 + n % 8 * 16 + k % 8 * 2;
}
__device__ __forceinline__ uint64_t descriptor(const void* smem, unsigned lbo, unsigned sbo) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
  return (uint64_t)((a >> 4) & 0x3FFF) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);  // bits 62-63: 0, no swizzle
}
// the A fragment of rows r0..r0+15, k0..k0+15 (mma.m16n8k16's layout, also each warp's share of wgmma's)
__device__ __forceinline__ void a_fragment(const __half* W, int r0, int k0, unsigned* a) {
  const int lane = threadIdx.x % 32, r = r0 + lane / 4, k = k0 + lane % 4 * 2;
  a[0] = *(const unsigned*)&W[r * K + k];
  a[1] = *(const unsigned*)&W[(r + 8) * K + k];
  a[2] = *(const unsigned*)&W[r * K + k + 8];
  a[3] = *(const unsigned*)&W[(r + 8) * K + k + 8];
}

// MODE 0: mma.sync, 8 k groups of 128. MODE 1: wgmma, 2 k groups of 512. MODE 2: the same, k step s adding into
// accumulator s % 4.
template <int MODE, int N, int PARTS>  // PARTS: 3 products and reduction, 1 products only, 2 reduction only
__global__ void __launch_bounds__(THREADS, 1) k(const __half* W, const __half* X, float* out, long long* cycles) {
  extern __shared__ __align__(128) unsigned char smem[];
  // smem: the N x K tile as core matrices (tile_offset), then the partial sums
  float* gs = (float*)(smem + N * K * 2);                       // partial sums: [k group][row][n]
  float* sums = gs + 8 * ROWS * N;                              // [row][n]
  for (int i = threadIdx.x; i < N * K; i += THREADS) {
    const int n = i / K, kk = i % K;
    *(__half*)(smem + tile_offset<N>(n, kk)) = X[i];
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int GROUPS = MODE == 0 ? 8 : 2, KSTEPS = K / 16 / GROUPS, MT = MODE == 0 ? 4 : 1;
  unsigned a[MT * KSTEPS][4];
  if (MODE == 0) {  // warp = k group; every row tile
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) a_fragment(W, m * 16, (warp * KSTEPS + s) * 16, a[m * KSTEPS + s]);
  } else {  // warpgroup = k group; warp w of it: rows 16w..16w+15
#pragma unroll
    for (int s = 0; s < KSTEPS; ++s) a_fragment(W, warp % 4 * 16, (warp / 4 * KSTEPS + s) * 16, a[s]);
  }
  __syncthreads();
  long long start = clock64();
  for (int it = 0; it < ITERS; ++it) {
    if (!(PARTS & 1)) {  // the reduction alone: no products
    } else if (MODE == 0) {
      float d[4][N / 8][4] = {};
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        const int kb = (warp * KSTEPS + s) * 2;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
          unsigned b0, b1;
          const int which = lane / 8 % 2, r = lane % 8;  // lanes 0-7: k block kb, 8-15: kb + 1
          const unsigned addr = (unsigned)__cvta_generic_to_shared(smem + ((kb + which) * (N / 8) + j) * 128 + r * 16);
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr));
#pragma unroll
          for (int m = 0; m < 4; ++m)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%0,%1,%2,%3};"
                         : "+f"(d[m][j][0]), "+f"(d[m][j][1]), "+f"(d[m][j][2]), "+f"(d[m][j][3])
                         : "r"(a[m * KSTEPS + s][0]), "r"(a[m * KSTEPS + s][1]), "r"(a[m * KSTEPS + s][2]),
                           "r"(a[m * KSTEPS + s][3]), "r"(b0), "r"(b1));
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m * 16 + lane / 4 + (e >= 2 ? 8 : 0), n = j * 8 + lane % 4 * 2 + e % 2;
            gs[(warp * ROWS + row) * N + n] = d[m][j][e];
          }
    } else {
      constexpr int CH = MODE == 2 ? 4 : 1;  // accumulator chains: k step s adds into chain s % CH
      float d[CH][N / 2];
#pragma unroll
      for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int e = 0; e < N / 2; ++e) d[c][e] = 0.f;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        const int kb = (warp / 4 * KSTEPS + s) * 2;  // the k step's first core matrix
        const unsigned kstride = (N / 8) * 128, nstride = 128;
        const uint64_t desc = descriptor(smem + kb * kstride, kstride, nstride);
        float* dc = d[s % CH];
        if constexpr (N == 8) {
          asm volatile("{.reg .pred p; setp.ne.b32 p, %9, 0;\n"
                       "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, "
                       "p, 1, 1, 0;}"
                       : "+f"(dc[0]), "+f"(dc[1]), "+f"(dc[2]), "+f"(dc[3])
                       : "r"(a[s][0]), "r"(a[s][1]), "r"(a[s][2]), "r"(a[s][3]), "l"(desc), "r"(s / CH));
        } else {
          asm volatile("{.reg .pred p; setp.ne.b32 p, %13, 0;\n"
                       "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
                       "{%8,%9,%10,%11}, %12, "
                       "p, 1, 1, 0;}"
                       : "+f"(dc[0]), "+f"(dc[1]), "+f"(dc[2]), "+f"(dc[3]), "+f"(dc[4]), "+f"(dc[5]), "+f"(dc[6]),
                         "+f"(dc[7])
                       : "r"(a[s][0]), "r"(a[s][1]), "r"(a[s][2]), "r"(a[s][3]), "l"(desc), "r"(s / CH));
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
      for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp % 4 * 16 + lane / 4 + (e >= 2 ? 8 : 0), n = j * 8 + lane % 4 * 2 + e % 2;
          float v = 0.f;
#pragma unroll
          for (int c = 0; c < CH; ++c) v += d[c][j * 4 + e];
          gs[(warp / 4 * ROWS + row) * N + n] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * N && (PARTS & 2); i += THREADS) {
      float v = 0.f;
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) v += gs[g * ROWS * N + i];
      sums[i] = v;
    }
    __syncthreads();
  }
  long long took = clock64() - start;
  if (threadIdx.x == 0) cycles[blockIdx.x] = took;
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < ROWS * N; i += THREADS) out[i] = sums[i];
}

template <int MODE, int N, int PARTS = 3>
void run(const __half* W, const __half* X, const std::vector<double>& ref, int ctas) {
  float* out; long long* cycles;
  CK(cudaMalloc(&out, ROWS * N * 4)); CK(cudaMalloc(&cycles, ctas * 8));
  const int smem = N * K * 2 + 9 * ROWS * N * 4;
  CK(cudaFuncSetAttribute(k<MODE, N, PARTS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    CK(cudaEventRecord(a));
    k<MODE, N, PARTS><<<ctas, THREADS, smem>>>(W, X, out, cycles);
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep) best = ms < best ? ms : best;
  }
  std::vector<float> got(ROWS * N); std::vector<long long> cyc(ctas);
  CK(cudaMemcpy(got.data(), out, ROWS * N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(cyc.data(), cycles, ctas * 8, cudaMemcpyDeviceToHost));
  double err = 0, mag = 0;
  for (int i = 0; i < ROWS * N; ++i) { err = fmax(err, fabs(got[i] - ref[i])); mag = fmax(mag, fabs(ref[i])); }
  long long most = 0; for (long long c : cyc) most = c > most ? c : most;
  // the reduction alone sums what the shared memory holds: its error is not a check
  printf("%-28s %-18s N=%2d  %.1f ns per tile (launch / %d)  %.0f cycles per tile (slowest block)  "
         "max error %.2e of %.2e\n",
         MODE == 0 ? "mma.sync, 8 k groups" : MODE == 1 ? "wgmma, 2 k groups" : "wgmma, 2 k groups, 4 chains",
         PARTS == 3 ? "products+reduction" : PARTS == 1 ? "products only" : "reduction only", N,
         best * 1e6f / ITERS, ITERS, (double)most / ITERS, err, mag);
  cudaFree(out); cudaFree(cycles);
}

template <int N> void compare(const __half* dW, const std::vector<__half>& W, int ctas) {
  std::vector<__half> X(N * K);
  for (int i = 0; i < N * K; ++i) X[i] = __float2half((float)((i * 7919 % 2001) - 1000) / 1000.f);
  std::vector<double> ref(ROWS * N, 0.0);
  for (int r = 0; r < ROWS; ++r)
    for (int n = 0; n < N; ++n)
      for (int kk = 0; kk < K; ++kk)
        ref[r * N + n] += (double)__half2float(W[r * K + kk]) * __half2float(X[n * K + kk]);
  __half* dX; CK(cudaMalloc(&dX, N * K * 2)); CK(cudaMemcpy(dX, X.data(), N * K * 2, cudaMemcpyHostToDevice));
  run<0, N>(dW, dX, ref, ctas); run<1, N>(dW, dX, ref, ctas); run<2, N>(dW, dX, ref, ctas);
  run<0, N, 1>(dW, dX, ref, ctas); run<1, N, 1>(dW, dX, ref, ctas); run<2, N, 1>(dW, dX, ref, ctas);
  run<0, N, 2>(dW, dX, ref, ctas); run<1, N, 2>(dW, dX, ref, ctas);
  cudaFree(dX);
}
int main() {
  std::vector<__half> W(ROWS * K);
  for (int i = 0; i < ROWS * K; ++i) W[i] = __float2half((float)((int)((long long)i * 104729 % 2001) - 1000) / 32000.f);
  __half* dW; CK(cudaMalloc(&dW, ROWS * K * 2)); CK(cudaMemcpy(dW, W.data(), ROWS * K * 2, cudaMemcpyHostToDevice));
  const int ctas = 64;  // one per SM: the products do not depend on the others
  compare<8>(dW, W, ctas);
  compare<16>(dW, W, ctas);
  return 0;
}

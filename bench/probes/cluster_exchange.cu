// Probe: can Hopper thread-block clusters cut the cost of bringing the exchanged state into every CTA?
// Per step, 128 CTAs x 256 threads: (C=1) every CTA loads the whole B x H half state tile from L2 into shared
// memory; (C=2, 4) each CTA of a cluster loads 1/C of it and stores it into every CTA of its cluster through
// distributed shared memory, then a cluster barrier. Then each CTA publishes its slice and a counter grid barrier
// (the project's ``counter``); "no barrier" rows leave the grid barrier out. Cooperative launch with clusters.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o cluster_exchange cluster_exchange.cu
//   ./cluster_exchange
//
// H100 figures and what they say: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include "probe_common.cuh"

template <int C, int MODE, int B, int H, int THREADS>
__global__ void __launch_bounds__(THREADS) step_kernel(const uint4* __restrict__ init, uint4* ws, unsigned* cnt, int steps, float* sink) {
  extern __shared__ uint4 tile[];  // B rows of H halves (rows padded by 8 halves = 1 uint4)
  constexpr int row16 = H / 8, stride16 = row16 + 1, n16 = B * row16;
  constexpr int share = n16 / C, per_thread = (share + THREADS - 1) / THREADS;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = C > 1 ? cluster.block_rank() : 0;
  float acc = 0.f;
  for (int t = 0; t < steps; ++t) {
    const uint4* src = ws + (size_t)(t & 1) * n16;
    uint4 v[per_thread];
#pragma unroll
    for (int k = 0; k < per_thread; ++k) {
      const int i = k * THREADS + threadIdx.x;
      if (i < share) v[k] = src[rank * share + i];
    }
#pragma unroll
    for (int k = 0; k < per_thread; ++k) {
      const int i = k * THREADS + threadIdx.x, j = rank * share + i;
      if (i < share) {
        uint4* local = &tile[(j / row16) * stride16 + j % row16];
        if (C == 1) *local = v[k];
        else {
#pragma unroll
          for (int c = 0; c < C; ++c) *cluster.map_shared_rank(local, c) = v[k];
        }
      }
    }
    if (C == 1) __syncthreads(); else cluster.sync();
    // consume: a few reads per thread
    for (int i = threadIdx.x; i < n16; i += THREADS * 8) { uint4 w = tile[(i / row16) * stride16 + i % row16]; acc += __uint_as_float(w.x & 0x3f800000u); }
    __syncthreads();
    uint4* dst = ws + (size_t)((t + 1) & 1) * n16;
    const int per = n16 / gridDim.x;
    for (int i = threadIdx.x; i < per; i += THREADS) dst[blockIdx.x * per + i] = make_uint4(t, i, blockIdx.x, 0);
    if (MODE != 2) grid_barrier(cnt, (unsigned)(t + 1) * gridDim.x);
  }
  if (acc == 12345.f) sink[0] = acc;
}

template <int C, int MODE, int B, int H>
float run(int ctas, int steps, bool coop) {
  const int threads = 256;
  const int n16 = B * H / 8;
  uint4 *ws; unsigned* cnt; float* sink;
  CK(cudaMalloc(&ws, 2 * n16 * sizeof(uint4))); CK(cudaMemset(ws, 0, 2 * n16 * sizeof(uint4)));
  CK(cudaMalloc(&cnt, 4)); CK(cudaMalloc(&sink, 4));
  const size_t smem = (size_t)B * (H / 8 + 1) * sizeof(uint4);
  auto k = step_kernel<C, MODE, B, H, 256>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas); cfg.blockDim = dim3(threads); cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attrs[2]; int na = 0;
  if (C > 1) { attrs[na].id = cudaLaunchAttributeClusterDimension; attrs[na].val.clusterDim.x = C; attrs[na].val.clusterDim.y = 1; attrs[na].val.clusterDim.z = 1; ++na; }
  if (coop) { attrs[na].id = cudaLaunchAttributeCooperative; attrs[na].val.cooperative = 1; ++na; }
  cfg.attrs = attrs; cfg.numAttrs = na;
  if (C > 1) {
    int clusters = 0;
    cudaLaunchConfig_t q = cfg; q.numAttrs = 1;
    CK(cudaOccupancyMaxActiveClusters(&clusters, k, &q));
    printf("  max active clusters of %d: %d (%d CTAs)\n", C, clusters, clusters * C);
  }
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    CK(cudaMemset(cnt, 0, 4));
    CK(cudaEventRecord(a));
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, (const uint4*)ws, ws, cnt, steps, sink);
    if (e != cudaSuccess) { printf("  launch failed: %s\n", cudaGetErrorString(e)); cudaGetLastError(); return -1; }
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep) best = ms < best ? ms : best;
  }
  CK(cudaFree(ws)); CK(cudaFree(cnt)); CK(cudaFree(sink));
  return best * 1000.f / steps;
}

template <int B>
void sweep(int steps) {
  printf("B=%d H=1024 ctas=128: tile %d KB per CTA\n", B, B * 2);
  printf("  C=1 load+barrier     %.3f us/step\n", run<1, 0, B, 1024>(128, steps, true));
  printf("  C=1 load, no barrier %.3f us/step\n", run<1, 2, B, 1024>(128, steps, true));
  printf("  C=2 dsmem+barrier    %.3f us/step\n", run<2, 0, B, 1024>(128, steps, true));
  printf("  C=2 dsmem, no barrier %.3f us/step\n", run<2, 2, B, 1024>(128, steps, true));
  printf("  C=4 dsmem+barrier    %.3f us/step\n", run<4, 0, B, 1024>(128, steps, true));
}
int main() {
  const int steps = 4096;
  sweep<8>(steps); sweep<16>(steps); sweep<32>(steps); sweep<64>(steps);
  printf("barrier alone: %.3f us/step\n", run<1, 0, 8, 128>(128, steps, true));
  return 0;
}

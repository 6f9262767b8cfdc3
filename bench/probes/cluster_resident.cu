// Probe: what a step's synchronization and state exchange cost when a whole layer lives in one thread-block
// cluster, with no grid barrier. One cluster of C CTAs x 256 threads; each CTA owns H / C units of a B x H half
// state. Per step every CTA stores its B x (H / C) slice into every CTA's shared tile through distributed
// shared memory (the tile double-buffered by step parity), the cluster barrier (barrier.cluster arrive.release
// / wait.acquire), then every CTA reads the whole tile and checks each value it reads (each carries its step,
// row and column). Against it, the same exchange through L2 among C CTAs: every CTA stores its slice to global
// memory, the project's counter grid barrier, every CTA loads the whole tile. Best of 5 launches of 8192 steps.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o cluster_resident cluster_resident.cu
//   ./cluster_resident
//
// H100 figures and what they say: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include "probe_common.cuh"

constexpr int THREADS = 256;

// a 16-byte piece of the state: step, row (batch), column (in 16-byte pieces), and a filler word
__device__ __forceinline__ uint4 piece(int t, int b, int j) { return make_uint4(t, b, j, t ^ (b << 8) ^ (j << 16)); }
__device__ __forceinline__ bool wrong(uint4 v, int t, int b, int j) {
  uint4 w = piece(t, b, j); return v.x != w.x || v.y != w.y || v.z != w.z || v.w != w.w;
}

// CLUSTER: exchange through distributed shared memory and the cluster barrier; else through L2 and the counter.
template <int C, int B, int H, bool CLUSTER>
__global__ void __launch_bounds__(THREADS, 1) step_kernel(uint4* ws, unsigned* cnt, int steps, unsigned* errors) {
  extern __shared__ uint4 tile[];  // two parities x B rows of H halves (H / 8 pieces)
  constexpr int row = H / 8, n = B * row, own = row / C;  // pieces per row, per tile, per CTA and row
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = CLUSTER ? (int)cluster.block_rank() : blockIdx.x;
  unsigned bad = 0;
  for (int t = 0; t < steps; ++t) {
    uint4* mine = tile + (t & 1) * n;
    for (int i = threadIdx.x; i < B * own; i += THREADS) {  // this CTA's slice: rows b, pieces rank * own ..
      const int b = i / own, j = rank * own + i % own;
      const uint4 v = piece(t, b, j);
      if (CLUSTER) {
#pragma unroll
        for (int c = 0; c < C; ++c) *cluster.map_shared_rank(&mine[b * row + j], c) = v;
      } else {
        ws[(t & 1) * n + b * row + j] = v;
      }
    }
    if (CLUSTER) {
      cluster.sync();
    } else {
      grid_barrier(cnt, (unsigned)(t + 1) * gridDim.x);
      for (int i = threadIdx.x; i < n; i += THREADS) mine[i] = __ldcg(&ws[(t & 1) * n + i]);
      __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += THREADS) bad += wrong(mine[i], t, i / row, i % row);
  }
  if (bad) atomicAdd(errors, bad);
}

template <int C, int B, int H, bool CLUSTER>
void run(const char* what) {
  const int steps = 8192;
  uint4* ws; unsigned *cnt, *errors;
  CK(cudaMalloc(&ws, 2 * B * H / 8 * sizeof(uint4))); CK(cudaMalloc(&cnt, 4)); CK(cudaMalloc(&errors, 4));
  CK(cudaMemset(errors, 0, 4));
  const size_t smem = 2 * (size_t)B * H / 8 * sizeof(uint4);
  auto k = step_kernel<C, B, H, CLUSTER>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (CLUSTER && C > 8) CK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(C); cfg.blockDim = dim3(THREADS); cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  if (CLUSTER) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = C; attr.val.clusterDim.y = 1; attr.val.clusterDim.z = 1;
  } else {
    attr.id = cudaLaunchAttributeCooperative; attr.val.cooperative = 1;
  }
  cfg.attrs = &attr; cfg.numAttrs = 1;
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    CK(cudaMemset(cnt, 0, 4));
    CK(cudaEventRecord(a));
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, ws, cnt, steps, errors);
    if (e != cudaSuccess) { printf("%-44s launch failed: %s\n", what, cudaGetErrorString(e)); cudaGetLastError(); return; }
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep) best = ms < best ? ms : best;
  }
  unsigned bad; CK(cudaMemcpy(&bad, errors, 4, cudaMemcpyDeviceToHost));
  printf("%-44s C=%2d B=%2d H=%4d  %.3f us/step  %u wrong values\n", what, C, B, H, best * 1000.f / steps, bad);
  CK(cudaFree(ws)); CK(cudaFree(cnt)); CK(cudaFree(errors));
}

int main() {
  run<8, 16, 256, true>("cluster: DSMEM stores + cluster barrier");
  run<8, 16, 256, false>("grid: L2 stores + counter + L2 loads");
  run<8, 8, 256, true>("cluster: DSMEM stores + cluster barrier");
  run<16, 16, 512, true>("cluster: DSMEM stores + cluster barrier");
  run<16, 16, 512, false>("grid: L2 stores + counter + L2 loads");
  run<16, 8, 512, true>("cluster: DSMEM stores + cluster barrier");
  run<16, 32, 512, true>("cluster: DSMEM stores + cluster barrier");
  return 0;
}

// Probe: grid barrier variants at 64, 128 and 132 CTAs x 256 threads. Each step every CTA stores 256 B, passes
// the barrier and checks a neighbour's values (a wrong value is counted and printed). Variants: the project's
// ``counter`` (release reduction, acquire polls); relaxed polls and one fence; an array of per-CTA release flags
// polled by one warp; every warp polling the counter (no second block barrier); a cluster barrier around one
// arrival per cluster; cooperative groups' grid.sync().
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o barrier_variants barrier_variants.cu
//   ./barrier_variants
//
// H100 figures: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include "probe_common.cuh"
__device__ __forceinline__ unsigned ld_rlx(const unsigned* p) { unsigned v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ uint4 ld_vol4(const unsigned* p) { uint4 v; asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_rel(unsigned* p, unsigned v) { asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void fence_acqrel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

template <int V>
__device__ __forceinline__ void barrier(unsigned* sync, unsigned step) {
  const unsigned n = gridDim.x, target = (step + 1) * n;
  if (V == 0) {  // counter: release add, acquire polls
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync) : "memory");
      while ((int)(ld_acq(sync) - target) < 0) {}
    }
    __syncthreads();
  } else if (V == 1) {  // counter: relaxed polls, one fence after
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync) : "memory");
      while ((int)(ld_rlx(sync) - target) < 0) {}
      fence_acqrel();
    }
    __syncthreads();
  } else if (V == 2) {  // flags: each block releases its own word; warp 0 polls all (4 per lane)
    __syncthreads();
    unsigned* flags = sync + 32;
    if (threadIdx.x == 0) st_rel(flags + blockIdx.x, step + 1);
    if (threadIdx.x < 32) {
      for (;;) {
        bool ok = true;
        for (unsigned i = threadIdx.x * 4; i < n; i += 128) {
          uint4 f = ld_vol4(flags + i);
          ok &= (int)(f.x - (step + 1)) >= 0 && (i + 1 >= n || (int)(f.y - (step + 1)) >= 0) &&
                (i + 2 >= n || (int)(f.z - (step + 1)) >= 0) && (i + 3 >= n || (int)(f.w - (step + 1)) >= 0);
        }
        if (__all_sync(0xffffffffu, ok)) break;
      }
      fence_acqrel();
    }
    __syncthreads();
  } else if (V == 3) {  // counter arrive by thread 0, but every warp's lane 0 polls (no second syncthreads)
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync) : "memory");
    if ((threadIdx.x & 31) == 0) { while ((int)(ld_acq(sync) - target) < 0) {} }
    __syncwarp();
  } else if (V == 4) {  // hierarchical: cluster barrier, rank 0 arrives for the cluster, cluster barrier
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const unsigned nc = n / cl.num_blocks();
    if (cl.block_rank() == 0 && threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync) : "memory");
      while ((int)(ld_acq(sync) - (step + 1) * nc) < 0) {}
    }
    cl.sync();
  } else if (V == 5) {  // grid.sync()
    cg::this_grid().sync();
  }
}

template <int V>
__global__ void __launch_bounds__(256) k(unsigned* sync, unsigned* data, int steps, unsigned* bad) {
  unsigned wrong = 0;
  for (int t = 0; t < steps; ++t) {
    unsigned* slot = data + (t & 1) * gridDim.x * 64;
    if (threadIdx.x < 64) slot[blockIdx.x * 64 + threadIdx.x] = t * 1000 + blockIdx.x;  // 256 B per CTA
    barrier<V>(sync, t);
    const unsigned nb = (blockIdx.x + 1 + threadIdx.x) % gridDim.x;
    if (threadIdx.x < 64 && slot[nb * 64 + threadIdx.x] != t * 1000 + nb) ++wrong;
  }
  if (wrong) atomicAdd(bad, wrong);
}

template <int V>
void run(const char* name, int ctas, int cluster, int steps) {
  unsigned *sync, *data, *bad;
  CK(cudaMalloc(&sync, 4096)); CK(cudaMalloc(&data, 2 * ctas * 64 * 4)); CK(cudaMalloc(&bad, 4));
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(ctas); cfg.blockDim = dim3(256);
  cudaLaunchAttribute attrs[2]; int na = 0;
  if (cluster > 1) { attrs[na].id = cudaLaunchAttributeClusterDimension; attrs[na].val.clusterDim = {(unsigned)cluster, 1, 1}; ++na; }
  attrs[na].id = cudaLaunchAttributeCooperative; attrs[na].val.cooperative = 1; ++na;
  cfg.attrs = attrs; cfg.numAttrs = na;
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    CK(cudaMemset(sync, 0, 4096)); CK(cudaMemset(bad, 0, 4));
    CK(cudaEventRecord(a));
    CK(cudaLaunchKernelEx(&cfg, k<V>, sync, data, steps, bad));
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep) best = ms < best ? ms : best;
    unsigned nbad; CK(cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost)); if (nbad) printf("  %s: %u wrong\n", name, nbad);
  }
  printf("%-34s ctas=%3d cluster=%d  %.3f us/step\n", name, ctas, cluster, best * 1000.f / steps);
  cudaFree(sync); cudaFree(data); cudaFree(bad);
}
int main() {
  const int steps = 8192;
  for (int ctas : {64, 128, 132}) {
    run<0>("counter (acquire polls)", ctas, 1, steps);
    run<1>("counter (relaxed polls + fence)", ctas, 1, steps);
    run<2>("flags (warp 0 polls all)", ctas, 1, steps);
    run<3>("counter, every warp polls", ctas, 1, steps);
    if (ctas % 2 == 0) run<4>("cluster then counter", ctas, 2, steps);
    if (ctas % 4 == 0) run<4>("cluster then counter", ctas, 4, steps);
    run<5>("grid.sync()", ctas, 1, steps);
  }
  return 0;
}

// What the standalone probes in this folder share: a CUDA error check, the project's acquire load (its barriers'
// common.cuh) and the project's `counter` grid barrier without its timeout (a release reduction by thread 0,
// acquire polls; prnn_tvm/codegen/barriers/counter.cuh).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "../../prnn_tvm/codegen/barriers/common.cuh"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ unsigned ld_acq(const unsigned* p) { return prnn_ld_acquire(p); }
__device__ __forceinline__ void grid_barrier(unsigned* cnt, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(cnt) : "memory");
    while ((int)(ld_acq(cnt) - target) < 0) {}
  }
  __syncthreads();
}

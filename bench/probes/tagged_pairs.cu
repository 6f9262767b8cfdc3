// Probe: the ``tags`` exchange of a B x H half state among 128 CTAs x 256 threads, one half per tagged 64-bit
// word (what the project's tags moves today) against two halves per word, against plain stores + the counter
// barrier + 16-byte loads. Every CTA publishes its units and polls the whole tile into shared memory each
// step; values are checked. (The two-halves variant at B=32 H=1024 spills: 32 pairs of words per thread.)
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o tagged_pairs tagged_pairs.cu
//   ./tagged_pairs
//
// H100 figures: bench/results/exchange-probes-h100.md.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "state_exchange.cuh"
constexpr int THREADS = 256;

template <int MODE, int B, int H>
__global__ void __launch_bounds__(THREADS) k(unsigned* cnt, void* wsv, int steps, unsigned* bad) {
  extern __shared__ __half tile[];  // B rows of H (+8) halves
  unsigned wrong = 0;
  for (int t = 0; t < steps; ++t) {
    if constexpr (MODE == 0) counter_exchange<B, H, THREADS>(cnt, (__half*)wsv, tile, t);
    else tags_exchange<MODE, B, H, THREADS>((uint64_t*)wsv, tile, t);  // MODE halves per tagged word
    __syncthreads();
    wrong += wrong_values<B, H, THREADS>(tile, t);
    __syncthreads();
  }
  if (wrong) atomicAdd(bad, wrong);
}

template <int MODE, int B, int H>
void run(const char* name, int steps) {
  const int ctas = 128;
  unsigned *cnt, *bad; void* ws;
  const size_t bytes = (size_t)2 * B * H * 8;
  CK(cudaMalloc(&cnt, 4)); CK(cudaMalloc(&bad, 4)); CK(cudaMalloc(&ws, bytes));
  const float best = best_launch_ms<B, H>(k<MODE, B, H>, ctas, THREADS, cnt, ws, bytes, false, steps, bad);
  printf("%-8s B=%2d H=%4d  %.3f us/step\n", name, B, H, best * 1000.f / steps);
  cudaFree(cnt); cudaFree(bad); cudaFree(ws);
}
template <int B, int H> void sweep(int steps) {
  run<0, B, H>("counter", steps);
  if constexpr (B * H / 2 / THREADS <= 32) run<1, B, H>("tags1", steps);
  run<2, B, H>("tags2", steps);
}
int main() {
  const int steps = 4096;
  sweep<4, 1024>(steps); sweep<8, 1024>(steps); sweep<16, 1024>(steps); sweep<32, 1024>(steps);
  sweep<8, 512>(steps); sweep<16, 512>(steps); sweep<32, 512>(steps);
  return 0;
}

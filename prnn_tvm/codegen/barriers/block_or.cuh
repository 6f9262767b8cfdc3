#ifndef PRNN_BLOCK_OR
#define PRNN_BLOCK_OR
__device__ __forceinline__ int prnn_block_or(int flag) { return __syncthreads_or(flag); }
#endif

// Runs a kernel of the CUDA source TVM emits on the host CPU, as written: prnn_tvm/verify/emulator.py includes
// this header before that source (translated only where CUDA has no host form: inline PTX, the dynamic shared
// memory declaration) and a launcher after it, compiles the whole with g++ and links it with the emulator's
// runtime (emulator_runtime.cpp, compiled once per version of the two files).
//
// The grid: one operating-system thread per thread block, so that blocks run at once as a persistent kernel's
// must (they wait for each other); the block's threads are fibers (ucontext) that the block's thread switches
// between at block barriers, warp shuffles and polling loads. __shared__ variables are thread_local: one per
// block. Every global buffer and each block's dynamic shared memory ends at a page that may not be touched, so an
// access one byte past its end stops the run with the buffer's name (SIGSEGV handler). Memory order is the host's
// (x86: stronger than the GPU's); what a weaker order would break only the GPU shows.
//
// This header is what the kernel's translation unit sees: CUDA's built-ins, each a call into the runtime or a
// host form of its own; the grid, the fibers and the program's main live in the runtime, so that each kernel's
// compile parses and generates only the kernel (the runtime's C++ library headers are not included here).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __CUDA_ARCH__ 900

struct dim3 {
  unsigned x, y, z;
};

#define PRNN_VECTOR2(T, N) \
  struct N##2 { T x, y; }; \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define PRNN_VECTOR4(T, N) \
  struct N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
PRNN_VECTOR2(float, float)
PRNN_VECTOR4(float, float)
PRNN_VECTOR2(double, double)
PRNN_VECTOR2(int, int)
PRNN_VECTOR4(int, int)
PRNN_VECTOR2(unsigned, uint)
PRNN_VECTOR4(unsigned, uint)
PRNN_VECTOR2(long long, longlong)
PRNN_VECTOR2(unsigned long long, ulonglong)

namespace prnn_emu {

[[noreturn]] void fail(const char* what);  // stops the run with `what` (exit status 3)

// The running thread's indices and its block's dynamic shared memory, set by the block's host thread as it
// switches fibers; the launch's shape, set before any block runs.
extern thread_local const dim3* thread_idx;
extern thread_local const dim3* block_idx;
extern thread_local unsigned char* dynamic_shared;
extern dim3 block_dim, grid_dim;

int block_barrier(int flag);  // __syncthreads(), __syncthreads_or(): every live thread of the block arrives
uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width);  // a warp's lanes swap values
void grid_sync();  // cooperative groups' grid.sync(): every block's threads
void poll_yield();  // a fiber waiting for another block's write lets the others run
unsigned long long globaltimer();

template <typename T>
T shfl_xor(unsigned mask, T value, int lane_mask, int width) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffled value fits a lane's slot");
  uint64_t bits = 0;
  memcpy(&bits, &value, sizeof(T));
  bits = shfl_xor_bits(mask, bits, lane_mask, width);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}

// The PTX memory operations the project's device code uses (prnn_tvm/verify/ptx.py translates them).
template <typename U>
U load(const void* p, int order) {
  poll_yield();
  return __atomic_load_n((const U*)p, order);
}

template <typename U>
void store(void* p, U value, int order) {
  __atomic_store_n((U*)p, value, order);
}

void call_kernel(void** args);  // the launcher the emulator writes after the kernel's source

}  // namespace prnn_emu

#define threadIdx (*prnn_emu::thread_idx)
#define blockIdx (*prnn_emu::block_idx)
#define blockDim (prnn_emu::block_dim)
#define gridDim (prnn_emu::grid_dim)

inline void __syncthreads() { prnn_emu::block_barrier(0); }
inline int __syncthreads_or(int flag) { return prnn_emu::block_barrier(flag); }
inline int __syncthreads_count(int) { prnn_emu::fail("__syncthreads_count is not emulated"); }
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  return prnn_emu::shfl_xor(mask, value, lane_mask, width);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) { prnn_emu::poll_yield(); }
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {  // a compare-and-swap loop, as CUDA's before native float atomics
  float old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    sum = old + v;
  } while (!__atomic_compare_exchange(p, &old, &sum, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline unsigned __float_as_uint(float v) { unsigned u; memcpy(&u, &v, 4); return u; }
inline float __uint_as_float(unsigned u) { float v; memcpy(&v, &u, 4); return v; }
inline int __float_as_int(float v) { int u; memcpy(&u, &v, 4); return u; }
inline float __int_as_float(int u) { float v; memcpy(&v, &u, 4); return v; }
#define PRNN_MIN_MAX(T) \
  inline T min(T a, T b) { return a < b ? a : b; } \
  inline T max(T a, T b) { return a < b ? b : a; }
PRNN_MIN_MAX(int)
PRNN_MIN_MAX(unsigned)
PRNN_MIN_MAX(long long)
PRNN_MIN_MAX(unsigned long long)
PRNN_MIN_MAX(float)
PRNN_MIN_MAX(double)
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

namespace cooperative_groups {
struct grid_group {
  void sync() { prnn_emu::grid_sync(); }
};
inline grid_group this_grid() { return grid_group{}; }
}  // namespace cooperative_groups

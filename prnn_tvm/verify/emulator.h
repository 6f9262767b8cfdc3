// Runs a kernel of the CUDA source TVM emits on the host CPU, as written: prnn_tvm/verify/emulator.py includes
// this header before that source (translated only where CUDA has no host form: inline PTX, the dynamic shared
// memory declaration) and a launcher after it, and compiles the whole with g++.
//
// The grid: one operating-system thread per thread block, so that blocks run at once as a persistent kernel's
// must (they wait for each other); the block's threads are fibers (ucontext) that the block's thread switches
// between at block barriers, warp shuffles and polling loads. __shared__ variables are thread_local: one per
// block. Every global buffer and each block's dynamic shared memory ends at a page that may not be touched, so an
// access one byte past its end stops the run with the buffer's name (SIGSEGV handler). Memory order is the host's
// (x86: stronger than the GPU's); what a weaker order would break only the GPU shows.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

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

[[noreturn]] inline void fail(const char* what) {
  fprintf(stderr, "emulated kernel: %s\n", what);
  fflush(stderr);
  _exit(3);
}

struct Fiber {
  ucontext_t context;
  dim3 index;
  unsigned linear = 0;
  bool done = false;
};

struct Warp {  // the fibers of one warp meet here for a shuffle
  unsigned live = 0, arrived = 0, generation = 0;
  uint64_t slots[32];
};

struct Block {
  dim3 index;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  unsigned live = 0, arrived = 0, generation = 0;
  int any = 0, any_result = 0;
  unsigned char* dynamic_shared = nullptr;
  void** args = nullptr;  // the kernel's arguments on this block's device (one set per emulated GPU)
  bool polled = false;
  unsigned long long events = 0;  // barriers completed and threads finished: a round without any is a deadlock
};

struct Region {  // a guarded allocation, for the fault message
  std::string name;
  uintptr_t start, end;
};

struct Launch {
  dim3 blocks, threads;
  size_t shared_bytes = 0;
  unsigned devices = 1;  // GPUs that each run the grid, sharing host memory (a layer split over GPUs)
  std::atomic<unsigned> arrived{0}, generation{0};
  std::vector<Region> regions;
};

inline Launch launch;  // the one launch a program runs
inline thread_local Block* block = nullptr;
constexpr size_t PAGE = 4096, STACK = 256 * 1024;

inline const dim3& thread_index() { return block->current->index; }
inline const dim3& block_index() { return block->index; }

// `bytes` of memory ending where a page that faults on any access begins (the fault handler names `name`).
inline unsigned char* guarded(size_t bytes, const char* name) {
  const size_t span = (bytes + PAGE - 1) / PAGE * PAGE;
  void* base = mmap(nullptr, span + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) fail("out of host memory");
  unsigned char* end = (unsigned char*)base + span;
  mprotect(end, PAGE, PROT_NONE);
  launch.regions.push_back(Region{name, (uintptr_t)(end - bytes), (uintptr_t)end});
  return end - bytes;
}

// A fiber's stack, with a page below it (where it grows into) that faults.
inline void* stack() {
  void* base = mmap(nullptr, STACK + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) fail("out of host memory");
  mprotect(base, PAGE, PROT_NONE);
  launch.regions.push_back(Region{"a thread's stack", (uintptr_t)base + PAGE, (uintptr_t)base + PAGE + STACK});
  return (unsigned char*)base + PAGE;
}

inline void on_fault(int, siginfo_t* info, void*) {
  const uintptr_t at = (uintptr_t)info->si_addr;
  char message[512];
  snprintf(message, sizeof message, "memory fault at %p, outside every buffer", info->si_addr);
  for (const Region& r : launch.regions) {
    if (at >= r.start - PAGE && at < r.start && r.name == "a thread's stack") {
      snprintf(message, sizeof message, "a thread's stack overflowed its %lu bytes", (unsigned long)(r.end - r.start));
    }
    if (at >= r.end && at < r.end + PAGE) {
      snprintf(message, sizeof message, "access %lu bytes past the end of %s (%lu bytes)",
               (unsigned long)(at - r.end), r.name.c_str(), (unsigned long)(r.end - r.start));
    }
  }
  fail(message);
}

inline void yield() {
  Fiber* me = block->current;
  swapcontext(&me->context, &block->scheduler);
}

inline void poll_yield() {  // a fiber waiting for another block's write lets the others run
  block->polled = true;
  yield();
}

inline void release(Block& b) {
  b.events++;
  b.arrived = 0;
  b.any_result = b.any;
  b.any = 0;
  b.generation++;
}

// __syncthreads() and __syncthreads_or(): every live thread of the block arrives; returns whether any flag was set.
inline int block_barrier(int flag) {
  Block& b = *block;
  const unsigned generation = b.generation;
  b.any |= flag != 0;
  if (++b.arrived == b.live) {
    release(b);
  } else {
    while (b.generation == generation) yield();
  }
  return b.any_result;
}

inline void warp_barrier(Warp& w) {
  const unsigned generation = w.generation;
  if (++w.arrived == w.live) {
    w.arrived = 0;
    w.generation++;
    block->events++;
  } else {
    while (w.generation == generation) yield();
  }
}

template <typename T>
T shfl_xor(unsigned mask, T value, int lane_mask, int width) {
  if (mask != 0xffffffffu) fail("a shuffle with a partial mask (not emulated)");
  Fiber& me = *block->current;
  Warp& w = block->warps[me.linear / 32];
  const unsigned lane = me.linear % 32;
  uint64_t bits = 0;
  memcpy(&bits, &value, sizeof(T));
  w.slots[lane] = bits;
  warp_barrier(w);
  unsigned source = lane ^ (unsigned)lane_mask;
  if (source >= (lane / width + 1) * width) source = lane;  // CUDA: a later group's lane gives the caller its own
  T out;
  memcpy(&out, &w.slots[source], sizeof(T));
  warp_barrier(w);
  return out;
}

inline void grid_sync() {  // cooperative groups' grid.sync(): every block's threads
  if (launch.devices > 1) fail("grid.sync() of a launch on several GPUs is not emulated (it syncs one GPU's grid)");
  block_barrier(0);
  if (block->current->linear == 0) {
    const unsigned blocks = launch.blocks.x * launch.blocks.y * launch.blocks.z;
    const unsigned generation = launch.generation.load();
    if (launch.arrived.fetch_add(1) + 1 == blocks) {
      launch.arrived.store(0);
      launch.generation.fetch_add(1);
    } else {
      while (launch.generation.load() == generation) poll_yield();
    }
  }
  block_barrier(0);
}

inline unsigned long long globaltimer() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec;
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

inline void fiber_main() {
  call_kernel(block->args);
  Block& b = *block;
  Fiber& me = *b.current;
  me.done = true;
  b.events++;
  b.live--;  // an exited thread no longer holds up the block's barriers, nor its warp's
  Warp& w = b.warps[me.linear / 32];
  w.live--;
  if (b.arrived && b.arrived == b.live) release(b);
  if (w.arrived && w.arrived == w.live) {
    w.arrived = 0;
    w.generation++;
  }
  swapcontext(&me.context, &b.scheduler);
}

// Before any block runs (the allocations are not thread-safe): block `linear`'s shared memory and fibers.
inline void prepare_block(Block& b, unsigned linear) {
  const dim3 g = launch.blocks, t = launch.threads;
  b.index = dim3{linear % g.x, (linear / g.x) % g.y, linear / (g.x * g.y)};
  const unsigned threads = t.x * t.y * t.z;
  const std::string name = "the dynamic shared memory of block " + std::to_string(linear);
  b.dynamic_shared = guarded(launch.shared_bytes, name.c_str());
  memset(b.dynamic_shared, 0xff, launch.shared_bytes);  // never written: NaN, which a result check sees
  b.fibers.resize(threads);
  b.warps.resize((threads + 31) / 32);
  b.live = threads;
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.linear = i;
    f.index = dim3{i % t.x, (i / t.x) % t.y, i / (t.x * t.y)};
    b.warps[i / 32].live++;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stack();
    f.context.uc_stack.ss_size = STACK;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
  }
}

// One block's threads, run by one host thread until each has returned.
inline void run_block(Block& b) {
  stack_t alternate;  // the fault handler's own stack: a fiber's may be the one that overflowed
  alternate.ss_sp = malloc(SIGSTKSZ * 4);
  alternate.ss_size = SIGSTKSZ * 4;
  alternate.ss_flags = 0;
  sigaltstack(&alternate, nullptr);
  block = &b;
  for (bool running = true; running;) {
    running = false;
    b.polled = false;
    const unsigned long long events = b.events;
    for (Fiber& f : b.fibers) {
      if (f.done) continue;
      b.current = &f;
      swapcontext(&b.scheduler, &f.context);
      running |= !f.done;
    }
    if (b.polled) sched_yield();
    else if (running && b.events == events) {  // every thread waits at a barrier that no thread can complete
      const std::string what = "block " + std::to_string(b.index.x) + ": its threads wait at block or warp "
                               "barriers that cannot complete (a barrier not every thread reaches)";
      fail(what.c_str());
    }
  }
}

// The emulator's program: argv[1] names a manifest, one line per kernel argument in order after the grid's:
//   grid BX BY BZ TX TY TZ SHARED_BYTES
//   buffer NAME BYTES PATH   (read from PATH, written back to it after the run)
//   int32 NAME VALUE | int64 NAME VALUE
//   hostword NAME PATH       (an int64 argument: the address of a 32-bit host word, written to PATH after the run)
//   hostbuffer NAME BYTES PATH  (an int64 argument: the address of a buffer read from PATH, written back after the
//                            run: page-locked host memory a kernel reaches through its address)
// Several GPUs (a split layer: each runs the grid with its own arguments, in one address space): the line
//   devices N                after the grid's, then each GPU's argument lines after a line `device D`, where
//   peer NAME D BUFFER       (an int64 argument) is the address of GPU D's argument BUFFER.
inline int main(int argc, char** argv) {
  if (argc != 2) fail("usage: emulator MANIFEST");
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGBUS, &action, nullptr);
  FILE* manifest = fopen(argv[1], "r");
  if (!manifest) fail("cannot read the manifest");
  struct Argument {
    std::string kind, name, path;
    size_t bytes = 0;
    unsigned char* data = nullptr;
    long long value = 0;
    void* pointer = nullptr;
  };
  char kind[32], name[256], path[4096];
  unsigned long long bytes;
  long long value;
  unsigned bx, by, bz, tx, ty, tz;
  if (fscanf(manifest, " grid %u %u %u %u %u %u %llu", &bx, &by, &bz, &tx, &ty, &tz, &bytes) != 7)
    fail("the manifest's first line is not a grid");
  launch.blocks = dim3{bx, by, bz};
  launch.threads = dim3{tx, ty, tz};
  launch.shared_bytes = bytes;
  std::vector<std::vector<Argument>> devices(1);  // each GPU's arguments in order
  unsigned current = 0;  // the GPU whose lines these are
  struct Peer {
    unsigned device, at, of;  // argument `at` of `device` is the address of GPU `of`'s buffer `buffer`
    std::string buffer;
  };
  std::vector<Peer> peers;
  while (fscanf(manifest, " %31s %255s", kind, name) == 2) {
    Argument a;
    a.kind = kind;
    a.name = name;
    if (a.kind == "devices") {
      launch.devices = (unsigned)atoi(name);
      if (launch.devices < 1) fail("a manifest's devices line names no device");
      devices.resize(launch.devices);
      continue;
    }
    if (a.kind == "device") {
      current = (unsigned)atoi(name);
      if (current >= launch.devices || !devices[current].empty()) fail("a device line out of order");
      continue;
    }
    if (a.kind == "buffer" || a.kind == "hostbuffer") {
      if (fscanf(manifest, " %llu %4095s", &bytes, path) != 2) fail("a buffer line without its size and path");
      a.bytes = bytes;
      a.path = path;
      a.data = guarded(bytes, ("argument " + a.name).c_str());
      FILE* f = fopen(path, "rb");
      if (!f || fread(a.data, 1, bytes, f) != bytes) fail("cannot read a buffer's file");
      fclose(f);
      a.pointer = a.data;
      a.value = (long long)(uintptr_t)a.data;
    } else if (a.kind == "hostword") {
      if (fscanf(manifest, " %4095s", path) != 1) fail("a host word without its path");
      a.path = path;
      a.data = guarded(4, ("host word " + a.name).c_str());
      memset(a.data, 0, 4);
      a.value = (long long)(uintptr_t)a.data;
    } else if (a.kind == "peer") {
      unsigned of;
      if (fscanf(manifest, " %u %4095s", &of, path) != 2) fail("a peer line without its device and buffer");
      a.kind = "int64";
      peers.push_back(Peer{current, (unsigned)devices[current].size(), of, path});
    } else if (a.kind == "int32" || a.kind == "int64") {
      if (fscanf(manifest, " %lld", &value) != 1) fail("a scalar without its value");
      a.value = value;
    } else {
      fail("an unknown kind of argument in the manifest");
    }
    devices[current].push_back(a);
  }
  fclose(manifest);
  for (const Peer& p : peers) {
    if (p.of >= launch.devices) fail("a peer line names a device past the devices line");
    const Argument* found = nullptr;
    for (const Argument& b : devices[p.of]) found = b.kind == "buffer" && b.name == p.buffer ? &b : found;
    if (!found) fail("a peer line names a buffer its device does not have");
    devices[p.device][p.at].value = (long long)(uintptr_t)found->pointer;
  }
  const unsigned blocks = bx * by * bz, all = blocks * launch.devices;
  std::vector<std::vector<int>> ints(launch.devices);
  std::vector<std::vector<void*>> args(launch.devices);
  for (unsigned d = 0; d < launch.devices; ++d) {
    ints[d].resize(devices[d].size());
    args[d].resize(devices[d].size());
    for (size_t i = 0; i < devices[d].size(); ++i) {
      Argument& a = devices[d][i];
      if (a.kind == "buffer") args[d][i] = &a.pointer;
      else if (a.kind == "int32") args[d][i] = &(ints[d][i] = (int)a.value);
      else args[d][i] = &a.value;
    }
  }
  std::vector<Block> grid(all);
  for (unsigned i = 0; i < all; ++i) {
    prepare_block(grid[i], i % blocks);
    grid[i].args = args[i / blocks].data();
  }
  std::vector<std::thread> hosts;
  for (unsigned i = 0; i < all; ++i) hosts.emplace_back(run_block, std::ref(grid[i]));
  for (std::thread& h : hosts) h.join();
  for (const std::vector<Argument>& on : devices)
  for (const Argument& a : on) {
    if (a.kind != "buffer" && a.kind != "hostbuffer" && a.kind != "hostword") continue;
    const size_t bytes_out = a.kind == "hostword" ? 4 : a.bytes;
    FILE* f = fopen(a.path.c_str(), "wb");
    if (!f || fwrite(a.data, 1, bytes_out, f) != bytes_out)
      fail("cannot write a buffer back");
    fclose(f);
  }
  return 0;
}

}  // namespace prnn_emu

#define threadIdx (prnn_emu::thread_index())
#define blockIdx (prnn_emu::block_index())
#define blockDim (prnn_emu::launch.threads)
#define gridDim (prnn_emu::launch.blocks)

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

// The emulator's runtime (prnn_tvm/verify/emulator.h says what the emulator is): the grid, the fibers that are a
// block's threads, the barriers and shuffles, and the program's main, which reads the manifest, runs the grid and
// writes the buffers back. prnn_tvm/verify/emulator.py compiles it once per version of it and of the header, and
// links every emulated kernel's program with it.
#include "emulator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sched.h>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

namespace prnn_emu {

void fail(const char* what) {
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

static Launch launch;  // the one launch a program runs
static thread_local Block* block = nullptr;  // the block this host thread runs
thread_local const dim3* thread_idx = nullptr;
thread_local const dim3* block_idx = nullptr;
thread_local unsigned char* dynamic_shared = nullptr;
dim3 block_dim, grid_dim;
constexpr size_t PAGE = 4096, STACK = 256 * 1024;

// `bytes` of memory ending where a page that faults on any access begins (the fault handler names `name`).
static unsigned char* guarded(size_t bytes, const char* name) {
  const size_t span = (bytes + PAGE - 1) / PAGE * PAGE;
  void* base = mmap(nullptr, span + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) fail("out of host memory");
  unsigned char* end = (unsigned char*)base + span;
  mprotect(end, PAGE, PROT_NONE);
  launch.regions.push_back(Region{name, (uintptr_t)(end - bytes), (uintptr_t)end});
  return end - bytes;
}

// A fiber's stack, with a page below it (where it grows into) that faults.
static void* stack() {
  void* base = mmap(nullptr, STACK + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) fail("out of host memory");
  mprotect(base, PAGE, PROT_NONE);
  launch.regions.push_back(Region{"a thread's stack", (uintptr_t)base + PAGE, (uintptr_t)base + PAGE + STACK});
  return (unsigned char*)base + PAGE;
}

static void on_fault(int, siginfo_t* info, void*) {
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

static void yield() {
  Fiber* me = block->current;
  swapcontext(&me->context, &block->scheduler);
}

void poll_yield() {  // a fiber waiting for another block's write lets the others run
  block->polled = true;
  yield();
}

static void release(Block& b) {
  b.events++;
  b.arrived = 0;
  b.any_result = b.any;
  b.any = 0;
  b.generation++;
}

// __syncthreads() and __syncthreads_or(): every live thread of the block arrives; returns whether any flag was set.
int block_barrier(int flag) {
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

static void warp_barrier(Warp& w) {
  const unsigned generation = w.generation;
  if (++w.arrived == w.live) {
    w.arrived = 0;
    w.generation++;
    block->events++;
  } else {
    while (w.generation == generation) yield();
  }
}

uint64_t shfl_xor_bits(unsigned mask, uint64_t bits, int lane_mask, int width) {
  if (mask != 0xffffffffu) fail("a shuffle with a partial mask (not emulated)");
  Fiber& me = *block->current;
  Warp& w = block->warps[me.linear / 32];
  const unsigned lane = me.linear % 32;
  w.slots[lane] = bits;
  warp_barrier(w);
  unsigned source = lane ^ (unsigned)lane_mask;
  if (source >= (lane / width + 1) * width) source = lane;  // CUDA: a later group's lane gives the caller its own
  const uint64_t out = w.slots[source];
  warp_barrier(w);
  return out;
}

void grid_sync() {  // cooperative groups' grid.sync(): every block's threads
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

unsigned long long globaltimer() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (unsigned long long)now.tv_sec * 1000000000ull + (unsigned long long)now.tv_nsec;
}

static void fiber_main() {
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
static void prepare_block(Block& b, unsigned linear) {
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
static void run_block(Block& b) {
  stack_t alternate;  // the fault handler's own stack: a fiber's may be the one that overflowed
  alternate.ss_sp = malloc(SIGSTKSZ * 4);
  alternate.ss_size = SIGSTKSZ * 4;
  alternate.ss_flags = 0;
  sigaltstack(&alternate, nullptr);
  block = &b;
  block_idx = &b.index;
  dynamic_shared = b.dynamic_shared;
  for (bool running = true; running;) {
    running = false;
    b.polled = false;
    const unsigned long long events = b.events;
    for (Fiber& f : b.fibers) {
      if (f.done) continue;
      b.current = &f;
      thread_idx = &f.index;
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
static int run(int argc, char** argv) {
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
  launch.blocks = grid_dim = dim3{bx, by, bz};
  launch.threads = block_dim = dim3{tx, ty, tz};
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

int main(int argc, char** argv) { return prnn_emu::run(argc, argv); }

// Probe: how a step request reaches a resident kernel and how its result comes back, for a session that keeps a
// layer's weights on chip between calls. A resident kernel of CTAS CTAs x 256 threads serves STEPS requests; each
// needs the whole input vector (IN floats: every CTA multiplies it by its rows of W_ih) and produces its slice of
// the output (OUT floats over all CTAs). The "compute" is a stand-in (out[j] = x[j % IN] + 1): what is timed is
// the transport. Every value carries what it must be, and every value read is checked.
//
// Host side (the caller writes x in page-locked memory and reads y there; p50/p99 of the host's round trip):
//   input  direct  every CTA polls the tagged words in host memory ({bits, step} per value, 8-byte relaxed loads
//                  over PCIe, a warp per 256 values) until all carry this step
//          relay   CTA 0 polls them so and re-publishes them tagged in device memory; the other CTAs poll that copy
//          flag    thread 0 of CTA 0 polls a step word in host memory (acquire), the block reads the plain values
//                  and re-publishes them tagged in device memory, as relay
//   output every CTA stores its slice as plain floats into host memory that the host filled with a sentinel
//          (all bits set, never a result); the host polls until no word holds it: no fence, no flag
// GPU side (a chain of dependent steps inside one CUDA graph, as a decoder's steps; us per step):
//   tagged   a producer kernel computes x from the last y into the session's tagged mailbox; the resident
//            kernel polls it; a collect kernel on the caller's stream polls the output words until they carry
//            this step and hands y to the next producer
//   memops   the producer writes plain x, cuStreamWriteValue32 posts the step; the resident kernel polls that
//            word; every CTA counts its slice out (release add); cuStreamWaitValue32 (>=) on the caller's
//            stream waits for the count, and the next producer reads the plain y
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o session_transport session_transport.cu
//   ./session_transport                                            # the survey above
//   ./session_transport session VALUES HALF OUT CTAS THREADS [STEPS]  # a session's own transport, its step a no-op
//
// The second form times the transport of one session shape with the session's own device code
// (prnn_tvm/codegen/barriers/session.cuh: its take, relay, respond, publish and collect) around a step that does
// nothing (response word j is input value j % VALUES plus one): what a step of that shape costs with no recurrence.
// VALUES: the step's input (batch x input), HALF 1: 16-bit values, two a request word (else float32, one a word);
// OUT: the response words (states x batch x hidden); CTAS x THREADS: the session kernel's grid (one CTA an SM).
//   host   the host transport as the native host step runs it: the host packs the request into the page-locked
//          ring, CTA 0 relays it, every CTA takes it, every CTA stores its share of the responses into the
//          page-locked response ring, the host spins on the last word, then on the others; p50 / p99 / max over
//          STEPS (default 10^5) of the host's round trip, the first 5% left out; every value checked
//   graph  the device transport in a chain of dependent steps replayed from one CUDA graph, as the bench's chain:
//          the publish kernel, the collect kernel, and a copy of the collected states into the next input (three
//          nodes a step); us per step, best and median of 20 replays of 100 steps
//
// H100 figures and what they say: bench/results/session-transport-h100.md.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>
#include <cuda.h>
#include <cuda_fp16.h>
#include "probe_common.cuh"
#include "../../prnn_tvm/codegen/barriers/session.cuh"

constexpr int THREADS = 256;
constexpr unsigned SENTINEL = 0xffffffffu;
constexpr long long TIMEOUT_NS = 2000000000ll;  // every wait of the probe gives up after 2 s

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ uint2 ld_relaxed_sys(const uint2* p) {
  uint2 v; asm volatile("ld.relaxed.sys.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned* p) {
  unsigned v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_relaxed_gpu(uint2* p, uint2 v) {
  asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__host__ __device__ __forceinline__ float input_value(int t, int i) { return (float)((t * 7 + i) % 1000); }

// Poll n tagged words at src until every one carries `step`; their values into x (shared). Returns 1 on timeout,
// 2 when the host asked the kernel to stop (looked at every 64 rounds: a read of host memory costs a PCIe round
// trip). From host memory only the first warps poll (one warp per 256 values), the rest wait at the block barrier.
template <bool HOST_SRC>
__device__ int poll_tagged(const uint2* src, int n, unsigned step, float* x, const unsigned* stop, unsigned* errors) {
  const int pollers = HOST_SRC ? min(THREADS, 32 * ((n + 255) / 256)) : THREADS;
  unsigned long long t0 = globaltimer();
  for (unsigned round = 1;; ++round) {
    int stale = 0;
    if (threadIdx.x < pollers)
      for (int i = threadIdx.x; i < n; i += pollers) {
        uint2 w = ld_relaxed_sys(src + i);
        if (w.y != step) stale = 1;
        else x[i] = __uint_as_float(w.x);
      }
    if (!__syncthreads_or(stale)) return 0;
    if (round % 64 == 0) {
      if (__syncthreads_or(threadIdx.x == 0 && stop && *(volatile const unsigned*)stop)) return 2;
      if (globaltimer() - t0 > TIMEOUT_NS) { if (threadIdx.x == 0) atomicAdd(errors + 1, 1u); return 1; }
    }
  }
}

// Thread 0 polls a step word (acquire) until it reaches `step`; 1 on timeout, 2 on stop (as poll_tagged).
__device__ int poll_word(const unsigned* word, unsigned step, const unsigned* stop, unsigned* errors) {
  __shared__ int late;
  if (threadIdx.x == 0) {
    unsigned long long t0 = globaltimer();
    late = 0;
    for (unsigned round = 1; (int)(ld_acquire_sys(word) - step) < 0; ++round) {
      if (round % 64) continue;
      if (stop && *(volatile const unsigned*)stop) { late = 2; break; }
      if (globaltimer() - t0 > TIMEOUT_NS) { atomicAdd(errors + 1, 1u); late = 1; break; }
    }
  }
  __syncthreads();
  return late;
}

enum Input { DIRECT, DIRECT_DEVICE, RELAY, FLAG, MEMOPS };
enum Output { HOST_SENTINEL, TAGGED, COUNTED };

// errors[0]: wrong values seen, errors[1]: timeouts
template <Input IN_MODE, Output OUT_MODE>
__global__ void __launch_bounds__(THREADS, 1) resident(const uint2* host_in, const unsigned* in_word, uint2* relay,
                                                        const float* plain_in, int in_n, float* out_host,
                                                        uint2* out_tagged, float* out_plain, unsigned* out_count,
                                                        int out_n, int steps, const unsigned* stop, unsigned* errors) {
  extern __shared__ float x[];
  const int per = (out_n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(out_n, lo + per);
  for (int t = 1; t <= steps; ++t) {
    int late = 0;
    if (IN_MODE == DIRECT) late = poll_tagged<true>(host_in, in_n, t, x, stop, errors);
    if (IN_MODE == DIRECT_DEVICE) late = poll_tagged<false>(host_in, in_n, t, x, stop, errors);
    if (IN_MODE == RELAY || IN_MODE == FLAG) {  // CTA 0 takes the request from the host, the others from it
      if (blockIdx.x == 0) {
        if (IN_MODE == RELAY) {
          late = poll_tagged<true>(host_in, in_n, t, x, stop, errors);
        } else {
          late = poll_word(in_word, t, stop, errors);
          for (int i = threadIdx.x; i < in_n; i += THREADS) x[i] = ((volatile const float*)host_in)[i];
          __syncthreads();
        }
        if (!late && gridDim.x > 1)  // the others give up by their own look at the stop word
          for (int i = threadIdx.x; i < in_n; i += THREADS)
            st_relaxed_gpu(relay + i, make_uint2(__float_as_uint(x[i]), t));
      } else {
        late = poll_tagged<false>(relay, in_n, t, x, stop, errors);
      }
    }
    if (IN_MODE == MEMOPS) {
      late = poll_word(in_word, t, stop, errors);
      for (int i = threadIdx.x; i < in_n; i += THREADS) x[i] = ((volatile const float*)plain_in)[i];
      __syncthreads();
    }
    if (late) {  // stopped or timed out: a waiter on the count (cuStreamWaitValue32 has no timeout) must not
                 // wait for this kernel
      if (OUT_MODE == COUNTED && threadIdx.x == 0) atomicAdd(out_count, 1u << 30);
      return;
    }
    for (int i = threadIdx.x; i < in_n; i += THREADS)
      if (x[i] != input_value(t, i)) atomicAdd(errors, 1u);
    for (int j = lo + threadIdx.x; j < hi; j += THREADS) {
      float y = x[j % in_n] + 1.0f;
      if (OUT_MODE == HOST_SENTINEL) ((volatile float*)out_host)[(t & 1) * out_n + j] = y;
      if (OUT_MODE == TAGGED) st_relaxed_gpu(out_tagged + j, make_uint2(__float_as_uint(y), t));
      if (OUT_MODE == COUNTED) out_plain[j] = y;
    }
    if (OUT_MODE == COUNTED) {
      __syncthreads();
      if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(out_count) : "memory");
    }
    __syncthreads();  // x is overwritten by the next step's poll
  }
}

static void report(const char* name, std::vector<double>& v, unsigned* errors) {
  if (v.size() < 100) { printf("%-48s gave up after %zu steps: timeouts %u\n", name, v.size(), errors[1]); return; }
  std::vector<double> m(v.begin() + v.size() / 20, v.end());
  std::sort(m.begin(), m.end());
  printf("%-48s p50 %6.2f  p99 %6.2f  max %8.2f us   wrong %u timeouts %u\n", name, m[m.size() / 2],
         m[m.size() * 99 / 100], m.back(), errors[0], errors[1]);
}

// ---------------------------------------------------------------- host input, host output
template <Input IN_MODE>
static void host_round_trip(const char* mode, int ctas, int in_n, int out_n, int steps) {
  uint2* in; float* out; unsigned *word, *stop, *errors; uint2* relay;
  CK(cudaHostAlloc(&in, sizeof(uint2) * in_n, cudaHostAllocMapped));
  CK(cudaHostAlloc(&out, sizeof(float) * 2 * out_n, cudaHostAllocMapped));
  CK(cudaHostAlloc(&word, 64, cudaHostAllocMapped));
  CK(cudaHostAlloc(&errors, 64, cudaHostAllocMapped));
  CK(cudaHostAlloc(&stop, 64, cudaHostAllocMapped)); *stop = 0;
  CK(cudaMalloc(&relay, sizeof(uint2) * in_n));
  CK(cudaMemset(relay, 0, sizeof(uint2) * in_n));
  memset(in, 0, sizeof(uint2) * in_n); memset(errors, 0, 64); *word = 0;
  memset(out, 0xff, sizeof(float) * 2 * out_n);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  resident<IN_MODE, HOST_SENTINEL><<<ctas, THREADS, in_n * sizeof(float), s>>>(
      in, word, relay, nullptr, in_n, out, nullptr, nullptr, nullptr, out_n, steps, stop, errors);
  CK(cudaGetLastError());
  std::vector<double> lat(steps);
  float* plain = reinterpret_cast<float*>(in);
  const auto started = std::chrono::steady_clock::now();
  for (int t = 1; t <= steps; ++t) {
    if (std::chrono::steady_clock::now() - started > std::chrono::milliseconds(1500)) {  // a slow mode: enough samples
      lat.resize(t - 1);
      *(volatile unsigned*)stop = 1;
      break;
    }
    volatile unsigned* slot = reinterpret_cast<volatile unsigned*>(out + (t & 1) * out_n);
    auto t0 = std::chrono::steady_clock::now();
    if (IN_MODE == FLAG) {
      for (int i = 0; i < in_n; ++i) plain[i] = input_value(t, i);
      __sync_synchronize();
      *(volatile unsigned*)word = t;
    } else {
      for (int i = 0; i < in_n; ++i) {  // one 8-byte store a value: bits and step land together
        float v = input_value(t, i); unsigned bits; memcpy(&bits, &v, 4);
        *(volatile unsigned long long*)(in + i) = ((unsigned long long)(unsigned)t << 32) | bits;
      }
    }
    bool late = false;
    for (int j = 0; j < out_n && !late; ++j) {
      auto w0 = std::chrono::steady_clock::now();
      while (slot[j] == SENTINEL)
        if (std::chrono::steady_clock::now() - w0 > std::chrono::seconds(2)) { errors[1]++; late = true; break; }
    }
    if (late) { lat.resize(t - 1); break; }  // the kernel gives up on its own 2 s after its last request
    lat[t - 1] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    for (int j = 0; j < out_n; ++j) {
      float y; unsigned bits = slot[j]; memcpy(&y, &bits, 4);
      if (y != input_value(t, j % in_n) + 1.0f) errors[0]++;
    }
    memset((void*)(out + ((t + 1) & 1) * out_n), 0xff, sizeof(float) * out_n);  // re-arm the next step's slot
    __sync_synchronize();
  }
  CK(cudaStreamSynchronize(s));
  char name[96]; snprintf(name, sizeof name, "host %-6s ctas %3d in %5d out %5d", mode, ctas, in_n, out_n);
  report(name, lat, errors);
  cudaFreeHost(in); cudaFreeHost(out); cudaFreeHost(word); cudaFreeHost(stop); cudaFreeHost(errors); cudaFree(relay);
  cudaStreamDestroy(s);
}

// ---------------------------------------------------------------- GPU input, GPU output, inside a CUDA graph
// The next x from the last y (a model's kernel between two steps, e.g. an embedding of the emitted token):
// x[i] = input_value(t, i), read from y so that the chain is a real dependence.
__global__ void produce_tagged(const uint2* y_tagged, const float* y_plain, uint2* mailbox, float* x_plain, int in_n,
                               int out_n, unsigned* step, unsigned* errors) {
  unsigned t = *step + 1;  // the producer owns the step counter: a graph replays the same nodes
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < in_n; i += gridDim.x * blockDim.x) {
    float prev = y_plain ? y_plain[i % out_n] : __uint_as_float(y_tagged[i % out_n].x);
    float x = input_value(t, i) + 0.0f * prev;
    if (t > 1 && prev != input_value(t - 1, i % out_n % in_n) + 1.0f) atomicAdd(errors, 1u);
    if (mailbox) st_relaxed_gpu(mailbox + i, make_uint2(__float_as_uint(x), t));
    else x_plain[i] = x;
  }
}

__global__ void advance(unsigned* step) { *step += 1; }

// Poll the resident kernel's tagged output until it carries this step (one CTA: a small output).
__global__ void collect_tagged(const uint2* out_tagged, int out_n, const unsigned* step, unsigned* errors) {
  unsigned t = *step;
  unsigned long long t0 = globaltimer();
  for (;;) {
    int stale = 0;
    for (int j = threadIdx.x; j < out_n; j += blockDim.x) stale |= ld_relaxed_sys(out_tagged + j).y != t;
    if (!__syncthreads_or(stale)) return;
    if (globaltimer() - t0 > TIMEOUT_NS) { if (threadIdx.x == 0) atomicAdd(errors + 1, 1u); return; }
  }
}

typedef CUresult (*WriteValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*WaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static void gpu_chain(bool memops, int ctas, int in_n, int out_n, int graph_steps, int replays) {
  static WriteValue32 write_value = nullptr;
  static WaitValue32 wait_value = nullptr;
  if (!write_value) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void**)&write_value, 12000, cudaEnableDefault, &q));
    CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", (void**)&wait_value, 12000, cudaEnableDefault, &q));
  }
  const int steps = graph_steps * replays;
  uint2 *mailbox, *out_tagged; float *x_plain, *y_plain; unsigned *step, *word, *count, *errors;
  CK(cudaMalloc(&mailbox, sizeof(uint2) * in_n)); CK(cudaMemset(mailbox, 0, sizeof(uint2) * in_n));
  CK(cudaMalloc(&out_tagged, sizeof(uint2) * out_n)); CK(cudaMemset(out_tagged, 0, sizeof(uint2) * out_n));
  CK(cudaMalloc(&x_plain, sizeof(float) * in_n)); CK(cudaMalloc(&y_plain, sizeof(float) * out_n));
  CK(cudaMalloc(&step, 64)); CK(cudaMemset(step, 0, 64));
  CK(cudaMalloc(&word, 64)); CK(cudaMemset(word, 0, 64));
  CK(cudaMalloc(&count, 64)); CK(cudaMemset(count, 0, 64));
  CK(cudaHostAlloc(&errors, 64, cudaHostAllocMapped)); memset(errors, 0, 64);
  cudaStream_t rs, cs; CK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  // Load every kernel the chain launches before the resident one starts: under CUDA's lazy loading (the default) the
  // first launch of a kernel loads its code with a context synchronization, which waits for the resident kernel.
  for (const void* f : {(const void*)produce_tagged, (const void*)advance, (const void*)collect_tagged}) {
    cudaFuncAttributes attr; CK(cudaFuncGetAttributes(&attr, f));
  }
  const unsigned* stop = nullptr;
  if (memops)
    resident<MEMOPS, COUNTED><<<ctas, THREADS, in_n * sizeof(float), rs>>>(
        nullptr, word, nullptr, x_plain, in_n, nullptr, nullptr, y_plain, count, out_n, steps, stop, errors);
  else
    resident<DIRECT_DEVICE, TAGGED><<<ctas, THREADS, in_n * sizeof(float), rs>>>(
        mailbox, nullptr, nullptr, nullptr, in_n, nullptr, out_tagged, nullptr, nullptr, out_n, steps, stop, errors);
  CK(cudaGetLastError());
  // the tagged chain: one graph of graph_steps dependent steps, replayed (the step number lives on the device)
  cudaGraph_t graph; cudaGraphExec_t exec;
  if (!memops) {
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < graph_steps; ++k) {
      produce_tagged<<<1, 256, 0, cs>>>(out_tagged, nullptr, mailbox, nullptr, in_n, out_n, step, errors);
      advance<<<1, 1, 0, cs>>>(step);
      collect_tagged<<<1, 256, 0, cs>>>(out_tagged, out_n, step, errors);
    }
    CK(cudaStreamEndCapture(cs, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
  }
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<double> per_step;
  for (int r = 0; r < replays; ++r) {
    if (memops) {  // a memop's value is fixed at capture: a graph per replay, its steps' numbers written in
      CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < graph_steps; ++k) {
        unsigned t = r * graph_steps + k + 1;
        produce_tagged<<<1, 256, 0, cs>>>(nullptr, y_plain, nullptr, x_plain, in_n, out_n, step, errors);
        advance<<<1, 1, 0, cs>>>(step);
        if (write_value((CUstream)cs, (CUdeviceptr)word, t, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
          printf("cuStreamWriteValue32 refused in capture\n"); exit(1);
        }
        if (wait_value((CUstream)cs, (CUdeviceptr)count, t * ctas, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
          printf("cuStreamWaitValue32 refused in capture\n"); exit(1);
        }
      }
      CK(cudaStreamEndCapture(cs, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
    }
    CK(cudaEventRecord(e0, cs));
    CK(cudaGraphLaunch(exec, cs));
    CK(cudaEventRecord(e1, cs));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    per_step.push_back(1000.0 * ms / graph_steps);
    if (memops) { CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph)); }
  }
  CK(cudaStreamSynchronize(rs));
  CK(cudaGetLastError());
  char name[96];
  snprintf(name, sizeof name, "gpu %-7s ctas %3d in %5d out %5d (graph)", memops ? "memops" : "tagged", ctas, in_n,
           out_n);
  std::sort(per_step.begin(), per_step.end());
  printf("%-48s best %6.2f  median %6.2f us/step   wrong %u timeouts %u\n", name, per_step.front(),
         per_step[per_step.size() / 2], errors[0], errors[1]);
  if (!memops) { CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph)); }
  cudaFree(mailbox); cudaFree(out_tagged); cudaFree(x_plain); cudaFree(y_plain); cudaFree(step); cudaFree(word);
  cudaFree(count); cudaFreeHost(errors); cudaStreamDestroy(rs); cudaStreamDestroy(cs);
}

// ---------------------------------------------------------------- a session's own transport, its step a no-op
constexpr int SESSION_DEPTH = 2;             // request and response slots, as prnn_tvm/runtime/session.py's DEPTH
constexpr int SESSION_LIMIT_US = 2000000;    // every wait of the no-op session gives up after 2 s
constexpr int SESSION_TAKE_PER = 10;         // prnn_tvm/codegen/session.py's TAKE_PER
constexpr int SESSION_COLLECT_THREADS = 1024;  // and its COLLECT_THREADS
constexpr int SESSION_PER_MAX = 16;          // words a collect thread polls at most here (16384 response words)

// Calls f with std::integral_constant<int, per>, 1 <= per <= N (a template argument picked at run time).
template <int N, typename F>
static void with_per(int per, F f) {
  if constexpr (N > 0) {
    if (per == N) f(std::integral_constant<int, N>{});
    else with_per<N - 1>(per, f);
  }
}

// The resident kernel of a session whose step is a no-op: each step's request taken as the session takes it (with
// host_req, CTA 0 relays it from the page-locked ring), then this CTA's share of the response words stored tagged
// (with host_resp, into the page-locked ring), as the session's threads store their new states.
template <int PER, typename V, bool PAIRS>
__global__ void __launch_bounds__(1024, 1) session_noop(uint64_t* mailbox, unsigned long long host_req,
                                                        uint64_t* resp, unsigned long long host_resp, int words,
                                                        int values, int out_n, int steps, unsigned* sync) {
  extern __shared__ float x[];
  const int per = (out_n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(out_n, lo + per);
  for (int t = 0; t < steps; ++t) {
    const int slot = t % SESSION_DEPTH;
    const unsigned tag = prnn_session_tag(sync, (unsigned)t);
    const unsigned long long host_slot = host_req ? host_req + 8ull * slot * words : 0ull;
    if (prnn_session_take<PER, V, PAIRS>(mailbox + (long long)slot * words, host_slot, x, words, values, tag, t, sync,
                                         SESSION_LIMIT_US))
      return;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x)
      prnn_session_respond<V>(resp, host_resp, (long long)slot * out_n + j, (V)(x[j % values] + 1.0f), tag);
    __syncthreads();  // x is the next take's
  }
}

template <typename V, bool PAIRS>
__global__ void session_publish_kernel(const V* x, uint64_t* mailbox, unsigned* control, const unsigned* sync,
                                       int values, int words) {
  prnn_session_publish<V, PAIRS>(x, mailbox, control, sync, values, words, SESSION_DEPTH);
}

template <typename V, int PER>
__global__ void session_collect_kernel(const uint64_t* resp, V* y, int out_n, unsigned* control, unsigned* sync) {
  prnn_session_collect<V, PER>(resp, y, out_n, control, sync, SESSION_LIMIT_US, SESSION_DEPTH, 0ull);
}

// The next step's input from the states collected (as the bench's chain copies the output into x).
template <typename V>
__global__ void session_next_input(const V* y, V* x, int values) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < values; i += gridDim.x * blockDim.x) x[i] = y[i];
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <int PER, typename V, bool PAIRS>
static void launch_noop(cudaStream_t s, int ctas, int threads, uint64_t* mailbox, uint64_t* host_req, uint64_t* resp,
                        uint64_t* host_resp, int words, int values, int out_n, int steps, unsigned* sync) {
  auto kernel = session_noop<PER, V, PAIRS>;
  // at least 120 KB of shared memory: one CTA an SM, as the session's kernel (its registers) is
  const int smem = std::max<int>(values * (int)sizeof(float), 120 * 1024);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<ctas, threads, smem, s>>>(mailbox, (unsigned long long)host_req, resp, (unsigned long long)host_resp,
                                     words, values, out_n, steps, sync);
  CK(cudaGetLastError());
}

static unsigned read_error(const unsigned* sync) {
  unsigned error = 0;
  CK(cudaMemcpy(&error, sync, sizeof error, cudaMemcpyDeviceToHost));
  return error;
}

// The payload bits of input_value's values (0-999, exact in 16 bits too) and of each plus one (a response).
static std::vector<unsigned> payload_bits(bool half_values, int plus) {
  std::vector<unsigned> bits(1000);
  for (int v = 0; v < 1000; ++v) {
    const float f = (float)(v + plus);
    if (half_values) bits[v] = __half_as_ushort(__float2half(f));
    else memcpy(&bits[v], &f, 4);
  }
  return bits;
}

template <int PER, typename V, bool PAIRS>
static void session_host(int ctas, int threads, int values, int words, int out_n, int steps) {
  uint64_t *req, *resp, *mailbox; unsigned* sync;
  CK(cudaHostAlloc(&req, 8ull * SESSION_DEPTH * words, cudaHostAllocMapped));
  CK(cudaHostAlloc(&resp, 8ull * SESSION_DEPTH * out_n, cudaHostAllocMapped));
  memset(req, 0, 8ull * SESSION_DEPTH * words); memset(resp, 0, 8ull * SESSION_DEPTH * out_n);
  CK(cudaMalloc(&mailbox, 8ull * SESSION_DEPTH * words)); CK(cudaMemset(mailbox, 0, 8ull * SESSION_DEPTH * words));
  CK(cudaMalloc(&sync, 64)); CK(cudaMemset(sync, 0, 64));  // sync[0] the error word, sync[2] the tags' base (0)
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  launch_noop<PER, V, PAIRS>(s, ctas, threads, mailbox, req, nullptr, resp, words, values, out_n, steps, sync);
  std::vector<double> lat;
  const std::vector<unsigned> in_bits = payload_bits(PAIRS, 0), out_bits = payload_bits(PAIRS, 1);
  std::vector<unsigned> x(values), out(out_n);
  unsigned wrong = 0, timeouts = 0;
  for (int t = 0; t < steps && !timeouts; ++t) {
    for (int i = 0; i < values; ++i) x[i] = in_bits[(t * 7 + i) % 1000];  // the caller's input, before the step
    const unsigned tag = (unsigned)t + 1;  // the base (0) + step + 1, as the kernel's
    uint64_t* slot = req + (long long)(t % SESSION_DEPTH) * words;
    const uint64_t* answer = resp + (long long)(t % SESSION_DEPTH) * out_n;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < words; ++i) {  // packed as the native step packs (prnn_tvm/runtime/session_native.c)
      unsigned bits = PAIRS ? x[2 * i] | (2 * i + 1 < values ? x[2 * i + 1] << 16 : 0u) : x[i];
      if (bits > PRNN_SESSION_CLOSE - 1) bits = PRNN_SESSION_CLOSE - 1;
      __atomic_store_n(slot + i, ((uint64_t)tag << 32) | bits, __ATOMIC_RELAXED);
    }
    int i = 0;  // the words before i carry the tag and are unpacked
    for (unsigned polls = 1;; ++polls) {
      if ((unsigned)(__atomic_load_n(answer + out_n - 1, __ATOMIC_ACQUIRE) >> 32) == tag) {
        for (; i < out_n; ++i) {
          const uint64_t word = __atomic_load_n(answer + i, __ATOMIC_ACQUIRE);
          if ((unsigned)(word >> 32) != tag) break;
          out[i] = (unsigned)word;
        }
        if (i == out_n) break;
      }
      __builtin_ia32_pause();
      if (polls % 64 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(2)) { timeouts = 1; break; }
    }
    if (timeouts) break;
    lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    for (int j = 0; j < out_n; ++j) wrong += out[j] != out_bits[(t * 7 + j % values) % 1000];
  }
  CK(cudaStreamSynchronize(s));  // a step that timed out: the kernel gives up 2 s after its last request
  const unsigned error = read_error(sync);
  if (lat.size() < 100) {
    printf("  host to host: gave up after %zu steps (error word %u)\n", lat.size(), error);
  } else {
    std::vector<double> m(lat.begin() + lat.size() / 20, lat.end());
    std::sort(m.begin(), m.end());
    printf("  host to host                         p50 %7.2f  p99 %7.2f  max %8.2f us over %zu steps   wrong %u "
           "timeouts %u\n", m[m.size() / 2], m[m.size() * 99 / 100], m.back(), lat.size(), wrong,
           timeouts + (error != 0));
  }
  cudaFreeHost(req); cudaFreeHost(resp); cudaFree(mailbox); cudaFree(sync); cudaStreamDestroy(s);
}

template <int PER, typename V, bool PAIRS>
static void session_graph(int ctas, int threads, int values, int words, int out_n, int graph_steps, int replays) {
  const int collect_threads = std::min(SESSION_COLLECT_THREADS, ceil_div(out_n, 32) * 32);
  const int collect_per = ceil_div(out_n, collect_threads);
  uint64_t *mailbox, *resp; V *x, *y; unsigned *control, *sync;
  CK(cudaMalloc(&mailbox, 8ull * SESSION_DEPTH * words)); CK(cudaMemset(mailbox, 0, 8ull * SESSION_DEPTH * words));
  CK(cudaMalloc(&resp, 8ull * SESSION_DEPTH * out_n)); CK(cudaMemset(resp, 0, 8ull * SESSION_DEPTH * out_n));
  CK(cudaMalloc(&x, sizeof(V) * values)); CK(cudaMemset(x, 0, sizeof(V) * values));
  CK(cudaMalloc(&y, sizeof(V) * out_n));
  CK(cudaMalloc(&control, 64)); CK(cudaMemset(control, 0, 64));
  CK(cudaMalloc(&sync, 64)); CK(cudaMemset(sync, 0, 64));
  cudaStream_t rs, cs; CK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  const auto publish = session_publish_kernel<V, PAIRS>;
  const auto next = session_next_input<V>;
  void (*collect)(const uint64_t*, V*, int, unsigned*, unsigned*) = nullptr;
  with_per<SESSION_PER_MAX>(collect_per, [&](auto per) { collect = session_collect_kernel<V, decltype(per)::value>; });
  // every kernel of the chain loaded before the resident one starts (CUDA's lazy loading would wait for it)
  for (const void* f : {(const void*)publish, (const void*)next, (const void*)collect}) {
    cudaFuncAttributes attr; CK(cudaFuncGetAttributes(&attr, f));
  }
  launch_noop<PER, V, PAIRS>(rs, ctas, threads, mailbox, nullptr, resp, nullptr, words, values, out_n,
                             graph_steps * (replays + 1), sync);
  cudaGraph_t graph; cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < graph_steps; ++k) {
    publish<<<std::min(ceil_div(values, 256), 64), 256, 0, cs>>>(x, mailbox, control, sync, values, words);
    collect<<<1, collect_threads, 0, cs>>>(resp, y, out_n, control, sync);
    next<<<ceil_div(values, 256), 256, 0, cs>>>(y, x, values);
  }
  CK(cudaStreamEndCapture(cs, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<double> per_step;
  for (int r = 0; r <= replays; ++r) {  // the first replay warms up
    CK(cudaEventRecord(e0, cs));
    CK(cudaGraphLaunch(exec, cs));
    CK(cudaEventRecord(e1, cs));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r) per_step.push_back(1000.0 * ms / graph_steps);
  }
  CK(cudaStreamSynchronize(rs));
  unsigned steps_done = 0;
  CK(cudaMemcpy(&steps_done, control, sizeof steps_done, cudaMemcpyDeviceToHost));
  std::sort(per_step.begin(), per_step.end());
  printf("  in a graph (publish, collect, copy)  best %7.2f  median %7.2f us/step   steps %u of %d, error word %u\n",
         per_step.front(), per_step[per_step.size() / 2], steps_done, graph_steps * (replays + 1), read_error(sync));
  CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph));
  cudaFree(mailbox); cudaFree(resp); cudaFree(x); cudaFree(y); cudaFree(control); cudaFree(sync);
  cudaStreamDestroy(rs); cudaStreamDestroy(cs);
}

template <typename V, bool PAIRS>
static void session_transport(int values, int out_n, int ctas, int threads, int steps) {
  const int words = PAIRS ? ceil_div(values, 2) : values;
  const int take_per = std::min(SESSION_TAKE_PER, ceil_div(words, threads));
  printf("session transport, the step a no-op: %d %s values in %d request words, %d response words, %d CTAs x %d "
         "threads\n", values, PAIRS ? "16-bit" : "float32", words, out_n, ctas, threads);
  with_per<SESSION_TAKE_PER>(take_per, [&](auto per) {
    session_host<decltype(per)::value, V, PAIRS>(ctas, threads, values, words, out_n, steps);
    session_graph<decltype(per)::value, V, PAIRS>(ctas, threads, values, words, out_n, 100, 20);
  });
}

static int session_main(int argc, char** argv) {
  if (argc < 7) {
    printf("usage: %s session VALUES HALF OUT CTAS THREADS [STEPS]\n", argv[0]);
    return 2;
  }
  const int values = atoi(argv[2]), half_values = atoi(argv[3]), out_n = atoi(argv[4]), ctas = atoi(argv[5]);
  const int threads = atoi(argv[6]), steps = argc > 7 ? atoi(argv[7]) : 100000;
  if (values < 1 || values > 8192 || out_n < 1 || out_n > SESSION_COLLECT_THREADS * SESSION_PER_MAX || ctas < 1 ||
      threads < 32 || threads > 1024 || threads % 32 || steps < 100) {
    printf("VALUES 1-8192, OUT 1-%d, CTAS >= 1, THREADS a multiple of 32 up to 1024, STEPS >= 100\n",
           SESSION_COLLECT_THREADS * SESSION_PER_MAX);
    return 2;
  }
  if (half_values) session_transport<half, true>(values, out_n, ctas, threads, steps);
  else session_transport<float, false>(values, out_n, ctas, threads, steps);
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  if (argc > 1 && std::string(argv[1]) == "session") return session_main(argc, argv);
  const int steps = 5000;
  struct Shape { int in_n, out_n; } shapes[] = {{128, 128}, {960, 960}, {5120, 5120}};
  for (auto sh : shapes)
    for (int ctas : {8, 64, 128}) {
      gpu_chain(false, ctas, sh.in_n, sh.out_n, 100, 20);
      gpu_chain(true, ctas, sh.in_n, sh.out_n, 100, 20);
    }
  for (auto sh : shapes)
    for (int ctas : {1, 8, 64, 128}) {
      if (ctas <= 8) host_round_trip<DIRECT>("direct", ctas, sh.in_n, sh.out_n, steps);
      host_round_trip<RELAY>("relay", ctas, sh.in_n, sh.out_n, steps);
      host_round_trip<FLAG>("flag", ctas, sh.in_n, sh.out_n, steps);
    }
  return 0;
}

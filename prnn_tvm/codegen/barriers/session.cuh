#include "common.cuh"
#include "tags.cuh"
#ifndef PRNN_SESSION
#define PRNN_SESSION
// Resident sessions (prnn_tvm/codegen/session.py): a persistent kernel that serves one step per request.
// A request is the step's raw input x_t (B x K values, row-major) as tagged words (base + step + 1) in the
// session's device mailbox ([slot][word]): a word's 32 payload bits carry two 16-bit values of a half layer (the
// first in the low half; PAIRS) or one value as float32 bits. Every CTA polls the request and takes it whole into
// shared memory; each CTA then projects it with W_ih and b_ih for its own units (prnn_session_project). Two transports
// fill the mailbox. Device: prnn_session_publish (a copy and tag of x) on the caller's stream; the kernel stores
// each step's new states tagged in the device response slot, and prnn_session_collect, on the caller's stream
// after the publish, polls them. Host: the host writes the tagged words into page-locked host memory, CTA 0 alone
// polls them there (reads of host memory are PCIe round trips: one agent) and relays them into the device
// mailbox, and the kernel stores the new states tagged straight into a page-locked host response buffer, which
// the host polls. A request whose values are all PRNN_SESSION_CLOSE (every bit set: a NaN no input carries, the
// publishers write another NaN instead) closes the kernel. control[0] counts the steps requested of the
// running launch (the host zeroes it before each launch); the collect advances it. control[1] counts the
// requests published to it (the host tells an idle exit that took no request by it). Every wait is bounded.
#define PRNN_SESSION_CLOSE 0xffffffffu
// In the error word (1 + what timed out): a wait for a request, not for a block or a response, at that step.
#define PRNN_SESSION_IDLE 0x40000000

// One tagged word: relaxed at GPU scope (device memory), or at system scope (page-locked host memory).
template <bool SYS>
__device__ __forceinline__ uint64_t prnn_session_load(const uint64_t* p) {
  uint64_t v;
  if (SYS) {
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  } else {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  }
  return v;
}

// CTA-wide: poll the n tagged words at src (thread i: words i + j * blockDim.x, j < PER) into v until every one
// carries tag. Returns 0, or 1 for the whole block when the wait gave up: it waited limit_us (recorded as
// what + 1 in the error word) or another waiter reported a timeout.
template <int PER, bool SYS = false>
__device__ __forceinline__ int prnn_session_poll(const uint64_t* src, int n, unsigned tag, uint64_t (&v)[PER],
                                                 unsigned* sync, int what, int limit_us) {
  static_assert(PER <= 32, "stale bits");
  unsigned stale = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) stale |= ((int)(threadIdx.x + j * blockDim.x) < n ? 1u : 0u) << j;
  const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)limit_us * 1000ull;
  for (unsigned polls = 1;; ++polls) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (stale & (1u << j)) v[j] = prnn_session_load<SYS>(src + threadIdx.x + j * blockDim.x);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if ((stale & (1u << j)) && (unsigned)(v[j] >> 32) == tag) stale &= ~(1u << j);
    }
    if (!__syncthreads_or(stale != 0u)) return 0;
    if (polls % PRNN_CHECK_EVERY == 0 &&
        __syncthreads_or(threadIdx.x == 0 && prnn_give_up(sync, what, start, limit))) {
      return 1;
    }
  }
}

// CTA-wide: wait for the n words of a request at src (the device mailbox's slot, tagged tag), PER * blockDim.x at
// a time; their values (values of them; two of V a word with PAIRS) into dst (shared, float32). With host_src (the host request slot; 0: the device transport), CTA 0
// polls that instead and relays each word into src. Returns, for the whole block, 0 (taken), 1 (no request
// within limit_us, recorded as (step | PRNN_SESSION_IDLE) + 1 in the error word, or another block reported a
// timeout) or 2 (the request is the close mark).
template <int PER, typename V, bool PAIRS>
__device__ __forceinline__ int prnn_session_take(uint64_t* src, unsigned long long host_src, float* dst, int n,
                                                 int values, unsigned tag, int step, unsigned* sync, int limit_us) {
  const bool relay = host_src != 0ull && blockIdx.x == 0;
  int close = 0;
  for (int first = 0; first < n; first += PER * (int)blockDim.x) {
    uint64_t v[PER];
    const int what = step | PRNN_SESSION_IDLE;
    if (relay) {
      if (prnn_session_poll<PER, true>((const uint64_t*)host_src + first, n - first, tag, v, sync, what, limit_us))
        return 1;
    } else if (prnn_session_poll<PER>(src + first, n - first, tag, v, sync, what, limit_us)) {
      return 1;
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = first + threadIdx.x + j * blockDim.x;
      if (i < n) {
        if (relay) asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(src + i), "l"(v[j]) : "memory");
        const unsigned bits = (unsigned)v[j];
        close |= bits == PRNN_SESSION_CLOSE;
        if (PAIRS) {
          dst[2 * i] = (float)prnn_from_payload<V>(bits & 0xffffu);
          if (2 * i + 1 < values) dst[2 * i + 1] = (float)prnn_from_payload<V>(bits >> 16);
        } else {
          dst[i] = __uint_as_float(bits);
        }
      }
    }
  }
  return __syncthreads_or(close) ? 2 : 0;
}

// CTA-wide, after prnn_session_take: this CTA's part of the step's input projection, x W_ih^T + b_ih, from x (B x
// K, shared) into dst (shared, [row][slice][unit in CTA]: S slices of the CTA's U units, units from cta * U; those
// past H zero), a warp per column (lanes split k, float32 sums), then a block barrier.
template <typename V, int B, int K>
__device__ __forceinline__ void prnn_session_project(const float* x, const V* __restrict__ W,
                                                    const V* __restrict__ bias, float* dst, int H, int S, int U,
                                                    int cta) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int j = threadIdx.x / 32; j < S * U; j += warps) {
    const int s = j / U, ul = j % U, u = cta * U + ul;
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = 0.0f;
    if (u < H) {
      const V* w = W + (long long)(s * H + u) * K;
#pragma unroll 4
      for (int k = lane; k < K; k += 32) {
        const float wk = (float)w[k];
#pragma unroll
        for (int b = 0; b < B; ++b) acc[b] += wk * x[b * K + k];
      }
#pragma unroll
      for (int b = 0; b < B; ++b) {
#pragma unroll
        for (int d = 16; d > 0; d /= 2) acc[b] += __shfl_xor_sync(0xffffffffu, acc[b], d);
      }
    }
    if (lane == 0) {
      const float bj = u < H ? (float)bias[s * H + u] : 0.0f;
#pragma unroll
      for (int b = 0; b < B; ++b) dst[(b * S + s) * U + ul] = u < H ? acc[b] + bj : 0.0f;
    }
  }
  __syncthreads();
}

// The step the next request is for, and its tag: control[0] and the barrier's base (constant while a launch runs).
__device__ __forceinline__ unsigned prnn_session_step(const unsigned* control) { return prnn_ld_relaxed(control); }
__device__ __forceinline__ unsigned prnn_session_tag(const unsigned* sync, unsigned step) {
  return prnn_ld_relaxed(sync + 2) + step + 1u;
}

// A request word: the value's bits with the step's tag, the close mark replaced by the canonical NaN.
__device__ __forceinline__ void prnn_session_post(uint64_t* p, float v, unsigned tag) {
  unsigned bits = __float_as_uint(v);
  if (bits == PRNN_SESSION_CLOSE) bits = 0x7fffffffu;
  const unsigned long long word = ((unsigned long long)tag << 32) | bits;
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(word) : "memory");
}

// A step's new state value, tagged, into the device response word at resp, or with host_resp (the host transport;
// 0: the device one) into the page-locked host word at the same index (a system-scope store: the tag orders it).
template <typename V>
__device__ __forceinline__ void prnn_session_respond(uint64_t* resp, unsigned long long host_resp, long long index,
                                                    V v, unsigned tag) {
  const unsigned long long word = ((unsigned long long)tag << 32) | prnn_payload_bits(v);
  if (host_resp != 0ull) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"((uint64_t*)host_resp + index), "l"(word) : "memory");
  } else {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(resp + index), "l"(word) : "memory");
  }
}

// The publish kernel's body: the n values of x (a step's input, B x K) tagged into the next step's request slot of
// words words (two values a word with PAIRS: no pair goes as the close mark, whose two halves are NaNs).
template <typename V, bool PAIRS>
__device__ __forceinline__ void prnn_session_publish(const V* x, uint64_t* mailbox, unsigned* control,
                                                     const unsigned* sync, int n, int words, int depth) {
  const unsigned step = prnn_session_step(control), tag = prnn_session_tag(sync, step);
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(control + 1, 1u);
  uint64_t* slot = mailbox + (long long)(step % (unsigned)depth) * words;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    if (PAIRS) {
      unsigned bits = prnn_payload_bits(x[2 * i]) | (2 * i + 1 < n ? prnn_payload_bits(x[2 * i + 1]) << 16 : 0u);
      if (bits == PRNN_SESSION_CLOSE) bits = 0xfffffffeu;
      const unsigned long long word = ((unsigned long long)tag << 32) | bits;
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(slot + i), "l"(word) : "memory");
    } else {
      prnn_session_post(slot + i, (float)x[i], tag);
    }
  }
}

// The close kernel's body: the close mark in every word of the next step's request slot.
__device__ __forceinline__ void prnn_session_close(uint64_t* mailbox, const unsigned* control, const unsigned* sync,
                                                   int words, int depth) {
  const unsigned step = prnn_session_step(control), tag = prnn_session_tag(sync, step);
  uint64_t* slot = mailbox + (long long)(step % (unsigned)depth) * words;
  const unsigned long long word = ((unsigned long long)tag << 32) | PRNN_SESSION_CLOSE;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(slot + i), "l"(word) : "memory");
  }
}

// The collect kernel's body (one CTA): poll the n response words of the requested step until every one carries
// its tag, their values into y; then advance the step count. A wait longer than timeout_us (or an error word the
// resident kernel set) gives up: y is NaN and the error word goes to the host word at error_host.
template <typename V, int PER>
__device__ __forceinline__ void prnn_session_collect(const uint64_t* resp, V* y, int n, unsigned* control,
                                                     unsigned* sync, int timeout_us, int depth,
                                                     unsigned long long error_host) {
  __shared__ unsigned step_seen;
  if (threadIdx.x == 0) step_seen = prnn_session_step(control);
  __syncthreads();
  const unsigned step = step_seen, tag = prnn_session_tag(sync, step);
  const uint64_t* src = resp + (long long)(step % (unsigned)depth) * n;
  uint64_t v[PER];
  const int failed = prnn_session_poll<PER>(src, n, tag, v, sync, (int)step, timeout_us);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n) y[i] = failed ? prnn_from_payload<V>(0xffffffffu) : prnn_from_payload<V>((unsigned)v[j]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (failed) prnn_report(sync, error_host);
    control[0] = step + 1u;
  }
}
#endif

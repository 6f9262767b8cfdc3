#include "common.cuh"
#include "tags.cuh"
#ifndef PRNN_SESSION
#define PRNN_SESSION
// Resident sessions (prnn_tvm/codegen/session.py): a persistent kernel that serves one step per request.
// A request is the step's input projection as tagged words (value bits, base + step + 1) in the session's
// mailbox, laid out CTA by CTA ([slot][cta][row][slice][unit]: each CTA's words are contiguous), written by
// prnn_session_publish on the caller's stream. A request whose values are all PRNN_SESSION_CLOSE (every bit
// set: a NaN no projection carries, the publisher writes the canonical NaN instead) closes the kernel. The
// kernel stores each step's outputs tagged in the response slot; prnn_session_collect, on the caller's stream
// after the publish, polls them. control[0] counts the steps requested of the running launch (the host
// zeroes it before each launch); the collect advances it. control[1] counts the requests published to it (the
// host tells an idle exit that took no request by it). Every wait is bounded.
#define PRNN_SESSION_CLOSE 0xffffffffu
// In the error word (1 + what timed out): a wait for a request, not for a block or a response, at that step.
#define PRNN_SESSION_IDLE 0x40000000

// CTA-wide: poll the n tagged words at src (thread i: words i + j * blockDim.x, j < PER) into v until every one
// carries tag. Returns 0, or 1 for the whole block when the wait gave up: it waited limit_us (recorded as
// what + 1 in the error word) or another waiter reported a timeout.
template <int PER>
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
      if (stale & (1u << j)) {
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[j]) : "l"(src + threadIdx.x + j * blockDim.x)
                     : "memory");
      }
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

// CTA-wide: wait for this CTA's n request words at src (tagged tag); their values into dst (shared). Returns, for
// the whole block, 0 (taken), 1 (no request within limit_us, recorded as (step | PRNN_SESSION_IDLE) + 1 in the
// error word, or another block reported a timeout) or 2 (the request is the close mark).
template <int PER>
__device__ __forceinline__ int prnn_session_take(const uint64_t* src, float* dst, int n, unsigned tag, int step,
                                                 unsigned* sync, int limit_us) {
  uint64_t v[PER];
  if (prnn_session_poll<PER>(src, n, tag, v, sync, step | PRNN_SESSION_IDLE, limit_us)) return 1;
  int close = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n) {
      close |= (unsigned)v[j] == PRNN_SESSION_CLOSE;
      dst[i] = __uint_as_float((unsigned)v[j]);
    }
  }
  return __syncthreads_or(close) ? 2 : 0;
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

// The mailbox index of column j of the projection (slice s = j / H, unit u = j % H) of row b.
__device__ __forceinline__ long long prnn_session_word(int slot, int b, int s, int u, int B, int S, int U, int ctas) {
  return (((long long)slot * ctas + u / U) * B + b) * (S * U) + s * U + u % U;
}

// The publish kernel's body: xp = x W^T + bias for the B rows of x (B x K), every column of the CTA-major layout
// (S slices of ctas * U units, units past H zero), a warp per column, into the request slot of the next step.
template <typename V, int B>
__device__ __forceinline__ void prnn_session_publish(const V* x, const V* W, const V* bias, uint64_t* mailbox,
                                                     unsigned* control, const unsigned* sync, int K, int H,
                                                     int S, int U, int ctas, int depth) {
  const unsigned step = prnn_session_step(control), tag = prnn_session_tag(sync, step);
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(control + 1, 1u);
  const int slot = (int)(step % (unsigned)depth), lane = threadIdx.x % 32, padded = ctas * U;
  const int warps = gridDim.x * blockDim.x / 32;
  for (int j = (blockIdx.x * blockDim.x + threadIdx.x) / 32; j < S * padded; j += warps) {
    const int s = j / padded, u = j % padded;
    float acc[B];
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = 0.0f;
    if (u < H) {
      const V* w = W + (long long)(s * H + u) * K;
      for (int k = lane; k < K; k += 32) {
        const float wk = (float)w[k];
#pragma unroll
        for (int b = 0; b < B; ++b) acc[b] += wk * (float)x[(long long)b * K + k];
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
      for (int b = 0; b < B; ++b) {
        prnn_session_post(mailbox + prnn_session_word(slot, b, s, u, B, S, U, ctas), u < H ? acc[b] + bj : 0.0f, tag);
      }
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

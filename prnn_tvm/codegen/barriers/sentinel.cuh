#include "counter.cuh"
#ifndef PRNN_SENTINEL
#define PRNN_SENTINEL
// The sentinel exchange: every bit set marks a slot not written yet (a NaN in each exchanged type);
// a store of that very NaN writes the canonical one instead. `marked`: the bits of prnn_sentinel_marks<V> that
// say a word still holds it.
template <typename V> struct prnn_sentinel_bits;
template <> struct prnn_sentinel_bits<float> {
  typedef unsigned type;
  static constexpr unsigned canonical = 0x7fc00000u;
  static constexpr unsigned marked = 1u;
};
#ifdef __CUDA_FP16_H__
template <> struct prnn_sentinel_bits<half> {
  typedef unsigned short type;
  static constexpr unsigned short canonical = 0x7e00u;
  static constexpr unsigned marked = 0x80008000u;
};
#endif
#ifdef __CUDA_BF16_H__
template <> struct prnn_sentinel_bits<nv_bfloat16> {
  typedef unsigned short type;
  static constexpr unsigned short canonical = 0x7fc0u;
  static constexpr unsigned marked = 0x80008000u;
};
#endif
// Where the 32-bit word w of polled values still holds the sentinel, in the bits prnn_sentinel_bits<V>::marked: a
// float32 word of all bits set (bit 0), or a 16-bit half of all bits set (bit 15 of that half: 0xfffe minus the
// half sets it for a half up to 0x7ffe or of 0xffff, the half's own top bit keeps 0xffff alone; a borrow from the
// low half reaches the high half only when the low half is the sentinel). Two integer operations a word (an IADD
// and a LOP3), masked once per load: __vcmpeq2 took five or six (ncu, LSTM fp16 1024x16: the poll's checks were a
// quarter of all instructions issued), a masked sum three, 0.3-2.2% of a step more (bench/ab_source.py on H100).
template <typename V>
__device__ __forceinline__ unsigned prnn_sentinel_marks(unsigned w) {
  if (sizeof(V) == 4) return w == 0xffffffffu ? 1u : 0u;
  return (0xfffefffeu - w) & w;
}
// The bits of stale whose loads still hold the sentinel: load j is the WORDS words at w + j * WORDS (a 2-byte
// load's word: its high half is 0). A poll's one check of what its round of loads brought.
template <typename V, int WORDS, int LOADS>
__device__ __forceinline__ unsigned prnn_still_stale(const unsigned* w, unsigned stale) {
#pragma unroll
  for (int j = 0; j < LOADS; ++j) {
    unsigned marks = 0u;
#pragma unroll
    for (int e = 0; e < WORDS; ++e) marks |= prnn_sentinel_marks<V>(w[j * WORDS + e]);
    if ((stale & (1u << j)) && !(marks & prnn_sentinel_bits<V>::marked)) stale &= ~(1u << j);
  }
  return stale;
}
// One relaxed load of BYTES (16, 8, 4 or 2) at p into the words at w (2 bytes: the low half of w[0]).
template <int BYTES>
__device__ __forceinline__ void prnn_relaxed_load(const void* p, unsigned* w) {
  if (BYTES == 16) {
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p) : "memory");
  } else if (BYTES == 8) {
    asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p) : "memory");
  } else if (BYTES == 4) {
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(w[0]) : "l"(p) : "memory");
  } else {
    unsigned short h;
    asm volatile("ld.relaxed.gpu.global.u16 %0, [%1];" : "=h"(h) : "l"(p) : "memory");
    w[0] = h;
  }
}
// Before the launch's one barrier: mark a slot this thread will write.
template <typename V>
__device__ __forceinline__ void prnn_sentinel_fill(V* p) {
  typedef typename prnn_sentinel_bits<V>::type B;
  *(B*)p = (B)~0u;
}
// Publish v with a relaxed store (the other blocks poll it with relaxed loads).
template <typename V>
__device__ __forceinline__ void prnn_sentinel_store(V* p, V v) {
  typedef typename prnn_sentinel_bits<V>::type B;
  B bits = *(const B*)&v;
  if (bits == (B)~0u) bits = prnn_sentinel_bits<V>::canonical;
  if (sizeof(B) == 2) {
    asm volatile("st.relaxed.gpu.global.b16 [%0], %1;" :: "l"(p), "h"((unsigned short)bits) : "memory");
  } else {
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" :: "l"(p), "r"((unsigned)bits) : "memory");
  }
}
// Copy n0 values from src0 and n1 from src1 (row-major rows of ROW) that other blocks are writing into dst0
// and dst1 (rows padded to ROW_PAD); SOURCES = 1 ignores src1. Thread t loads the BYTES-wide groups
// t + j * blockDim.x, j < PER, of each source, all in one poll, and loads again those that still hold the
// sentinel: a source that came early costs no round trip of its own. Returns 1 for the whole block if a wait
// timed out or another block reported one. SLEEP_NS > 0: the thread sleeps about that long before each poll
// after the first (prnn_poll_pause).
template <typename V, int PER, int BYTES, int ROW, int ROW_PAD, int SLEEP_NS, int SOURCES>
__device__ __forceinline__ int prnn_sentinel_copy(const V* src0, V* dst0, int n0, const V* src1, V* dst1, int n1,
                                                  int step, unsigned* sync, int timeout_us) {
  constexpr int VEC = BYTES / (int)sizeof(V), WORDS = BYTES >= 4 ? BYTES / 4 : 1, LOADS = SOURCES * PER;
  static_assert((SOURCES == 1 || SOURCES == 2) && LOADS <= 32 && VEC >= 1 && ROW % VEC == 0,
                "sources, stale bits, vector width");
  unsigned w[LOADS][WORDS];
  int failed = 0;
  const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
  unsigned stale = 0;  // bit j: load j (source j / PER, group j % PER) still holds the sentinel
#pragma unroll
  for (int j = 0; j < LOADS; ++j)
    stale |= ((int)(threadIdx.x + (j % PER) * blockDim.x) * VEC < (j < PER ? n0 : n1) ? 1u : 0u) << j;
  for (unsigned polls = 1; stale; ++polls) {
    prnn_poll_pause<SLEEP_NS>(polls);
#pragma unroll
    for (int j = 0; j < LOADS; ++j) {
      if (stale & (1u << j)) {
        prnn_relaxed_load<BYTES>((j < PER ? src0 : src1) + (threadIdx.x + (j % PER) * blockDim.x) * VEC, w[j]);
      }
    }
    stale = prnn_still_stale<V, WORDS, LOADS>(&w[0][0], stale);
    // the step whose values never came is step - 1: record it as (step - 1) + 1
    if (stale && polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step - 1, start, limit)) {
      failed = 1;
      break;
    }
  }
  if (!failed) {
#pragma unroll
    for (int j = 0; j < LOADS; ++j) {
      const int i = (threadIdx.x + (j % PER) * blockDim.x) * VEC;
      if (i < (j < PER ? n0 : n1)) {
        V* d = (j < PER ? dst0 : dst1) + (i / ROW) * ROW_PAD + i % ROW;
        if (BYTES == 16) *(uint4*)d = make_uint4(w[j][0], w[j][WORDS > 1 ? 1 : 0], w[j][WORDS > 2 ? 2 : 0],
                                                w[j][WORDS > 3 ? 3 : 0]);
        else if (BYTES == 8) *(uint2*)d = make_uint2(w[j][0], w[j][WORDS > 1 ? 1 : 0]);
        else if (BYTES == 4) *(unsigned*)d = w[j][0];
        else *(unsigned short*)d = (unsigned short)w[j][0];
      }
    }
  }
  return __syncthreads_or(failed);
}
// A lane's tensor-core B fragments straight from the sequence (the tensor-core template's operand_path="direct"):
// TILES batch rows ROW_STEP values apart from src, PIECES loads of BYTES each per row, 4 * BYTES apart (the other
// lanes of the row load in between), into frag (the lane's registers once inlined, in load order). Loads of rows
// from `rows` on and pieces from `pieces` on are not made and read as zero. POLL: load again those that still
// hold the sentinel, bounded as prnn_sentinel_copy; else load once (an initial state, where every value is
// valid). Returns 1 if this thread's wait timed out or another block reported one: the caller makes that
// block-uniform.
template <typename V, int TILES, int PIECES, int BYTES, int SLEEP_NS, int POLL>
__device__ __forceinline__ int prnn_sentinel_frags(const V* src, long long row_step, int rows, int pieces, V* frag,
                                                   int step, unsigned* sync, int timeout_us) {
  constexpr int VEC = BYTES / (int)sizeof(V), WORDS = BYTES / 4, LOADS = TILES * PIECES;
  static_assert(LOADS <= 32 && (BYTES == 8 || BYTES == 16), "stale bits, load width");
  unsigned* w = (unsigned*)frag;
  unsigned stale = 0;
#pragma unroll
  for (int j = 0; j < LOADS; ++j) {
    if (j / PIECES < rows && j % PIECES < pieces) {
      stale |= 1u << j;
    } else {
#pragma unroll
      for (int e = 0; e < WORDS; ++e) w[j * WORDS + e] = 0u;
    }
  }
  int failed = 0;
  const unsigned long long start = POLL ? prnn_globaltimer() : 0ull, limit = (unsigned long long)timeout_us * 1000ull;
  for (unsigned polls = 1; stale; ++polls) {
    if (POLL) prnn_poll_pause<SLEEP_NS>(polls);
#pragma unroll
    for (int j = 0; j < LOADS; ++j) {
      if (stale & (1u << j)) {
        const V* p = src + (j / PIECES) * row_step + (j % PIECES) * 4 * VEC;
        if (!POLL && BYTES == 16) *(uint4*)(w + j * WORDS) = *(const uint4*)p;
        else if (!POLL) *(uint2*)(w + j * WORDS) = *(const uint2*)p;
        else prnn_relaxed_load<BYTES>(p, w + j * WORDS);
      }
    }
    if (!POLL) break;
    stale = prnn_still_stale<V, WORDS, LOADS>(w, stale);
    // the step whose values never came is step - 1: record it as (step - 1) + 1
    if (stale && polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step - 1, start, limit)) {
      failed = 1;
      break;
    }
  }
  return failed;
}
#endif

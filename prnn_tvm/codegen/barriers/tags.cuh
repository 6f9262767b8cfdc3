#include "common.cuh"
#ifndef PRNN_TAGS
#define PRNN_TAGS
// Data-carried synchronization: an exchanged value travels with the step that wrote it,
// (tag << 32 | payload bits) in one single-copy-atomic 64-bit store; a reader polls the values
// it needs until all carry the tag it expects. No separate barrier, no release fence. The
// payload is any type of at most 32 bits with a prnn_payload_bits / prnn_from_payload pair.
__device__ __forceinline__ unsigned prnn_payload_bits(float v) { return __float_as_uint(v); }
template <typename V> __device__ __forceinline__ V prnn_from_payload(unsigned bits);
template <> __device__ __forceinline__ float prnn_from_payload<float>(unsigned bits) { return __uint_as_float(bits); }
#ifdef __CUDA_FP16_H__
__device__ __forceinline__ unsigned prnn_payload_bits(half v) { return __half_as_ushort(v); }
template <> __device__ __forceinline__ half prnn_from_payload<half>(unsigned bits) {
  return __ushort_as_half((unsigned short)bits);
}
#endif
#ifdef __CUDA_BF16_H__
__device__ __forceinline__ unsigned prnn_payload_bits(nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <> __device__ __forceinline__ nv_bfloat16 prnn_from_payload<nv_bfloat16>(unsigned bits) {
  return __ushort_as_bfloat16((unsigned short)bits);
}
#endif
template <typename V>
__device__ __forceinline__ void prnn_tag_store(uint64_t* p, V v, unsigned tag) {
  const unsigned long long word = ((unsigned long long)tag << 32) | prnn_payload_bits(v);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(word) : "memory");
}
template <typename V>
__device__ __forceinline__ V prnn_tag_value(const uint64_t* p) {
  return prnn_from_payload<V>((unsigned)*p);
}
// Poll the tagged words this thread takes into v until every one carries `tag` in its bits from TAG_SHIFT up: the
// VEC-wide groups (threadIdx.x + j * blockDim.x) * VEC, j < PER, of the n words of src (rows of ROW words, SRC_ROW
// apart in the source; only stale groups are loaded again). VEC = 2 loads two words at once with a volatile vector
// load (each 64-bit word stays single-copy atomic; ld.relaxed has no vector form). SLEEP_NS > 0: the thread sleeps
// about that long before each poll after the first (prnn_poll_pause). Returns 1 if the wait timed out here or another
// block reported one (this thread's alone: the caller makes it the block's).
template <int PER, int VEC, int ROW, int SRC_ROW, int TAG_SHIFT, int SLEEP_NS>
__device__ __forceinline__ int prnn_poll_tagged(uint64_t (&v)[PER][VEC], const uint64_t* src, int n, unsigned tag,
                                                int step, unsigned* sync, int timeout_us) {
  static_assert(PER <= 32 && (VEC == 1 || VEC == 2) && ROW % VEC == 0 && SRC_ROW % VEC == 0, "stale bits, vector");
  const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
  unsigned stale = 0;  // bit j: group j still carries an older tag; only those are polled again
#pragma unroll
  for (int j = 0; j < PER; ++j) stale |= ((int)(threadIdx.x + j * blockDim.x) * VEC < n ? 1u : 0u) << j;
  for (unsigned polls = 1; stale; ++polls) {
    prnn_poll_pause<SLEEP_NS>(polls);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (stale & (1u << j)) {
        const unsigned i = (threadIdx.x + j * blockDim.x) * VEC;
        const uint64_t* p = src + (SRC_ROW == ROW ? i : i / ROW * SRC_ROW + i % ROW);
        if (VEC == 2) {
          asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v[j][0]), "=l"(v[j][VEC - 1]) : "l"(p)
                       : "memory");
        } else {
          asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[j][0]) : "l"(p) : "memory");
        }
      }
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      bool fresh = true;
#pragma unroll
      for (int e = 0; e < VEC; ++e) fresh &= (unsigned)(v[j][e] >> TAG_SHIFT) == tag;
      if ((stale & (1u << j)) && fresh) stale &= ~(1u << j);
    }
    // the step whose values never came is step - 1: record it as (step - 1) + 1
    if (stale && polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step - 1, start, limit)) return 1;
  }
  return 0;
}
// Poll n tagged words with prnn_poll_tagged, then hand each of this thread's to store(index of the word, word): the
// copy loop of prnn_tag_copy and of packed.cuh's prnn_packed_copy. Returns 1 for the whole block if a wait timed out
// or another block reported one (nothing stored then).
template <int PER, int VEC, int ROW, int SRC_ROW, int TAG_SHIFT, int SLEEP_NS, typename Store>
__device__ __forceinline__ int prnn_poll_copy(const uint64_t* src, int n, unsigned tag, int step, unsigned* sync,
                                              int timeout_us, Store store) {
  uint64_t v[PER][VEC];
  const int failed = prnn_poll_tagged<PER, VEC, ROW, SRC_ROW, TAG_SHIFT, SLEEP_NS>(v, src, n, tag, step, sync,
                                                                                  timeout_us);
  if (!failed) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = (threadIdx.x + j * blockDim.x) * VEC;
      if (i < n) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) store(i + e, v[j][e]);
      }
    }
  }
  return __syncthreads_or(failed);
}
// Copy n tagged values (row-major rows of ROW) into dst (rows padded to ROW_PAD), polled by prnn_poll_tagged until
// every tag is the one written at step - 1. Returns 1 for the whole block if a wait timed out or another block
// reported one. SRC_ROW: values between the source's rows (ROW: contiguous; more: ROW columns of each row of a wider
// array).
template <typename V, int PER, int VEC, int ROW, int ROW_PAD, int SLEEP_NS, int SRC_ROW = ROW>
__device__ __forceinline__ int prnn_tag_copy(const uint64_t* src, V* dst, int n, int base, int step,
                                             unsigned* sync, int timeout_us) {
  const unsigned tag = (unsigned)base + (unsigned)step;  // written at step - 1
  return prnn_poll_copy<PER, VEC, ROW, SRC_ROW, 32, SLEEP_NS>(
      src, n, tag, step, sync, timeout_us,
      [&](int k, uint64_t word) { dst[(k / ROW) * ROW_PAD + k % ROW] = prnn_from_payload<V>((unsigned)word); });
}
#endif

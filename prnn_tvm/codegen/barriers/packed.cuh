#include "peers.cuh"
#ifndef PRNN_PACKED
#define PRNN_PACKED
// Packed tagged words (a split layer's words="packed", packed.py): three 16-bit values of consecutive units of one
// batch row (lanes 0, 1, 2: bits 0-15, 16-31, 32-47) and the low 16 bits of the step's tag (bits 48-63) in one
// single-copy-atomic 64-bit word. A CTA's U units of a row take W = ceil(U / 3) words, the last partly empty (zeros).
__device__ __forceinline__ unsigned long long prnn_packed_word(unsigned a, unsigned b, unsigned c, unsigned tag) {
  return ((unsigned long long)(tag & 0xffffu) << 48) | ((unsigned long long)(c & 0xffffu) << 32) |
         ((unsigned long long)(b & 0xffffu) << 16) | (unsigned long long)(a & 0xffffu);
}
template <typename V>
__device__ __forceinline__ unsigned long long prnn_pack(V a, V b, V c, unsigned tag) {
  return prnn_packed_word(prnn_payload_bits(a), prnn_payload_bits(b), prnn_payload_bits(c), tag);
}
// Into this GPU's copy (gpu scope: its readers are its own blocks).
__device__ __forceinline__ void prnn_packed_store(uint64_t* p, unsigned long long word) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(word) : "memory");
}
// The same word into a peer's copy at the same place (system scope, over NVLink; peers.cuh says why no fence).
__device__ __forceinline__ void prnn_packed_store_peer(const uint64_t* slot, const uint64_t* ws, long long peer,
                                                       unsigned long long word) {
  uint64_t* p = (uint64_t*)peer + (slot - ws);
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(word) : "memory");
}
// The split's floor (timing only): the "peer" is this GPU's own copy, the same store into the same slot again.
__device__ __forceinline__ void prnn_packed_store_peer(const uint64_t* slot, const uint64_t* ws, const uint64_t* own,
                                                       unsigned long long word) {
  prnn_packed_store_peer(slot, ws, (long long)own, word);
}
// Poll-and-copy n packed words (rows of WROW words, SRC_ROW words apart in the source) into dst, polled by
// prnn_poll_tagged (tags.cuh) until every word carries the low 16 bits of the tag written at step - 1: word w of a row
// holds units (w / W) * U + (w % W) * 3 + lane, lane < 3, of which those of the CTA's U and below COLS go to
// dst[row * ROW_PAD + unit]. Returns 1 for the whole block if a wait timed out or another block reported one.
template <typename V, int PER, int VEC, int WROW, int W, int U, int COLS, int ROW_PAD, int SLEEP_NS, int SRC_ROW>
__device__ __forceinline__ int prnn_packed_copy(const uint64_t* src, V* dst, int n, int base, int step,
                                                unsigned* sync, int timeout_us) {
  static_assert(W == (U + 2) / 3, "three units a word");
  const unsigned tag = ((unsigned)base + (unsigned)step) & 0xffffu;  // written at step - 1
  return prnn_poll_copy<PER, VEC, WROW, SRC_ROW, 48, SLEEP_NS>(src, n, tag, step, sync, timeout_us,
                                                               [&](int k, uint64_t word) {
    const int row = k / WROW, w = k % WROW;
    const int first = (w / W) * U + (w % W) * 3;
#pragma unroll
    for (int lane = 0; lane < 3; ++lane) {
      if ((w % W) * 3 + lane < U && first + lane < COLS) {
        dst[row * ROW_PAD + first + lane] = prnn_from_payload<V>((unsigned)(word >> (16 * lane)) & 0xffffu);
      }
    }
  });
}
#endif

#include "tags.cuh"
#ifndef PRNN_PEERS
#define PRNN_PEERS
// A layer split over several GPUs (schedules/split.py): every GPU keeps a whole copy of the tagged exchange, and a
// value published into this GPU's copy at `slot` also goes, as the same tagged word, to the same place of a peer
// GPU's copy, whose base address is `peer` (a store over NVLink once peer access is enabled). System scope: the
// peer's readers are not in this GPU's scope. The word carries its step, so no fence orders it.
template <typename V>
__device__ __forceinline__ void prnn_tag_store_peer(const uint64_t* slot, const uint64_t* ws, long long peer, V v,
                                                    unsigned tag) {
  uint64_t* p = (uint64_t*)peer + (slot - ws);
  const unsigned long long word = ((unsigned long long)tag << 32) | prnn_payload_bits(v);
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(word) : "memory");
}
// The split's floor (timing only): the "peer" is this GPU's own copy, the same store into the same slot again.
template <typename V>
__device__ __forceinline__ void prnn_tag_store_peer(const uint64_t* slot, const uint64_t* ws, const uint64_t* own,
                                                    V v, unsigned tag) {
  prnn_tag_store_peer<V>(slot, ws, (long long)own, v, tag);
}
#endif

"""Synchronization between timesteps: the project's three designs and cooperative groups' ``grid.sync()``.

- ``tags`` (default where it fits): data-carried synchronization. Every exchanged value
  travels with the step that wrote it, ``(tag << 32) | bits`` in one single-copy-atomic
  64-bit relaxed store (the payload: the value's bits, any type of up to 32 bits listed in
  ``PAYLOAD_TYPES``); a block polls the values it needs until all carry the expected
  tag (only the stale ones are loaded again). No barrier call, no release fence, no
  separate data read: on an H100 the fastest (0.91-0.97 us per all-to-all step at 132
  CTAs, vs 1.32 for ``grid.sync()``), up to 23% faster per LSTM step at batch 1-4. It
  needs twice the state traffic, so large batch tiles fall back to ``counter``. With a
  double-buffered exchange it is only a barrier when every block reads every other
  block's values, which a recurrent product guarantees.
- ``sentinel``: the exchange cuDNN's persistent LSTM uses. Each step's state goes into a slot of
  its own, the output sequence, which the kernel fills with a sentinel (every bit set: a NaN in
  float32, float16 and bfloat16, which no store writes) before one ``counter`` barrier at its
  start; a block then polls the values of step ``t - 1`` with 16-byte relaxed loads until none
  is the sentinel. Each value is its own flag (2 bytes a half value, where ``tags`` moves 8),
  and no slot is written twice in a launch, so no tag, no reset and no fence between steps.
  One-part, one-phase cells whose exchanged state is their output; fastest on small grids.
- ``counter``: one monotonic arrival counter; thread 0 of each block adds with a gpu-scope
  *release* reduction after a block barrier (cumulative over the block's writes), polls
  with *acquire* loads, and a block barrier publishes the result. As fast as ``grid.sync()``,
  and bounded.
- ``grid_sync``: cooperative groups; no state, no timeout (CUDA guarantees it under
  cooperative launch); the baseline.

The project's designs share one protocol (device code pasted with ``T.cuda.func_call``,
which pastes the source once per function called, hence the include guards):

- the device functions of both (``_COMMON``) are pasted with their own source, each barrier's
  with its own (which includes the common part behind its guard): TVM keeps one source per
  function name, so one module can hold kernels of different barriers;
- **state** is a ``uint32`` buffer of ``SYNC_WORDS`` words owned by the layer: word 0 the
  error word (0, or 1 + the step whose wait timed out), word 1 the arrival count, word 2
  the base, word 3 the blocks that left the running launch;
- **no reset between launches**: the base is the number of barriers (``counter``) or steps
  (``tags``) all earlier launches passed, mod 2^32. Every thread reads it once when the
  kernel starts (a volatile load, which the compiler cannot repeat later); step ``s`` waits
  for count ``(base + s + 1) * ctas`` or for values tagged ``base + s`` written at step
  ``s - 1``, compared wrap-safe. The last block to leave advances the base: thread 0 of each
  block counts it out with an acquire-release atomic, after a block barrier of the time
  loop that every thread of the block passed after reading the base (a launch of no steps
  leaves the base as it was), and the next launch starts after this one ends. Not block 0:
  with ``tags`` and independent parts (a bidirectional layer's directions) block 0 never
  waits for the other part's blocks. Only a timeout leaves the state inconsistent: the host
  then zeroes it (and the workspace, whose tags are stale);
- **never hangs**: every poll loop looks at the error word and ``%globaltimer`` every
  ``PRNN_CHECK_EVERY`` polls, gives up after ``timeout_us``, records the step in the error
  word (first one wins) and makes the whole block leave its time loop; a waiter that sees
  the error word set gives up at once;
- **reported without a host synchronization**: when its time loop ends, a block that finds
  the error word set fills its part of the outputs with NaN (a result read before anyone
  checks never looks valid) and copies the word to ``error_host``, the address of a word of
  page-locked host memory that the host reads whenever it likes (0: no such word). The
  error word stays set until the host resets the state, so every later launch on that
  state gives up at once and fills NaN too; the host raises :class:`BarrierTimeout`;
- ``stall_step`` (a test knob, -1 in normal use) makes block 0 skip its arrival (or its
  tagged stores) at that step, which forces the timeout path.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ..dtypes import itemsize
from ..errors import ConfigError
from ..signature import SYNC_SCALARS

SYNC_WORDS = 4  # error word, counter, base, blocks that left the running launch

_COMMON = r"""
#ifndef PRNN_BARRIER_COMMON
#define PRNN_BARRIER_COMMON
__device__ __forceinline__ unsigned prnn_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned prnn_ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long prnn_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Before poll number POLLS of a data-carried wait: with SLEEP_NS > 0, from the second poll on, sleep about
// SLEEP_NS nanoseconds (__nanosleep: sm_70+; the hardware picks a time up to twice it). Fewer polls of the
// same lines leave the L2 to the stores being waited for; each costs up to the sleep in latency.
template <int SLEEP_NS>
__device__ __forceinline__ void prnn_poll_pause(unsigned polls) {
#if __CUDA_ARCH__ >= 700
  if (SLEEP_NS > 0 && polls > 1) __nanosleep(SLEEP_NS);
#endif
}
// Barriers (or steps) all earlier launches passed, read once by every thread at the start (volatile:
// a plain load may be repeated later, when the last block out may have moved the base on).
__device__ __forceinline__ int prnn_barrier_begin(const unsigned* sync) { return (int)prnn_ld_relaxed(sync + 2); }
// The last block to leave records this launch's barriers in the base: each block counts itself out in
// word 3 (release: after its threads read the base; acquire: the last one sees every count before it).
__device__ __forceinline__ void prnn_barrier_end(unsigned* sync, int base, int barriers) {
  if (threadIdx.x != 0) return;
  unsigned left;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(left) : "l"(sync + 3) : "memory");
  if (left == gridDim.x - 1) {
    sync[3] = 0u;
    sync[2] = (unsigned)base + (unsigned)barriers;
  }
}
// Every PRNN_CHECK_EVERY polls a waiter looks at the error word and the clock: checking on
// every poll would put a second round trip into each one.
#define PRNN_CHECK_EVERY 32
// 1 when this wait must give up: another block reported a timeout, or this one timed out
// (then it records 1 + step in the error word, first one wins).
__device__ __forceinline__ int prnn_give_up(unsigned* sync, int step, unsigned long long start,
                                            unsigned long long limit_ns) {
  if (prnn_ld_relaxed(sync) != 0u) return 1;
  if (prnn_globaltimer() - start > limit_ns) {
    atomicCAS(sync, 0u, (unsigned)step + 1u);
    return 1;
  }
  return 0;
}
// At the end of a launch: the error word (0, or 1 + the step that timed out). When it is set,
// thread 0 copies it to the host-mapped word at error_host (0: none) with a system-scope store.
__device__ __forceinline__ unsigned prnn_report(const unsigned* sync, unsigned long long error_host) {
  const unsigned error = prnn_ld_relaxed(sync);
  if (error != 0u && threadIdx.x == 0 && error_host != 0ull) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(error_host), "r"(error) : "memory");
  }
  return error;
}
// Poll *p until it reaches target (wrap-safe); 0 when reached, 1 when giving up.
__device__ __forceinline__ int prnn_wait_geq(const unsigned* p, unsigned target, unsigned* sync, int step,
                                             unsigned long long limit_ns, unsigned long long start) {
  for (unsigned polls = 1; (int)(prnn_ld_acquire(p) - target) < 0; ++polls) {
    if (polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step, start, limit_ns)) return 1;
  }
  return 0;
}
#endif
"""

_COUNTER = _COMMON + r"""
#ifndef PRNN_BARRIER_COUNTER
#define PRNN_BARRIER_COUNTER
// One monotonic arrival counter: thread 0 adds with a release reduction and polls it.
__device__ __forceinline__ int prnn_barrier_counter(unsigned* sync, int base, int step, int timeout_us,
                                                 int stall_step) {
  __shared__ int prnn_abort;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (!(blockIdx.x == 0 && step == stall_step)) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(sync + 1) : "memory");
    }
    const unsigned target = ((unsigned)base + (unsigned)step + 1u) * gridDim.x;
    prnn_abort = prnn_wait_geq(sync + 1, target, sync, step, (unsigned long long)timeout_us * 1000ull,
                               prnn_globaltimer());
  }
  __syncthreads();
  return prnn_abort;
}
#endif
"""


_TAGS = _COMMON + r"""
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
// Copy n tagged values (row-major rows of ROW) into dst (rows padded to ROW_PAD): thread t
// takes the VEC-wide groups t + j * blockDim.x, j < PER, and polls until every tag is the one
// written at step - 1 (only stale groups are loaded again). Returns 1 for the whole block if a
// wait timed out or another block reported one. VEC = 2 loads two tagged words at once with a
// volatile vector load (each 64-bit word stays single-copy atomic; ld.relaxed has no vector form).
// SLEEP_NS > 0: the thread sleeps about that long before each poll after the first (prnn_poll_pause).
template <typename V, int PER, int VEC, int ROW, int ROW_PAD, int SLEEP_NS>
__device__ __forceinline__ int prnn_tag_copy(const uint64_t* src, V* dst, int n, int base, int step,
                                             unsigned* sync, int timeout_us) {
  static_assert(PER <= 32 && (VEC == 1 || VEC == 2) && ROW % VEC == 0, "stale bits, vector width");
  const unsigned tag = (unsigned)base + (unsigned)step;  // written at step - 1
  uint64_t v[PER][VEC];
  int failed = 0;
  const unsigned long long start = prnn_globaltimer(), limit = (unsigned long long)timeout_us * 1000ull;
  unsigned stale = 0;  // bit j: group j still carries an older tag; only those are polled again
#pragma unroll
  for (int j = 0; j < PER; ++j) stale |= ((int)(threadIdx.x + j * blockDim.x) * VEC < n ? 1u : 0u) << j;
  for (unsigned polls = 1; stale; ++polls) {
    prnn_poll_pause<SLEEP_NS>(polls);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (stale & (1u << j)) {
        const uint64_t* p = src + (threadIdx.x + j * blockDim.x) * VEC;
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
      for (int e = 0; e < VEC; ++e) fresh &= (unsigned)(v[j][e] >> 32) == tag;
      if ((stale & (1u << j)) && fresh) stale &= ~(1u << j);
    }
    // the step whose values never came is step - 1: record it as (step - 1) + 1
    if (stale && polls % PRNN_CHECK_EVERY == 0 && prnn_give_up(sync, step - 1, start, limit)) {
      failed = 1;
      break;
    }
  }
  if (!failed) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = (threadIdx.x + j * blockDim.x) * VEC;
      if (i < n) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          dst[((i + e) / ROW) * ROW_PAD + (i + e) % ROW] = prnn_from_payload<V>((unsigned)v[j][e]);
        }
      }
    }
  }
  return __syncthreads_or(failed);
}
#endif
"""


_SENTINEL = _COUNTER + r"""
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
"""

@dataclass(frozen=True)
class Barrier:
    """A way to separate timesteps.

    ``function`` is the barrier's device function (None for cooperative groups' grid sync
    and for ``tags``, where no barrier call exists); ``carries_data`` marks the
    data-carried variant, which changes how a kernel exchanges its states.
    """

    name: str
    function: str | None
    source: str | None
    carries_data: bool = False
    sentinel: bool = False  # the data-carried exchange through the output sequence (else tagged words)

    @property
    def has_state(self) -> bool:
        return self.source is not None


BARRIERS = {
    "tags": Barrier("tags", None, _TAGS, carries_data=True),
    "sentinel": Barrier("sentinel", "prnn_barrier_counter", _SENTINEL, carries_data=True, sentinel=True),
    "counter": Barrier("counter", "prnn_barrier_counter", _COUNTER),
    "grid_sync": Barrier("grid_sync", None, None),
}


# The C type of each exchanged dtype the ``tags`` payload carries (at most 32 bits next to the tag).
PAYLOAD_TYPES = {"float32": "float", "float16": "half", "bfloat16": "nv_bfloat16"}


def payload_type(dtype: str, barrier: Barrier | None = None) -> str:
    """The C type a data-carried barrier (``tags``, or ``barrier``) exchanges ``dtype`` values as;
    ConfigError when it cannot."""
    if dtype not in PAYLOAD_TYPES:
        name = "tags" if barrier is None else barrier.name
        raise ConfigError(f"the '{name}' barrier carries {', '.join(PAYLOAD_TYPES)} values, not {dtype}")
    return PAYLOAD_TYPES[dtype]


@dataclass(frozen=True)
class SyncArgs:
    """The kernel arguments of a stateful barrier (``prnn_tvm.signature.recurrent_args`` orders them)."""

    sync: object
    timeout_us: object
    stall_step: object
    error_host: object


def declare_sync_args() -> SyncArgs:
    """Declare the barrier's kernel arguments inside a ``T.prim_func()`` frame (for kernels without a
    layer signature, like the barrier probe)."""
    sync = T.arg("sync", T.buffer((SYNC_WORDS,), "uint32", buffer_name="sync"))
    return SyncArgs(sync, *(T.arg(name, tirx.Var(name, dtype)) for name, dtype in SYNC_SCALARS.items()))


def emit_begin(barrier: Barrier, args: SyncArgs | None):
    """At kernel start: bind and return the base (None for ``grid_sync``)."""
    if not barrier.has_state:
        return None
    call = T.cuda.func_call("prnn_barrier_begin", args.sync.data, source_code=_COMMON, return_type="int32")
    return T.bind(call, var=tirx.Var("barrier_base", "int32"))


def emit_end(barrier: Barrier, args: SyncArgs | None, base, advance) -> None:
    """At kernel end: advance the base past this launch (by its barriers, or its steps for ``tags``)."""
    if barrier.has_state:
        T.evaluate(T.cuda.func_call("prnn_barrier_end", args.sync.data, base, advance, source_code=_COMMON,
                                    return_type="void"))


def emit_report(barrier: Barrier, args: SyncArgs):
    """At kernel end: the error word, copied to the host word when set (an int32 expression bound to a var)."""
    call = T.cuda.func_call("prnn_report", args.sync.data, T.Cast("uint64", args.error_host),
                            source_code=_COMMON, return_type="uint32")
    return T.bind(T.Cast("int32", call), var=tirx.Var("barrier_error", "int32"))


def tag_store(barrier: Barrier, ptr, value, base, step):
    """``tags``: store ``value`` written at ``step`` with its tag (an expression to evaluate)."""
    return T.cuda.func_call("prnn_tag_store", ptr, value, T.Cast("uint32", base + step + 1),
                            source_code=barrier.source, return_type="void")


def tag_value(barrier: Barrier, ptr, dtype: str):
    """``tags``: the ``dtype`` value part of a tagged word (the caller's own earlier store: no polling)."""
    return T.cuda.func_call(f"prnn_tag_value<{payload_type(dtype)}>", ptr, source_code=barrier.source,
                            return_type=dtype)


def tag_copy(barrier: Barrier, threads: int, src, dst, dtype: str, n, max_n: int, row: int, row_pad: int, base,
             step, args: SyncArgs, sleep_ns: int = 0):
    """``tags``: poll-and-copy ``n`` (at most ``max_n``) tagged ``dtype`` values, rows of ``row``, into
    shared memory rows of ``row_pad``, sleeping about ``sleep_ns`` between polls (0: none); returns the
    block-uniform abort flag."""
    vec = 2 if row % 2 == 0 else 1
    per, _ = polled_loads(barrier, max_n, threads, row, itemsize(dtype))  # as the config's validate counts them
    call = T.cuda.func_call(f"prnn_tag_copy<{payload_type(dtype)}, {per}, {vec}, {row}, {row_pad}, {sleep_ns}>",
                            src, dst, n, base, step, args.sync.data, args.timeout_us, source_code=barrier.source,
                            return_type="int32")
    return T.bind(call, var=tirx.Var("exchange_abort", "int32"))


def row_lanes(hidden: int, itemsize: int) -> int:
    """Values per load of a state tile's rows of ``hidden`` values (a plain tile load, a ``sentinel`` poll):
    16 bytes where the row allows, else 4, 2 or 1 values."""
    return next(n for n in (16 // itemsize, 4, 2, 1) if hidden % n == 0)


SENTINEL_SOURCES = 2  # operands one ``sentinel`` poll waits on together (``prnn_sentinel_copy``'s SOURCES)


def polled_loads(barrier: Barrier, values: int, threads: int, hidden: int, itemsize: int,
                 operands: int = 1) -> tuple[int, int]:
    """``(loads per thread, registers per load)`` of a data-carried barrier's poll of ``values`` exchanged
    values (rows of ``hidden``) of each of ``operands`` operands; ``(0, 0)`` for the others. A ``tags`` load
    holds two tagged 64-bit words (one where ``hidden`` is odd) and polls one operand at a time; a ``sentinel``
    one holds up to 16 bytes and polls up to ``SENTINEL_SOURCES`` operands at once. Each its own 64-bit address."""
    if not barrier.carries_data:
        return 0, 0
    if barrier.sentinel:
        lanes = row_lanes(hidden, itemsize)
        return polled_together(barrier, operands) * -(-values // (threads * lanes)), max(1, lanes * itemsize // 4) + 2
    vec = 2 if hidden % 2 == 0 else 1
    return -(-values // (threads * vec)), 2 * vec + 2


def polled_together(barrier: Barrier, operands: int) -> int:
    """How many of a phase's ``operands`` one poll of a data-carried barrier waits on at once."""
    return min(operands, SENTINEL_SOURCES) if barrier.sentinel else min(operands, 1)


def sentinel_fill(barrier: Barrier, ptr, dtype: str):
    """``sentinel``: mark the slot at ``ptr`` not written yet (before the launch's one barrier)."""
    return T.cuda.func_call(f"prnn_sentinel_fill<{payload_type(dtype, barrier)}>", ptr, source_code=barrier.source,
                            return_type="void")


def sentinel_store(barrier: Barrier, ptr, value, dtype: str):
    """``sentinel``: publish ``value`` at ``ptr`` (an expression to evaluate)."""
    return T.cuda.func_call(f"prnn_sentinel_store<{payload_type(dtype, barrier)}>", ptr, value,
                            source_code=barrier.source, return_type="void")


def sentinel_copy(barrier: Barrier, threads: int, sources: list, dtype: str, max_n: int, row: int, row_pad: int,
                  step, args: SyncArgs, sleep_ns: int = 0):
    """``sentinel``: one poll-and-copy of up to ``SENTINEL_SOURCES`` sources ``(src, dst, n)``: ``n`` (at most
    ``max_n``; 0: none) ``dtype`` values written at ``step - 1``, rows of ``row``, from ``src`` into shared memory
    at ``dst``, rows of ``row_pad``, sleeping about ``sleep_ns`` between polls (0: none); returns the
    block-uniform abort flag."""
    assert 1 <= len(sources) <= SENTINEL_SOURCES, len(sources)
    size = itemsize(dtype)
    per, _ = polled_loads(barrier, max_n, threads, row, size)  # per source, as the config's validate counts them
    width = row_lanes(row, size) * size
    src, dst, _ = sources[0]
    second = sources[1] if len(sources) > 1 else (src, dst, 0)  # SOURCES = 1 never reads it
    call = T.cuda.func_call(f"prnn_sentinel_copy<{payload_type(dtype, barrier)}, {per}, {width}, {row}, {row_pad}, "
                            f"{sleep_ns}, {len(sources)}>",
                            *sources[0], *second, step, args.sync.data, args.timeout_us, source_code=barrier.source,
                            return_type="int32")
    return T.bind(call, var=tirx.Var("exchange_abort", "int32"))


def sentinel_fragments(barrier: Barrier, src, row_step, rows, pieces, frag, dtype: str, tiles: int, loads: int,
                       width: int, poll: bool, step, args: SyncArgs, sleep_ns: int = 0):
    """``sentinel``, a lane's own tensor-core fragments: ``tiles`` batch rows ``row_step`` values apart from ``src``,
    ``loads`` loads of ``width`` bytes each per row, ``4 * width`` bytes apart, into the registers at ``frag``; rows
    from ``rows`` on and loads from ``pieces`` on read as zero. ``poll``: values written at ``step - 1``, polled
    until none holds the sentinel (sleeping about ``sleep_ns`` between polls); else loaded once (an initial state).
    Returns this thread's abort flag (not block-uniform)."""
    call = T.cuda.func_call(f"prnn_sentinel_frags<{payload_type(dtype, barrier)}, {tiles}, {loads}, {width}, "
                            f"{sleep_ns}, {int(poll)}>", src, T.Cast("int64", row_step), rows, pieces, frag, step,
                            args.sync.data, args.timeout_us, source_code=barrier.source, return_type="int32")
    return T.bind(call, var=tirx.Var("exchange_abort", "int32"))


_BLOCK_OR = r"""
#ifndef PRNN_BLOCK_OR
#define PRNN_BLOCK_OR
__device__ __forceinline__ int prnn_block_or(int flag) { return __syncthreads_or(flag); }
#endif
"""


def block_or(flag):
    """A block barrier that returns whether ``flag`` is set in any thread of the block (an int32 expression)."""
    return T.cuda.func_call("prnn_block_or", flag, source_code=_BLOCK_OR, return_type="int32")


def sentinel_start(barrier: Barrier, base, args: SyncArgs):
    """``sentinel``: the launch's one barrier, after every block filled its slots (barrier ordinal 0, never
    stalled by the test knob); returns the abort flag."""
    call = T.cuda.func_call(barrier.function, args.sync.data, base, 0, args.timeout_us, -1,
                            source_code=barrier.source, return_type="int32")
    return T.bind(call, var=tirx.Var("start_abort", "int32"))


def emit(barrier: Barrier, step, base, args: SyncArgs | None, stall=None) -> None:
    """Emit the barrier of ``step`` (its ordinal among the launch's barriers); with a stateful
    barrier, leave the enclosing loop if it timed out. ``stall`` is the ordinal the test knob
    stalls (default: the ``stall_step`` argument itself)."""
    if barrier.carries_data:
        return
    if not barrier.has_state:
        T.evaluate(T.cuda.grid_sync())
        return
    stall = args.stall_step if stall is None else stall
    call = T.cuda.func_call(barrier.function, args.sync.data, base, step, args.timeout_us, stall,
                            source_code=barrier.source, return_type="int32")
    abort = T.bind(call, var=tirx.Var("barrier_abort", "int32"))
    with T.If(abort != 0):
        with T.Then():
            T.Break()

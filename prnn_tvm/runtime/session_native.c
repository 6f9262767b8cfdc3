/* The host's half of a session's host step, native (prnn_tvm/runtime/session_native.py builds and loads it; the
 * Python it replaces, and the word layout, are prnn_tvm/runtime/session_host.py and session_words.py).
 *
 * One call per step: the step's input into its request slot as tagged 64-bit words ((tag << 32) | value bits),
 * then a spin on the step's response slot until every word carries the tag, its values unpacked into the caller's
 * output. Each word is one aligned 8-byte atomic store or load, so a word's tag vouches for its value: the request
 * needs no sequence word and no fence, and the resident kernel reads the words in any order. The spin's loads are
 * atomic (the compiler may not hoist them out of the loop), with a pause between polls; every CHECK_EVERY polls it
 * looks at the kernel's error word and the clock (CLOCK_MONOTONIC), so it ends at the kernel's error (FAILED) or
 * past its deadline (TIMED_OUT). It holds the GIL for the first HOLD_GIL_NS (a step's usual wait: no cost to take
 * it back) and lets other threads run for the rest of a longer wait.
 *
 * A CPython extension module rather than a library for ctypes: a ctypes call costs about 0.5 us and a NumPy array's
 * address through ctypes a microsecond or more, where this takes the arrays through the buffer protocol (or a
 * tensor's data_ptr() as an integer) in one vectorcall.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#define READY 0
#define FAILED 1
#define TIMED_OUT 2
#define CHECK_EVERY 64
#define HOLD_GIL_NS 50000LL
#define CLOSE_SENT_AS 0xfffffffeu /* an input value whose bits are the close mark's goes as this NaN */

enum { PACK_FLOAT32 = 0, PACK_PAIRS = 1, PACK_WIDEN = 2 };

/* A session's rings and how its words are packed (session_native.Ring, filled once by the host). */
typedef struct {
  uint64_t *requests;       /* depth x request_words */
  uint64_t *responses;      /* depth x response_words */
  const uint32_t *error;    /* the resident kernel's error word: non-zero once it left with an error */
  const uint32_t *widen;    /* PACK_WIDEN: the float32 bits of every 16-bit value, by its bits */
  int64_t depth, request_words, response_words;
  int64_t values;           /* input values a request carries */
  int64_t mode;             /* PACK_FLOAT32: a float32 a word; PACK_PAIRS: two 16-bit values a word (the first in
                               the low half); PACK_WIDEN: a 16-bit value a word, widened to float32 bits */
  int64_t input_bytes;      /* bytes of an input value: 4, or 2 */
  int64_t state_bytes;      /* bytes of a state value: 4, or 2 (a response word's low bits) */
} prnn_ring;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void pack(const prnn_ring *r, const void *x, int64_t step, uint32_t tag) {
  uint64_t *slot = r->requests + (step % r->depth) * r->request_words;
  const uint64_t high = (uint64_t)tag << 32;
  const int64_t n = r->request_words;
  if (r->mode == PACK_FLOAT32) {
    const uint32_t *v = (const uint32_t *)x;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = v[i] > CLOSE_SENT_AS ? CLOSE_SENT_AS : v[i];
      __atomic_store_n(slot + i, high | bits, __ATOMIC_RELAXED);
    }
  } else if (r->mode == PACK_PAIRS) {
    const uint16_t *v = (const uint16_t *)x;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t low = v[2 * i], up = 2 * i + 1 < r->values ? v[2 * i + 1] : 0u;
      uint32_t bits = low | (up << 16);
      if (bits > CLOSE_SENT_AS) bits = CLOSE_SENT_AS;
      __atomic_store_n(slot + i, high | bits, __ATOMIC_RELAXED);
    }
  } else {
    const uint16_t *v = (const uint16_t *)x;
    for (int64_t i = 0; i < n; ++i) __atomic_store_n(slot + i, high | r->widen[v[i]], __ATOMIC_RELAXED);
  }
}

/* Spin until every response word of step's slot carries tag, unpacking each into out as it is seen (a word that
 * carries the step's tag is written again only for the request after next, which the host has not posted). */
static int collect(const prnn_ring *r, void *out, int64_t step, uint32_t tag, int64_t timeout_ns) {
  const uint64_t *slot = r->responses + (step % r->depth) * r->response_words;
  const int64_t n = r->response_words;
  const int64_t start = now_ns();
  PyThreadState *released = NULL;
  int ended = READY;
  int64_t i = 0; /* the words before i carry the tag and are unpacked */
  for (uint64_t polls = 1;; ++polls) {
    if ((uint32_t)(__atomic_load_n(slot + n - 1, __ATOMIC_ACQUIRE) >> 32) == tag) {
      for (; i < n; ++i) {
        const uint64_t word = __atomic_load_n(slot + i, __ATOMIC_ACQUIRE);
        if ((uint32_t)(word >> 32) != tag) break;
        if (r->state_bytes == 4) {
          ((uint32_t *)out)[i] = (uint32_t)word;
        } else {
          ((uint16_t *)out)[i] = (uint16_t)word;
        }
      }
      if (i == n) break;
    }
    relax();
    if (polls % CHECK_EVERY == 0) {
      if (__atomic_load_n(r->error, __ATOMIC_ACQUIRE)) {
        ended = FAILED;
        break;
      }
      const int64_t waited = now_ns() - start;
      if (waited > timeout_ns) {
        ended = TIMED_OUT;
        break;
      }
      if (released == NULL && waited > HOLD_GIL_NS) released = PyEval_SaveThread();
    }
  }
  if (released != NULL) PyEval_RestoreThread(released);
  return ended;
}

/* obj's memory: an integer address (a tensor's data_ptr(); the caller checked its size), or a C-contiguous buffer
 * of exactly bytes bytes (writable for an output). view->obj is NULL unless a buffer was taken. */
static void *memory_of(PyObject *obj, Py_ssize_t bytes, int writable, Py_buffer *view, const char *name) {
  view->obj = NULL;
  if (PyLong_Check(obj)) {
    void *address = PyLong_AsVoidPtr(obj);
    if (address == NULL && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: a null address", name);
    return address;
  }
  if (PyObject_GetBuffer(obj, view, PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0)) != 0) return NULL;
  if (!PyBuffer_IsContiguous(view, 'C')) { /* the caller may copy it into order and call again */
    PyErr_Format(PyExc_BufferError, "%s is not C-contiguous", name);
    PyBuffer_Release(view);
    view->obj = NULL;
    return NULL;
  }
  if (view->len != bytes) {
    PyErr_Format(PyExc_ValueError, "%s holds %zd bytes; the session's step takes %zd", name, view->len, bytes);
    PyBuffer_Release(view);
    view->obj = NULL;
    return NULL;
  }
  return view->buf;
}

static void release(Py_buffer *view) {
  if (view->obj != NULL) PyBuffer_Release(view);
}

static const prnn_ring *ring_of(PyObject *obj) {
  const prnn_ring *r = (const prnn_ring *)PyLong_AsVoidPtr(obj);
  if (r == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ring: a null address");
  return r;
}

static int integers(PyObject *const *args, Py_ssize_t count, int64_t *found) {
  for (Py_ssize_t k = 0; k < count; ++k) {
    found[k] = PyLong_AsLongLong(args[k]);
    if (found[k] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

/* The three calls: ring, then x (with_x), then out (with_out), then step and tag, then timeout_ns (with_out). */
static PyObject *call(const char *usage, PyObject *const *args, Py_ssize_t nargs, int with_x, int with_out) {
  const Py_ssize_t wanted = 3 + with_x + 2 * with_out;
  if (nargs != wanted) return PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", usage, wanted, nargs);
  int64_t numbers[3];
  const prnn_ring *r = ring_of(args[0]);
  if (r == NULL || integers(args + 1 + with_x + with_out, 2 + with_out, numbers)) return NULL;
  Py_buffer in = {0}, got = {0};
  const void *x = NULL;
  void *out = NULL;
  if (with_x && (x = memory_of(args[1], (Py_ssize_t)(r->values * r->input_bytes), 0, &in, "x")) == NULL) {
    return NULL;
  }
  if (with_out) {
    out = memory_of(args[1 + with_x], (Py_ssize_t)(r->response_words * r->state_bytes), 1, &got, "out");
    if (out == NULL) {
      release(&in);
      return NULL; /* nothing posted */
    }
  }
  if (with_x) {
    pack(r, x, numbers[0], (uint32_t)numbers[1]);
    release(&in);
  }
  if (!with_out) Py_RETURN_NONE;
  const int ended = collect(r, out, numbers[0], (uint32_t)numbers[1], numbers[2]);
  release(&got);
  return PyLong_FromLong(ended);
}

/* post(ring, x, step, tag): step's input x into its request slot. */
static PyObject *py_post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return call("post(ring, x, step, tag)", args, nargs, 1, 0);
}

/* collect(ring, out, step, tag, timeout_ns) -> READY, FAILED or TIMED_OUT: step's states into out. */
static PyObject *py_collect(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return call("collect(ring, out, step, tag, timeout_ns)", args, nargs, 0, 1);
}

/* step(ring, x, out, step, tag, timeout_ns) -> READY, FAILED or TIMED_OUT: post, then collect. */
static PyObject *py_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  return call("step(ring, x, out, step, tag, timeout_ns)", args, nargs, 1, 1);
}

static PyMethodDef methods[] = {
    {"post", (PyCFunction)(void (*)(void))py_post, METH_FASTCALL, "post(ring, x, step, tag)"},
    {"collect", (PyCFunction)(void (*)(void))py_collect, METH_FASTCALL,
     "collect(ring, out, step, tag, timeout_ns) -> 0 ready, 1 failed, 2 timed out"},
    {"step", (PyCFunction)(void (*)(void))py_step, METH_FASTCALL,
     "step(ring, x, out, step, tag, timeout_ns) -> 0 ready, 1 failed, 2 timed out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "prnn_tvm_session_host", NULL, -1, methods};

PyMODINIT_FUNC PyInit_prnn_tvm_session_host(void) {
  PyObject *m = PyModule_Create(&module);
  if (m != NULL && (PyModule_AddIntConstant(m, "READY", READY) || PyModule_AddIntConstant(m, "FAILED", FAILED) ||
                    PyModule_AddIntConstant(m, "TIMED_OUT", TIMED_OUT) ||
                    PyModule_AddIntConstant(m, "CHECK_EVERY", CHECK_EVERY))) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}

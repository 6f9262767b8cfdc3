"""A resident session's device side (device code: ``barriers/session.cuh``).

The resident kernel is a persistent template's kernel in session mode (``schedules/session.py``): its time loop
takes each step's input x_t from a mailbox (:func:`take`) and projects it itself (:func:`project`), and stores each
step's new states tagged (:func:`respond`). Under the device transport :func:`publish_func`'s kernel puts x_t into
the mailbox on the caller's stream, :func:`collect_func`'s kernel, which the caller's stream runs after the publish,
waits for the states, and :func:`close_func`'s kernel puts the close mark where the next request would go; under
the host transport the host writes requests (and the close mark) into page-locked memory that CTA 0 relays into the
mailbox, and the kernel stores the states into page-locked host memory. Requests and responses are tagged words
``(value bits, base + step + 1)`` (the ``tags`` exchange's format and base), so stale words of an earlier step or
launch never pass for this step's, and every wait is bounded.

The three small kernels are hand-placed (one function call each into the device code) and run on the SMs the
resident kernel leaves free.
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..dtypes import policy
from ..errors import ConfigError
from ..signature import REQUESTS, RESPONSES, Grid, Launch, request_words
from .barriers.source import cuda_source
from .kernel import persistent_frame

PUBLISH_THREADS = 256  # a thread per input value
COLLECT_THREADS = 1024  # one CTA polls every output word: at most 32 a thread
CLOSE_THREADS = 256
MAX_POLLED = 32  # words one thread of a take or a collect polls at once (its stale bits)
MAX_INPUT_VALUES = 8192  # a step's input x_t (B x input) in each CTA's shared memory: 32 KB of float32
# words a thread of the resident kernel polls at once when it takes a request, in chunks of that many per thread:
# 20 a thread spilled beside the tensor-core weights of LSTM 640 at batch 8 (fp16, one value a word); two values a
# word make its request 2560 words, 10 a thread: one take, 234 registers
TAKE_PER = 10


def _source() -> str:
    return cuda_source("session.cuh")


def grids(inputs: int, values: int) -> dict:
    """The small kernels' grids, by function: the publish and the close a thread per value of a step's input
    (``inputs``, B x input), the collect one CTA for the ``values`` of a step's states."""
    if values > COLLECT_THREADS * MAX_POLLED:
        raise ConfigError(
            f"a session collects at most {COLLECT_THREADS * MAX_POLLED} state values a step (one CTA); "
            f"this layer makes {values} (states x batch x hidden): use a smaller batch"
        )
    return {
        "session_publish": Grid(min(-(-inputs // PUBLISH_THREADS), 64), PUBLISH_THREADS, 0, False),
        "session_collect": Grid(1, min(COLLECT_THREADS, -(-values // 32) * 32), 0, False),
        "session_close": Grid(min(-(-inputs // CLOSE_THREADS), 64), CLOSE_THREADS, 0, False),
    }


def _kernel(launch: Launch, body) -> tirx.PrimFunc:
    with IRBuilder() as ib:
        with persistent_frame(launch) as (a, _bx, _tx):
            T.evaluate(body(a))
    return ib.get()


def publish_func(launch: Launch) -> tirx.PrimFunc:
    """``session_publish``: ``x`` (a step's input), tagged, into the next step's request slot (two half values a
    word where the mailbox has fewer words than values)."""
    x = launch.arg("x")
    ctype = policy(x.dtype).c_type
    values, words = math.prod(x.shape), math.prod(launch.arg(REQUESTS).shape[1:])
    return _kernel(
        launch,
        lambda a: T.cuda.func_call(
            f"prnn_session_publish<{ctype}, {'true' if words < values else 'false'}>",
            a.named["x"].data,
            a.named[REQUESTS].data,
            a.named["control"].data,
            a.sync.sync.data,
            values,
            words,
            a.seq_len,
            source_code=_source(),
            return_type="void",
        ),
    )


def collect_func(launch: Launch) -> tirx.PrimFunc:
    """``session_collect``: the requested step's new states into ``states``, then the step count on."""
    states = launch.arg("states")
    n = math.prod(states.shape)
    per = -(-n // launch.grid.threads)
    ctype = policy(states.dtype).c_type
    return _kernel(
        launch,
        lambda a: T.cuda.func_call(
            f"prnn_session_collect<{ctype}, {per}>",
            a.named[RESPONSES].data,
            a.named["states"].data,
            n,
            a.named["control"].data,
            a.sync.sync.data,
            a.sync.timeout_us,
            a.seq_len,
            T.Cast("uint64", a.sync.error_host),
            source_code=_source(),
            return_type="void",
        ),
    )


def close_func(launch: Launch) -> tirx.PrimFunc:
    """``session_close``: the close mark in every word of the next step's request slot."""
    words = math.prod(launch.arg(REQUESTS).shape[1:])
    return _kernel(
        launch,
        lambda a: T.cuda.func_call(
            "prnn_session_close",
            a.named[REQUESTS].data,
            a.named["control"].data,
            a.sync.sync.data,
            words,
            a.seq_len,
            source_code=_source(),
            return_type="void",
        ),
    )


def take(src, host, slot, dst, values: int, dtype: str, threads: int, tag, step, sync, idle_us):
    """In the resident kernel, CTA-wide: wait for the words of a step's request of ``values`` values of ``dtype``
    (``signature.request_words``: two a word for a half layer) at ``src`` (the mailbox's slot ``slot``, tagged
    ``tag``; with ``host``, the host transport's requests, CTA 0 relays that slot of them into ``src`` first) and put
    the values in shared memory at ``dst`` (float32), :data:`TAKE_PER` words a thread at a time; an int32 bound to a
    var, block-uniform: 0 taken, 1 timed out (recorded in the error word), 2 the close mark."""
    words = request_words(values, dtype)
    per = min(TAKE_PER, -(-words // threads))
    host_slot = T.if_then_else(host != 0, host + T.Cast("int64", slot) * (words * 8), T.int64(0))
    call = T.cuda.func_call(
        f"prnn_session_take<{per}, {policy(dtype).c_type}, {'true' if words < values else 'false'}>",
        src,
        T.Cast("uint64", host_slot),
        dst,
        words,
        values,
        T.Cast("uint32", tag),
        step,
        sync.sync.data,
        idle_us,
        source_code=_source(),
        return_type="int32",
    )
    return T.bind(call, var=tirx.Var("request", "int32"))


def project(x, w, bias, dst, batch: int, input_size: int, hidden: int, slices: int, units: int, cta):
    """In the resident kernel, CTA-wide, after :func:`take`: this CTA's part of the step's input projection, ``x``
    (shared, batch x input) times ``w`` (``W_ih``) plus ``bias`` (``b_ih``), into ``dst`` (shared, [row][slice][unit
    of the CTA]), float32 sums; ends with a block barrier."""
    ctype = policy(str(w.dtype)).c_type
    return T.cuda.func_call(
        f"prnn_session_project<{ctype}, {batch}, {input_size}>",
        x,
        w.data,
        bias.data,
        dst,
        hidden,
        slices,
        units,
        cta,
        source_code=_source(),
        return_type="void",
    )


def respond(resp, host, index, value, dtype: str, tag):
    """In the resident kernel: a step's new state ``value`` (``dtype``), tagged ``tag``, into word ``index`` of the
    responses (``resp``, device memory; or with ``host``, the host transport's page-locked responses)."""
    return T.cuda.func_call(
        f"prnn_session_respond<{policy(dtype).c_type}>",
        resp.data,
        T.Cast("uint64", host),
        T.Cast("int64", index),
        value,
        T.Cast("uint32", tag),
        source_code=_source(),
        return_type="void",
    )

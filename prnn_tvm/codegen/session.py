"""A resident session's device side (device code: ``barriers/session.cuh``).

The resident kernel is a persistent template's kernel in session mode (``schedules/session.py``): its time loop
takes each step's input projection from a mailbox, where :func:`publish_func`'s kernel puts it on the caller's
stream, and stores each step's new states tagged for :func:`collect_func`'s kernel, which the caller's stream runs
after the publish; :func:`close_func`'s kernel puts the close mark where the next request would go. Requests and
responses are tagged words ``(value bits, base + step + 1)`` (the ``tags`` exchange's format and base), so stale
words of an earlier step or launch never pass for this step's, and every wait is bounded.

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
from ..signature import REQUESTS, RESPONSES, Grid, Launch
from .barriers.source import cuda_source
from .kernel import persistent_frame

PUBLISH_THREADS = 256  # 8 warps: a warp per projection column
COLLECT_THREADS = 1024  # one CTA polls every output word: at most 32 a thread
CLOSE_THREADS = 256
MAX_POLLED = 32  # words one thread of a take or a collect polls at once (its stale bits)


def _source() -> str:
    return cuda_source("session.cuh")


def grids(ctas: int, units: int, slices: int, batch: int, values: int) -> dict:
    """The small kernels' grids, by function: the publish a warp per column of the CTA-major projection (at most
    two CTAs' worth of warps per SM of an H100), the collect one CTA for the ``values`` of a step's states, the
    close enough CTAs for one word each."""
    columns = slices * ctas * units
    if values > COLLECT_THREADS * MAX_POLLED:
        raise ConfigError(
            f"a session collects at most {COLLECT_THREADS * MAX_POLLED} state values a step (one CTA); "
            f"this layer makes {values} (states x batch x hidden): use a smaller batch"
        )
    warps = PUBLISH_THREADS // 32
    return {
        "session_publish": Grid(min(-(-columns // warps), 264), PUBLISH_THREADS, 0, False),
        "session_collect": Grid(1, min(COLLECT_THREADS, -(-values // 32) * 32), 0, False),
        "session_close": Grid(min(-(-(ctas * batch * slices * units) // CLOSE_THREADS), 64), CLOSE_THREADS, 0, False),
    }


def _kernel(launch: Launch, body) -> tirx.PrimFunc:
    with IRBuilder() as ib:
        with persistent_frame(launch) as (a, _bx, _tx):
            T.evaluate(body(a))
    return ib.get()


def publish_func(launch: Launch, hidden: int, slices: int, units: int, ctas: int) -> tirx.PrimFunc:
    """``session_publish``: ``x W_ih^T + b_ih`` into the next step's request slot."""
    x = launch.arg("x")
    batch, k = x.shape
    ctype = policy(x.dtype).c_type
    return _kernel(
        launch,
        lambda a: T.cuda.func_call(
            f"prnn_session_publish<{ctype}, {batch}>",
            a.named["x"].data,
            a.named["W_ih"].data,
            a.named["b_ih"].data,
            a.named[REQUESTS].data,
            a.named["control"].data,
            a.sync.sync.data,
            k,
            hidden,
            slices,
            units,
            ctas,
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
    mailbox = launch.arg(REQUESTS)
    words = mailbox.shape[1] * mailbox.shape[2] * mailbox.shape[3]
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


def take(src, dst, words: int, threads: int, tag, step, sync, idle_us):
    """In the resident kernel, CTA-wide: wait for this CTA's ``words`` request words at ``src`` (tagged ``tag``)
    and put their values in shared memory at ``dst``; an int32 bound to a var, block-uniform: 0 taken, 1 timed
    out (recorded in the error word), 2 the close mark."""
    per = -(-words // threads)
    if per > MAX_POLLED:
        raise ConfigError(
            f"a session kernel's CTA takes at most {MAX_POLLED * threads} request values a step "
            f"({threads} threads); this config's CTA takes {words}: fewer units per CTA or a smaller "
            "batch"
        )
    call = T.cuda.func_call(
        f"prnn_session_take<{per}>",
        src,
        dst,
        words,
        T.Cast("uint32", tag),
        step,
        sync.sync.data,
        idle_us,
        source_code=_source(),
        return_type="int32",
    )
    return T.bind(call, var=tirx.Var("request", "int32"))

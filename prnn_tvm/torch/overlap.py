"""An inference call's input projection beside its recurrence, in one recurrent launch, where the recurrent grid leaves
most SMs free (head-wise layers: a CTA per head, 12 of the H100's 132 SMs at 12 heads of 64).

The call's order (:func:`run_overlapped`), all on the GPU, nothing waiting on the host:

- the caller's stream: the call's epoch (word 0 of the stream's flag words) incremented, the first chunk of steps
  projected (cuBLAS), the side stream forked there;
- the side stream: every later piece of the sequence projected (each piece as long as all before it, so that the
  GEMMs keep ahead of the recurrence), each followed, in stream order, by a copy of the epoch into the flag of each
  chunk it completed;
- the caller's stream: the recurrent kernel, launched once (the layer's kernel that waits for the flags,
  ``prnn_tvm.xp_ready_build``), then the join of the side stream.

Every piece is queued before the recurrent launch: a launch on the side stream may block the host until the GPU is
idle (CUDA's lazy loading loads a kernel at its first launch, cuBLAS's of each new shape among them, and that may
synchronize the context), and queued after the launch it would wait for a recurrence that waits for it, until the
bound. Queued before, nothing the host does after the launch can hold a piece back.

The kernel (``schedules/xp_ready.py``) waits, before its first load of each chunk's first step, until the chunk's
flag holds the call's epoch: flags are never reset, a replayed CUDA graph increments the epoch on the device, and the
fork and join are events, so a capture keeps all of it. A wait is bounded by the layer's ``barrier_timeout_us``; one
that gives up writes a page-locked host word, fills every later step with NaN, and the next call (or the module's
``check()``) raises :class:`~prnn_tvm.errors.BarrierTimeout`.

Off (the projection, then the layer's own kernel, as before): with the module's ``overlap_projection`` False; for a
grid of more than :data:`MAX_GRID_SHARE` of the SMs (a dense layer's projection has no free SMs to run on: the pieces
would wait for SMs the recurrence holds, and i51over measured a sequence cut into launches slower everywhere); for
sequences of fewer than two chunks, and those whose buffers reach 2^31 elements (launches over pieces of the
sequence); for layers whose config has no kernel that waits (every other template and layout, stacks, both
directions; training). The compiled layer's own call, a repeated call (:mod:`~prnn_tvm.torch.repeat`) and an
exported layer keep the old order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch  # PyTorch itself: absolute import

from prnn_tvm.errors import BarrierTimeout, ConfigError
from prnn_tvm.runtime.limits import chunk_length
from prnn_tvm.signature import XP_READY_SCALARS

# The recurrent grid's share of the SMs up to which the projection runs beside it: the GEMM pieces need SMs the
# recurrence leaves free, and a grid of half the SMs leaves the pieces as many SMs as a plain projection has at worst
# half its speed (heads of 16 to 256 at hidden 768: 3 to 48 CTAs of the H100's 132). Measure with
# bench/against_flashrnn.py --cases heads, which times the module call with and without it.
MAX_GRID_SHARE = 0.5
MIN_CHUNK_STEPS = 8  # the first chunk's least steps: a GEMM over fewer rows costs its launch alone
# Chunks per call at most: a wait costs its step an L2 round trip even where the flag is set, and the first chunk
# (T / MAX_CHUNKS steps) is what the recurrence runs while the host queues the side stream's first pieces
MAX_CHUNKS = 16
FLAG_WORDS = 1 + MAX_CHUNKS  # the epoch, then a flag per chunk


@dataclass(frozen=True)
class ChunkPlan:
    """How a call of ``steps`` steps projects its input: chunks of ``chunk`` steps (the kernel's ``xp_chunk``; the
    first one projected before the launch), the later ones in ``pieces`` (``(start, stop)`` steps, each piece as long
    as every step before it, the last cut at ``steps``), one GEMM each on the side stream."""

    steps: int
    chunk: int
    pieces: tuple

    def flags(self, start: int, stop: int) -> slice:
        """The flag words of the chunks that the piece ``[start, stop)`` completes."""
        return slice(1 + start // self.chunk, 1 + -(-stop // self.chunk))


def chunk_plan(steps: int) -> ChunkPlan | None:
    """The plan of a call of ``steps`` steps, or None where it has fewer than two chunks (nothing to overlap). The
    first chunk is short, so that the recurrence starts early: ``steps / MAX_CHUNKS``, at least
    :data:`MIN_CHUNK_STEPS`; each later piece doubles the steps projected, so that a GEMM of ``n`` steps runs while
    the recurrence runs ``n`` steps (a GEMM's step costs a fraction of a recurrent step: 142 us against 722 us for
    1024 steps of LSTM 12 x 64, B=16, bf16, on the H100)."""
    chunk = max(MIN_CHUNK_STEPS, -(-steps // MAX_CHUNKS))
    if steps < 2 * chunk:
        return None
    pieces, start = [], chunk
    while start < steps:
        stop = min(steps, 2 * start)
        pieces.append((start, stop))
        start = stop
    return ChunkPlan(steps, chunk, tuple(pieces))


def overlaps(layer, steps: int, device: torch.device, enabled: bool) -> ChunkPlan | None:
    """The plan of an inference call of ``steps`` steps of ``layer`` on ``device`` with the projection beside the
    recurrence, or None where it runs before it (module doc). Builds the layer's kernel that waits
    (:func:`waiting_kernel`) at the first call that would overlap."""
    if not enabled or device.type != "cuda":
        return None
    if layer.report.ctas > MAX_GRID_SHARE * _sm_count(device.index or 0):
        return None
    if steps > chunk_length(layer.signature, steps):  # launches over pieces of the sequence: the projection first
        return None
    plan = chunk_plan(steps)
    return plan if plan is not None and waiting_kernel(layer) is not None else None


def waiting_kernel(layer):
    """The runtime layer of ``layer``'s recurrent kernel that waits for its projection's chunks
    (:func:`~prnn_tvm.xp_ready_build.compile_xp_ready`, built once), or None where its config has none."""
    from prnn_tvm.xp_ready_build import compile_xp_ready  # the compiler, at the first call that would overlap

    try:
        return compile_xp_ready(layer).runtime
    except ConfigError:
        return None


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def project_into(x: torch.Tensor, W_ih: torch.Tensor, b_ih: torch.Tensor | None, out: torch.Tensor) -> None:
    """``out = x @ W_ih.T + b_ih`` over a piece of steps (time-major), in ``out``'s type (float32 for a half layer:
    the GEMM on tensor cores into float32, as :func:`~prnn_tvm.torch.projection.project` computes it)."""
    rows, dest = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
    if W_ih.dtype == out.dtype:
        torch.mm(rows, W_ih.t(), out=dest)
    else:
        torch.mm(rows, W_ih.t(), out_dtype=out.dtype, out=dest)
    if b_ih is not None:
        dest.add_(b_ih)


def before_piece(start: int) -> None:
    """What the side stream runs before the piece that starts at step ``start``: nothing (a test makes it a spin, a
    late piece)."""


def write_flags(flags: torch.Tensor, plan: ChunkPlan, start: int, stop: int) -> None:
    """The epoch into the flags of the chunks that the piece ``[start, stop)`` completes (stream-ordered after it)."""
    words = flags[plan.flags(start, stop)]
    words.copy_(flags[:1].expand_as(words))


class Overlaps:
    """A module's flag words (one set per device and stream, made at first use; a CUDA graph's own, kept as long as the
    module) and the page-locked host word per device that a wait that gave up writes."""

    def __init__(self):
        self._flags: dict = {}
        self._words: dict = {}
        self._captured: list = []

    def flags(self, device: torch.device, stream: int) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():  # the graph's own, incremented by every replay
            flags = torch.zeros(FLAG_WORDS, dtype=torch.int32, device=device)
            self._captured.append(flags)
            return flags
        key = (device, stream)
        if key not in self._flags:
            self._flags[key] = torch.zeros(FLAG_WORDS, dtype=torch.int32, device=device)
        return self._flags[key]

    def error_word(self, device: torch.device):
        if device not in self._words:
            import tvm  # TVM's runtime, at the first launch

            from prnn_tvm.runtime.base import HostWord

            self._words[device] = HostWord(tvm.runtime.device("cuda", device.index or 0))
        return self._words[device]

    def check(self, who: str, timeout: str) -> None:
        """Raise :class:`~prnn_tvm.errors.BarrierTimeout` if a wait for the projection gave up since the last check
        (the word read without waiting for the GPU), and clear it. ``who``, ``timeout``: for the message."""
        for word in self._words.values():
            recorded = word.read()
            if recorded:
                word.clear()
                raise BarrierTimeout(
                    f"{who}: the recurrent kernel waited {timeout} for the input projection of step "
                    f"{recorded - 1}, computed beside it on a side stream, and it never came: that call's outputs are "
                    "NaN from that step on, and its final states. Keep the side stream's work from blocking, raise "
                    "the layer's barrier_timeout_us, or set the module's overlap_projection = False to project "
                    "before the launch."
                )


def run_overlapped(module, layer, plan: ChunkPlan, x, W_ih, b_ih, launch) -> list:
    """One inference call with its projection beside the recurrence (module doc): ``launch(xp, scalars)`` launches
    :func:`waiting_kernel` of ``layer`` on the current stream with ``scalars`` (the
    :data:`~prnn_tvm.signature.XP_READY_SCALARS`) and returns what it writes."""
    overlaps, device = module._overlaps, x.device
    main = torch.cuda.current_stream(device)
    flags = overlaps.flags(device, main.cuda_stream)
    flags[:1].add_(1)  # this call's epoch, on the device: a replayed graph's too
    declared = layer.signature.launch("recurrent").arg("xp")
    xp = torch.empty(plan.steps, x.shape[1], declared.shape[2], dtype=getattr(torch, declared.dtype), device=device)
    project_into(x[: plan.chunk], W_ih, b_ih, xp[: plan.chunk])
    scalars = dict(zip(XP_READY_SCALARS, (flags.data_ptr(), plan.chunk, layer.barrier_timeout_us,
                                          overlaps.error_word(device).address)))
    side = module._side_stream(device)
    side.wait_stream(main)  # forked after the first chunk, before the launch
    with torch.cuda.stream(side):  # every piece queued before the launch (module doc)
        for start, stop in plan.pieces:
            before_piece(start)
            project_into(x[start:stop], W_ih, b_ih, xp[start:stop])
            write_flags(flags, plan, start, stop)
    written = launch(xp, scalars)
    main.wait_stream(side)  # joined before anything after the call: xp and x are freed or reused after it
    return written

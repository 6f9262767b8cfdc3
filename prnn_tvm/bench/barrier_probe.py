"""A kernel that does nothing but cross the grid barrier: for latency figures and stress tests.

Every step, thread 0 of each block writes a tag (``launch_id * 65536 + step``) into its
slot of a ping-pong buffer, the block crosses the barrier, and after it each block reads
what the others wrote in the step before and counts every wrong value:

- ``all_to_all=True``: every block checks every other block's tag (the stress test:
  a barrier that lets anyone through early shows up as wrong values);
- ``all_to_all=False``: each block checks one neighbour's tag (one dependent read per
  step, like the probe the baselines in DESIGN were taken with). Not for ``tags``, which
  is only a barrier when every block reads every block's value.

Tags carry the launch id, so a value left over from an earlier launch counts as wrong.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..codegen import barriers
from ..codegen.build import PIPELINE, nvcc_compile, plain_args
from ..codegen.kernel import HAND_PLACED, PLAIN_ARGS, SEQ_LEN
from ..errors import BarrierTimeout
from ..runtime.base import DEFAULT_TIMEOUT_US, take_timeout
from ..target import gpu_spec

TAG_STRIDE = 65536  # tags are launch_id * TAG_STRIDE + step, so steps stay below this


def probe_func(barrier: str, ctas: int, threads: int, all_to_all: bool) -> tirx.PrimFunc:
    """The probe as a PrimFunc ``barrier_probe(buf, errors, launch_id, steps[, sync, timeout_us, stall_step,
    error_host])`` (the probe checks its state on the host: ``error_host`` is 0).

    ``buf`` is (2, ctas): int32 tags, or uint64 tagged values for the ``tags`` variant
    (whose tags come from the device-side base; the value is the step); ``errors`` is (1,)
    uint32.
    """
    bar = barriers.by_name(barrier)
    problem = bar.probe_problem(all_to_all)
    if problem:
        raise ValueError(problem)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("barrier_probe")
            T.func_attr(
                {
                    "tirx.noalias": True,
                    HAND_PLACED: True,
                    PLAIN_ARGS: ["buf", "errors", "sync"],
                    "tirx.kernel_launch_params": ["tirx.use_cooperative_launch"],
                }
            )
            buf = T.arg("buf", T.buffer((2, ctas), bar.exchange_dtype("int32"), buffer_name="buf"))
            errors = T.arg("errors", T.buffer((1,), "uint32", buffer_name="errors"))
            launch_id = T.arg("launch_id", tirx.Var("launch_id", "int32"))
            steps = T.arg(SEQ_LEN, tirx.Var(SEQ_LEN, "int32"))
            sync = barriers.declare_sync_args() if bar.state_words is not None else None
            with T.launch_thread("blockIdx.x", ctas) as bx, T.launch_thread("threadIdx.x", threads) as tx:
                seen = T.alloc_buffer((ctas,), "float32", scope="shared")
                base = bar.begin(sync)
                with T.serial(0, steps) as t:
                    if bar.polls_values:
                        _tagged_step(bar, buf, errors, seen, sync, base, t, bx, tx, ctas, threads)
                    else:
                        _plain_step(
                            bar, buf, errors, sync, base, launch_id, steps, t, bx, tx, ctas, threads, all_to_all
                        )
                bar.end(sync, base, steps, steps - 1)
    return ib.get()


def _plain_step(bar, buf, errors, sync, base, launch_id, steps, t, bx, tx, ctas, threads, all_to_all):
    """Check the tags of step t - 1, write this step's, cross the barrier."""
    expect = launch_id * TAG_STRIDE + t
    with T.If(t > 0):
        with T.Then():
            for block in _checked_blocks(bx, tx, ctas, threads, all_to_all):
                _count_if(errors, tirx.all(block < ctas, buf[t % 2, block] != expect))
    with T.If(tx == 0):
        with T.Then():
            T.buffer_store(buf, expect + 1, [(t + 1) % 2, bx])
    bar.wait(t, base, sync, when=t < steps - 1)


def _tagged_step(bar, buf, errors, seen, sync, base, t, bx, tx, ctas, threads):
    """Poll every block's tagged value of step t - 1, check them, write this step's."""
    with T.If(t > 0):
        with T.Then():
            abort = bar.poll_copy(
                threads,
                T.address_of(buf[t % 2, 0]),
                T.address_of(seen[0]),
                "float32",
                ctas,
                ctas,
                ctas,
                ctas,
                base,
                t,
                sync,
            )
            with T.If(abort != 0):
                with T.Then():
                    T.Break()
            for i in range(-(-ctas // threads)):
                slot = i * threads + tx
                _count_if(errors, tirx.all(slot < ctas, seen[slot] != T.Cast("float32", t)))
    with T.If(tirx.all(tx == 0, tirx.Not(tirx.all(bx == 0, t == sync.stall_step)))):
        with T.Then():
            T.evaluate(bar.store(T.address_of(buf[(t + 1) % 2, bx]), T.Cast("float32", t + 1), base, t))


def _checked_blocks(bx, tx, ctas, threads, all_to_all):
    if all_to_all:
        return [i * threads + tx for i in range(-(-ctas // threads))]
    return [T.if_then_else(tx == 0, (bx + 1) % ctas, ctas)]  # thread 0 checks the neighbour


def _count_if(errors, wrong):
    with T.If(wrong):
        with T.Then():
            T.evaluate(T.call_extern("uint32", "atomicAdd", T.address_of(errors[0]), T.uint32(1)))


def build_probe(barrier: str, ctas: int, threads: int, all_to_all: bool, arch: str):
    """Compile the probe for ``arch`` (through the project's nvcc callback); returns the runtime module."""
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")
    func = probe_func(barrier, ctas, threads, all_to_all)
    mod = tvm.IRModule({"barrier_probe": func})
    with target, nvcc_compile(arch, [], plain_args([func])):
        return tvm.tirx.build(mod, target=target, pipeline=PIPELINE)


class Probe:
    """A compiled probe with its buffers on the local GPU.

    ``run(steps, launches)`` returns the number of wrong values seen (0 for a correct
    barrier); ``seconds_per_step(steps)`` times one launch with TVM's time_evaluator.
    """

    def __init__(self, barrier: str, ctas: int, threads: int, all_to_all: bool):
        self.barrier, self.ctas = barriers.by_name(barrier), ctas
        self.module = build_probe(barrier, ctas, threads, all_to_all, gpu_spec().arch)  # the local GPU's arch
        self.dev = tvm.cuda(0)
        self.buf = tvm.runtime.tensor(np.zeros((2, ctas), self.barrier.exchange_dtype("int32")), self.dev)
        self.errors = tvm.runtime.tensor(np.zeros(1, np.uint32), self.dev)
        self.sync = tvm.runtime.tensor(np.zeros(barriers.SYNC_WORDS, np.uint32), self.dev)
        self.timeout_us, self.stall_step, self.launch_id = DEFAULT_TIMEOUT_US, -1, 0

    def _args(self, steps: int) -> list:
        args = [self.buf, self.errors, self.launch_id, steps]
        return args + ([self.sync, self.timeout_us, self.stall_step, 0] if self.barrier.state_words is not None else [])

    def run(self, steps: int, launches: int = 1) -> int:
        """Launch ``launches`` times (fresh launch id each); return the wrong values counted."""
        if steps >= TAG_STRIDE:
            raise ValueError(f"at most {TAG_STRIDE - 1} steps per launch")
        self.errors.copyfrom(np.zeros(1, np.uint32))
        for _ in range(launches):
            self.launch_id = (self.launch_id + 1) % 30000
            self.module["barrier_probe"](*self._args(steps))
        recorded = take_timeout(self.sync, stale=[self.buf])
        if recorded is not None:
            raise BarrierTimeout(f"probe barrier timed out after step {recorded}")
        return int(self.errors.numpy()[0])

    def seconds_per_step(self, steps: int = 1000, number: int = 5, repeat: int = 5) -> float:
        timer = self.module.time_evaluator("barrier_probe", self.dev, number=number, repeat=repeat)
        return min(timer(*self._args(steps)).results) / steps

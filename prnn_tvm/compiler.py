"""``compile_cell``: cell definition in, runnable (or inspectable) layer out."""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, replace

import tvm

from .cache import layers as layer_cache
from .choice import choose_and_build
from .codegen.build import Built, build_functions, build_module
from .codegen.kernel import Kernel, layer_signature
from .dtypes import policy
from .errors import ConfigError, InputError
from .frontend.analysis import analyze
from .frontend.cell import Cell
from .frontend.directions import bidirectional as both_directions
from .frontend.plan import CellPlan
from .frontend.registry import resolve
from .frontend.stack import stacked
from .report import CompileReport
from .runtime import limits
from .runtime.base import RuntimeLayer
from .runtime.layer import Layer
from .schedules import backward_for, by_name, gpu_backward, saving_forward, templates_for
from .session_build import SessionKernels, compile_session  # noqa: F401 - the compiler's entry points, re-exported
from .signature import SEQ, Signature
from .split_build import compile_split
from .target import GpuSpec, cpu_target, gpu_spec

log = logging.getLogger(__name__)


def compile_cell(
    cell: str | Cell,
    hidden: int,
    batch: int,
    *,
    input_size: int | None = None,
    seq_len: int | None = None,
    dtype: str = "float32",
    target: str = "cuda",
    arch: str | None = None,
    config=None,
    tuning_logs=None,
    layers: int = 1,
    bidirectional: bool = False,
    cache: bool = True,
    devices=None,
) -> Layer:
    """Compile a recurrent cell into a layer: input projection + recurrent kernel.

    Parameters
    ----------
    cell : str or Cell
        A built-in name (``"lstm"``), a ``path/to/cell.py`` defining ``CELL``, or a Cell.
    hidden, batch : int
        Hidden size and batch size; the kernel is specialized for both.
    input_size : int, optional
        Features per timestep of ``x`` (default: ``hidden``).
    seq_len : int, optional
        The sequence length the layer is meant for (recorded in the report); the kernel
        itself accepts any length.
    dtype : str
        The storage dtype, one of ``prnn_tvm.dtypes.POLICIES``: ``"float32"``, ``"float16"`` or ``"bfloat16"``
        (tensor cores, sm_80+) on the GPU; those and ``"float64"`` on the CPU (``target="llvm"``).
    target : str
        ``"cuda"`` for the persistent GPU kernel, ``"llvm"`` (or ``"cpu"``) for the CPU
        reference build.
    arch : str or GpuSpec, optional
        CUDA architecture (``"sm_90"``), or a full GpuSpec; defaults to the local GPU's.
        Without a GPU the layer holds CUDA source only: it can be inspected, not run.
    config : config object or dict, optional
        Schedule knobs (a ``PersistentConfig`` or its dict, as tuning records hold them).
        Default: the best tuning record for this cell, shapes and GPU in ``tuning_logs``
        (see ``prnn-tvm tune``), else the template's default (``prnn_tvm.choice``).
    tuning_logs : path or list of paths, optional
        Tuning logs to look in (default: the package's ``tuning_logs/<arch>.jsonl``);
        ``[]`` ignores tuning records.
    layers : int
        Stacked layers of the cell in one launch, run as a wavefront (``prnn_tvm.frontend.stack``):
        layer ``l`` computes step ``t`` while layer ``l + 1`` computes step ``t - 1``, one barrier per
        wavefront step. The layer's output is the last layer's; ``x`` and ``W_ih`` are layer 0's, and
        every later layer's input weights and biases are arguments ``l<l>_W_ih``, ``l<l>_b_ih``.
    bidirectional : bool
        Both directions of the cell in one launch (``prnn_tvm.frontend.directions``), as ``torch.nn``'s
        ``bidirectional=True``: the reverse direction reads each row from its last step back, the output
        is ``2 * hidden`` wide (forward, reverse). ``W_ih`` and ``b_ih`` are both directions' stacked
        (forward rows first); the cell's own arguments are named per direction, ``fwd_W_hh``,
        ``rev_h0``. Not with ``layers > 1`` (a layer above reads the whole of both directions).
    cache : bool
        Look the layer up in the on-disk layer cache first, and store it there once built (``prnn_tvm.cache``:
        a later process gets it in milliseconds). False compiles it here whatever the cache holds; the
        environment turns the cache off for every compile (``PRNN_TVM_CACHE=0``) and moves it
        (``PRNN_TVM_CACHE_DIR``).
    devices : list of int, optional
        Split the layer's units over these GPUs of one host (``[0, 1]``; P2P between every pair, NVLink): each runs
        the persistent kernel over its slice, the states exchanged each step through peer memory
        (``schedules/split.py``). Returns a :class:`~prnn_tvm.runtime.split.SplitLayer` (inference, NumPy in and
        out); not cached. For layers too big for one GPU's registers; a smaller one is split all the same.

    Use ``layer.report.format()`` to see the grid, registers and spills.
    """
    if bidirectional not in (True, False) or not isinstance(bidirectional, (bool, int)):
        raise ConfigError(f"bidirectional must be True or False, got {bidirectional!r}")
    cell = stacked(resolve(cell), layers)
    if bidirectional:
        if layers > 1:
            raise ConfigError(
                "a bidirectional stack cannot run as one wavefront (layer l + 1 reads the whole of "
                "both directions of layer l): compile each layer with bidirectional=True"
            )
        cell = both_directions(cell)
    hidden, batch, input_size, seq_len = (
        _positive(name, value)
        for name, value in (("hidden", hidden), ("batch", batch), ("input_size", input_size), ("seq_len", seq_len))
    )
    input_size = input_size or hidden
    policy(dtype)  # refuses a dtype the compiler does not support, naming the ones it does
    tgt, gpu = _target(target, arch)
    plan = analyze(cell, batch, hidden, dtype)
    _check_index_range(layer_signature(plan, input_size))
    if devices is not None:  # one layer over several GPUs (prnn_tvm.split_build)
        return compile_split(plan, devices, input_size, tgt, gpu, config,
                             lambda p, k, b, c: _report(p, k, b, input_size, seq_len, gpu, c))
    key = layer_cache.key_for(plan, input_size, seq_len, tgt, gpu, config, tuning_logs, layers, bidirectional, cache)
    found = layer_cache.lookup(key, plan, tgt, gpu, input_size)
    if found is not None:
        return found
    with layer_cache.warnings_logged() as warnings:
        kernel, built, choice = choose_and_build(
            plan,
            templates_for(plan, tgt),
            tgt,
            gpu,
            lambda k: build_module(plan, k, input_size, tgt, gpu),
            config,
            tuning_logs,
        )
    rep = _report(plan, kernel, built, input_size, seq_len, gpu, choice)
    log.info("compiled %s: %s", cell.name, rep.format().replace("\n", "; "))
    return layer_cache.store(key, Layer(plan, kernel, built, input_size, tgt, gpu, rep), warnings)


def compile_backward(layer: Layer) -> RuntimeLayer:
    """The backward of ``layer``'s recurrent kernel, compiled (once per layer): a runtime layer whose one
    launch, ``recurrent_backward``, takes the recurrent kernel's inputs (``xp``, weights, params, initial
    states, ``lengths``) and the gradients of its outputs (``d_out``, ``d_<state>_n``), and returns
    ``(d_xp, (d_<weight>..., d_<param>..., d_<state>0...))`` (see ``signature.backward_args``). CPU
    builds only so far."""
    if layer._backward is None:
        plan, key = layer.plan, layer_cache.backward_key(layer)
        found = layer_cache.lookup_kernels(key, layer.target, None)
        if found is not None:  # (keyed without the input size: another layer of this plan may have stored it)
            module, (signature,), _ = found
            signature = replace(signature, input_size=layer.input_size)
        else:
            kernel = backward_for(plan, layer.target)
            signature = Signature(
                plan.cell.name, plan.batch, plan.hidden, layer.input_size, plan.dtype, (kernel.launch,)
            )
            module = build_functions({"recurrent_backward": kernel.func}, layer.target, None).module
            module = layer_cache.store_kernels(key, module, [signature], None, layer.target, None, {})
        widest = max(plan.input.slices, len(plan.states), sum(r.slices for r in plan.reductions))
        layer._backward = _BackwardLayer(signature, module, plan.batch * plan.hidden * widest)
    return layer._backward


class _BackwardLayer(RuntimeLayer):
    """A backward launch: one pass over the whole sequence. It walks time backwards, so unlike a forward
    call it cannot run a sequence in consecutive chunks; one that would need them is refused."""

    def __init__(self, signature: Signature, module, per_step: int):
        super().__init__(signature, module, is_cuda=False)
        self.per_step = per_step  # elements per step of its largest buffer (its own included)

    def _bind(self, signature: Signature, args: tuple, kwargs: dict):
        call = super()._bind(signature, args, kwargs)
        if call.chunks > 1 or call.seq_len * self.per_step > limits.MAX_ELEMENTS:
            raise InputError(
                f"backpropagation through {call.seq_len} steps needs buffers of "
                f"{call.seq_len * self.per_step} elements, and kernels index with 32-bit integers (at "
                f"most {limits.MAX_ELEMENTS}): train on shorter pieces of the sequence (truncated "
                "backpropagation through time)"
            )
        return call


@dataclass(frozen=True)
class Training:
    """What a CUDA layer trains with (:func:`compile_training`), two launches of one module:

    - ``forward``: the layer's recurrent kernel (same config) that also writes ``saved`` (T, B,
      (states + gate rows + operand stages) x hidden, float32, ``CellPlan.saved_leaves``): each
      state at every step's start, every product, every stage a later phase multiplies;
    - ``backward``: the persistent backward (``schedules/persistent_backward.py``), arguments
      ``signature.gpu_backward_args``; its ``d_gates`` and the saved operands make the weight
      gradients, one GEMM per product, which the caller runs (cuBLAS in ``prnn_tvm.torch``).

    Both take the layer's ``barrier_timeout_us``, and follow it when it is set.

    ``report`` is ptxas's figures of both kernels and the backward's config, one line each.
    """

    plan: CellPlan
    forward: RuntimeLayer
    backward: RuntimeLayer
    report: str


def compile_training(layer: Layer) -> Training:
    """The training kernels of a CUDA ``layer`` (once per layer; see :class:`Training`). ConfigError
    when the backward's transposed weights do not fit in registers (a half layer's as tensor-core fragments
    in the half type, else widened to float32 as a float32 layer's), saying so; the CPU build trains every
    layer (:func:`compile_backward`)."""
    if layer._training is None:
        if layer.target.kind.name != "cuda":
            raise ConfigError(
                "compile_training builds CUDA layers' training kernels; a CPU layer's backward is "
                "compile_backward(layer)"
            )
        key = layer_cache.training_key(layer)
        found = layer_cache.lookup_kernels(key, layer.target, layer.gpu)
        if found is not None:
            module, signatures, info = found
            report = info["report"]
        else:
            signatures, built, report = _build_training(layer)
            module = layer_cache.store_kernels(
                key, built.module, signatures, built.source, layer.target, layer.gpu, {"report": report}
            )
        runtimes = [RuntimeLayer(signature, module, True, layer.barrier_timeout_us) for signature in signatures]
        layer._training = Training(layer.plan, *runtimes, report)
        log.info("training kernels of %s: %s", layer.plan.cell.name, report.replace("\n", "; "))
    return layer._training


def _build_training(layer: Layer) -> tuple[list, Built, str]:
    """The signatures of the saving forward and the backward of a CUDA ``layer``, their module and the report."""
    plan, target, gpu = layer.plan, layer.target, layer.gpu
    try:
        save = saving_forward(plan, target, gpu, layer.kernel.config)
        backwards = gpu_backward(plan, gpu)
    except ConfigError as err:
        widened = (f" (the persistent backward holds the transposed weights in {plan.policy.compute})"
                   if plan.policy.widens else "")
        raise ConfigError(f"{err}{widened}; train this layer on the CPU build (target 'llvm')") from None
    for backward in backwards:
        built = build_functions({"recurrent_save": save.func, "recurrent_backward": backward.func}, target, gpu)
        if built.ptxas is None or not built.ptxas.function("recurrent_backward").spills:
            break  # else the next, with fewer weights per thread (the last is kept, spills said below)
    signatures, lines = [], []
    for kernel in (save, backward):
        launch = kernel.launch
        fn = built.ptxas.function(launch.function) if built.ptxas is not None else None
        signature = Signature(plan.cell.name, plan.batch, plan.hidden, layer.input_size, plan.dtype, (launch,))
        if fn is not None:
            signature = signature.with_grid(
                launch.function, registers=fn.registers, static_smem_bytes=fn.static_smem_bytes
            )
        signatures.append(signature)
        figures = f"{fn.registers} registers, {fn.spills} spill bytes" if fn is not None else built.note
        lines.append(f"{launch.function}: {launch.grid.ctas} CTAs x {launch.grid.threads} threads, {figures}")
    lines[-1] += f" ({' '.join(f'{k}={v}' for k, v in backward.config.as_dict().items())})"
    return signatures, built, "\n".join(lines)


def _check_index_range(signature) -> None:
    """Kernels index buffers with 32-bit integers: refuse a weight, or one step of a sequence, that
    has 2^31 elements or more (longer sequences run in chunks: ``prnn_tvm.runtime.binding``)."""
    for arg in signature.inputs + signature.outputs:
        elements = math.prod(int(d) for d in arg.shape if d != SEQ)
        if elements > limits.MAX_ELEMENTS:
            what = "one step of " if SEQ in arg.shape else ""
            raise ConfigError(
                f"{what}{arg.name} would have {elements} elements ({' x '.join(map(str, arg.shape))}); "
                "kernels index a buffer with 32-bit integers, so at most "
                f"{limits.MAX_ELEMENTS}: lower hidden, batch or input_size"
            )


def _positive(name: str, value) -> int | None:
    """A size argument as an int (NumPy integers too), or None; ConfigError otherwise."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _target(target, arch):
    if isinstance(target, tvm.target.Target):
        kind = target.kind.name
        arch = arch or str(target.attrs.get("arch", "")) or None
    else:
        kind = {"cpu": "llvm"}.get(str(target), str(target))
    if kind == "llvm":
        if arch is not None:
            raise ConfigError(
                f"arch={arch!r} is a CUDA architecture, and target 'llvm' is the CPU build, which takes "
                "none: drop arch, or compile for target='cuda'"
            )
        return cpu_target(), None
    if kind == "cuda":
        gpu = arch if isinstance(arch, GpuSpec) else gpu_spec(arch)
        return gpu.target(), gpu
    raise ConfigError(f"unknown target '{target}'; use 'cuda' or 'llvm'")


def _weight_tiers(kernel: Kernel, plan: CellPlan) -> dict:
    """Where a CTA keeps its recurrent weights, in bytes (the report's ``weight_*`` fields): its threads' weight
    registers (32-bit words), the weights in shared memory and those read from global memory every step; nothing for a
    template without a geometry."""
    g = by_name(kernel.template).geometry(kernel.config, plan) if kernel.config is not None else None
    if g is None or not hasattr(g, "weights_per_thread"):
        return {}
    return dict(weight_register_bytes=4 * g.threads * g.weights_per_thread, weight_smem_bytes=getattr(g, "smem_ws", 0),
                weight_l2_bytes=getattr(g, "l2_ws", 0))


def _report(
    plan: CellPlan, kernel: Kernel, built: Built, input_size: int, seq_len: int | None, gpu: GpuSpec | None, choice
) -> CompileReport:
    fn, grid = built.recurrent, kernel.launch.grid
    return CompileReport(
        cell=plan.cell.name,
        fingerprint=plan.fingerprint(),
        batch=plan.batch,
        hidden=plan.hidden,
        input_size=input_size,
        seq_len=seq_len,
        dtype=plan.dtype,
        target=f"cuda {gpu.arch}" if gpu else "llvm (CPU reference)",
        template=kernel.template,
        config=kernel.config.as_dict() if kernel.config is not None else {},
        config_origin=choice.origin,
        config_detail=choice.describe(),
        config_passed_over=choice.passed_over,
        ctas=grid and grid.ctas,
        threads=grid and grid.threads,
        dynamic_smem_bytes=grid and grid.dynamic_smem_bytes,
        registers=fn and fn.registers,
        stack_bytes=fn and fn.stack_bytes,
        spill_store_bytes=fn and fn.spill_store_bytes,
        spill_load_bytes=fn and fn.spill_load_bytes,
        static_smem_bytes=fn and fn.static_smem_bytes,
        **_weight_tiers(kernel, plan),
        ptxas_note=built.note,
        projection_ptxas=_projection_figures(built),
    )


def _projection_figures(built: Built) -> str:
    """ptxas's figures for the input projection's kernel, in words ("" without a ptxas report)."""
    if built.ptxas is None:
        return ""
    fn = built.ptxas.function("projection")
    return (
        f"{fn.registers} registers/thread, {fn.spills} B spills, {fn.stack_bytes} B stack, "
        f"{fn.static_smem_bytes} B static shared memory"
    )

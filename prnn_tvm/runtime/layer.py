"""A compiled layer: the run-time half (:mod:`prnn_tvm.runtime.base`) plus what compiled it.

Call order (positional or by keyword): ``x, W_ih, b_ih``, the cell's recurrent weights
and per-unit params in declaration order, then the initial states (``h0``, ``c0``, ...;
zeros when omitted). ``Layer.recurrent`` takes the precomputed projection ``xp`` in
place of ``x, W_ih, b_ih``. Arrays may be NumPy (copied to the device; NumPy comes back)
or anything with ``__dlpack__`` on the layer's device (wrapped without a copy; TVM
tensors, which speak DLPack, come back).
"""

from __future__ import annotations

from pathlib import Path

import tvm

from ..codegen.build import Built
from ..codegen.kernel import Kernel, layer_signature
from ..errors import ConfigError, PrnnError
from ..frontend.plan import CellPlan
from ..report import CompileReport
from ..session_build import compile_session
from ..signature import Signature
from ..target import GpuSpec, local_gpu
from .base import RuntimeLayer
from .session import FREE_SMS, RELEASE_AFTER_S, open_session


class Layer(RuntimeLayer):
    """A recurrent layer compiled for one cell, batch, hidden size and target.

    Use :func:`prnn_tvm.compile_cell` to make one. ``layer(x, W_ih, b_ih, W_hh, b_hh, h0, c0)``
    returns ``(out, (h_n, c_n, ...))`` with ``out`` of shape (T, batch, hidden);
    :func:`prnn_tvm.export` writes it to a shared library that :func:`prnn_tvm.load` runs
    with the TVM runtime alone. ``signature`` describes its launches and arguments.

    ``barrier_timeout_us`` bounds every grid-barrier wait, the layer's training kernels' and projected launch's
    too (setting it sets theirs): a timed-out launch fills its outputs
    with NaN, and :class:`~prnn_tvm.errors.BarrierTimeout` is raised by the call itself when it
    returns NumPy, else by the next call or :meth:`check` (see :class:`RuntimeLayer`);
    ``debug_stall_step`` (tests only) makes block 0 skip its arrival at that step, forcing the
    timeout path.

    A layer from the layer cache (:meth:`restored`) runs its cached library's module, and ``library`` is that
    library's path, written with ``library_metadata`` (None for a layer built in this process, or cached where
    it cannot run); its ``kernel`` is made again when first asked for. ``cache_key`` is its key in the cache
    (None for a layer compiled without it).
    """

    def __init__(
        self,
        plan: CellPlan,
        kernel: Kernel,
        built: Built,
        input_size: int,
        target: tvm.target.Target,
        gpu: GpuSpec | None,
        report: CompileReport,
    ):
        signature = layer_signature(plan, input_size, kernel.launch)
        if kernel.launch.grid is not None:  # the co-residency check wants ptxas's figures where there are any
            grid = kernel.launch.grid
            signature = signature.with_grid(
                kernel.launch.function,
                registers=report.registers or grid.registers,
                static_smem_bytes=report.static_smem_bytes or 0,
            )
        imports = built.module.imports
        self._setup(
            plan,
            signature,
            built.module,
            report,
            built.source,
            target,
            gpu,
            bool(imports) and imports[0].kind == "cuda",
        )
        self._kernel = kernel

    @classmethod
    def restored(
        cls,
        plan: CellPlan,
        signature: Signature,
        module,
        report: CompileReport,
        cuda_source: str | None,
        target: tvm.target.Target,
        gpu: GpuSpec | None,
        library: Path | None,
        metadata: dict,
        rebuild,
    ) -> Layer:
        """A layer of the layer cache: ``library`` is the library of an equal layer, written with ``metadata``, and
        ``module`` its module, loaded; both None where it cannot run here (a CUDA layer for another GPU, or
        none). ``rebuild`` makes what the entry does not hold, when asked: ``rebuild.kernel()`` the template's
        kernel, ``rebuild.module()`` the compiled module."""
        layer = cls.__new__(cls)
        layer._setup(plan, signature, module, report, cuda_source, target, gpu, module is not None)
        layer.library, layer.library_metadata, layer._rebuild = library, metadata, rebuild
        return layer

    def _setup(self, plan, signature, module, report, cuda_source, target, gpu, loaded: bool) -> None:
        self.plan, self.target, self.gpu = plan, target, gpu
        self.report, self.cuda_source = report, cuda_source
        self.library, self.library_metadata, self._rebuild, self._kernel = None, None, None, None
        self._backward = None  # its backward, once compiled (prnn_tvm.compiler.compile_backward)
        self._training = None  # a CUDA layer's training kernels, once compiled (prnn_tvm.compiler.compile_training)
        self._session = None  # a CUDA layer's session kernels, once compiled (prnn_tvm.compiler.compile_session)
        self._projected = None  # its projected launch, or why it has none, once asked (prnn_tvm.projected_build)
        self.cache_key = None  # its key in the layer cache (prnn_tvm.cache), which its backward's extends
        self._gpu_code = loaded  # a CUDA layer whose module holds code this process can launch
        super().__init__(signature, module, target.kind.name == "cuda")

    def _timeout_followers(self) -> list:
        return self._derived_runtimes()

    def _derived_runtimes(self) -> list[RuntimeLayer]:
        """The runtimes of the launches made from this layer that launch by their own (its training kernels, its
        projected launch), once built."""
        found = []
        training = getattr(self, "_training", None)  # not yet set while RuntimeLayer.__init__ sets the timeout
        if training is not None:
            found += [training.forward, training.backward]
        projected = getattr(self, "_projected", None)
        if projected is not None and not isinstance(projected, ConfigError):  # a ConfigError: why there is none
            found.append(projected.runtime)
        return found

    @property
    def kernel(self) -> Kernel:
        """The schedule template's kernel (PrimFunc, launch, config)."""
        if self._kernel is None:
            self._kernel = self._rebuild.kernel()
        return self._kernel

    @property
    def module(self):
        """The TVM runtime module holding the layer's functions."""
        if self._module is None:
            self._module = self._rebuild.module()
        return self._module

    @module.setter
    def module(self, value) -> None:
        self._module = value

    def compiled_module(self):
        """The module as TVM compiled it, which ``export_library`` can write (a module loaded from a library is
        built again)."""
        return self.module if self.library is None else self._rebuild.module()

    def session(self, *, release_after: float = RELEASE_AFTER_S, free_sms: int = FREE_SMS, **arrays):
        """A resident session of this CUDA layer (:mod:`prnn_tvm.runtime.session`): its kernel launched once, one
        step per call (``session.step(x_t)`` with NumPy, ``session.post(x_t, out)`` with GPU tensors). ``arrays``:
        ``W_ih``, ``b_ih`` and the cell's weights and params by the names a call takes, and optionally initial
        states (``h0``, ``c0``, ...). ``release_after``: seconds without a step after which the GPU is let go (the
        next step relaunches); ``free_sms``: SMs left to other kernels. Keyword arguments of
        :class:`~prnn_tvm.runtime.session.Session` pass through. A stack serves a step per call as a deep stack
        (compile ``"<cell>_d<layers>"``)."""
        kernels = compile_session(self)
        self.device  # noqa: B018 - refuses a layer that holds CUDA source only, saying so
        return open_session(kernels.signature, kernels.module, arrays, release_after=release_after, free_sms=free_sms)

    @property
    def device(self) -> tvm.runtime.Device:
        if self.is_cuda and (local_gpu() is None or not self._gpu_code):
            raise PrnnError(
                "this layer was compiled for CUDA on a machine without a usable GPU, so it holds "
                "CUDA source only; compile it where the GPU is (or use target='llvm' to run on the CPU)"
            )
        return super().device

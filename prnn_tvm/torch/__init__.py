"""PyTorch modules backed by prnn-tvm's persistent kernels: ``LSTM``, ``GRU``, ``RNN``, ``from_torch``, and
``Recurrent`` for any cell (a built-in, a cell file, a :class:`~prnn_tvm.Cell`).

Drop-in for ``torch.nn.LSTM``/``GRU``/``RNN`` (stacked and bidirectional too; trainable)::

    fast = prnn_tvm.torch.from_torch(torch_lstm)     # shares its parameters, no copy
    with torch.no_grad():
        out, (h_n, c_n) = fast(x)                    # out (T, B, H), or (B, T, H) with batch_first

Parameters have PyTorch's names, layout and gate order (``weight_ih_l0``, ``bias_hh_l0``,
...), so ``state_dict`` loads either way. Tensors reach the kernels through DLPack, without
copies (``batch_first`` input is made time-major: one copy). Batch and hidden size are
compile-time constants of a kernel: a module compiles its layer the first time it needs a
batch size, device and dtype (the parameters': float32, float16 or bfloat16), logs it, and
keeps it for later calls; a call's rows are padded up to a bucket (``batch_buckets``: powers of
two up to 64, then multiples of 64), and the layers of ``kept_batch_sizes`` batch sizes are kept
(:mod:`~prnn_tvm.torch.buckets`). A layer no prnn-tvm config places runs on torch.nn's own
kernels where its cell is one of torch.nn's (:mod:`~prnn_tvm.torch.fallback`). On CUDA the
input projection is torch's own GEMM (cuBLAS), then the persistent kernel runs (half precision
on tensor cores); CPU tensors run the CPU build. A one-directional stack (``num_layers``) runs, in
an inference call, as one persistent launch where
its layers' weights fit in registers together (the CPU build: always): a wavefront in which layer ``l`` computes
step ``t`` while layer ``l + 1`` computes step ``t - 1`` (:mod:`prnn_tvm.frontend.stack`;
:attr:`stack_notes` says, per compiled shape, whether it does and why not). Otherwise a stack runs
one layer after another, outputs concatenated as PyTorch does. An inference call runs a bidirectional
layer's two directions as one launch where their weights fit in registers together
(:mod:`prnn_tvm.frontend.directions`; :attr:`direction_notes` says which, and why); otherwise a launch
per direction, the reverse one on the time-reversed sequence, on the GPU side by side (the reverse
one on a stream of the module's, forked from and joined back to the caller's) where the GPU holds
both grids at once, else one after the other. A
``PackedSequence`` runs as its padded batch with per-row lengths (rows stop at their length, the
reverse direction starts at each row's last step) and comes back packed the same way.

A CUDA call is asynchronous like any torch op: its kernels run on torch's current stream (or on a
side stream joined back to it), outputs come from torch's allocator, and nothing waits for the
GPU. So calls can be captured in a CUDA graph (``torch.cuda.graph``) and replayed, and calls on
several streams may run at once (each stream, and each captured graph, has its own barrier state).
A barrier timeout fills that call's outputs with NaN and is raised, as
:class:`~prnn_tvm.errors.BarrierTimeout`, by the module's next call or by :meth:`check`.
Gradients: a call that needs them is differentiable (``torch.autograd``), with the adjoints
derived from the cell's plan. On the CPU the forward is torch's projection and the CPU build's
recurrent kernel, the backward the compiled backpropagation through time
(``torch.autograd.gradcheck`` passes on float64 modules). On the GPU the forward is the layer's
kernel saving each step's states and products, the backward the persistent backward kernel,
then torch's GEMMs for the weights' gradients (:func:`prnn_tvm.compiler.compile_training`), in
float32 for half layers too. Gradients are first derivatives: a backward that would itself be
differentiated (``create_graph=True``, as a gradient penalty asks) is refused
(:class:`~prnn_tvm.errors.UnsupportedError`), never computed without the kernel's terms. Under
``torch.compile`` and ``torch.export`` a call is the operator ``prnn_tvm::layers`` (:mod:`~prnn_tvm.torch.ops`:
no graph break, an exported program that runs anywhere); ``torch.jit.trace`` is refused. The modules are
``torch.nn.RNNBase`` s with its bookkeeping; parameters are read by attribute (parametrizations, ``weight_norm``);
under ``torch.autocast`` a module runs in its dtype where torch.nn's would.

The package: :mod:`~prnn_tvm.torch.modules` (the modules, torch.nn's manners), :mod:`~prnn_tvm.torch.dispatch`
(which compiled layer serves a call, and running it: the CUDA kernels through the runtime's
:class:`~prnn_tvm.runtime.launcher.Launcher`), :mod:`~prnn_tvm.torch.arguments` (a launch's arguments from the
parameters, and what is kept of them), :mod:`~prnn_tvm.torch.projection` (the input projection),
:mod:`~prnn_tvm.torch.autograd` (the ``torch.autograd.Function`` s), :mod:`~prnn_tvm.torch.sequences` (packed and
reversed sequences), :mod:`~prnn_tvm.torch.buckets` (batch buckets), :mod:`~prnn_tvm.torch.fallback` (torch.nn's
kernels where nothing fits), :mod:`~prnn_tvm.torch.ops` (the torch operators), :mod:`~prnn_tvm.torch.amp`
(autocast).
"""

try:
    import torch  # noqa: F401 - PyTorch itself; say how to install it where it is missing
except ModuleNotFoundError as err:
    if err.name != "torch":
        raise
    raise ModuleNotFoundError(
        "prnn_tvm.torch needs PyTorch: pip install 'prnn-tvm[torch]' (from the repository: pip install -e '.[torch]')",
        name="torch",
    ) from err

from .dispatch import DTYPES
from .modules import GRU, LSTM, RNN, Recurrent, from_torch
from .projection import BIAS_IN_GEMM

for _public in (LSTM, GRU, RNN, Recurrent, from_torch):  # pickles and reprs name the public path, not the file
    _public.__module__ = __name__

__all__ = ["LSTM", "GRU", "RNN", "Recurrent", "from_torch", "DTYPES", "BIAS_IN_GEMM"]

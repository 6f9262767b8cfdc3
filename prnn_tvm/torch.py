"""PyTorch modules backed by prnn-tvm's persistent kernels: ``LSTM``, ``GRU``, ``RNN``, ``from_torch``, and
``Recurrent`` for any cell (a built-in, a cell file, a :class:`~prnn_tvm.Cell`).

Drop-in for ``torch.nn.LSTM``/``GRU``/``RNN`` (stacked and bidirectional too; trainable)::

    fast = prnn_tvm.torch.from_torch(torch_lstm)     # shares its parameters, no copy
    with torch.no_grad():
        out, (h_n, c_n) = fast(x)                    # out (T, B, H), or (B, T, H) with batch_first

Parameters have PyTorch's names, layout and gate order (``weight_ih_l0``, ``bias_hh_l0``,
...), so ``state_dict`` loads either way. Tensors reach the kernels through DLPack, without
copies (``batch_first`` input is made time-major: one copy). Batch and hidden size are
compile-time constants of a kernel: a module compiles its layer the first time it sees a
batch size, device and dtype (the parameters': float32, float16 or bfloat16), logs it, and
keeps it for later calls. On CUDA the input projection is torch's own GEMM (cuBLAS), then the
persistent kernel runs (half precision on tensor cores); CPU tensors run the CPU build. A
one-directional stack (``num_layers``) runs, in an inference call, as one persistent launch where
its layers' weights fit on chip together (the CPU build: always): a wavefront in which layer ``l`` computes
step ``t`` while layer ``l + 1`` computes step ``t - 1`` (:mod:`prnn_tvm.frontend.stack`;
:attr:`stack_notes` says, per compiled shape, whether it does and why not). Otherwise a stack runs
one layer after another, outputs concatenated as PyTorch does. An inference call runs a bidirectional
layer's two directions as one launch where their weights fit on chip together
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
(:class:`~prnn_tvm.errors.UnsupportedError`), never computed without the kernel's terms. A module's calls
cannot be recorded by ``torch.jit.trace`` or ``torch.export`` (they are TVM calls) and are refused under
them; ``torch.compile`` runs them as they are.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref

try:
    import torch  # PyTorch itself: absolute import
except ModuleNotFoundError as err:
    if err.name != "torch":
        raise
    raise ModuleNotFoundError("prnn_tvm.torch needs PyTorch: pip install 'prnn-tvm[torch]' (from the repository: "
                              "pip install -e '.[torch]')", name="torch") from err
import tvm_ffi
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from prnn_tvm.deferred import (  # the compiler (and TVM) at the first compile, not at import
    analyze,
    compile_backward,
    compile_cell,
    compile_training,
    resolve,
    split_direction_name,
    split_layer_name,
)
from prnn_tvm.dtypes import POLICIES
from prnn_tvm.errors import ConfigError, InputError, LaunchError, UnsupportedError
from prnn_tvm.runtime.limits import ALIGNMENT, MAX_ELEMENTS, chunk_length
from prnn_tvm.signature import ArgRole

log = logging.getLogger(__name__)

# the cell's arguments -> torch.nn's parameter names, without their layer and direction suffix (``_l0``,
# ``_l1_reverse``), in torch.nn's order (the cells take PyTorch's layout and gate order)
_TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
_BIASES = ("b_ih", "b_hh")  # what bias=False leaves out (zeros)
ALL_STEPS = 2**31 - 1  # a row length that no sequence reaches: the kernels clamp lengths to the sequence's
# the parameter dtypes a module runs in -> the layer dtype it compiles
DTYPES = {getattr(torch, p.torch_type): name for name, p in POLICIES.items()}  # float64: the CPU build only


class _Recurrent(torch.nn.Module):
    # Whether the cell only ever adds the input projection's bias and the recurrent one (torch.nn's LSTM and
    # RNN: gates = W_ih x + b_ih + W_hh h + b_hh; not GRU, whose n gate multiplies b_hn by r). Then a half
    # inference call on the GPU passes ``b_hh + b_ih`` as the recurrent bias and its projection is one GEMM,
    # without the bias pass a half GEMM into float32 needs in torch (``_projection``): 9.5-32 us of GPU time a
    # call at LSTM H 256-1024, B 8-16, T=256 (H100, torch.profiler). The sum is rounded once to the half type
    # (half an ulp of the bias).
    _FOLDS_INPUT_BIAS = False

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None, arch: str | None = None, config=None, names: dict | None = None):
        super().__init__()
        kind = type(self).__name__
        for name, value, least in (("input_size", input_size, 1), ("hidden_size", hidden_size, 1),
                                   ("num_layers", num_layers, 1), ("proj_size", proj_size, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{kind}: {name} must be {'a positive' if least else 'a'} whole number (an int"
                                  f"{'' if least else ' of at least 0'}), got {value!r}")
        if proj_size:
            raise ConfigError(f"{kind}: proj_size={proj_size} is not supported")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ConfigError(f"{kind}: dropout must be a number in [0, 1], got {dropout!r}")
        for name, value in (("bias", bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
            if value not in (True, False) or not isinstance(value, (bool, int)):
                raise ConfigError(f"{kind}: {name} must be True or False, got {value!r}")
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in DTYPES:
            raise ConfigError(f"{kind}: dtype {dtype} is not supported; use one of {', '.join(map(str, DTYPES))}")
        self.cell, self.input_size, self.hidden_size = cell, input_size, hidden_size
        self.num_layers, self.bidirectional, self.dropout = num_layers, bool(bidirectional), float(dropout)
        self.bias, self.batch_first, self.arch, self.config = bool(bias), bool(batch_first), arch, config
        # a bidirectional inference call runs a layer's two directions as one launch where both fit on chip
        # together (False: a launch per direction); direction_notes says per compiled shape which and why
        # a launch per direction on the GPU runs the reverse one on a stream of its own, beside the forward
        # one, where both grids fit on the GPU together (False: always one after the other)
        self.concurrent_directions = True
        self.one_launch_directions = True
        self.direction_notes: dict = {}
        # a one-directional stack's inference call runs as one wavefront launch where it fits (False:
        # always layer by layer); stack_notes says per (batch, device, dtype) which runs and why
        self.wavefront = True
        self.stack_notes: dict = {}
        # gate and state counts come from the cell's plan (any batch: the shapes do not depend on it)
        plan = analyze(resolve(cell), 1, hidden_size)
        self._states = tuple(s.name for s in plan.states)
        # the cell's arguments -> parameter names (without suffix), in the order the parameters are made
        self._names = names or {a: a for a in ("W_ih", "b_ih", *(s.name for s in (*plan.weights, *plan.params)))}
        directions = 2 if self.bidirectional else 1
        kw = {"device": device, "dtype": dtype}
        self._shapes: dict = {}  # each parameter's shape, as made: what a call checks a replaced one against
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            shapes = {"W_ih": (plan.input.slices * hidden_size, width), "b_ih": (plan.input.slices * hidden_size,)}
            shapes.update({s.name: (s.slices * hidden_size, hidden_size) for s in plan.weights})
            shapes.update({s.name: (s.slices * hidden_size,) for s in plan.params})
            for direction in range(directions):
                for arg, name in self._names.items():
                    if bias or arg not in _BIASES:
                        self._shapes[name + _suffix(layer, direction)] = shapes[arg]
                        setattr(self, name + _suffix(layer, direction),
                                torch.nn.Parameter(torch.empty(*shapes[arg], **kw)))
        self.reset_parameters()
        self._layers: dict = {}
        self._launchers: dict = {}
        self._arguments: dict = {}
        self._side_streams: dict = {}
        self._aligned_copies: dict = {}
        self._constants: dict = {}
        self._derived: dict = {}
        self._joined: dict = {}
        self._launch_notes: dict = {}  # one-launch builds (stacks, both directions) -> what runs, and why
        self._captured: list = []  # launch states captured in CUDA graphs: kept as long as the module

    _COMPILED = ("_layers", "_launchers", "_arguments", "_side_streams", "_aligned_copies", "_constants",
                 "_derived", "_joined", "_launch_notes", "_captured", "stack_notes",
                 "direction_notes")

    def __getstate__(self) -> dict:
        """Copies and pickles (``copy.deepcopy``, ``torch.save``) keep the parameters and options but
        not what was compiled or cached for them (TVM modules do not serialize): the copy compiles on
        first use, for its own device."""
        state = self.__dict__.copy()
        state.update({name: type(state[name])() for name in self._COMPILED})
        return state

    def reset_parameters(self) -> None:
        """PyTorch's initialization: U(-1/sqrt(hidden), 1/sqrt(hidden))."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, cell={self.cell}, num_layers={self.num_layers}, "
                f"bias={self.bias}, batch_first={self.batch_first}, bidirectional={self.bidirectional}")

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype, which the module computes in (``.half()``, ``.to(torch.bfloat16)`` change it)."""
        return self._first_parameter().dtype

    def _first_parameter(self) -> torch.Tensor:
        """The first parameter (``self.parameters()`` walks the module tree: microseconds a call)."""
        return next(iter(self._parameters.values()))

    def layer_for(self, batch: int, device: torch.device, dtype: torch.dtype | None = None,
                  input_size: int | None = None):
        """The compiled layer for ``batch`` on ``device`` in ``dtype`` (the parameters'; compiled on
        first use, then kept), taking ``input_size`` features (the module's; a stack's later layers take
        hidden x directions)."""
        dtype = self.dtype if dtype is None else dtype
        input_size = self.input_size if input_size is None else input_size
        key = (batch, device.type, device.index, dtype, input_size)
        if key not in self._layers:
            target = "cuda" if device.type == "cuda" else "llvm"
            if device.type not in ("cuda", "cpu"):
                raise InputError(f"{type(self).__name__}: tensors on {device} are not supported; use cuda or cpu")
            if dtype not in DTYPES:
                raise ConfigError(f"{type(self).__name__}: parameters of {dtype} are not supported; use one of "
                                  f"{', '.join(map(str, DTYPES))}")
            log.info("compiling %s hidden=%d batch=%d %s for %s", self.cell, self.hidden_size, batch, DTYPES[dtype],
                     target)
            self._layers[key] = compile_cell(self.cell, self.hidden_size, batch, input_size=input_size,
                                             dtype=DTYPES[dtype], target=target,
                                             arch=self.arch if target == "cuda" else None,
                                             config=self.config if target == "cuda" else None)
        return self._layers[key]

    def stack_for(self, batch: int, device: torch.device, dtype: torch.dtype | None = None):
        """The module's layers compiled as one wavefront launch (``compile_cell(..., layers=num_layers)``) for
        ``batch`` on ``device``, or None where a call runs them layer by layer: one layer, both directions,
        :attr:`wavefront` off, or (CUDA) weights that do not fit on chip together (compiled on first use, then
        kept; ``stack_notes[(batch, device, dtype)]`` says which, and why)."""
        if not (self.wavefront and self.num_layers > 1 and not self.bidirectional):
            return None
        dtype = self.dtype if dtype is None else dtype
        return self._one_launch((batch, device.type, device.index, dtype, "stack"), self.stack_notes,
                                (batch, str(device), dtype), batch, device, dtype, self.input_size,
                                "one wavefront launch", "layer by layer", layers=self.num_layers)

    def directions_for(self, batch: int, device: torch.device, dtype: torch.dtype, input_size: int):
        """A bidirectional layer's two directions compiled as one launch (``compile_cell(...,
        bidirectional=True)``: each direction on CTAs of its own) for ``batch`` on ``device`` taking
        ``input_size`` features, or None where a call runs a launch per direction: a one-directional
        module, :attr:`one_launch_directions` off, or weights that do not fit on chip together. Compiled on
        first use, then kept; ``direction_notes[(batch, device, dtype, input_size)]`` says which, and why."""
        if not (self.bidirectional and self.one_launch_directions):
            return None
        key, notes_key = (batch, device.type, device.index, dtype, input_size), (batch, str(device), dtype, input_size)
        return self._one_launch((*key, "bidirectional"), self.direction_notes, notes_key, batch, device, dtype,
                                input_size, "one launch", "a launch per direction", bidirectional=True)

    def _one_launch(self, key: tuple, notes: dict, notes_key: tuple, batch: int, device: torch.device,
                    dtype: torch.dtype, input_size: int, done: str, otherwise: str, **options):
        """The module's cell compiled with ``options`` (``layers``, ``bidirectional``) for ``batch`` on ``device``
        once, then kept as ``_layers[key]``; None where it does not fit (not tried again). ``notes[notes_key]``
        says which: ``done`` with the grid's figures, or ``otherwise`` with the compile's refusal."""
        if key not in self._launch_notes:
            cuda = device.type == "cuda"
            try:
                layer = compile_cell(self.cell, self.hidden_size, batch, input_size=input_size, dtype=DTYPES[dtype],
                                     target="cuda" if cuda else "llvm", arch=self.arch if cuda else None, **options)
            except ConfigError as err:
                self._launch_notes[key] = f"{otherwise}: {err}"
                log.info("%s of hidden %d at batch %d: %s", type(self).__name__, self.hidden_size, batch,
                         self._launch_notes[key])
            else:
                rep = layer.report
                self._launch_notes[key] = done + (
                    f": {rep.ctas} CTAs x {rep.threads} threads, {rep.registers} registers, "
                    f"{rep.spill_store_bytes} B spills" if cuda else " (the CPU build)")
                self._layers[key] = layer
        notes[notes_key] = self._launch_notes[key]
        return self._layers.get(key)

    def check(self) -> None:
        """Wait for this module's kernels and raise :class:`~prnn_tvm.errors.BarrierTimeout` if one timed
        out since the last check (a call raises an earlier one's by itself; a replayed CUDA graph's
        timeout surfaces here or at the next eager call)."""
        for (_, kind, index, *_), layer in self._layers.items():
            if kind == "cuda":
                torch.cuda.synchronize(index)
            layer.check(wait=False)
            if layer._training is not None:
                layer._training.forward.check(wait=False)
                layer._training.backward.check(wait=False)

    def _aligned(self, name: str, fresh: bool = False) -> torch.Tensor:
        """Parameter ``name`` detached (DLPack refuses tensors that track gradients), or an aligned copy of
        it when it does not start on a 64-byte boundary (cuDNN's flattened weights put biases anywhere).
        Kept while the parameter and its storage stay the same (a copy: and its version counter), so the
        copy is made once per weight update. ``fresh`` (a CUDA graph being captured): made anew and not
        kept, so that the graph makes it in every replay from the parameter as it is then."""
        p, cached = self._parameters[name], self._aligned_copies.get(name)
        if not fresh and cached is not None and cached[0] is p and cached[1] == p.data_ptr() and cached[2] in (
                None, p._version):
            return cached[3]
        self._check_parameter(name, p)
        # torch's allocators align blocks; a strided parameter (torch.nn takes one) is copied compact, as is one
        # that does not start on an aligned address
        placed = p.data_ptr() % ALIGNMENT == 0 and p.is_contiguous()
        ready = p.detach() if placed else p.detach().clone(memory_format=torch.contiguous_format)
        if not fresh:
            self._aligned_copies[name] = (p, p.data_ptr(), None if placed else p._version, ready)
        return ready

    def _tracked(self, name: str) -> torch.Tensor:
        """Parameter ``name`` as a differentiable call passes it: checked, and compact (a strided one through
        ``contiguous``, which autograd differentiates)."""
        p = self._parameters[name]
        self._check_parameter(name, p)
        return p if p.is_contiguous() else p.contiguous()

    def _check_parameter(self, name: str, p: torch.Tensor) -> None:
        """InputError, naming the parameter as torch.nn does (``weight_hh_l0``), for one whose shape is not the
        one the module made or whose dtype or device is not the module's (its first parameter's)."""
        first, kind = self._first_parameter(), type(self).__name__
        made = getattr(self, "_shapes", {}).get(name)  # none in a module pickled before shapes were kept
        if made is not None and tuple(p.shape) != made:
            raise InputError(f"{kind}: parameter {name} has shape {tuple(p.shape)}, expected {made}")
        if p.dtype != first.dtype or p.device != first.device:
            raise InputError(f"{kind}: parameter {name} is {p.dtype} on {p.device}, the module's parameters are "
                             f"{first.dtype} on {first.device} (its first, {next(iter(self._parameters))}); convert "
                             "it (.to(dtype, device))")

    def _constant(self, shape: tuple, device: torch.device, dtype: torch.dtype, value=0) -> torch.Tensor:
        """A constant the kernels only read (zeros for omitted initial states and absent biases, the
        lengths of rows that run every step): made once per shape and kept, except when first needed
        while a CUDA graph is being captured (memory made then belongs to the graph)."""
        key = (shape, device, dtype, value)
        constant = self._constants.get(key)
        if constant is None:
            constant = torch.full(shape, value, device=device, dtype=dtype)
            if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
                self._constants[key] = constant
        return constant

    def _joined_parameters(self, names: tuple, fresh: bool = False) -> torch.Tensor:
        """Parameters ``names`` stacked along their first dimension (both directions' ``W_ih``, for one GEMM):
        made once per weight update (kept while the parameters and their version counters stay the same;
        ``fresh``, as in :meth:`_aligned`: made anew, not kept)."""
        parts = [self._aligned(name, fresh) for name in names]
        if fresh:
            return torch.cat(parts)
        versions = tuple((p.data_ptr(), p._version) for p in parts)
        cached = self._joined.get(names)
        if cached is not None and cached[0] == versions and all(a is b for a, b in zip(cached[1], parts)):
            return cached[2]
        joined = torch.cat(parts)
        self._joined[names] = (versions, parts, joined)
        return joined

    def _biased_weight(self, W_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
        """``[W_ih | b_ih | 0]`` for a half projection on the GPU (``_projection``), made once per weight
        update (:meth:`_derived_from`)."""
        return self._derived_from("biased", _biased, W_ih, b_ih, fresh=torch.cuda.is_current_stream_capturing())

    def _derived_from(self, what: str, make, *tensors: torch.Tensor, fresh: bool = False) -> torch.Tensor:
        """``make(*tensors)``, made once per weight update: kept while the same tensors (:meth:`_aligned` or
        :meth:`_joined_parameters` ones) keep their version counters, and dropped when any of them is (a
        replaced parameter or a remade joined one leaves nothing behind). ``fresh`` (a CUDA graph being
        captured): made anew and not kept, so that every replay makes it from the parameters as they are."""
        if fresh:
            return make(*tensors)
        key, versions = (what, *map(id, tensors)), tuple(t._version for t in tensors)
        cached = self._derived.get(key)
        if cached is not None and cached[1] == versions and all(r() is t for r, t in zip(cached[0], tensors)):
            return cached[2]
        made = make(*tensors)
        cache = self._derived  # not self: the callbacks keep no module alive

        def forget(_, key=key, cache=cache):  # the ids die with the tensors: so does their entry
            cache.pop(key, None)

        self._derived[key] = (tuple(weakref.ref(t, forget) for t in tensors), versions, made)
        return made

    def _folded_input_bias(self, layer, suffix: str | None, weights: list, fresh: bool = False) -> list:
        """A launch's ``weights`` (:meth:`_parameter_arguments` order, ``layer`` and ``suffix`` as there) with the
        projection's bias moved into the recurrent one (:attr:`_FOLDS_INPUT_BIAS`): ``b_ih`` becomes None and
        each ``b_hh`` whose direction's projection this launch's GEMM makes becomes ``b_hh + b_ih``, summed in
        float32 and rounded once to the parameters' type (made once per weight update). A stack's upper layers
        keep theirs: the kernel projects them itself. Which arguments change is worked out once per launch;
        ``fresh`` as in :meth:`_derived_from`."""
        key = (id(layer), suffix, "folded")
        plan = self._arguments.get(key)
        if plan is None:
            entries = self._parameter_arguments(layer, suffix)
            at = next(i for i, (arg, _, _) in enumerate(entries) if arg == "b_ih")
            projected = entries[at][1] if isinstance(entries[at][1], tuple) else (entries[at][1],)
            own_ih, own_hh = self._names["b_ih"], self._names["b_hh"]
            partners = [(i, own_ih + name[len(own_hh):]) for i, (_, name, _) in enumerate(entries)
                        if isinstance(name, str) and name.startswith(own_hh)]
            plan = self._arguments[key] = (at, [(i, partner) for i, partner in partners if partner in projected])
        at, pairs = plan
        folded = list(weights)
        folded[at] = None
        for i, partner in pairs:
            folded[i] = self._derived_from("folded", _summed, weights[i], self._aligned(partner, fresh), fresh=fresh)
        return folded

    def forward(self, input, hx=None):
        kind, H = type(self).__name__, self.hidden_size
        if torch.jit.is_tracing() or _EXPORTING():
            tracer = "torch.jit.trace" if torch.jit.is_tracing() else "torch.export"
            raise UnsupportedError(f"{kind}: {tracer} cannot record a prnn_tvm.torch module (its kernels are TVM "
                                   "calls, and its kernels' sizes would be traced as constants); call it eagerly, or "
                                   "under torch.compile, which runs it as it is (torch.cuda.graph captures its CUDA "
                                   "calls)")
        states = len(self._states)
        directions = 2 if self.bidirectional else 1
        slots = self.num_layers * directions  # the initial and final states of each layer and direction
        hx = () if hx is None else (tuple(hx) if states > 1 else (hx,))
        packed = input if isinstance(input, PackedSequence) else None
        lengths = None
        if packed is not None:  # padded, time-major, in the caller's batch order (as are hx and h_n)
            input, lengths, sorted_steps = _unpacked(packed)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (input, *hx, *self._parameters.values()))
        if input.dim() not in (2, 3) or input.shape[-1] != self.input_size:
            raise InputError(f"{kind}: input must be (T, B, {self.input_size}) or unbatched (T, {self.input_size}), "
                             f"got shape {tuple(input.shape)}")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if self.batch_first and batched and packed is None:
            x = x.transpose(0, 1)
        x = x.contiguous()
        B = x.shape[1]
        want = (slots, B, H) if batched else (slots, H)
        if len(hx) not in (0, states):
            wanted = f"({', '.join(f'{s}0' for s in self._states)})" if states > 1 else f"{self._states[0]}0"
            raise InputError(f"{kind}: hx must be {wanted}")
        for t in hx:
            if tuple(t.shape) != want:
                raise InputError(f"{kind}: initial state has shape {tuple(t.shape)}, expected {want}")
        first = self._first_parameter()
        dtype, where = first.dtype, first.device
        for what, t in (("input", x), *(("initial state", t) for t in hx)):
            if t.dtype != dtype:
                raise InputError(f"{kind}: {what} is {t.dtype}, the module's parameters are {dtype}; convert one "
                                 "of them (.to(dtype))")
            if t.device != where:
                raise InputError(f"{kind}: {what} is on {t.device}, the module's parameters on {where}; move one "
                                 "of them (.to(device))")
        if x.shape[0] == 0:
            raise InputError(f"{kind}: the input has no timesteps (shape {tuple(input.shape)}); a sequence needs "
                             "at least one")
        if B == 0:  # nothing to run: empty results, shaped as torch.nn's
            out = x.new_empty(x.shape[0], 0, H * directions)
            ends = [x.new_empty(slots, 0, H) for _ in range(states)]
            return (out.transpose(0, 1) if self.batch_first else out), (tuple(ends) if states > 1 else ends[0])
        initial = [_detached(t, grad) if batched else _detached(t, grad).unsqueeze(1) for t in hx]  # (slots, B, H)
        out, finals = x, [[None] * slots for _ in range(states)]
        # the reverse direction reads each row's steps backwards: the whole sequence, or its own length
        backwards = (None if directions == 1 else (lambda s: s.flip(0)) if lengths is None
                     else _reversal_within(lengths, x.shape[0]))
        # where a layer runs a launch per direction, an inference call on the GPU runs the reverse one on a stream
        # of its own, beside the forward one, where the two grids fit on the GPU together (measured: else the
        # second waits, and it costs 5-9%)
        concurrent = directions == 2 and self.concurrent_directions and x.device.type == "cuda" and not grad
        # a one-directional stack in inference: one wavefront launch, where it fits
        stack = None if grad or (self.training and self.dropout) else self.stack_for(B, x.device, x.dtype)
        if stack is not None:
            layer_major = [t[layer] for layer in range(self.num_layers) for t in initial]
            out, ends = self._run(stack, self._launch_arguments(stack, x, None, layer_major, lengths))
            for i, end in enumerate(ends):  # layer-major, the cell's states in order within a layer
                finals[i % states][i // states] = end
        for layer in range(self.num_layers if stack is None else 0):  # else one launch per layer and direction
            both = None if grad else self.directions_for(B, x.device, x.dtype, out.shape[2])
            if both is not None:  # the layer's directions in one launch: its output in torch's order
                pairs = [t[layer * directions + direction] for direction in range(directions) for t in initial]
                out, ends = self._run(both, self._launch_arguments(both, out, _suffix(layer, 0), pairs, lengths))
                for i, end in enumerate(ends):  # direction-major, the cell's states in order within one
                    finals[i % states][layer * directions + i // states] = end
            else:
                # every direction's inputs are made ready on the caller's stream (aligned copies, constants),
                # then the directions run: one after the other, or side by side (joined before the next layer)
                ready = [self._inputs(out if direction == 0 else backwards(out), _suffix(layer, direction),
                                      [t[layer * directions + direction] for t in initial], lengths, grad)
                         for direction in range(directions)]
                side = self._side_stream(x.device) if concurrent and ready[0][0].grids_that_fit() >= 2 else None
                if side is not None:
                    side.wait_stream(torch.cuda.current_stream(x.device))
                outs = []
                for direction, (compiled, args) in enumerate(ready):
                    with torch.cuda.stream(side) if side is not None and direction == 1 else _NOTHING:
                        y, ends = self._run(compiled, args, grad)
                        outs.append(y if direction == 0 else backwards(y))
                    for k, end in enumerate(ends):
                        finals[k][layer * directions + direction] = end
                if side is not None:
                    torch.cuda.current_stream(x.device).wait_stream(side)
                out = outs[0] if directions == 1 else torch.cat(outs, dim=2)  # PyTorch's order: forward, reverse
            if self.training and self.dropout and layer < self.num_layers - 1:  # between layers, as torch.nn
                out = torch.nn.functional.dropout(out, self.dropout, training=True)
        finals = [f[0].unsqueeze(0) if slots == 1 else torch.stack(f) for f in finals]
        if packed is not None:
            out = _packed_like(packed, out, sorted_steps)
        elif not batched:
            out, finals = out.squeeze(1), [f.squeeze(1) for f in finals]
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, (tuple(finals) if states > 1 else finals[0])

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream a bidirectional layer's reverse direction runs on beside the caller's current stream (one
        per current stream: two callers' streams never share one). Two persistent kernels on two streams run
        at once where both grids fit on the GPU, else one after the other."""
        key = (device, _current_stream(device))
        if key not in self._side_streams:
            self._side_streams[key] = torch.cuda.Stream(device)
        return self._side_streams[key]

    def _inputs(self, x: torch.Tensor, suffix: str, initial: list, lengths: torch.Tensor | None = None,
                grad: bool = False) -> tuple:
        """One layer and direction's compiled layer and arguments: ``(layer, args)`` (:meth:`_launch_arguments`).
        ``x``: time-major; parameters ``*{suffix}``; ``initial``: its initial states, or [] for zeros."""
        layer = self.layer_for(x.shape[1], x.device, x.dtype, x.shape[2])
        return layer, self._launch_arguments(layer, x, suffix, initial, lengths, grad)

    def _launch_arguments(self, layer, x: torch.Tensor, suffix: str | None, initial: list,
                          lengths: torch.Tensor | None = None, grad: bool = False) -> list:
        """``layer``'s arguments in its signature's order (``x``, weights, params, initial states, lengths), made
        ready on the current stream (aligned copies, constants). ``suffix``: the layer and direction of the
        parameters (None: ``layer`` is a wavefront stack of every layer, :meth:`stack_for`; for both directions
        in one launch, :meth:`directions_for`, the forward one's); ``initial``: the initial states in the
        launch's order (a stack's layer-major, both directions' direction-major), or [] for zeros;
        ``lengths``: each row's steps (int32 on ``x``'s device), or None for all; ``grad``: differentiable."""
        B, H, dtype, device = x.shape[1], self.hidden_size, x.dtype, x.device
        # what is derived from the parameters (aligned copies, joined and folded ones) is kept between calls,
        # but made inside a CUDA graph being captured: a replay then follows in-place parameter updates
        fresh = device.type == "cuda" and torch.cuda.is_current_stream_capturing()

        def param(name, shape):  # tracked by autograd when differentiable, else detached (and aligned) once
            if name is None:  # an absent bias
                return self._constant(shape, device, dtype)
            if isinstance(name, tuple):  # both directions' input projections, stacked
                return self._joined_parameters(name, fresh)
            return self._tracked(name) if grad else self._aligned(name, fresh)

        weights = [param(name, shape) for _, name, shape in self._parameter_arguments(layer, suffix)]
        widens = POLICIES[DTYPES[dtype]].widens  # a half layer: its projection's GEMM is torch's, in float32
        if self._FOLDS_INPUT_BIAS and self.bias and not grad and device.type == "cuda" and widens:
            weights = self._folded_input_bias(layer, suffix, weights, fresh)
        zeros = len(self._states) * (self.num_layers if suffix is None else len(layer.plan.outputs))
        states = [_aligned_state(t) for t in initial] or [self._constant((B, H), device, dtype)] * zeros
        if lengths is None and device.type == "cuda":  # every row runs every step (any T: the most an int32 says)
            lengths = self._constant((B,), device, torch.int32, ALL_STEPS)
        return [_detached(x, grad), *weights, *states, lengths]

    def _run(self, layer, args: list, grad: bool = False) -> tuple:
        """Run one layer and direction on its arguments (:meth:`_launch_arguments`) on the current stream: ``(out,
        finals)``, finals of shape (B, H)."""
        x = args[0]
        if grad and x.device.type == "cuda":  # torch differentiates the projection, and makes dW (one GEMM each)
            xp = _projection(*args[:3], differentiable=True)
            out, *finals = _CudaBackprop.apply(self, self._training_kernels(layer), xp, *args[3:])
            return out, finals
        if grad:  # the recurrent kernel's backward is compiled for the CPU
            out, *finals = _CpuBackprop.apply(layer, _projection(*args[:3]), *args[3:])
            return out, finals
        if x.device.type == "cuda":
            out, *finals = self._run_cuda(layer, _projection(*args[:3], biased_weight=self._biased_weight), args[3:])
            return out, finals
        out, finals = layer(*args)
        return torch.from_dlpack(out), [torch.from_dlpack(f) for f in finals]

    def _parameter_arguments(self, layer, suffix: str | None) -> list:
        """``layer``'s weight and param inputs (``W_ih``, ``b_ih``, then the cell's), in its signature's order,
        for the layer and direction ``suffix`` (None: ``layer`` is a wavefront stack, whose arguments name
        their layers, ``l1_W_hh``): ``(argument, parameter name, shape)``, the name None for an absent bias
        (worked out once: a signature's inputs are derived on each use)."""
        key = (id(layer), suffix)
        if key not in self._arguments:
            found = []
            both = bool(layer.plan.reversed_states)  # both directions in one launch: names fwd_W_hh, rev_W_hh
            for a in layer.signature.inputs:
                if a.role not in (ArgRole.WEIGHT, ArgRole.PARAM):
                    continue
                if both and a.name in ("W_ih", "b_ih"):  # stacked: the forward direction's rows first
                    found.append((a.name, None if not self.bias and a.name in _BIASES else
                                  tuple(self._names[a.name] + suffix + own for own in ("", _REVERSE)),
                                  a.concrete_shape(1)))
                    continue
                if both:
                    direction, base = split_direction_name(a.name)
                    own = suffix + (_REVERSE if direction else "")
                elif suffix is not None:
                    base, own = a.name, suffix
                elif a.name in ("W_ih", "b_ih"):  # a stack's layer 0 projection
                    base, own = a.name, _suffix(0, 0)
                else:
                    index, base = split_layer_name(a.name)
                    own = _suffix(index, 0)
                found.append((a.name, None if not self.bias and base in _BIASES else self._names[base] + own,
                              a.concrete_shape(1)))
            self._arguments[key] = found
        return self._arguments[key]

    def _run_cuda(self, layer, xp: torch.Tensor, recurrent: list, function: str = "recurrent") -> list:
        """Launch ``function`` of ``layer`` on torch's current stream, into tensors from torch's allocator; no
        waiting. ``recurrent``: the launch's data arguments after ``xp``, in its order (for ``recurrent``: the
        recurrent weights, params, initial states and lengths). Returns what it writes, in its order."""
        layer.check(wait=False)  # an earlier launch's timeout is raised before this one starts
        launcher = self._launchers.get((id(layer), function))
        if launcher is None:
            launcher = self._launchers[id(layer), function] = _Launcher(layer, xp.device, function)
        return launcher(xp, recurrent, self._captured)

    def _training_kernels(self, layer):
        """The training kernels of a CUDA layer (compiled on first use); an InputError saying what to do
        where there are none."""
        try:
            return compile_training(layer)
        except ConfigError as err:
            raise InputError(f"{type(self).__name__}: gradients on the GPU: {err}; or call it under torch.no_grad() "
                             "(inference)") from None


class _CpuBackprop(torch.autograd.Function):
    """One layer and direction's recurrent kernel on the CPU build, differentiable: the backward is the
    compiled backpropagation through time (:func:`prnn_tvm.compiler.compile_backward`; adjoints derived from
    the cell's plan, no derivative written per cell). Arguments: the layer, then the recurrent kernel's
    inputs in its signature's order (``xp``, weights, params, initial states, lengths or None)."""

    @staticmethod
    def forward(ctx, layer, xp, *args):
        ctx.layer = layer
        ctx.save_for_backward(xp, *args)
        out, finals = layer.recurrent(xp.detach(), *[None if a is None else a.detach() for a in args])
        return (torch.from_dlpack(out), *(torch.from_dlpack(f) for f in finals))

    @staticmethod
    def backward(ctx, d_out, *d_finals):
        _refuse_double_backward(ctx.layer.plan.cell.name)
        layer, (xp, *args) = ctx.layer, ctx.saved_tensors
        backward = compile_backward(layer)
        grad_dtype = getattr(torch, backward.signature.launches[0].arg("d_out").dtype)
        grads = [g.to(grad_dtype).contiguous() for g in (d_out, *d_finals)]
        d_xp, d_inputs = backward(xp.detach(), *[None if a is None else a.detach() for a in args], *grads)
        d_inputs = [torch.from_dlpack(g) for g in d_inputs]  # weights, params, initial states: as in args
        return (None, torch.from_dlpack(d_xp).to(xp.dtype),
                *(None if a is None or a.dtype == torch.int32 else g.to(a.dtype)
                  for a, g in zip(args, [*d_inputs, None])))


class _CudaBackprop(torch.autograd.Function):
    """One layer and direction's recurrent kernel on the GPU, differentiable. The forward is the training
    forward (the layer's kernel, also saving each step's states and products); the backward is the
    persistent backward kernel (:func:`prnn_tvm.compiler.compile_training`; adjoints derived from the
    cell's plan), then one GEMM per product for the weights' gradients and a sum over the batch for the
    params'. Arguments: the module, the layer's :class:`~prnn_tvm.compiler.Training`, then the recurrent
    kernel's inputs in its signature's order (``xp``, weights, params, initial states, lengths)."""

    @staticmethod
    def forward(ctx, module, training, xp, *args):
        ctx.module, ctx.training = module, training
        inputs = [xp.detach(), *(_aligned_state(a.detach()) for a in args)]
        out, *finals, saved = module._run_cuda(training.forward, inputs[0], inputs[1:], "recurrent_save")
        ctx.save_for_backward(*inputs, saved)
        return (out, *finals)

    @staticmethod
    def backward(ctx, d_out, *d_finals):
        _refuse_double_backward(ctx.training.plan.cell.name)
        module, training = ctx.module, ctx.training
        xp, *args, saved = ctx.saved_tensors
        plan, H = training.plan, module.hidden_size
        names = _data_names(training.forward)[1:]  # the forward's arguments after xp
        # the backward computes in float32 (a half layer's outputs come back as float32 gradients)
        given = dict(zip(names, args), saved=saved, d_out=d_out.float().contiguous())
        given.update({f"d_{s.name}_n": d.float().contiguous() for s, d in zip(plan.states, d_finals)})
        launched = module._run_cuda(training.backward, xp, [given[n] for n in _data_names(training.backward)[1:]],
                                    "recurrent_backward")
        d = dict(zip((a.name for a in training.backward.signature.launches[0].args if a.role.written), launched))
        T, B, _ = d_out.shape
        # each operand's column in ``saved`` (CellPlan.saved_leaves: states and stages are one slice wide)
        where = {leaf.name: i for i, leaf in enumerate(plan.saved_leaves()) if leaf.kind in ("state", "stage")}
        column = 0
        for r in plan.reductions:  # each product's weights: sum over steps and rows of d_gates^T operand
            gates = d["d_gates"][:, :, column:column + r.slices * H].reshape(T * B, r.slices * H)
            i = where[r.operand]
            dW = gates.t() @ saved[:, :, i * H:(i + 1) * H].reshape(T * B, H)
            d[f"d_{r.weight}"] = d[f"d_{r.weight}"] + dW if f"d_{r.weight}" in d else dW
            column += r.slices * H
        d.update({f"d_{q.name}": d[f"d_{q.name}_rows"].sum(0) for q in plan.params})
        grads = [None if d.get(f"d_{n}") is None else d[f"d_{n}"].to(given[n].dtype) for n in names]
        return (None, None, d["d_xp"].to(xp.dtype), *grads)  # lengths: none


def _refuse_double_backward(cell: str) -> None:
    """Autograd runs a backward with gradients enabled only where its result is to be differentiated again
    (``create_graph=True``): the kernels' backward is not differentiable, so that result would miss every term
    through the kernel (a gradient penalty's gradient on ``weight_hh`` and the biases would be zero)."""
    if torch.is_grad_enabled():
        raise UnsupportedError(f"double backward through '{cell}': the backward of a prnn_tvm.torch module is not "
                               "differentiable (create_graph=True, as a gradient penalty asks, would give second "
                               "derivatives without the kernel's terms); compute that loss with torch.nn's module, or "
                               "without create_graph")


def _data_names(layer) -> list:
    """The data arguments of a one-launch layer, in its order."""
    return [a.name for a in layer.signature.launches[0].args if a.role.data]


class _Launcher:
    """Calls one launch of a layer with torch tensors (the recurrent kernel, or a training kernel); what can
    be worked out once is (a call's host time is part of what a user waits for at small batch)."""

    def __init__(self, layer, device: torch.device, function: str = "recurrent"):
        self.layer, self.device, self.name = layer, device, function
        args = layer.signature.launch(function).args
        self.function = layer.function(function)
        self.tvm_device = tvm_ffi.device("cuda", device.index)
        self.arity = len(args)
        # where each argument goes: the call's data (inputs, then the outputs made for it), the layer's scalars
        # (read at every call: tests change them), the launch state (workspace and barrier words)
        self.data_at = [i for i, a in enumerate(args) if a.role.data]
        self.written = [(i, a) for i, a in enumerate(args) if a.role.written]
        self.written_dtypes = [getattr(torch, a.dtype) for _, a in self.written]
        self.written_shapes: dict = {}  # sequence length -> their shapes
        self.scratch = [(i, a, getattr(torch, a.dtype)) for i, a in enumerate(args) if a.role is ArgRole.SCRATCH]
        self.scalars_at = [(i, a.name) for i, a in enumerate(args) if a.role is ArgRole.SCALAR]
        self.owned_at = [(i, a.name) for i, a in enumerate(args) if a.role.owned]
        self.placed: dict = {}  # stream -> (its launch state, an argument list with that state in place)
        self.max_steps = chunk_length(layer.signature, MAX_ELEMENTS)  # more: launches over pieces
        self.zeros = _torch_zeros(device)

    def _arguments(self, stream: int, captured: list) -> list:
        """A fresh argument list with the launch state in place: the stream's own (kept by the layer, made anew
        after a timeout), or, while a CUDA graph is captured, one of the graph's own."""
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing:
            state = self.layer.new_launch_state(self.zeros)  # zeroed at the start of every replay
            captured.append(state)
        else:
            state = self.layer.launch_state(stream, self.zeros)
            placed = self.placed.get(stream)
            if placed is not None and placed[0] is state:
                return placed[1].copy()
        args = [None] * self.arity
        for i, name in self.owned_at:
            args[i] = state[name]
        if not capturing:
            self.placed[stream] = (state, args.copy())
        return args

    def __call__(self, xp: torch.Tensor, recurrent: list, captured: list) -> list:
        layer, T = self.layer, xp.shape[0]
        stream = _current_stream(self.device)
        if T > self.max_steps and self.name != "recurrent":
            raise InputError(f"training through {T} steps on the GPU needs buffers past {MAX_ELEMENTS} elements, and "
                             "kernels index with 32-bit integers: train on shorter pieces of the sequence "
                             "(truncated backpropagation through time)")
        if T > self.max_steps:  # past 2^31 elements: the runtime's chunked call (not capturable)
            with tvm_ffi.use_raw_stream(self.tvm_device, stream):
                out, finals = layer.recurrent(xp, *recurrent)
            return [torch.from_dlpack(out), *(torch.from_dlpack(f) for f in finals)]
        args = self._arguments(stream, captured)
        scalars = layer.scalars()
        for i, name in self.scalars_at:
            args[i] = scalars[name]
        for i, value in zip(self.data_at, (xp, *recurrent)):
            args[i] = value
        shapes = self.written_shapes.get(T)
        if shapes is None:
            shapes = self.written_shapes[T] = [a.concrete_shape(T) for _, a in self.written]
        outputs = [torch.empty(*shape, dtype=dtype, device=self.device)  # unpacked: 1-2 us less a call than a tuple
                   for shape, dtype in zip(shapes, self.written_dtypes)]
        for (i, _), value in zip(self.written, outputs):
            args[i] = value
        for i, a, dtype in self.scratch:  # the exchange sequence of a call: written and read by the kernel alone
            args[i] = torch.empty(*a.concrete_shape(T), dtype=dtype, device=self.device)
        try:
            with tvm_ffi.use_raw_stream(self.tvm_device, stream):
                self.function(*args)
        except Exception as err:  # a refused launch surfaces as a TVM error; keep its text
            raise LaunchError(f"launching {self.name} of {layer.signature.cell} failed: {err}") from err
        return outputs


def _reversal_within(lengths: torch.Tensor, steps: int):
    """A function that reverses each row of a (T, B, F) sequence within its own length (a row of length n:
    steps n-1..0, then its padding where it was); applied twice it is the identity."""
    t = torch.arange(steps, device=lengths.device, dtype=lengths.dtype)[:, None]
    index = torch.where(t < lengths, lengths - 1 - t, t).long()  # (T, B)

    def reverse(sequence: torch.Tensor) -> torch.Tensor:
        return sequence.gather(0, index[:, :, None].expand_as(sequence))
    return reverse


def _unpacked(packed: PackedSequence) -> tuple:
    """``(padded, lengths, sorted_steps)``: the (T, B, F) padded batch and each row's length (int32, on its
    device) in the caller's batch order, and the lengths in the packing's (descending) order on the CPU.
    Nothing waits for the GPU: the rows are reordered on the device (``pad_packed_sequence`` itself would
    read the order back to the host), the lengths, known on the host, go up by an asynchronous copy."""
    padded, sorted_steps = pad_packed_sequence(PackedSequence(packed.data, packed.batch_sizes))
    lengths = sorted_steps.to(torch.int32)
    if padded.device.type == "cuda":
        lengths = lengths.pin_memory().to(padded.device, non_blocking=True)
    if packed.unsorted_indices is not None:
        order = packed.unsorted_indices
        padded, lengths = padded.index_select(1, order), lengths.index_select(0, order.to(lengths.device))
    return padded, lengths, sorted_steps


def _packed_like(packed: PackedSequence, padded: torch.Tensor, sorted_steps: torch.Tensor) -> PackedSequence:
    """A padded (T, B, F) output in the caller's batch order, packed as the input ``packed`` was."""
    if packed.sorted_indices is not None:
        padded = padded.index_select(1, packed.sorted_indices)
    data = pack_padded_sequence(padded, sorted_steps, enforce_sorted=True).data
    return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)


_NOTHING = contextlib.nullcontext()  # reusable
_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)  # torch.export tracing (torch 2.5 and later)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's raw getter, where it has one


def _current_stream(device: torch.device) -> int:
    """The handle of torch's current stream on ``device`` (a stream object costs microseconds per call)."""
    return _RAW_STREAM(device.index) if _RAW_STREAM is not None else torch.cuda.current_stream(device).cuda_stream


_REVERSE = "_reverse"  # torch.nn's suffix of the reverse direction's parameters, after the layer's


def _suffix(layer: int, direction: int) -> str:
    """torch.nn's parameter suffix of a layer and direction: ``_l0``, ``_l1_reverse``."""
    return f"_l{layer}" + (_REVERSE if direction else "")


def _torch_zeros(device: torch.device):
    """A launch state's buffers from torch's allocator (unsigned words: zeroed as signed ones, whose
    kernels torch has everywhere, then viewed)."""
    def zeros(a):
        dtype = getattr(torch, a.dtype)
        signed = {torch.uint32: torch.int32, torch.uint64: torch.int64}.get(dtype, dtype)
        return torch.zeros(a.shape, dtype=signed, device=device).view(dtype)
    return zeros


def _detached(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """``t`` as a call passes it on: as it is where autograd tracks the call, else detached (DLPack refuses
    tensors that require gradients; ``detach`` costs a microsecond, so only those)."""
    return t.detach() if t.requires_grad and not grad else t


def _aligned_state(t: torch.Tensor) -> torch.Tensor:
    """An initial state as the kernel takes it: contiguous, starting on a 64-byte boundary (else a copy)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


# Elements of a half projection from which its bias is added inside the GEMM (``_projection``). On the H100,
# T=256, the projection alone (`scratch`, median of 5 x 50), separate add_ / bias in the GEMM, ms: 2^24
# elements (LSTM H=1024 B=16, H=512 B=32, H=256 B=64) 0.134 / 0.088, 0.114 / 0.077, 0.104 / 0.074; 2^23
# (H=1024 B=8, H=512 B=16, H=256 B=32) 0.068 / 0.060, 0.057 / 0.068, 0.052 / 0.064; 2^22 and less:
# 0.042-0.045 / 0.060-0.075.
BIAS_IN_GEMM = 1 << 24


def _projection(x: torch.Tensor, W_ih: torch.Tensor, b_ih: torch.Tensor | None, differentiable: bool = False,
                biased_weight=None) -> torch.Tensor:
    """``x @ W_ih.T + b_ih`` for every step as one GEMM (cuBLAS on the GPU) in the recurrent kernel's ``xp``
    type: float32 layers follow torch's TF32 setting; half layers multiply on tensor cores into float32
    (widened first where autograd must differentiate it).

    A half GEMM into float32 has no bias epilogue in torch (``addmm`` with ``out_dtype`` measured as slow as
    the GEMM and a separate ``add_``). The ``add_`` reads and writes the float32 result: at
    :data:`BIAS_IN_GEMM` elements and more (LSTM H=1024 B=16 T=256) it costs as much as the GEMM, so there
    the bias rides in the GEMM: ``x`` padded with columns of ones times ``[W_ih | b_ih | 0]`` (the bias
    multiplied by one and summed in float32: the same value), ``biased_weight(W_ih, b_ih)`` making that
    matrix. Below, the padded GEMM measured slower than the two kernels. Where the cell lets the recurrent bias
    carry ``b_ih`` (``_Recurrent._FOLDS_INPUT_BIAS``), ``b_ih`` is None: the GEMM alone."""
    if x.dtype in (torch.float32, torch.float64):  # float64: the CPU build's
        return torch.nn.functional.linear(x, W_ih, b_ih)  # one addmm over the (T * B) rows
    if x.device.type == "cuda" and not differentiable:
        T, B, _ = x.shape
        rows = x.view(T * B, -1)
        if b_ih is None:  # folded into the recurrent bias (``_Recurrent._FOLDS_INPUT_BIAS``)
            return torch.mm(rows, W_ih.t(), out_dtype=torch.float32).view(T, B, -1)
        if T * B * W_ih.shape[0] < BIAS_IN_GEMM:
            return torch.mm(rows, W_ih.t(), out_dtype=torch.float32).add_(b_ih).view(T, B, -1)
        W = biased_weight(W_ih, b_ih)
        ones = torch.nn.functional.pad(rows, (0, W.shape[1] - x.shape[2]), value=1.0)
        return torch.mm(ones, W.t(), out_dtype=torch.float32).view(T, B, -1)
    # a half layer that trains (or on the CPU): float32 math, differentiable
    return torch.nn.functional.linear(x.float(), W_ih.float(), b_ih.float())


def _summed(b_hh: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """``b_hh + b_ih`` in float32, rounded once to their type."""
    return (b_hh.float() + b_ih.float()).to(b_hh.dtype)


def _biased(W_ih: torch.Tensor, b_ih: torch.Tensor) -> torch.Tensor:
    """``[W_ih | b_ih | 0]``, its columns padded to a multiple of 8 (16-byte rows for the GEMM)."""
    rows, columns = W_ih.shape
    W = W_ih.new_zeros(rows, -(-(columns + 1) // 8) * 8)
    W[:, :columns] = W_ih
    W[:, columns] = b_ih
    return W


class LSTM(_Recurrent):
    """``torch.nn.LSTM`` on persistent kernels (one launch per layer and direction); gradients on the CPU."""

    _FOLDS_INPUT_BIAS = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None, *, arch: str | None = None, config=None):
        super().__init__("lstm", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype, arch, config, _TORCH_NAMES)


class GRU(_Recurrent):
    """``torch.nn.GRU`` on persistent kernels (one launch per layer and direction); gradients on the CPU."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None, *, arch: str | None = None, config=None):
        super().__init__("gru", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype, arch, config, _TORCH_NAMES)


class RNN(_Recurrent):
    """``torch.nn.RNN`` (tanh or relu) on persistent kernels (one launch per layer and direction); gradients
    on the CPU."""

    _FOLDS_INPUT_BIAS = True

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None, *, arch: str | None = None, config=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ConfigError(f"RNN: unknown nonlinearity '{nonlinearity}'; use 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(f"rnn_{nonlinearity}", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype, arch, config, _TORCH_NAMES)


class Recurrent(_Recurrent):
    """Any cell as a torch module: a built-in name (``"gru_cho"``), a ``path/to/cell.py`` defining ``CELL``,
    or a :class:`~prnn_tvm.Cell`; stacked and bidirectional like the others.

    Parameters are named after the cell's arguments, per layer and direction: ``W_ih_l0``, ``b_ih_l0``
    (the input projection), then the cell's weights and params (``U_rz_l0``, ..., ``W_ih_l0_reverse``).
    ``hx`` holds the cell's states in declaration order (a tensor for a one-state cell, else a tuple), each
    (layers x directions, B, H), and so does the returned final state. Gradients on the CPU with no code
    written for the cell: the backward is derived from its plan.
    """

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, batch_first: bool = False,
                 bidirectional: bool = False, device=None, dtype=None, *, arch: str | None = None, config=None):
        super().__init__(cell, input_size, hidden_size, num_layers, True, batch_first, 0.0, bidirectional, 0,
                         device, dtype, arch, config)

    def extra_repr(self) -> str:
        name = getattr(self.cell, "name", self.cell)
        return (f"{self.input_size}, {self.hidden_size}, cell={name}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, bidirectional={self.bidirectional}")


def from_torch(module: torch.nn.Module, *, arch: str | None = None, config=None) -> _Recurrent:
    """The prnn-tvm module for a ``torch.nn.LSTM``, ``GRU`` or ``RNN``, sharing its parameters (no copy).

    Use it to speed up a trained model's recurrent layers at inference; a ``.half()`` or
    bfloat16 module runs the half-precision kernels; stacked and bidirectional modules run one
    persistent launch per layer and direction. Refused with the reason: ``proj_size``, a dtype
    other than float32, float16 or bfloat16.
    """
    kinds = {"LSTM": LSTM, "GRU": GRU, "RNN_TANH": RNN, "RNN_RELU": RNN}
    mode = getattr(module, "mode", None)
    if not isinstance(module, torch.nn.RNNBase) or mode not in kinds:
        raise ConfigError(f"from_torch takes a torch.nn.LSTM, GRU or RNN, got {type(module).__name__}")
    p = module.weight_ih_l0
    kw = dict(num_layers=module.num_layers, bias=module.bias, batch_first=module.batch_first,
              dropout=module.dropout, bidirectional=module.bidirectional, device=p.device, dtype=p.dtype, arch=arch,
              config=config)
    if mode == "LSTM":
        kw["proj_size"] = module.proj_size
    if mode.startswith("RNN"):
        kw["nonlinearity"] = module.nonlinearity
    ours = kinds[mode](module.input_size, module.hidden_size, **kw)
    for name, _ in list(ours.named_parameters()):
        setattr(ours, name, getattr(module, name))  # the same Parameter objects: shared, not copied
    return ours.train(module.training)

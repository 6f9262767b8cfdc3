"""The torch.nn modules: ``LSTM``, ``GRU`` and ``RNN`` with torch.nn's constructors, parameter names, layout and
gate order, ``Recurrent`` for any cell, and ``from_torch``. A module checks a call as torch.nn does, runs it
through :class:`~prnn_tvm.torch.dispatch.Dispatch` with the arguments
:class:`~prnn_tvm.torch.arguments.LaunchArguments` makes, and returns what torch.nn returns."""

from __future__ import annotations

import math
import threading

import torch  # PyTorch itself: absolute import
from torch.nn.utils.rnn import PackedSequence

from prnn_tvm.deferred import analyze, resolve
from prnn_tvm.errors import ConfigError, InputError, UnsupportedError

from . import ops, repeat
from .amp import autocast_dtype
from .arguments import BIASES, LaunchArguments, detached, parameter_suffix
from .buckets import KeptShapes
from .dispatch import _NOTHING, DTYPES, Dispatch, stacked_finals
from .sequences import packed_like, unpacked
from .session import ModuleSession
from .split import SplitLayers, call_refusal, module_refusal

# the cell's arguments -> torch.nn's parameter names, without their layer and direction suffix (``_l0``,
# ``_l1_reverse``), in torch.nn's order (the cells take PyTorch's layout and gate order)
_TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)  # torch.export tracing (torch 2.5 and later)
_COMPILING = torch.compiler.is_compiling


class _Given(threading.local):
    """A call's parameters where they are not the module's (:meth:`_Recurrent._run_given`), per thread; ``params``
    None otherwise (a class attribute: a thread that never set one reads it without the lookup failing, which costs
    a microsecond)."""

    params = None


class _Recurrent(Dispatch, LaunchArguments, torch.nn.RNNBase):
    """What every prnn_tvm.torch module is: its options and parameters (made from the cell's plan), torch.nn's
    checks and conventions around a call (:meth:`forward`), the compiled layers and their launches
    (:class:`~prnn_tvm.torch.dispatch.Dispatch`), the launches' arguments
    (:class:`~prnn_tvm.torch.arguments.LaunchArguments`).

    A ``torch.nn.RNNBase`` (``isinstance`` holds, as code that looks for recurrent modules asks) with RNNBase's
    bookkeeping (``mode``, ``proj_size``, ``all_weights``, ``_flat_weights_names``): its constructor is not run,
    as it makes torch.nn's parameters, and these come from the cell's plan (the same names and layout for
    torch.nn's cells). Parameters are read by attribute (:meth:`_parameter`), so parametrizations and
    ``weight_norm`` apply."""

    # torch.autocast on the CPU runs torch.nn's LSTM and RNN in its dtype (``lstm``, ``rnn_tanh``, ``rnn_relu`` are
    # lower-precision ops there) but not GRU; on CUDA cuDNN's RNNs always (:meth:`_autocast`)
    _AUTOCAST_CPU = False
    devices = None  # the GPUs a module's layers are split over (``devices=[0, 1]``), or None: one device

    def __init__(
        self,
        cell,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
        arch: str | None = None,
        config=None,
        names: dict | None = None,
        devices=None,
    ):
        torch.nn.Module.__init__(self)  # not RNNBase's: it makes torch.nn's parameters (the class docstring)
        kind = type(self).__name__
        for name, value, least in (
            ("input_size", input_size, 1),
            ("hidden_size", hidden_size, 1),
            ("num_layers", num_layers, 1),
            ("proj_size", proj_size, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(
                    f"{kind}: {name} must be {'a positive' if least else 'a'} whole number (an int"
                    f"{'' if least else ' of at least 0'}), got {value!r}"
                )
        if proj_size:
            raise ConfigError(
                f"{kind}: proj_size={proj_size} (an LSTM with projections, LSTMP) is not supported; use "
                "torch.nn.LSTM for it, or proj_size=0"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ConfigError(f"{kind}: dropout must be a number in [0, 1], got {dropout!r}")
        for name, value in (("bias", bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
            if value not in (True, False) or not isinstance(value, (bool, int)):
                raise ConfigError(f"{kind}: {name} must be True or False, got {value!r}")
        dtype = torch.float32 if dtype is None else dtype
        if devices is not None:  # each layer split over these GPUs (:mod:`~prnn_tvm.torch.split`)
            from prnn_tvm.runtime.peers import checked_devices

            self.devices = checked_devices(devices)
            device = torch.device("cuda", self.devices[0]) if device is None else device
        if dtype not in DTYPES:
            raise ConfigError(f"{kind}: dtype {dtype} is not supported; use one of {', '.join(map(str, DTYPES))}")
        self.cell, self.input_size, self.hidden_size = cell, input_size, hidden_size
        self.num_layers, self.bidirectional, self.dropout = num_layers, bool(bidirectional), float(dropout)
        self.bias, self.batch_first, self.arch, self.config = bool(bias), bool(batch_first), arch, config
        refused = module_refusal(self) if self.devices is not None else None
        if refused:
            raise ConfigError(f"{kind}: {refused}")
        # torch.nn's mode for its cells ("LSTM", "GRU", "RNN_TANH"), else the cell's name
        self.mode, self.proj_size = cell.upper() if names is _TORCH_NAMES else getattr(cell, "name", str(cell)), 0
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
        self._input_bias = plan.input_bias  # the params that carry b_ih (_FOLDS_INPUT_BIAS)
        # the cell's arguments -> parameter names (without suffix), in the order the parameters are made
        self._names = names or {a: a for a in ("W_ih", "b_ih", *(s.name for s in (*plan.weights, *plan.params)))}
        directions = 2 if self.bidirectional else 1
        kw = {"device": device, "dtype": dtype}
        self._shapes: dict = {}  # each parameter's shape, as made: what a call checks a replaced one against
        self._all_weights: list = []  # RNNBase's: the parameter names of each layer and direction
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            shapes = {"W_ih": (plan.input.slices * hidden_size, width), "b_ih": (plan.input.slices * hidden_size,)}
            shapes.update(plan.weight_shapes())  # (slices * hidden, hidden / heads): a head-wise weight's blocks
            shapes.update({s.name: (s.slices * hidden_size,) for s in plan.params})
            for direction in range(directions):
                self._all_weights.append([])
                for arg, name in self._names.items():
                    if bias or arg not in BIASES:
                        self._all_weights[-1].append(name + parameter_suffix(layer, direction))
                        self._shapes[name + parameter_suffix(layer, direction)] = shapes[arg]
                        setattr(
                            self,
                            name + parameter_suffix(layer, direction),
                            torch.nn.Parameter(torch.empty(*shapes[arg], **kw)),
                        )
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
        self._plans: dict = {}  # a repeated call's key -> its plan (:mod:`~prnn_tvm.torch.repeat`)
        # batch buckets (options batch_buckets, kept_batch_sizes) and torch.nn's kernels where nothing fits
        self._kept = KeptShapes()  # the batch sizes whose layers are kept, least recently called first
        self._fallbacks: dict = {}  # (batch, device type, index, dtype, input size, training) -> refusal or None
        self.fallback_notes: dict = {}  # (batch, device, dtype, layer) -> which layer runs on torch.nn's, and why
        self._given = _Given()  # a call's parameters where they are not the module's (_run_given)
        self._split = SplitLayers()  # the layers split over ``devices``, and their weights on each GPU
        self._flat_weights_names = list(self._shapes)
        self._init_flat_weights()  # RNNBase's _flat_weights, which its __setattr__ keeps up to date

    _COMPILED = (
        "_layers",
        "_launchers",
        "_arguments",
        "_side_streams",
        "_aligned_copies",
        "_constants",
        "_derived",
        "_joined",
        "_launch_notes",
        "_captured",
        "_kept",
        "_fallbacks",
        "fallback_notes",
        "stack_notes",
        "direction_notes",
        "_split",
        "_plans",
    )

    def __getstate__(self) -> dict:
        """Copies and pickles (``copy.deepcopy``, ``torch.save``) keep the parameters and options but
        not what was compiled or cached for them (TVM modules do not serialize): the copy compiles on
        first use, for its own device."""
        state = self.__dict__.copy()
        state.update({name: type(state[name])() for name in self._COMPILED})
        del state["_given"], state["_flat_weight_refs"]  # a thread's, and weak references: made anew by __setstate__
        return state

    def __setstate__(self, state: dict) -> None:
        """Not RNNBase's (which reads torch.nn's layouts): a thread's parameters made anew, and RNNBase's
        bookkeeping made from the parameters for a module pickled before it was one."""
        state.setdefault("_split", SplitLayers())  # a module pickled before modules split over GPUs
        state.setdefault("_plans", {})  # a module pickled before repeated calls were planned
        torch.nn.Module.__setstate__(self, state)
        self._given = _Given()
        if "_all_weights" not in state:
            self._shapes = {name: tuple(p.shape) for name, p in self._parameters.items()}
            self._all_weights, self._flat_weights_names = [list(self._shapes)], list(self._shapes)
            self.mode, self.proj_size = str(self.cell).upper(), 0
        self._init_flat_weights()

    def __setattr__(self, name: str, value) -> None:
        """As torch.nn's, and every repeated call's plan forgotten (:mod:`~prnn_tvm.torch.repeat`): an option, the
        training mode or a parameter may have changed."""
        super().__setattr__(name, value)
        plans = self.__dict__.get("_plans")
        if plans:
            plans.clear()

    def flatten_parameters(self) -> None:
        """Nothing to do: torch.nn's makes the parameters views of one cuDNN buffer, and the kernels here take
        each parameter where it is (kept as they are, so that a bias stays on a 64-byte boundary)."""

    def _parameter(self, name: str) -> torch.Tensor:
        """Parameter ``name`` as a call reads it: by attribute (a parametrization's or ``weight_norm``'s
        weight included), or the call's own (:meth:`_run_given`). A registered parameter is read from the registry
        itself: ``getattr`` reaches it through ``Module.__getattr__``, a microsecond or two per parameter and call;
        a parametrized one is not registered under its name, and goes through ``getattr``."""
        given = self._given.params
        if given is not None:
            return given[name]
        found = self._parameters.get(name)
        return getattr(self, name) if found is None else found

    def _run_given(self, x: torch.Tensor, params: list, initial: list, lengths, grad: bool) -> tuple:
        """The layers on ``x`` with ``params`` (every parameter, in the module's order) in place of the
        module's: ``(out, finals)``, each final state (layers x directions, B, H). For a call in another dtype
        (autocast) and for the operator (:mod:`~prnn_tvm.torch.ops`), whose parameters are tensors it is given."""
        previous = self._given.params
        self._given.params = dict(zip(self._shapes, params))
        try:
            out, finals = self._run_layers(x, initial, lengths, grad)
        finally:
            self._given.params = previous
        return out, stacked_finals(finals)

    def reset_parameters(self) -> None:
        """PyTorch's initialization: U(-1/sqrt(hidden), 1/sqrt(hidden))."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, cell={self.cell}, num_layers={self.num_layers}, "
            f"bias={self.bias}, batch_first={self.batch_first}, bidirectional={self.bidirectional}"
        )

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype, which the module computes in (``.half()``, ``.to(torch.bfloat16)`` change it)."""
        return self._first_parameter().dtype

    def _first_parameter(self) -> torch.Tensor:
        """The first parameter (``self.parameters()`` walks the module tree: microseconds a call)."""
        return self._parameter(self._flat_weights_names[0])

    def _leaves(self):
        """The tensors a call's gradients reach: the parameters, and a parametrization's originals (held by a
        submodule of its own)."""
        return self.parameters() if self._modules else self._parameters.values()

    def _autocast(self, device_type: str, dtype: torch.dtype) -> torch.dtype | None:
        """The dtype a call runs in under ``torch.autocast`` where torch.nn's module would, None otherwise: on CUDA
        every cell, in float16 whatever the autocast dtype (torch's autocast casts cuDNN's RNNs to half: under
        ``autocast("cuda", torch.bfloat16)`` torch.nn's LSTM and GRU returned float16 on the H200); on the CPU where
        :attr:`_AUTOCAST_CPU`, in the autocast dtype; float64 modules never (autocast leaves float64 alone)."""
        if device_type == "cpu" and not self._AUTOCAST_CPU or dtype == torch.float64:
            return None
        found = autocast_dtype(device_type)
        return torch.float16 if found is not None and device_type == "cuda" else found

    @property
    def _FOLDS_INPUT_BIAS(self) -> bool:
        """Whether an inference call on the GPU adds ``b_ih`` to the cell's params instead of to its projection
        (one GEMM, no bias pass): where the cell's plan finds params that carry the input projection's bias
        (:attr:`~prnn_tvm.frontend.plan.CellPlan.input_bias`: torch.nn's LSTM and RNN, not GRU)."""
        return bool(self._input_bias)

    def session(self, batch: int, **options) -> ModuleSession:
        """A resident session of this module for ``batch`` rows: its kernel launched once, a step per call
        (``y, states = session.step(x_t)``; :class:`~prnn_tvm.torch.session.ModuleSession`). ``options``:
        ``release_after`` (seconds without a step before the GPU is let go; None: never), ``free_sms``,
        ``idle_timeout_s``, ``barrier_timeout_us``, ``collect_timeout_us``."""
        return ModuleSession(self, batch, **options)

    def forward(self, input, hx=None):
        """As torch.nn's: ``input`` (T, B, F), (B, T, F) with ``batch_first``, unbatched (T, F) or a
        ``PackedSequence``; ``hx`` the initial states (omitted: zeros). Returns ``(output, final states)``. A call
        repeated with tensors of the same shapes runs the plan the module made of it (:mod:`~prnn_tvm.torch.repeat`)
        where that plan still holds."""
        key = repeat.call_key(self, input, hx)
        if key is None:
            return self._call(input, hx)
        done = repeat.planned(self, key, input, hx)
        if done is None:
            done = self._call(input, hx)
            repeat.note(self, key, input, hx)
        return done

    def _call(self, input, hx):
        """:meth:`forward` by the module's own path: every check, every decision."""
        kind, H = type(self).__name__, self.hidden_size
        if torch.jit.is_tracing():
            raise UnsupportedError(
                f"{kind}: torch.jit.trace cannot record a prnn_tvm.torch module (its kernels are TVM calls, and "
                "its kernels' sizes would be traced as constants); use torch.export or torch.compile, or call "
                "it eagerly (torch.cuda.graph captures its CUDA calls)"
            )
        states = len(self._states)
        directions = 2 if self.bidirectional else 1
        slots = self.num_layers * directions  # the initial and final states of each layer and direction
        hx = () if hx is None else (tuple(hx) if states > 1 else (hx,))
        packed = input if isinstance(input, PackedSequence) else None
        lengths = None
        if packed is not None:  # padded, time-major, in the caller's batch order (as are hx and h_n)
            input, lengths, sorted_steps = unpacked(packed)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (input, *hx, *self._leaves()))
        if input.dim() not in (2, 3) or input.shape[-1] != self.input_size:
            raise InputError(
                f"{kind}: input must be (T, B, {self.input_size}) or unbatched (T, {self.input_size}), "
                f"got shape {tuple(input.shape)}"
            )
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
        cast = self._autocast(where.type, dtype)  # torch.autocast's dtype, where torch.nn's module follows it
        for what, t in (("input", x), *(("initial state", t) for t in hx)):
            if t.dtype != dtype and not (cast is not None and t.is_floating_point() and t.dtype != torch.float64):
                raise InputError(
                    f"{kind}: {what} is {t.dtype}, the module's parameters are {dtype}; convert one "
                    "of them (.to(dtype))"
                )
            if t.device != where:
                raise InputError(
                    f"{kind}: {what} is on {t.device}, the module's parameters on {where}; move one "
                    "of them (.to(device))"
                )
        if cast is not None:  # autocast: the call in its dtype, as torch.nn's (parameters cast in _call_layers)
            x, hx = x.to(cast), tuple(t.to(cast) for t in hx)
        if x.shape[0] == 0:
            raise InputError(
                f"{kind}: the input has no timesteps (shape {tuple(input.shape)}); a sequence needs at least one"
            )
        if B == 0:  # nothing to run: empty results, shaped as torch.nn's
            out = x.new_empty(x.shape[0], 0, H * directions)
            ends = [x.new_empty(slots, 0, H) for _ in range(states)]
            return (out.transpose(0, 1) if self.batch_first else out), (tuple(ends) if states > 1 else ends[0])
        initial = [detached(t, grad) if batched else detached(t, grad).unsqueeze(1) for t in hx]  # (slots, B, H)
        out, finals = self._call_layers(x, initial, lengths, grad, None if cast == dtype else cast)
        if packed is not None:
            out = packed_like(packed, out, sorted_steps)
        elif not batched:
            out, finals = out.squeeze(1), [f.squeeze(1) for f in finals]
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, (tuple(finals) if states > 1 else finals[0])

    def _call_layers(self, x: torch.Tensor, initial: list, lengths, grad: bool, cast: torch.dtype | None) -> tuple:
        """The layers on ``x`` (time-major, compact) from ``initial`` (per state, (slots, B, H), or [] for zeros):
        ``(out, finals)``, finals per state (slots, B, H); the parameters cast to ``cast`` (autocast) unless
        None. Eagerly: the layers themselves. Under torch.compile and torch.export: the operator
        ``prnn_tvm::layers`` (:mod:`~prnn_tvm.torch.ops`), which they record; where it cannot serve the
        module (:meth:`_operator_refusal`), torch.compile runs the layers as they are (a graph break) and
        torch.export refuses."""
        tracing = _COMPILING() or _EXPORTING()
        refusal = self._operator_refusal() if tracing else None
        if tracing and refusal is None:
            params = [getattr(self, name) for name in self._flat_weights_names]
            if cast is not None:
                params = [p.to(cast) for p in params]
            # a call that needs gradients: the operator that keeps its autograd graph for the backward (torch.export
            # records the inference one, whose backward runs the layers again). The overloads themselves, called
            # positionally: the graph calls what is recorded, and an overload packet's keyword parsing costs
            # microseconds a call (bench/compiled.py)
            op = torch.ops.prnn_tvm.layers_train if grad and not _EXPORTING() else torch.ops.prnn_tvm.layers
            out, *finals = op.default(
                x,
                params,
                initial,
                lengths,
                self.cell,
                self.hidden_size,
                self.num_layers,
                self.bidirectional,
                self.bias,
                self._names is _TORCH_NAMES,
                self.arch,
                self.wavefront,
                self.one_launch_directions,
                self.concurrent_directions,
                len(self._states),
            )
            return out, finals[: len(self._states)]  # layers_train's last output: its graph's token
        if _EXPORTING():
            raise UnsupportedError(f"{type(self).__name__}: torch.export cannot record this module: {refusal}")
        if tracing:  # torch.compile: Dynamo runs the layers as they are (a graph break)
            return _run_uncompiled(self, x, initial, lengths, grad, cast)
        return self._run_eagerly(x, initial, lengths, grad, cast)

    def _run_eagerly(self, x: torch.Tensor, initial: list, lengths, grad: bool, cast: torch.dtype | None) -> tuple:
        """:meth:`_call_layers` run as it is, with torch.autocast off inside (the layers pick their own dtypes:
        a half layer's projection into float32, the CPU build's float32 math)."""
        if self.devices is not None:
            refused = call_refusal(self, x, grad, cast)
            if refused:
                raise UnsupportedError(f"{type(self).__name__}: {refused}")
            return self._split.run(self, x, initial, lengths)
        with torch.autocast(x.device.type, enabled=False) if autocast_dtype(x.device.type) else _NOTHING:
            if cast is not None:
                params = [getattr(self, name).to(cast) for name in self._flat_weights_names]
                return self._run_given(x, params, initial, lengths, grad)
            out, finals = self._run_layers(x, initial, lengths, grad)
            return out, stacked_finals(finals)

    def _operator_refusal(self) -> str | None:
        """Why the operator ``prnn_tvm::layers`` cannot run this module, or None where it can: its plain
        arguments name a configuration, which a cell given as an object or a template config does not, and its
        backward runs the layers again, which dropout's masks would not repeat."""
        if not ops.AVAILABLE:
            return "this torch has no torch.library.register_fake (torch 2.4 and later)"
        if not isinstance(self.cell, str):
            return "its cell is an object, not a built-in name or a file (pass its name or path)"
        if self.config is not None:
            return "it has a template config (config=...), which the operator's arguments do not carry"
        if self.training and self.dropout:
            return "dropout in training mode (call .eval(), or dropout=0)"
        if self.devices is not None:
            return f"its layers are split over GPUs {list(self.devices)}, which the operator's arguments do not carry"
        return None


# what Dynamo must not trace into (TVM calls, caches keyed by ids): called only while torch.compile traces a call
# that the operator cannot serve, as the wrapper costs a third of a microsecond a call. torch's own lazy form of
# torch.compiler.disable, which imports Dynamo at the first call rather than here (a second of CPU at ``import
# prnn_tvm.torch``).
_run_uncompiled = torch._disable_dynamo(_Recurrent._run_eagerly)


def _operator_runner(cell, input_size, hidden_size, num_layers, bidirectional, bias, torch_names, arch, dtype):
    """The parameterless module the operator runs a configuration with (:func:`prnn_tvm.torch.ops.layers_for`)."""
    names = _TORCH_NAMES if torch_names else None
    return _Recurrent(
        cell,
        input_size,
        hidden_size,
        num_layers,
        bias,
        False,
        0.0,
        bidirectional,
        0,
        device="meta",
        dtype=dtype,
        arch=arch,
        names=names,
    )


ops.serve_with(_operator_runner)


class LSTM(_Recurrent):
    """``torch.nn.LSTM`` on persistent kernels (one launch per layer and direction); gradients on the CPU."""

    _AUTOCAST_CPU = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
        *,
        arch: str | None = None,
        config=None,
        devices=None,
    ):
        super().__init__(
            "lstm",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            proj_size,
            device,
            dtype,
            arch,
            config,
            _TORCH_NAMES,
            devices,
        )


class GRU(_Recurrent):
    """``torch.nn.GRU`` on persistent kernels (one launch per layer and direction); gradients on the CPU."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        *,
        arch: str | None = None,
        config=None,
        devices=None,
    ):
        super().__init__(
            "gru",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
            arch,
            config,
            _TORCH_NAMES,
            devices,
        )


class RNN(_Recurrent):
    """``torch.nn.RNN`` (tanh or relu) on persistent kernels (one launch per layer and direction); gradients
    on the CPU."""

    _AUTOCAST_CPU = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        *,
        arch: str | None = None,
        config=None,
        devices=None,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ConfigError(f"RNN: unknown nonlinearity '{nonlinearity}'; use 'tanh' or 'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(
            f"rnn_{nonlinearity}",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
            arch,
            config,
            _TORCH_NAMES,
            devices,
        )


class Recurrent(_Recurrent):
    """Any cell as a torch module: a built-in name (``"gru_cho"``), a ``path/to/cell.py`` defining ``CELL``,
    or a :class:`~prnn_tvm.Cell`; stacked and bidirectional like the others.

    Parameters are named after the cell's arguments, per layer and direction: ``W_ih_l0``, ``b_ih_l0``
    (the input projection), then the cell's weights and params (``U_rz_l0``, ..., ``W_ih_l0_reverse``).
    ``hx`` holds the cell's states in declaration order (a tensor for a one-state cell, else a tuple), each
    (layers x directions, B, H), and so does the returned final state. Gradients on the CPU with no code
    written for the cell: the backward is derived from its plan.
    """

    def __init__(
        self,
        cell,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        batch_first: bool = False,
        bidirectional: bool = False,
        device=None,
        dtype=None,
        *,
        arch: str | None = None,
        config=None,
        devices=None,
    ):
        super().__init__(
            cell,
            input_size,
            hidden_size,
            num_layers,
            True,
            batch_first,
            0.0,
            bidirectional,
            0,
            device,
            dtype,
            arch,
            config,
            devices=devices,
        )

    def extra_repr(self) -> str:
        name = getattr(self.cell, "name", self.cell)
        return (
            f"{self.input_size}, {self.hidden_size}, cell={name}, num_layers={self.num_layers}, "
            f"batch_first={self.batch_first}, bidirectional={self.bidirectional}"
        )


def from_torch(module: torch.nn.Module, *, arch: str | None = None, config=None, devices=None) -> _Recurrent:
    """The prnn-tvm module for a ``torch.nn.LSTM``, ``GRU`` or ``RNN``, sharing its parameters (no copy).

    Use it to speed up a trained model's recurrent layers at inference; a ``.half()`` or
    bfloat16 module runs the half-precision kernels; stacked and bidirectional modules run one
    persistent launch per layer and direction. Refused with the reason: ``proj_size``, a dtype
    other than float32, float16 or bfloat16.

    ``devices=[0, 1, ...]`` splits each layer's units over those GPUs of one host (:mod:`~prnn_tvm.torch.split`:
    for layers too big for one GPU; inference only, one direction, with biases); ``module`` then lives on the first
    of them, and so do a call's tensors.
    """
    kinds = {"LSTM": LSTM, "GRU": GRU, "RNN_TANH": RNN, "RNN_RELU": RNN}
    mode = getattr(module, "mode", None)
    if not isinstance(module, torch.nn.RNNBase) or mode not in kinds:
        raise ConfigError(f"from_torch takes a torch.nn.LSTM, GRU or RNN, got {type(module).__name__}")
    p = module.weight_ih_l0
    kw = dict(
        num_layers=module.num_layers,
        bias=module.bias,
        batch_first=module.batch_first,
        dropout=module.dropout,
        bidirectional=module.bidirectional,
        device=p.device,
        dtype=p.dtype,
        arch=arch,
        config=config,
        devices=devices,
    )
    if mode == "LSTM":
        kw["proj_size"] = module.proj_size
    if mode.startswith("RNN"):
        kw["nonlinearity"] = module.nonlinearity
    ours = kinds[mode](module.input_size, module.hidden_size, **kw)
    for name, _ in list(ours.named_parameters()):
        setattr(ours, name, getattr(module, name))  # the same Parameter objects: shared, not copied
    return ours.train(module.training)

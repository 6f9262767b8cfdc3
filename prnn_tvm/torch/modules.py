"""The torch.nn modules: ``LSTM``, ``GRU`` and ``RNN`` with torch.nn's constructors, parameter names, layout and
gate order, ``Recurrent`` for any cell, and ``from_torch``. A module checks a call as torch.nn does, runs it
through :class:`~prnn_tvm.torch.dispatch.Dispatch` with the arguments
:class:`~prnn_tvm.torch.arguments.LaunchArguments` makes, and returns what torch.nn returns."""

from __future__ import annotations

import math

import torch  # PyTorch itself: absolute import
from torch.nn.utils.rnn import PackedSequence

from prnn_tvm.deferred import analyze, resolve
from prnn_tvm.errors import ConfigError, InputError, UnsupportedError

from .arguments import BIASES, LaunchArguments, detached, parameter_suffix
from .buckets import KeptShapes
from .dispatch import DTYPES, Dispatch
from .sequences import packed_like, unpacked
from .session import ModuleSession

# the cell's arguments -> torch.nn's parameter names, without their layer and direction suffix (``_l0``,
# ``_l1_reverse``), in torch.nn's order (the cells take PyTorch's layout and gate order)
_TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}
_EXPORTING = getattr(torch.compiler, "is_exporting", lambda: False)  # torch.export tracing (torch 2.5 and later)
# what Dynamo must not trace into (TVM calls, caches keyed by ids): called only while torch.compile traces a call,
# as the wrapper costs a third of a microsecond a call. torch's own lazy form of torch.compiler.disable, which
# imports Dynamo at the first call rather than here (a second of CPU at ``import prnn_tvm.torch``).
_run_uncompiled = torch._disable_dynamo(Dispatch._run_layers)
_COMPILING = torch.compiler.is_compiling


class _Recurrent(Dispatch, LaunchArguments, torch.nn.Module):
    """What every prnn_tvm.torch module is: its options and parameters (made from the cell's plan), torch.nn's
    checks and conventions around a call (:meth:`forward`), the compiled layers and their launches
    (:class:`~prnn_tvm.torch.dispatch.Dispatch`), the launches' arguments
    (:class:`~prnn_tvm.torch.arguments.LaunchArguments`)."""

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
    ):
        super().__init__()
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
        self._input_bias = plan.input_bias  # the params that carry b_ih (_FOLDS_INPUT_BIAS)
        # the cell's arguments -> parameter names (without suffix), in the order the parameters are made
        self._names = names or {a: a for a in ("W_ih", "b_ih", *(s.name for s in (*plan.weights, *plan.params)))}
        directions = 2 if self.bidirectional else 1
        kw = {"device": device, "dtype": dtype}
        self._shapes: dict = {}  # each parameter's shape, as made: what a call checks a replaced one against
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            shapes = {"W_ih": (plan.input.slices * hidden_size, width), "b_ih": (plan.input.slices * hidden_size,)}
            shapes.update(plan.weight_shapes())  # (slices * hidden, hidden / heads): a head-wise weight's blocks
            shapes.update({s.name: (s.slices * hidden_size,) for s in plan.params})
            for direction in range(directions):
                for arg, name in self._names.items():
                    if bias or arg not in BIASES:
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
        # batch buckets (options batch_buckets, kept_batch_sizes) and torch.nn's kernels where nothing fits
        self._kept = KeptShapes()  # the batch sizes whose layers are kept, least recently called first
        self._fallbacks: dict = {}  # (batch, device type, index, dtype, input size, training) -> refusal or None
        self.fallback_notes: dict = {}  # (batch, device, dtype, layer) -> which layer runs on torch.nn's, and why

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
    )

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
        return next(iter(self._parameters.values()))

    @property
    def _FOLDS_INPUT_BIAS(self) -> bool:
        """Whether a half inference call on the GPU adds ``b_ih`` to the cell's params instead of to its projection
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
        ``PackedSequence``; ``hx`` the initial states (omitted: zeros). Returns ``(output, final states)``."""
        kind, H = type(self).__name__, self.hidden_size
        if torch.jit.is_tracing() or _EXPORTING():
            tracer = "torch.jit.trace" if torch.jit.is_tracing() else "torch.export"
            raise UnsupportedError(
                f"{kind}: {tracer} cannot record a prnn_tvm.torch module (its kernels are TVM "
                "calls, and its kernels' sizes would be traced as constants); call it eagerly, or "
                "under torch.compile, which runs it as it is (torch.cuda.graph captures its CUDA "
                "calls)"
            )
        states = len(self._states)
        directions = 2 if self.bidirectional else 1
        slots = self.num_layers * directions  # the initial and final states of each layer and direction
        hx = () if hx is None else (tuple(hx) if states > 1 else (hx,))
        packed = input if isinstance(input, PackedSequence) else None
        lengths = None
        if packed is not None:  # padded, time-major, in the caller's batch order (as are hx and h_n)
            input, lengths, sorted_steps = unpacked(packed)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (input, *hx, *self._parameters.values()))
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
        for what, t in (("input", x), *(("initial state", t) for t in hx)):
            if t.dtype != dtype:
                raise InputError(
                    f"{kind}: {what} is {t.dtype}, the module's parameters are {dtype}; convert one "
                    "of them (.to(dtype))"
                )
            if t.device != where:
                raise InputError(
                    f"{kind}: {what} is on {t.device}, the module's parameters on {where}; move one "
                    "of them (.to(device))"
                )
        if x.shape[0] == 0:
            raise InputError(
                f"{kind}: the input has no timesteps (shape {tuple(input.shape)}); a sequence needs at least one"
            )
        if B == 0:  # nothing to run: empty results, shaped as torch.nn's
            out = x.new_empty(x.shape[0], 0, H * directions)
            ends = [x.new_empty(slots, 0, H) for _ in range(states)]
            return (out.transpose(0, 1) if self.batch_first else out), (tuple(ends) if states > 1 else ends[0])
        initial = [detached(t, grad) if batched else detached(t, grad).unsqueeze(1) for t in hx]  # (slots, B, H)
        if _COMPILING():  # torch.compile: Dynamo runs the layers as they are (a graph break)
            out, finals = _run_uncompiled(self, x, initial, lengths, grad)
        else:
            out, finals = self._run_layers(x, initial, lengths, grad)
        finals = [f[0].unsqueeze(0) if slots == 1 else torch.stack(f) for f in finals]
        if packed is not None:
            out = packed_like(packed, out, sorted_steps)
        elif not batched:
            out, finals = out.squeeze(1), [f.squeeze(1) for f in finals]
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, (tuple(finals) if states > 1 else finals[0])


class LSTM(_Recurrent):
    """``torch.nn.LSTM`` on persistent kernels (one launch per layer and direction); gradients on the CPU."""

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
        )


class RNN(_Recurrent):
    """``torch.nn.RNN`` (tanh or relu) on persistent kernels (one launch per layer and direction); gradients
    on the CPU."""

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
        )

    def extra_repr(self) -> str:
        name = getattr(self.cell, "name", self.cell)
        return (
            f"{self.input_size}, {self.hidden_size}, cell={name}, num_layers={self.num_layers}, "
            f"batch_first={self.batch_first}, bidirectional={self.bidirectional}"
        )


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
    )
    if mode == "LSTM":
        kw["proj_size"] = module.proj_size
    if mode.startswith("RNN"):
        kw["nonlinearity"] = module.nonlinearity
    ours = kinds[mode](module.input_size, module.hidden_size, **kw)
    for name, _ in list(ours.named_parameters()):
        setattr(ours, name, getattr(module, name))  # the same Parameter objects: shared, not copied
    return ours.train(module.training)

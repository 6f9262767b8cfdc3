"""The public cell API: how a recurrent cell is written.

A cell is one timestep written with ``tvm.te``. Its step function receives a
:class:`CellBuilder`, declares what it reads (the input projection, the states, the
recurrent weights, per-unit parameters) and returns the new value of every state as TE
tensors. The compiler analyses that graph (``prnn_tvm.frontend.analysis``) and places it into a
schedule template; it never needs to know which cell it is compiling.

Every tensor a cell sees is indexed ``[n, j]`` with ``n`` the batch row and ``j`` a
column; a tensor with ``slices`` gate slices has ``slices * hidden`` columns and column
``s * hidden + u`` belongs to hidden unit ``u`` (PyTorch's stacking of gates).

Example, a vanilla tanh RNN::

    from tvm import te, tirx
    from prnn_tvm import Cell

    def step(c):
        x, h = c.input(), c.state("h")
        W, b = c.weight("W_hh"), c.param("b_hh")
        hw = c.matvec(h, W, name="hw")                  # te.sum(h[n, k] * W[j, k])
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j] + b[j]), "h_new")}

    def reference(x, state, p):                          # NumPy, one step, float64
        return {"h": np.tanh(x + state["h"] @ p["W_hh"].T + p["b_hh"])}

    MY_RNN = Cell("my_rnn", step, reference)
"""

from __future__ import annotations

import enum
import sysconfig
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tvm import te, tirx

from ..errors import CellError, PrnnError
from .names import check_names, same_name

MAX_DELAY = 15  # a state's delay: at most the last layer's of the deepest wavefront stack (frontend.stack.MAX_LAYERS)


class Role(enum.Enum):
    """What a declared tensor is to the compiler."""

    INPUT = "input"  # x_t W_ih^T + b_ih for this step, shape (batch, slices*hidden)
    STATE = "state"  # carried from step to step, shape (batch, hidden)
    WEIGHT = "weight"  # recurrent weight, shape (slices*hidden, hidden / heads), PyTorch layout
    PARAM = "param"  # per-unit vector (biases, peepholes), shape (slices*hidden,)


@dataclass(frozen=True)
class Slot:
    """A tensor the cell declared, with its role, gate-slice count and (a weight's) heads: a weight of ``heads``
    heads is block-diagonal, ``hidden / heads`` columns wide (:meth:`CellBuilder.weight`)."""

    name: str
    role: Role
    slices: int
    tensor: te.Tensor = field(compare=False, repr=False)
    heads: int = 1


class CellBuilder:
    """What a step function receives: the sizes and the declaration methods.

    Parameters
    ----------
    batch, hidden : int
        Concrete sizes the cell is traced at.
    dtype : str
        Element type of every tensor (``"float32"``).
    """

    def __init__(self, batch: int, hidden: int, dtype: str = "float32", declarations_only: bool = False):
        self.batch = batch
        self.hidden = hidden
        self.dtype = dtype
        self.slots: list[Slot] = []
        # a trace for the names, roles and slices alone (frontend.stack.declared_slots, at hidden 1): heads that
        # do not divide its hidden size are declared as one
        self.declarations_only = declarations_only

    def _declare(self, name: str, role: Role, slices: int, shape: tuple[int, ...], heads: int = 1) -> te.Tensor:
        _check_name(name, role.value)
        for s in self.slots:
            if s.name == name:
                raise CellError(same_name(s.role.value, role.value, name))
        _check_slices(name, slices)
        t = te.placeholder(shape, self.dtype, name=name)
        self.slots.append(Slot(name, role, slices, t, heads))
        return t

    def input(self, slices: int = 1, name: str = "x") -> te.Tensor:
        """This step's input projection ``x_t W_ih^T + b_ih``: shape (batch, slices*hidden).

        The layer computes it for all timesteps in one matrix product before the
        recurrence; ``slices`` is the number of gates that take the input.
        """
        if any(s.role is Role.INPUT for s in self.slots):
            raise CellError("a cell has one input projection; c.input() was called twice")
        return self._declare(name, Role.INPUT, slices, (self.batch, slices * self.hidden))

    def state(self, name: str) -> te.Tensor:
        """A recurrent state of shape (batch, hidden); the step must return its new value."""
        return self._declare(name, Role.STATE, 1, (self.batch, self.hidden))

    def weight(self, name: str, slices: int = 1, heads: int = 1) -> te.Tensor:
        """A recurrent weight of shape (slices*hidden, hidden / heads), indexed ``W[j, k]``.

        This is PyTorch's ``weight_hh`` layout: row ``s*hidden + u`` holds gate ``s`` of unit ``u``. With
        ``heads`` > 1 the weight is block-diagonal: the hidden units form ``heads`` heads of ``D = hidden /
        heads`` consecutive units, and row ``s*hidden + u`` holds only the ``D`` columns of unit ``u``'s head
        (``W[s*hidden + n*D + d, e]`` multiplies unit ``n*D + e`` of head ``n``): xLSTM's and FlashRNN's
        head-wise recurrent matrix ``R[gates, heads, D, D]`` reshaped to ``(gates*hidden, D)``.
        """
        if self.declarations_only and isinstance(heads, int) and heads >= 1 and self.hidden % heads:
            heads = 1
        _check_heads(name, heads, self.hidden)
        return self._declare(name, Role.WEIGHT, slices, (slices * self.hidden, self.hidden // heads), heads)

    def param(self, name: str, slices: int = 1) -> te.Tensor:
        """A per-unit parameter vector of shape (slices*hidden,), e.g. ``bias_hh``."""
        return self._declare(name, Role.PARAM, slices, (slices * self.hidden,))

    def matvec(self, state: te.Tensor, weight: te.Tensor, name: str, heads: int | None = None) -> te.Tensor:
        """The recurrent product ``out[n, j] = sum_k state[n, k] * weight[j, k]``; over a weight of several heads
        (:meth:`weight`), block-diagonal: ``out[n, j] = sum_k state[n, head(j)*D + k] * weight[j, k]`` for ``k <
        D``, ``head(j) = (j % hidden) // D``, so a head's units read only that head's units. ``heads``, when
        given, must be the weight's (a check).

        A convenience: writing the same ``te.compute`` with ``te.sum`` by hand is equivalent.
        """
        _check_name(name, "product")
        declared = next((s.heads for s in self.slots if s.tensor.same_as(weight)), None)
        if heads is not None and heads != (declared or 1):
            raise CellError(
                f"product '{name}': heads={heads!r}, but its weight was declared with {declared or 1}; "
                "declare the heads with c.weight(name, slices, heads=...) and leave them out here"
            )
        rows, H = int(weight.shape[0]), self.hidden
        D = int(weight.shape[1])
        if D == H:
            k = te.reduce_axis((0, H), name=f"{name}_k")
            return te.compute((self.batch, rows), lambda n, j: te.sum(state[n, k] * weight[j, k], axis=k), name=name)
        k = te.reduce_axis((0, D), name=f"{name}_k")
        return te.compute(
            (self.batch, rows), lambda n, j: te.sum(state[n, (j % H) // D * D + k] * weight[j, k], axis=k), name=name
        )

    def sum(self, value: te.Tensor, name: str, columns: int | None = None) -> te.Tensor:
        """Each batch row's sum over every column of ``value`` (a (batch, slices*hidden) tensor: a stage, the input,
        a state, a product), as a (batch, hidden) stage whose every unit holds its row's total. It mixes every
        hidden unit of a row, so its value is there one phase after the values it sums (the analysis makes the
        sum a phase of its own); ``te.sum(value[n, k], axis=k)`` over ``k`` in ``range(slices * hidden)``, written
        by hand, is the same. ``columns``: the first that many columns only (whole gate slices)."""
        _check_name(name, "sum")
        k = te.reduce_axis((0, int(value.shape[1]) if columns is None else columns), name=f"{name}_k")
        return te.compute((self.batch, self.hidden), lambda n, j: te.sum(value[n, k], axis=k), name=name)

    def mean(self, value: te.Tensor, name: str, columns: int | None = None) -> te.Tensor:
        """Each batch row's mean over every column of ``value`` (see :meth:`sum`): a layer norm's mean, or with
        ``value`` a square its second moment."""
        _check_name(name, "mean")
        columns = int(value.shape[1]) if columns is None else columns
        k = te.reduce_axis((0, columns), name=f"{name}_k")
        scale = tirx.const(1.0 / columns, self.dtype)
        return te.compute((self.batch, self.hidden), lambda n, j: te.sum(value[n, k] * scale, axis=k), name=name)

    def pointwise(self, fn: Callable, name: str, slices: int = 1) -> te.Tensor:
        """A pointwise stage ``fn(n, j)`` of shape (batch, slices*hidden)."""
        _check_name(name, "stage")
        _check_slices(name, slices)
        return te.compute((self.batch, slices * self.hidden), fn, name=name)


def _check_name(name, kind: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise CellError(
            f"{kind} names must be Python identifiers (letters, digits and _, not starting with a digit), got {name!r}"
        )


def _check_heads(name: str, heads, hidden: int) -> None:
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise CellError(f"weight '{name}' needs a positive whole number of heads, got {heads!r}")
    if hidden % heads:
        raise CellError(
            f"weight '{name}': hidden={hidden} does not split into {heads} heads of equal size; "
            f"give a hidden size that is a multiple of {heads}, or fewer heads"
        )


def _check_slices(name: str, slices) -> None:
    if not isinstance(slices, int) or isinstance(slices, bool) or slices < 1:
        raise CellError(f"'{name}' needs a positive whole number of gate slices, got {slices!r}")


StepFn = Callable[[CellBuilder], Mapping[str, te.Tensor]]
ReferenceFn = Callable[[np.ndarray, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class TracedCell:
    """A cell's TE graph at concrete sizes: the declared slots and the state updates."""

    cell: "Cell"
    batch: int
    hidden: int
    dtype: str
    slots: tuple[Slot, ...]
    updates: Mapping[str, te.Tensor]


@dataclass(frozen=True)
class Cell:
    """A recurrent cell: a TE step function and its NumPy reference.

    Parameters
    ----------
    name : str
        Short name used in reports, records and the CLI.
    step : callable
        ``step(c: CellBuilder) -> {state_name: te.Tensor}``: one timestep in TE.
    reference : callable
        ``reference(x, state, params) -> {state_name: ndarray}``: the same step in NumPy,
        called in float64 with ``x`` the input projection (batch, slices*hidden), ``state``
        the states by name and ``params`` the weights and per-unit parameters by name.
    output : str or tuple of str
        The state whose value at every step is the layer's output sequence; several states' values side
        by side (``hidden`` columns each, in this order) for a tuple (:mod:`prnn_tvm.frontend.directions`
        makes these).
    doc : str
        Equations and source, shown by ``prnn-tvm cells``.
    delays : tuple of (state name, steps)
        States that start late (:mod:`prnn_tvm.frontend.stack` makes these; a cell written by hand has
        none): a state of delay ``d`` (0 to :data:`MAX_DELAY`) keeps its initial value for the first ``d``
        steps and stops changing ``d`` steps after a row's length; a layer of such a cell runs
        ``T + max delay`` steps, and its output sequence is the output state's, read its delay late.
    reversed_states, reversed_slices : tuple of str, tuple of int
        States whose time runs backwards, and the input slices they read
        (:mod:`prnn_tvm.frontend.directions` makes these: a bidirectional layer's reverse direction):
        at step ``t`` a row of length ``n`` reads those slices of the input projection at step
        ``n - 1 - t``, and a reversed output state's value of step ``t`` is the output at ``n - 1 - t``.
    error_gain : float
        How many times the dtype's bound on the error against the float64 reference (an LSTM's) the cell's layers
        may have, in every dtype (at least 1; :func:`prnn_tvm.checks.plan_tolerance`): a cell whose output moves
        more with a rounding error of a pre-activation than a sigmoid gate's output does (sLSTM's exponential
        gates: 2; measured past the bound in float16 and bfloat16).
    """

    name: str
    step: StepFn
    reference: ReferenceFn
    output: str | tuple = "h"
    doc: str = ""
    delays: tuple = ()
    reversed_states: tuple = ()
    reversed_slices: tuple = ()
    error_gain: float = 1.0

    def __post_init__(self):
        """Each field's type and range, so that a wrong one is refused where the cell is made (states named
        in ``output``, ``delays`` and ``reversed_states`` are checked against the step's when it is traced)."""
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise CellError(f"a cell's name is a non-empty printable string, got {self.name!r}")
        where = f"cell '{self.name}'"
        if not callable(self.step):
            raise CellError(
                f"{where}: step must be a function step(c) -> {{state: new value}}, got {type(self.step).__name__}"
            )
        if self.reference is not None and not callable(self.reference):
            raise CellError(
                f"{where}: reference must be a function reference(x, state, params) -> {{state: new "
                f"value}} (or None for a cell that is only analysed), got {type(self.reference).__name__}"
            )
        if not (
            isinstance(self.output, str)
            or (isinstance(self.output, (tuple, list)) and self.output and _names(self.output))
        ):
            raise CellError(f"{where}: output is a state's name or a tuple of them, got {self.output!r}")
        if not isinstance(self.doc, str):
            raise CellError(f"{where}: doc is a string, got {type(self.doc).__name__}")
        if (
            isinstance(self.error_gain, bool)
            or not isinstance(self.error_gain, (int, float))
            or not (1 <= self.error_gain <= 64)
        ):
            raise CellError(f"{where}: error_gain is a number in [1, 64], got {self.error_gain!r}")
        pairs = self.delays
        if not (
            isinstance(pairs, (tuple, list))
            and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs)
            and _names(p[0] for p in pairs)
            and all(_whole(p[1]) for p in pairs)
        ):
            raise CellError(f"{where}: delays is a tuple of (state name, steps) pairs, got {pairs!r}")
        bad = [(n, d) for n, d in pairs if not 0 <= d <= MAX_DELAY]
        if bad:
            raise CellError(
                f"{where}: delay {bad[0][1]} of state '{bad[0][0]}' is not in [0, {MAX_DELAY}]; a "
                "state starts at most that many steps late, never early"
            )
        twice = sorted({n for n, _ in pairs if sum(m == n for m, _ in pairs) > 1})
        if twice:
            raise CellError(f"{where}: delays names state(s) {', '.join(twice)} more than once")
        if not (isinstance(self.reversed_states, (tuple, list)) and _names(self.reversed_states)):
            raise CellError(f"{where}: reversed_states is a tuple of state names, got {self.reversed_states!r}")
        if not (
            isinstance(self.reversed_slices, (tuple, list)) and all(_whole(s) and s >= 0 for s in self.reversed_slices)
        ):
            raise CellError(f"{where}: reversed_slices is a tuple of input slice numbers, got {self.reversed_slices!r}")

    @property
    def outputs(self) -> tuple:
        """The output states, in the order their columns come."""
        return (self.output,) if isinstance(self.output, str) else tuple(self.output)

    def trace(self, batch: int, hidden: int, dtype: str = "float32", declarations_only: bool = False) -> TracedCell:
        """Run the step function at concrete sizes and return its TE graph, its names checked
        (:mod:`prnn_tvm.frontend.names`): CellError for a step that fails, saying where. ``declarations_only``:
        for what the step declares alone (weights whose heads do not divide ``hidden`` declared with one)."""
        builder = CellBuilder(batch, hidden, dtype, declarations_only)
        updates = self._user_call("step function", self.step, builder)
        if not isinstance(updates, Mapping):
            raise CellError(
                f"cell '{self.name}': the step function must return a dict "
                f"{{state name: new value}}, got {type(updates).__name__}"
            )
        check_names(self.name, builder.slots, updates)
        return TracedCell(self, batch, hidden, dtype, tuple(builder.slots), dict(updates))

    def step_reference(self, x: np.ndarray, state: Mapping, params: Mapping):
        """One step of the NumPy reference (``reference(x, state, params)``): CellError for a cell without one,
        or one that fails, saying where."""
        if self.reference is None:
            raise CellError(f"cell '{self.name}' has no NumPy reference; give Cell(..., reference=) one")
        return self._user_call("reference", self.reference, x, state, params)

    def _user_call(self, what: str, fn: Callable, *args):
        """``fn(*args)``, the cell author's code: any failure of it (an exception, ``sys.exit``) becomes a
        CellError saying which function of which cell raised what, and the file and line it came from."""
        try:
            return fn(*args)
        except PrnnError:
            raise
        except (Exception, SystemExit) as err:
            raise CellError(
                f"cell '{self.name}': its {what} raised {type(err).__name__}: {_first_line(err)} ({user_frame(err)})"
            ) from err


def _names(values) -> bool:
    return all(isinstance(v, str) for v in values)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_line(err: BaseException, limit: int = 300) -> str:
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else "(no message)"
    return text if len(text) <= limit else text[:limit] + "..."


_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_path(k) for k in ("stdlib", "purelib", "platlib")} if p
)
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1]) + "/"  # prnn_tvm/, whose frames are never the user's


def user_frame(err: BaseException) -> str:
    """Where the cell author's code raised ``err``: the file and line of the deepest frame of its traceback
    outside prnn-tvm, Python and installed libraries (the last frame if there is none)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "no traceback"

    def users(filename: str) -> bool:
        path = str(Path(filename).resolve())
        return not path.startswith((_PACKAGE_DIR, *_LIBRARY_DIRS)) or "/prnn_tvm/cells/" in path

    frame = next((f for f in reversed(frames) if users(f.filename)), frames[-1])
    return f"{frame.filename}, line {frame.lineno}, in {frame.name}"

"""Stacking: ``layers`` layers of one cell as one cell, run in one persistent launch as a wavefront or deep.

Layer ``l + 1`` reads layer ``l``'s output; in a wavefront it reads it one step late:

    wavefront step s:   layer l computes its time step t = s - l, from
                        - its own states (from wavefront step s - 1: its time t - 1), and
                        - its input: layer 0 the input projection x_t W_ih^T + b_ih, layer l > 0
                          W_ih_l h_{l-1} + b_ih_l over layer l - 1's output *as the step found it*
                          (computed at wavefront step s - 1: layer l - 1's time t).

Every product of a wavefront step multiplies a value the step starts with, so the stack is one
cell with one phase per phase of the base cell: no barrier between layers, one per wavefront
step, ``T + layers - 1`` of them. Layer ``l``'s input product is a recurrent product like any
other (its ``W_ih`` stays on chip with the recurrent weights).

The stacked cell's states, weights, params and stages are the base cell's, renamed per layer
(``l0_h``, ``l1_W_hh``, ...), plus ``l<l>_W_ih`` and ``l<l>_b_ih`` for layers 1 and up; its
output is the last layer's output. What makes it a *wavefront* rather than a deeper cell is
each state's *delay* (:attr:`~prnn_tvm.frontend.cell.Cell.delays`): layer ``l``'s states keep
their initial values for the first ``l`` steps and stop changing ``l`` steps after a row's
length, the layer runs ``T + layers - 1`` steps and its output sequence is the last layer's, read
``layers - 1`` steps late. The templates and the references apply delays; nothing else in the
compiler knows about stacks.

A *deep* stack (``wavefront=False``) is the same layers without the lag: layer ``l``'s input product
multiplies layer ``l - 1``'s new output of the same step, so a step has one phase per layer (and per
phase of the base cell) with a barrier between them, and step ``t``'s output is the last layer's at ``t``.
It costs a barrier per layer and step where the wavefront costs one per step, and it is what serves one
timestep per request (a resident session), where the wavefront would answer request ``t`` only
``layers - 1`` requests later.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import CellError, ConfigError
from .cell import MAX_DELAY, Cell, CellBuilder


def layer_name(layer: int, name: str) -> str:
    """A base cell's declared name in layer ``layer`` of a stack: ``l1_W_hh``."""
    return f"l{layer}_{name}"


INPUT_WEIGHT, INPUT_BIAS = "W_ih", "b_ih"  # layer l > 0's input product, as torch.nn names it
# The most layers one wavefront launch runs. Its kernel holds every layer's code, and nvcc's and TVM's time grow
# faster than the code (LSTM, hidden 1, sm_90, on 2 cores: 16 layers ~8 s, 32 ~25 s, 200 minutes); a deeper stack
# runs layer by layer (prnn_tvm.torch does so by itself).
MAX_LAYERS = MAX_DELAY + 1


def stacked(cell: Cell, layers: int, wavefront: bool = True) -> Cell:
    """``layers`` layers of ``cell`` as one wavefront cell, or with ``wavefront=False`` as one deep cell (see the
    module's doc); ``cell`` itself for one layer. Every layer's input is ``hidden`` wide, so layer ``l > 0``
    multiplies ``(slices * hidden, hidden)`` ``l<l>_W_ih`` by the layer below's output (``slices``: the base
    cell's input slices). The wavefront is named ``<cell>_x<layers>``, the deep stack ``<cell>_d<layers>``."""
    if not isinstance(wavefront, bool):
        raise CellError(f"wavefront must be True or False, got {wavefront!r}")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise CellError(f"layers must be a positive integer, got {layers!r}")
    if layers == 1:
        return cell
    if cell.delays:
        raise CellError(f"cell '{cell.name}' is already a stack; stack its base cell with layers= instead")
    if cell.reversed_states or len(cell.outputs) > 1:
        raise CellError(
            f"cell '{cell.name}' runs both directions of a layer; a bidirectional stack cannot run as one "
            "cell (layer l + 1 reads the whole of both directions of layer l): compile each layer "
            "with bidirectional=True (prnn_tvm.torch's bidirectional modules do)"
        )
    if layers > MAX_LAYERS:
        raise ConfigError(
            f"a stack of {layers} layers: one launch runs at most {MAX_LAYERS} (its kernel "
            "holds every layer, and compile time grows faster than the layers); compile fewer layers "
            "and run the rest as further layers (prnn_tvm.torch runs deeper stacks layer by layer)"
        )

    def step(c: CellBuilder):
        updates, below = {}, None
        for layer in range(layers):
            proxy = _LayerBuilder(c, layer, below)
            new = cell.step(proxy)
            if not isinstance(new, Mapping) or cell.output not in proxy.states:
                return new  # the analysis says what is wrong with the base cell, with its own names
            updates.update({layer_name(layer, name): value for name, value in new.items()})
            below = proxy.states[cell.output] if wavefront else new[cell.output]
        return updates

    def reference(x, state, p):
        new, below = {}, None
        for layer in range(layers):
            mine = {
                name[len(layer_name(layer, "")) :]: value
                for name, value in state.items()
                if name.startswith(layer_name(layer, ""))
            }
            params = {
                name[len(layer_name(layer, "")) :]: value
                for name, value in p.items()
                if name.startswith(layer_name(layer, ""))
            }
            xin = x if layer == 0 else (below @ params.pop(INPUT_WEIGHT).T + params.pop(INPUT_BIAS))
            found = cell.step_reference(xin, mine, params)
            new.update({layer_name(layer, name): value for name, value in found.items()})
            # the wavefront reads the value this step started with (its one-step lag), the deep stack the new one
            below = mine[cell.output] if wavefront else found[cell.output]
        return new

    output = layer_name(layers - 1, cell.output)
    if not wavefront:
        doc = f"{layers} stacked layers of '{cell.name}', one after another in each step (prnn_tvm.frontend.stack).\n\n"
        return Cell(
            f"{cell.name}_d{layers}", step, reference, output=output, doc=doc + cell.doc, error_gain=cell.error_gain
        )
    delays = tuple((layer_name(layer, name), layer) for layer in range(layers) for name in _state_names(cell))
    doc = f"{layers} stacked layers of '{cell.name}', run as a wavefront (prnn_tvm.frontend.stack).\n\n" + cell.doc
    return Cell(
        f"{cell.name}_x{layers}", step, reference, output=output, doc=doc, delays=delays, error_gain=cell.error_gain
    )


def declared_slots(cell: Cell) -> list:
    """The slots (states, input, weights, params) ``cell``'s step declares, from a trace at a small size (their
    names, roles and slices; a weight's heads are those of a real size's trace)."""
    return list(cell.trace(1, 1, declarations_only=True).slots)


def _state_names(cell: Cell) -> list[str]:
    """The base cell's state names, in declaration order."""
    return [s.name for s in declared_slots(cell) if s.role.value == "state"]


class Renamed:
    """What a base cell's step function sees inside a cell made of several copies of it: the outer builder
    with every declared name prefixed (``prefix``); :meth:`input` is the subclass's."""

    def __init__(self, builder: CellBuilder, prefix: str):
        self._c, self._prefix = builder, prefix
        self.batch, self.hidden, self.dtype = builder.batch, builder.hidden, builder.dtype
        self.states: dict = {}

    def _name(self, name: str) -> str:
        return self._prefix + name

    def state(self, name: str):
        tensor = self._c.state(self._name(name))
        self.states[name] = tensor
        return tensor

    def weight(self, name: str, slices: int = 1, heads: int = 1):
        return self._c.weight(self._name(name), slices, heads)

    def param(self, name: str, slices: int = 1):
        return self._c.param(self._name(name), slices)

    def matvec(self, state, weight, name: str, heads: int | None = None):
        return self._c.matvec(state, weight, self._name(name), heads)

    def pointwise(self, fn, name: str, slices: int = 1):
        return self._c.pointwise(fn, self._name(name), slices)

    def sum(self, value, name: str, columns: int | None = None):
        return self._c.sum(value, self._name(name), columns)

    def mean(self, value, name: str, columns: int | None = None):
        return self._c.mean(value, self._name(name), columns)


class _LayerBuilder(Renamed):
    """Layer ``layer`` of a stack: names prefixed ``l<layer>_``, and for ``layer > 0`` an input that is the
    product of ``l<layer>_W_ih`` with the layer below's output (``below``: in a wavefront its state placeholder,
    the value the step starts with; in a deep stack its new value) plus ``l<layer>_b_ih``."""

    def __init__(self, builder: CellBuilder, layer: int, below):
        super().__init__(builder, layer_name(layer, ""))
        self._layer, self._below = layer, below

    def input(self, slices: int = 1, name: str = "x"):
        if self._layer == 0:
            return self._c.input(slices, name)
        if any(s.name == self._name(INPUT_WEIGHT) for s in self._c.slots):
            raise CellError("a cell has one input projection; c.input() was called twice")
        W = self._c.weight(self._name(INPUT_WEIGHT), slices)
        b = self._c.param(self._name(INPUT_BIAS), slices)
        product = self._c.matvec(self._below, W, name=self._name("input_product"))
        return self._c.pointwise(lambda n, j: product[n, j] + b[j], name=self._name(name), slices=slices)


def split_layer_name(name: str) -> tuple[int, str]:
    """``l1_W_hh`` -> ``(1, "W_hh")``: a stack's argument name as its layer and the base cell's name."""
    prefix, _, base = name.partition("_")
    if not (prefix[:1] == "l" and prefix[1:].isdigit() and base):
        raise ValueError(f"'{name}' is not a stacked layer's name (l<layer>_<name>)")
    return int(prefix[1:]), base

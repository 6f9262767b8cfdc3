"""A cell's names: one namespace, checked once when the cell is traced.

Everything a step function names — its input, states, weights and params, and every stage and
product of its graph — is found by that name later: a leaf of the plan (``Leaf("stage", "t", 0)``),
a buffer of a kernel, a key of the NumPy reference's dicts, an argument of the layer. Two things of
one name would be taken for one (two stages named ``t``: the second read where the first was
meant), so every name must be a Python identifier (a C identifier in the generated source, too)
and name one thing.

The layer adds arguments of its own (``x``, ``W_ih``, ``b_ih``, ``lengths``, ``out``, ...) and
arguments made from the cell's names (state ``h``'s ``h0`` and ``h_n``, weight ``W``'s gradient
``d_W``, ...). Both come from :mod:`prnn_tvm.signature` itself — the argument lists of every
launch a layer may run (forward, training forward, backward), built once without the cell and
once per declared name — so a name that would take one of them is refused, naming whose it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from tvm import te, tirx

from ..errors import CellError
from ..signature import ArgRole, Launch, backward_args, gpu_backward_args, projection_launch, recurrent_args, with_saved

_ROLE_WORDS = {
    ArgRole.STATE: "initial state",
    ArgRole.FINAL: "final state",
    ArgRole.OUTPUT: "output",
    ArgRole.LENGTHS: "row lengths",
}


def check_names(cell_name: str, slots: Iterable, updates) -> None:
    """CellError unless every name of a traced cell (``slots``: the :class:`~prnn_tvm.frontend.cell.Slot` s it
    declared; ``updates``: its step's result, whose graph holds its stages and products) is an identifier
    naming one thing, and none takes an argument name of the layer's or one that another declared name makes."""
    slots = tuple(slots)
    kinds: dict[str, str] = {}  # name -> the kind of thing it names ("state", "stage", ...)

    def claim(name, kind: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise CellError(
                f"cell '{cell_name}': {kind} name {name!r} is not an identifier; name every state, "
                "weight, param, stage and product with letters, digits and _ (not starting with a digit)"
            )
        if name in kinds:
            raise CellError(f"cell '{cell_name}': {same_name(kinds[name], kind, name)}")
        kinds[name] = kind

    for s in slots:
        claim(s.name, s.role.value)  # input, state, weight, param
    weights = [s.tensor for s in slots if s.role.value == "weight"]
    for op in _graph_ops(updates):
        if not isinstance(op.body[0], tirx.Reduce):
            claim(op.name, "stage")
            continue  # a product reads a weight; a sum over units does not
        claim(op.name, "product" if any(t.same_as(w) for t in op.input_tensors for w in weights) else "sum")
    _check_arguments(
        cell_name, slots, {name: f"{kind} '{name}'" for name, kind in kinds.items() if kind != "input"}
    )  # the input is no argument: x is the layer's


def same_name(first: str, second: str, name: str) -> str:
    """The words for two things of one name (kinds ``first`` and ``second``: "state", "stage", ...)."""

    def a(kind: str) -> str:
        return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"

    which = f"two {first}s" if first == second else f"{a(first)} and {a(second)}"
    return (
        f"{which} are named '{name}'; every input, state, weight, param, stage and product of a cell needs a "
        "name of its own (rename one)"
    )


def _graph_ops(updates) -> list:
    """The compute ops of the step's graph (each once), in no particular order."""
    seen, todo, found = (
        set(),
        [t for t in (updates.values() if hasattr(updates, "values") else ()) if isinstance(t, te.Tensor)],
        [],
    )
    while todo:
        op = todo.pop().op
        if op in seen:
            continue
        seen.add(op)
        if isinstance(op, te.ComputeOp):
            found.append(op)
            todo.extend(op.input_tensors)
    return found


def _check_arguments(cell_name: str, slots: tuple, named: dict) -> None:
    """Refuse a name (``named``: name -> what it names, in words) that is one of the layer's own arguments,
    or an argument another name makes."""
    slices = next((s.slices for s in slots if s.role.value == "input"), 1)
    own = _own_arguments(slices)
    for name, what in named.items():
        if name in own:
            raise CellError(
                f"cell '{cell_name}': {what} has the name of the layer's own argument '{name}' "
                f"({own[name]}); rename it (the layer's own arguments: {', '.join(sorted(own))})"
            )
    made = {s.name: _made_arguments(s.role.value, s.name, slices) for s in slots if s.role.value != "input"}
    for name, what in named.items():
        for other, arguments in made.items():
            if other != name and name in arguments:
                raise CellError(
                    f"cell '{cell_name}': {what} has the name of the {arguments[name]} argument "
                    f"'{name}' of {named[other]}; rename one"
                )
    claimed: dict[str, str] = {}
    for name, arguments in made.items():
        for argument, word in arguments.items():
            if argument in claimed and claimed[argument] != name:
                raise CellError(
                    f"cell '{cell_name}': {named[claimed[argument]]} and {named[name]} both make the "
                    f"argument '{argument}'; rename one"
                )
            if argument != name and argument in own:
                raise CellError(
                    f"cell '{cell_name}': {named[name]} makes the {word} argument '{argument}', which "
                    f"is the layer's own ({own[argument]}); rename it"
                )
            claimed[argument] = name


def _launches(slices: int, weights: tuple = (), params: tuple = (), states: tuple = ()) -> list[Launch]:
    """Every launch a layer of these declared names may run, at size 1: the projection, the recurrent kernel
    (with every optional argument), the training forward and both backwards."""
    w = {name: (slices, 1) for name in weights}
    p = {name: (slices,) for name in params}
    recurrent = Launch(
        "recurrent", recurrent_args(1, 1, slices, w, p, states, "float32", workspace=(1,), sync_words=1, exchanged=1)
    )
    return [
        projection_launch(1, 1, slices, "float32"),
        recurrent,
        with_saved(recurrent, 1, "float32"),
        Launch("recurrent_backward", backward_args(1, 1, slices, w, p, states, "float32", "float32")),
        Launch(
            "recurrent_backward", gpu_backward_args(1, 1, slices, w, p, states, 1, 1, "float32", "float32", (1,), 1)
        ),
    ]


def _described(launches: list[Launch]) -> dict[str, str]:
    """Argument name -> what it is, in words."""
    return {
        a.name: (
            "gradient"
            if a.name.startswith("d_") and a.role is not ArgRole.INPUT
            else _ROLE_WORDS.get(a.role, a.role.value)
        )
        for launch in launches
        for a in launch.args
    }


@lru_cache(maxsize=None)
def _own_arguments(slices: int) -> dict[str, str]:
    """The layer's own arguments (those of a cell that declares nothing): name -> what it is."""
    return _described(_launches(slices))


@lru_cache(maxsize=None)
def _made_arguments(role: str, name: str, input_slices: int) -> dict[str, str]:
    """The arguments one declared name adds to the layer's own: name -> what it is (a weight's own argument
    and its gradient, a state's initial and final values and their gradients, ...)."""
    launches = _launches(input_slices, **{f"{role}s": (name,)})  # weights, params, states
    own = _own_arguments(input_slices)
    return {k: v for k, v in _described(launches).items() if k not in own or k == name}

"""A cell's names are one namespace (``prnn_tvm.frontend.names``): every pair of kinds alike, every argument
name of the layer and every argument another name makes is refused when the cell is traced; a cell that
takes none of them compiles and matches its reference."""

import itertools
import re

import numpy as np
import pytest
from tvm import te

import prnn_tvm
from prnn_tvm import CellError
from prnn_tvm.checks import check_against_reference
from prnn_tvm.dtypes import tolerance
from prnn_tvm.frontend.cell import Cell

# the default name of every named thing of the cell below: two of each kind (one input)
NAMES = {
    "input": "x",
    "state": "h",
    "state2": "g",
    "weight": "W",
    "weight2": "U",
    "param": "b",
    "param2": "a",
    "product": "hw",
    "product2": "gu",
    "stage": "s",
    "stage2": "t",
}
KINDS = ["input", "state", "weight", "param", "stage", "product"]


def two_state_cell(**renamed) -> Cell:
    """Two tanh RNNs side by side, every name taken from ``NAMES`` unless ``renamed``."""
    n = {**NAMES, **renamed}

    def step(c):
        x = c.input(2, name=n["input"])
        h, g = c.state(n["state"]), c.state(n["state2"])
        W, U = c.weight(n["weight"]), c.weight(n["weight2"])
        b, a = c.param(n["param"]), c.param(n["param2"])
        hw, gu = c.matvec(h, W, n["product"]), c.matvec(g, U, n["product2"])
        H = c.hidden
        s = c.pointwise(lambda i, j: te.tanh(x[i, j] + hw[i, j] + b[j]), n["stage"])
        t = c.pointwise(lambda i, j: te.tanh(x[i, H + j] + gu[i, j] + a[j]), n["stage2"])
        return {n["state"]: s, n["state2"]: t}

    def reference(x, state, p):
        H = state[n["state"]].shape[1]
        return {
            n["state"]: np.tanh(x[:, :H] + state[n["state"]] @ p[n["weight"]].T + p[n["param"]]),
            n["state2"]: np.tanh(x[:, H:] + state[n["state2"]] @ p[n["weight2"]].T + p[n["param2"]]),
        }

    return Cell("names", step, reference, output=n["state"])


def test_the_cell_with_its_own_names_matches_its_reference():
    layer = prnn_tvm.compile_cell(two_state_cell(), 6, 2, target="llvm")
    assert check_against_reference(layer, 5, tolerance("float32", 5)).ok


def _pairs():
    """Every unordered pair of kinds (two inputs aside: a cell has one), as keys of ``NAMES``."""
    for first, second in itertools.combinations_with_replacement(KINDS, 2):
        if first == second == "input":
            continue
        yield first, (second + "2" if first == second else second)


@pytest.mark.parametrize("first, second", list(_pairs()))
def test_two_things_of_one_name_are_refused(first, second):
    """Two stages of one name gave 27.7 of error on the CPU, two products 1.04: any pair of kinds is refused."""
    kinds = [first.rstrip("2"), second.rstrip("2")]
    said = f"two {kinds[0]}s" if kinds[0] == kinds[1] else r"an? (\w+) and an? (\w+)"
    with pytest.raises(CellError, match=f"{said} are named 'dup'; every input, state") as refused:
        prnn_tvm.analyze(two_state_cell(**{first: "dup", second: "dup"}), 2, 4)
    if kinds[0] != kinds[1]:  # the message names both kinds
        assert set(re.search(said, str(refused.value)).groups()) == set(kinds)


# the layer's own arguments, as a user reads them in its signature and exports (the spec: names.py derives them)
OWN = [
    "x",
    "W_ih",
    "b_ih",
    "xp",
    "lengths",
    "out",
    "exchange",
    "workspace",
    "sync",
    "timeout_us",
    "stall_step",
    "error_host",
    "saved",
    "d_out",
    "d_xp",
    "d_gates",
]


@pytest.mark.parametrize("kind", [k for k in NAMES if k != "input"])
@pytest.mark.parametrize("name", OWN)
def test_the_layers_own_argument_names_are_refused(kind, name):
    with pytest.raises(CellError, match=f"has the name of the layer's own argument '{name}'"):
        prnn_tvm.analyze(two_state_cell(input="inp", **{kind: name}), 2, 4)  # the input may take x: not it


def test_the_input_may_be_named_x_or_anything_free():
    assert prnn_tvm.analyze(two_state_cell(input="x"), 2, 4).input.name == "x"
    assert prnn_tvm.analyze(two_state_cell(input="lengths"), 2, 4).input.name == "lengths"  # it is no argument


@pytest.mark.parametrize(
    "maker, made, word",
    [
        ("state", "h0", "initial state"),
        ("state", "h_n", "final state"),
        ("state", "d_h0", "gradient"),
        ("state", "d_h_n", "gradient"),
        ("weight", "d_W", "gradient"),
        ("param", "d_b", "gradient"),
        ("param", "d_b_rows", "gradient"),
    ],
)
@pytest.mark.parametrize("taker", ["state2", "weight2", "param2", "stage", "product"])
def test_names_made_from_other_names_are_refused(maker, made, word, taker):
    """State ``h`` makes ``h0`` and ``h_n`` (and their gradients), weight ``W`` makes ``d_W``, param ``b`` makes
    ``d_b`` and ``d_b_rows``: none may name anything else."""
    with pytest.raises(CellError, match=f"has the name of the {word} argument '{made}' of {maker} "):
        prnn_tvm.analyze(two_state_cell(**{taker: made}), 2, 4)


def test_two_names_making_one_argument_are_refused():
    """State ``h``'s initial-state gradient and state ``d_h``'s initial state would both be ``d_h0``."""
    with pytest.raises(CellError, match="state 'h' and state 'd_h' both make the argument 'd_h0'"):
        prnn_tvm.analyze(two_state_cell(state2="d_h"), 2, 4)


@pytest.mark.parametrize("kind", ["state", "weight", "param", "stage", "product"])
@pytest.mark.parametrize("name", ["h w-1", "1st", "", "a.b"])
def test_names_that_are_no_identifiers_are_refused(kind, name):
    with pytest.raises(CellError, match="must be Python identifiers"):
        prnn_tvm.analyze(two_state_cell(**{kind: name}), 2, 4)


def test_a_hand_written_stage_is_in_the_namespace_too():
    """A stage written with te.compute (not c.pointwise) is checked by its op's name: te.compute's default name
    'compute' twice is two stages of one name."""

    def step(c):
        x, h, W = c.input(), c.state("h"), c.weight("W")
        hw = c.matvec(h, W, "hw")
        a = te.compute((c.batch, c.hidden), lambda i, j: x[i, j] + hw[i, j])
        return {"h": te.compute((c.batch, c.hidden), lambda i, j: te.tanh(a[i, j]))}

    with pytest.raises(CellError, match="two stages are named 'compute'"):
        prnn_tvm.analyze(Cell("unnamed", step, None), 2, 4)


@pytest.mark.parametrize("cell", ["lstm", "gru_cho", "stacked_rnn", "lstm_x3", "gru_bi", "mgu_x2"])
def test_built_in_cells_stacks_and_directions_pass(cell):
    assert prnn_tvm.analyze(prnn_tvm.resolve(cell), 2, 4).states

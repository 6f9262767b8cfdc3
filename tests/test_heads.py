"""Head-wise (block-diagonal) recurrent products: the cell API, the analysis, the float64 references, the CPU
build and its derived backward (``prnn_tvm.frontend.heads``). The CUDA templates' placement of heads is in
``test_heads_cuda.py``."""

import numpy as np
import pytest
from tvm import te

import prnn_tvm
from prnn_tvm import Cell, CellError
from prnn_tvm.checks import check_against_reference, check_gradients, gradient_check_hidden
from prnn_tvm.dtypes import tolerance
from prnn_tvm.frontend.heads import block_diagonal, diagonal_blocks, headed
from prnn_tvm.reference import plan_layer, random_inputs, random_lengths, reference_layer

from .test_backward import compare


def test_a_headed_weight_is_block_diagonal_and_its_product_reads_only_its_head():
    plan = prnn_tvm.analyze(prnn_tvm.resolve("lstm_h4"), 2, 8)
    (product,) = plan.reductions
    assert (product.heads, product.head_size(8)) == (4, 2)
    assert plan.weight_shapes() == {"W_hh": (32, 2)}
    dense = prnn_tvm.analyze(prnn_tvm.resolve("lstm"), 2, 8)
    assert plan.fingerprint() != dense.fingerprint()
    w = np.arange(32 * 2, dtype=np.float64).reshape(32, 2) + 1
    full = block_diagonal(w, 4)
    assert full.shape == (32, 8) and np.count_nonzero(full) == w.size
    assert np.array_equal(full[8 + 5], [0, 0, 0, 0, *w[8 + 5], 0, 0])  # gate 1, unit 5: head 2's columns 4, 5
    assert np.array_equal(diagonal_blocks(full, 4), w)


def test_a_hand_written_head_wise_product_is_the_same_plan():
    """``te.sum`` over a head's units, written out, is what ``c.matvec`` makes over a weight of heads."""

    def step(c):
        H, D = c.hidden, c.hidden // 3
        x, h = c.input(), c.state("h")
        W = c.weight("W_hh", heads=3)
        k = te.reduce_axis((0, D), name="k")
        hw = te.compute((c.batch, H), lambda n, j: te.sum(h[n, j // D * D + k] * W[j, k], axis=k), name="hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")}

    by_hand = prnn_tvm.analyze(Cell("by_hand", step, None), 2, 6)
    made = prnn_tvm.analyze(prnn_tvm.resolve("rnn_tanh_h3"), 2, 6)
    assert by_hand.reductions[0].heads == made.reductions[0].heads == 3


@pytest.mark.parametrize(
    "index, message",
    [
        (
            lambda n, j, k, D: k,
            r"'h' is indexed \[n, hw_k\]; the recurrent product reads its operand as \[n, \(j % "
            r"hidden\) // D \* D \+ k\], the head of row j",
        ),
        (lambda n, j, k, D: (j // D + 1) % 3 * D + k, "the head of row j"),  # the next head's units
    ],
)
def test_a_product_that_reads_another_head_is_refused(index, message):
    def step(c):
        D = c.hidden // 3
        x, h = c.input(), c.state("h")
        W = c.weight("W_hh", heads=3)
        k = te.reduce_axis((0, D), name="hw_k")
        hw = te.compute((c.batch, c.hidden), lambda n, j: te.sum(h[n, index(n, j, k, D)] * W[j, k], axis=k), name="hw")
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + hw[n, j]), "h_new")}

    with pytest.raises(CellError, match=message):
        prnn_tvm.analyze(Cell("wrong_head", step, None), 2, 6)


@pytest.mark.parametrize(
    "spec, hidden, message",
    [
        ("lstm_h4", 6, "weight 'W_hh': hidden=6 does not split into 4 heads of equal size"),
        ("lstm_h3", 1, "weight 'W_hh': hidden=1 does not split into 3 heads"),
    ],
)
def test_a_hidden_size_that_does_not_split_into_the_heads_is_refused(spec, hidden, message):
    with pytest.raises(CellError, match=message):
        prnn_tvm.compile_cell(spec, hidden, 2, target="llvm")


def test_heads_are_the_weights_and_a_product_cannot_say_otherwise():
    def step(c):
        x, h = c.input(), c.state("h")
        W = c.weight("W_hh", heads=2)
        return {"h": c.pointwise(lambda n, j: te.tanh(x[n, j] + c.matvec(h, W, "hw", heads=4)[n, j]), "h_new")}

    with pytest.raises(CellError, match="product 'hw': heads=4, but its weight was declared with 2"):
        prnn_tvm.analyze(Cell("mismatch", step, None), 1, 8)
    with pytest.raises(CellError, match="needs a positive whole number of heads, got 0"):
        prnn_tvm.analyze(Cell("zero", lambda c: {"h": c.weight("W", heads=0)}, None), 1, 8)


def test_a_cell_with_heads_of_its_own_is_not_split_again():
    base = Cell(
        "own",
        lambda c: {
            "h": c.pointwise(
                lambda n, j: c.input()[n, j] + c.matvec(c.state("h"), c.weight("W", heads=2), "hw")[n, j], "h_new"
            )
        },
        None,
    )
    with pytest.raises(CellError, match="declares weight 'W' with heads=2 itself"):
        prnn_tvm.analyze(headed(base, 2), 1, 4)


def test_headed_names_and_keeps_what_the_cell_is():
    assert prnn_tvm.resolve("lstm_h1") is not None and headed(prnn_tvm.resolve("lstm"), 1).name == "lstm"
    stack = prnn_tvm.resolve("lstm_h4_x2")
    assert stack.name == "lstm_h4_x2" and dict(stack.delays)["l1_h"] == 1
    plan = prnn_tvm.analyze(stack, 2, 8)
    assert {r.weight: r.heads for r in plan.reductions} == {"l0_W_hh": 4, "l1_W_ih": 1, "l1_W_hh": 4}
    both = prnn_tvm.analyze(prnn_tvm.resolve("gru_h2_bi"), 2, 8)
    assert both.reversed_states and {r.heads for r in both.reductions} == {2}


def test_the_plan_and_the_cells_own_reference_agree():
    """A headed cell's reference is the base cell's on block-diagonal dense weights; the plan's forward
    multiplies the heads."""
    for spec in ("lstm_h4", "gru_cho_h3", "mgu_h2"):
        plan = prnn_tvm.analyze(prnn_tvm.resolve(spec), 3, 12)
        inputs = random_inputs(plan, 6, 5, seed=1)
        out, finals = reference_layer(plan, inputs)
        got, got_finals, _ = plan_layer(plan, inputs)
        assert np.abs(out - got).max() < 1e-12 and all(np.abs(finals[s] - got_finals[s]).max() < 1e-12 for s in finals)


# awkward sizes: heads of one unit (hidden 7, prime), odd heads, a batch of one, input size apart from hidden
SIZES = [
    ("rnn_tanh_h7", 7, 1, 3),
    ("lstm_h7", 7, 2, 7),
    ("gru_h3", 9, 3, 4),
    ("gru_cho_h2", 6, 1, 11),
    ("lstm_peephole_h4", 16, 5, 3),
    ("mgu_h5", 5, 2, 2),
    ("stacked_rnn_h2", 4, 3, 1),
]


def assert_cpu_build_matches(spec, hidden: int, batch: int, input_size: int, dtype: str, steps: int = 9) -> None:
    """The CPU build of ``spec`` against its float64 reference over ragged row lengths: to 1e-12 in float64, within
    the dtype's bound otherwise."""
    layer = prnn_tvm.compile_cell(spec, hidden, batch, input_size=input_size, dtype=dtype, target="llvm")
    bound = 1e-12 if dtype == "float64" else tolerance(dtype, steps)
    res = check_against_reference(layer, steps, bound, lengths=random_lengths(batch, steps, seed=hidden))
    assert res.ok, res


@pytest.mark.parametrize("spec, hidden, batch, input_size", SIZES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_cpu_build_matches_the_float64_reference(spec, hidden, batch, input_size, dtype):
    assert_cpu_build_matches(spec, hidden, batch, input_size, dtype)


@pytest.mark.parametrize("spec, hidden, batch, input_size", SIZES)
def test_the_derived_backward_equals_the_plans(spec, hidden, batch, input_size):
    assert compare(spec, hidden, batch, 6, input_size, "float64", lengths=random_lengths(batch, 6, seed=4)) < 1e-12


@pytest.mark.parametrize("spec", ["lstm_h4", "gru_cho_h2", "rnn_relu_h3"])
def test_the_derived_backward_matches_central_differences(spec):
    hidden = gradient_check_hidden(prnn_tvm.analyze(prnn_tvm.resolve(spec), 1, 12))
    assert hidden % int(spec.rsplit("_h", 1)[1]) == 0
    res = check_gradients(spec, hidden=hidden)
    assert res.ok and res.max_abs_error < 1e-7, res.max_abs_error

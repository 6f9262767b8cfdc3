"""NumPy float64 references of a whole layer, and random inputs to check kernels with.

- :func:`reference_layer` runs the cell's own NumPy reference (what its author wrote), and
  :func:`reference_stack` a stack of such layers, each one or both directions;
- :func:`plan_layer` runs the same step from the cell's *plan* (the stages the compiler
  derived from its TE), saving every leaf of every step, and :func:`plan_gradients`
  backpropagates through it with the adjoints derived from the plan
  (:mod:`prnn_tvm.frontend.derivative`): the reference a training kernel is checked against.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .codegen.kernel import layer_signature
from .errors import CellError
from .frontend.derivative import step_adjoints
from .frontend.heads import block_diagonal, diagonal_blocks
from .frontend.plan import CellPlan, Leaf
from .frontend.texpr import evaluate
from .signature import ArgRole


def random_inputs(plan: CellPlan, seq_len: int, input_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every layer argument in the plan's storage dtype: the sequence ``x`` standard
    normal, weights and params as PyTorch initializes them (U(-1/sqrt(H), 1/sqrt(H))), initial
    states 0.5 * standard normal (nonzero). Per-row lengths are left out (every row runs the
    whole sequence); :func:`random_lengths` makes some."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(plan.hidden)
    arrays = {}
    for arg in layer_signature(plan, input_size).inputs:
        shape = arg.concrete_shape(seq_len)
        if arg.role is ArgRole.LENGTHS:
            continue
        if arg.role is ArgRole.INPUT:
            value = rng.standard_normal(shape)
        elif arg.role is ArgRole.STATE:
            value = 0.5 * rng.standard_normal(shape)
        else:  # weights and params
            value = rng.uniform(-bound, bound, size=shape)
        arrays[arg.name] = value.astype(arg.dtype)
    return arrays


def random_lengths(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """Per-row lengths in [1, T] (int32) for ``batch`` rows, in no order, with a full-length row and,
    from two rows up, a length-1 row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq_len + 1, size=batch)
    lengths[rng.permutation(batch)[:2]] = [seq_len, 1][: min(batch, 2)]
    return lengths.astype(np.int32)


def reference_layer(plan: CellPlan, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run the cell's NumPy reference over the sequence in float64: (output sequence, final states).
    With ``inputs["lengths"]`` a row past its length keeps its states and outputs zeros."""
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    xp = f64["x"] @ f64["W_ih"].T + f64["b_ih"]
    params = {s.name: f64[s.name] for s in (*plan.weights, *plan.params)}
    state = {s.name: f64[f"{s.name}0"] for s in plan.states}
    H, rows = plan.hidden, np.arange(plan.batch)
    out = np.empty((xp.shape[0], plan.batch, len(plan.outputs) * H))
    backwards = _backwards(inputs, xp.shape[0], plan.batch)
    for t, running, written in _steps(plan, inputs, xp.shape[0]):
        x = xp[min(t, len(xp) - 1)].copy()
        for s in plan.reversed_slices:  # a reversed slice reads each row's step n - 1 - t
            x[:, s * H : (s + 1) * H] = xp[backwards[t], rows, s * H : (s + 1) * H]
        new = _checked(plan, plan.cell.step_reference(x, state, params))
        state = {name: np.where(running[name], value, state[name]) for name, value in new.items()}
        for k, name in enumerate(plan.outputs):
            value = np.where(running[name], state[name], 0.0)
            if name in plan.reversed_states:
                out[backwards[t], rows, k * H : (k + 1) * H] = value
            elif written is not None:
                out[written, :, k * H : (k + 1) * H] = value
    return out, state


def reference_stack(
    plan: CellPlan, x: np.ndarray, layers: list, lengths: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A stack of layers of one cell in float64, as ``torch.nn``'s ``num_layers`` and ``bidirectional``:
    ``layers[l][d]`` holds the arguments of layer ``l``'s direction ``d`` (weights, params and initial
    states by name, as :func:`reference_layer` takes them, without ``x``); direction 1 reads each row's steps
    backwards within its length (``lengths``, or the whole sequence), and a layer's directions' outputs,
    concatenated, are the next layer's input. Returns (output (T, B, hidden x directions), final states
    {state: (layers x directions, B, hidden)}, slots in torch's order: layer-major, forward first)."""
    seq_len, batch = x.shape[:2]
    steps = np.full(batch, seq_len) if lengths is None else np.asarray(lengths).reshape(batch)
    t = np.arange(seq_len)[:, None]
    backwards = np.where(t < steps, steps - 1 - t, t)[:, :, None]  # (T, B, 1): padding stays where it is

    def reverse(sequence):
        return np.take_along_axis(sequence, backwards, axis=0)

    given = {} if lengths is None else {"lengths": steps}
    finals: dict[str, list] = {s.name: [] for s in plan.states}
    sequence = np.asarray(x, dtype=np.float64)
    for directions in layers:
        outs = []
        for d, args in enumerate(directions):
            out, ends = reference_layer(plan, {**args, **given, "x": sequence if d == 0 else reverse(sequence)})
            outs.append(out if d == 0 else reverse(out))
            for name, value in ends.items():
                finals[name].append(value)
        sequence = np.concatenate(outs, axis=2)
    return sequence, {name: np.stack(values) for name, values in finals.items()}


def _row_lengths(inputs: dict, seq_len: int, batch: int) -> np.ndarray:
    """Each row's steps, (batch, 1): ``inputs["lengths"]``, or the whole sequence when absent."""
    lengths = inputs.get("lengths")
    return (np.full(batch, seq_len) if lengths is None else np.asarray(lengths).reshape(batch))[:, None]


def _backwards(inputs: dict, seq_len: int, batch: int) -> np.ndarray:
    """(T, batch): the step a reversed state's step t takes in each row, n - 1 - t while the row runs (n its
    length), then t."""
    lengths = np.minimum(_row_lengths(inputs, seq_len, batch)[:, 0], seq_len)
    t = np.arange(seq_len)[:, None]
    return np.where(t < lengths, lengths - 1 - t, t)


def _running(inputs: dict, seq_len: int, batch: int) -> list[np.ndarray]:
    """Per step, which rows still run: (batch, 1) booleans."""
    lengths = _row_lengths(inputs, seq_len, batch)
    return [t < lengths for t in range(seq_len)]


def _steps(plan: CellPlan, inputs: dict, seq_len: int):
    """The steps a layer runs, ``seq_len`` plus the plan's lag (a stack's wavefront,
    :mod:`prnn_tvm.frontend.stack`): per step ``(t, {state: (batch, 1) booleans, which rows change it},
    the output sequence's step it writes, or None)``. A state of delay ``d`` changes from step ``d`` until
    ``d`` steps after its row's length (``inputs["lengths"]``, or the sequence); the output is the output
    state's, ``d`` steps late."""
    lengths = _row_lengths(inputs, seq_len, plan.batch)
    delays = plan.delays
    out_delay = max(delays[name] for name in plan.outputs)  # one output state but in a bidirectional layer's
    for t in range(seq_len + plan.lag):
        running = {name: (t >= d) & (t < lengths + d) for name, d in delays.items()}
        yield t, running, (t - out_delay if out_delay <= t < seq_len + out_delay else None)


def _checked(plan: CellPlan, new) -> dict:
    """The reference's new states as float64 arrays; CellError naming what it got wrong otherwise."""
    name, want = plan.cell.name, (plan.batch, plan.hidden)
    if not isinstance(new, Mapping) or set(new) != {s.name for s in plan.states}:
        got = sorted(new) if isinstance(new, Mapping) else type(new).__name__
        raise CellError(
            f"cell '{name}': its reference returned {got}; it must return {{state: new value}} for "
            f"the states {', '.join(s.name for s in plan.states)}"
        )
    try:
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in new.items()}
    except (TypeError, ValueError) as err:
        raise CellError(f"cell '{name}': its reference returned a state that is no array of numbers ({err})") from None
    for k, v in arrays.items():
        if v.shape != want:
            raise CellError(
                f"cell '{name}': its reference returned state '{k}' of shape {v.shape}; states are "
                f"(batch, hidden) = {want}"
            )
    return arrays


def plan_layer(plan: CellPlan, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict, list[dict]]:
    """The layer in float64 from the plan's stages: (output sequence, final states, each step's leaf
    values as {Leaf: (batch, hidden) array}; products' leaves included). Per-row lengths as in
    :func:`reference_layer`."""
    if plan.untrainable:
        raise CellError(plan.untrainable)
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    H = plan.hidden
    xp = f64["x"] @ f64["W_ih"].T + f64["b_ih"]
    state = {s.name: f64[f"{s.name}0"] for s in plan.states}
    out, steps = np.empty((xp.shape[0], plan.batch, H)), []
    for t, running in enumerate(_running(inputs, xp.shape[0], plan.batch)):
        values = {
            leaf: _leaf_value(plan, leaf, xp[t], f64) for leaf in plan.leaf_vars if leaf.kind in ("input", "param")
        }
        values.update({Leaf("state", name, 0): value for name, value in state.items()})  # read or multiplied
        env = {plan.leaf_vars[leaf]: v for leaf, v in values.items() if leaf in plan.leaf_vars}
        for phase in range(plan.phases):
            for us in (us for us in plan.unit_sums if us.phase == phase):  # each row's sum over every unit
                leaf = Leaf("unit_sum", us.name, 0)
                total = sum(np.broadcast_to(evaluate(expr, env), (plan.batch, H)).sum(axis=1) for expr in us.exprs)
                values[leaf] = np.repeat(total[:, None], H, axis=1)
                env[plan.leaf_vars[leaf]] = values[leaf]
            for r in (r for r in plan.reductions if r.phase == phase):  # products once their operand exists
                operand = state[r.operand] if phase == 0 else values[Leaf("stage", r.operand, 0)]
                weight = block_diagonal(f64[r.weight], r.heads)
                for s in range(r.slices):
                    leaf = Leaf("reduction", r.name, s)
                    values[leaf] = operand @ weight[s * H : (s + 1) * H].T
                    if leaf in plan.leaf_vars:
                        env[plan.leaf_vars[leaf]] = values[leaf]
            for stage in (st for st in plan.stages if st.phase == phase):
                for s, expr in enumerate(stage.exprs):
                    leaf = Leaf("stage", stage.name, s)
                    values[leaf] = np.broadcast_to(evaluate(expr, env), (plan.batch, H))
                    if leaf in plan.leaf_vars:
                        env[plan.leaf_vars[leaf]] = values[leaf]
        steps.append(values)
        state = {name: np.where(running, values[leaf], state[name]) for name, leaf in plan.updates.items()}
        out[t] = np.where(running, state[plan.output], 0.0)
    return out, state, steps


def plan_gradients(
    plan: CellPlan, inputs: dict[str, np.ndarray], d_out: np.ndarray, d_finals: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Gradients of ``sum(out * d_out) + sum_s sum(final_s * d_finals[s])`` with respect to every layer
    argument (``x``, ``W_ih``, ``b_ih``, the recurrent weights and params, the initial states ``<s>0``),
    in float64, by backpropagation through time with the plan's derived adjoints. A step a row does not
    run (past its ``inputs["lengths"]``) passes that row's state gradients through unchanged."""
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items() if k != "lengths"}
    H, adjoints = plan.hidden, step_adjoints(plan)
    _, _, steps = plan_layer(plan, inputs)
    running = _running(inputs, len(steps), plan.batch)
    grads = {name: np.zeros_like(value) for name, value in f64.items()}
    d_xp = np.zeros((len(steps), plan.batch, f64["W_ih"].shape[0]))
    carry = {s.name: np.zeros((plan.batch, H)) for s in plan.states}
    for name, value in (d_finals or {}).items():
        carry[name] = carry[name] + value
    for t in reversed(range(len(steps))):
        values = steps[t]
        env = {var: values[leaf] for leaf, var in plan.leaf_vars.items()}
        env.update(
            {
                var: running[t] * (carry[name] + (d_out[t] if name == plan.output else 0.0))
                for name, var in adjoints.incoming.items()
            }
        )
        d = {}
        for phase in reversed(range(plan.phases)):  # a phase's products and sums, then what they send back
            for us in (us for us in plan.unit_sums if us.phase == phase):  # a row total's adjoint: every unit's share
                share = _adjoint(adjoints, Leaf("unit_sum", us.name, 0), env, plan)
                env[adjoints.unit_sums[us.name]] = np.repeat(share.sum(axis=1)[:, None], H, axis=1)
            for r in (r for r in plan.reductions if r.phase == phase):
                for s in range(r.slices):
                    d[r.name, s] = _adjoint(adjoints, Leaf("reduction", r.name, s), env, plan)
            for name in (
                n for n in adjoints.operands if any(r.operand == n and r.phase == phase for r in plan.reductions)
            ):
                env[adjoints.operands[name]] = _back_through_products(plan, d, name, f64)
        carry = {
            s.name: _adjoint(adjoints, Leaf("state", s.name, 0), env, plan)
            + _back_through_products(plan, d, s.name, f64)
            + ~running[t] * carry[s.name]
            for s in plan.states
        }
        for s in range(plan.input.slices):
            d_xp[t][:, s * H : (s + 1) * H] = _adjoint(adjoints, Leaf("input", plan.input.name, s), env, plan)
        for p in plan.params:
            for s in range(p.slices):
                grads[p.name][s * H : (s + 1) * H] += _adjoint(adjoints, Leaf("param", p.name, s), env, plan).sum(0)
        for r in plan.reductions:
            operand = values[Leaf("state", r.operand, 0)] if r.phase == 0 else values[Leaf("stage", r.operand, 0)]
            dense = np.concatenate([d[r.name, s].T @ operand for s in range(r.slices)])
            grads[r.weight] += diagonal_blocks(dense, r.heads)
    for s in plan.states:
        grads[f"{s.name}0"] = carry[s.name]
    x2d = f64["x"].reshape(-1, f64["x"].shape[-1])
    grads["W_ih"] = d_xp.reshape(-1, d_xp.shape[-1]).T @ x2d
    grads["b_ih"] = d_xp.sum((0, 1))
    grads["x"] = d_xp @ f64["W_ih"]
    return grads


def _leaf_value(plan: CellPlan, leaf: Leaf, xp_t: np.ndarray, f64: dict) -> np.ndarray:
    """An input or param leaf's value for the whole batch."""
    H = plan.hidden
    if leaf.kind == "input":
        return xp_t[:, leaf.slice * H : (leaf.slice + 1) * H]
    return np.broadcast_to(f64[leaf.name][leaf.slice * H : (leaf.slice + 1) * H], (plan.batch, H))


def _adjoint(adjoints, leaf: Leaf, env: dict, plan: CellPlan) -> np.ndarray:
    """A leaf's adjoint for the whole batch (zeros where the step does not depend on it)."""
    expr = adjoints.leaves.get(leaf)
    return (
        np.zeros((plan.batch, plan.hidden))
        if expr is None
        else np.broadcast_to(adjoints.evaluate(expr, env), (plan.batch, plan.hidden))
    )


def _back_through_products(plan: CellPlan, d: dict, operand: str, f64: dict) -> np.ndarray:
    """What the products over ``operand`` send back to it: sum over their slices of d(slice) @ W(slice)."""
    H, total = plan.hidden, np.zeros((plan.batch, plan.hidden))
    for r in (r for r in plan.reductions if r.operand == operand):
        weight = block_diagonal(f64[r.weight], r.heads)
        for s in range(r.slices):
            if (r.name, s) in d:
                total = total + d[r.name, s] @ weight[s * H : (s + 1) * H]
    return total

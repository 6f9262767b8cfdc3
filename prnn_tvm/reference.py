"""NumPy float64 reference of a whole layer, and random inputs to check kernels with."""

from __future__ import annotations

import numpy as np

from .frontend.plan import CellPlan


def layer_arg_names(plan: CellPlan) -> list[str]:
    """The layer's inputs in call order: x, W_ih, b_ih, weights, params, initial states."""
    return ["x", "W_ih", "b_ih", *(w.name for w in plan.weights), *(p.name for p in plan.params),
            *(f"{s.name}0" for s in plan.states)]


def random_inputs(plan: CellPlan, seq_len: int, input_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 inputs for every layer argument, initialized as PyTorch does (U(-1/sqrt(H), 1/sqrt(H)))
    with nonzero initial states."""
    rng = np.random.default_rng(seed)
    B, H = plan.batch, plan.hidden
    bound = 1.0 / np.sqrt(H)

    def uniform(*shape):
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    n_in = plan.input.slices * H
    arrays = {"x": rng.standard_normal((seq_len, B, input_size)).astype(np.float32),
              "W_ih": uniform(n_in, input_size), "b_ih": uniform(n_in)}
    arrays.update({w.name: uniform(w.slices * H, H) for w in plan.weights})
    arrays.update({p.name: uniform(p.slices * H) for p in plan.params})
    arrays.update({f"{s.name}0": (0.5 * rng.standard_normal((B, H))).astype(np.float32) for s in plan.states})
    return arrays


def reference_layer(plan: CellPlan, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run the cell's NumPy reference over the sequence in float64: (output sequence, final states)."""
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    xp = f64["x"] @ f64["W_ih"].T + f64["b_ih"]
    params = {s.name: f64[s.name] for s in (*plan.weights, *plan.params)}
    state = {s.name: f64[f"{s.name}0"] for s in plan.states}
    out = np.empty((xp.shape[0], plan.batch, plan.hidden))
    for t in range(xp.shape[0]):
        state = {k: np.asarray(v, dtype=np.float64) for k, v in plan.cell.reference(xp[t], state, params).items()}
        out[t] = state[plan.output]
    return out, state

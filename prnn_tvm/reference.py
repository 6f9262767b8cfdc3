"""NumPy float64 reference of a whole layer, and random inputs to check kernels with."""

from __future__ import annotations

import numpy as np

from .codegen.kernel import layer_signature
from .frontend.plan import CellPlan
from .signature import ArgRole


def random_inputs(plan: CellPlan, seq_len: int, input_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for every layer argument in the plan's storage dtype: the sequence ``x`` standard
    normal, weights and params as PyTorch initializes them (U(-1/sqrt(H), 1/sqrt(H))), initial
    states 0.5 * standard normal (nonzero)."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(plan.hidden)
    arrays = {}
    for arg in layer_signature(plan, input_size).inputs:
        shape = arg.concrete_shape(seq_len)
        if arg.role is ArgRole.INPUT:
            value = rng.standard_normal(shape)
        elif arg.role is ArgRole.STATE:
            value = 0.5 * rng.standard_normal(shape)
        else:  # weights and params
            value = rng.uniform(-bound, bound, size=shape)
        arrays[arg.name] = value.astype(arg.dtype)
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

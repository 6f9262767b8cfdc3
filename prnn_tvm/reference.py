"""NumPy float64 reference of a whole layer, and random inputs to check kernels with."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .codegen.kernel import layer_signature
from .errors import CellError
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
        state = _checked(plan, plan.cell.reference(xp[t], state, params))
        out[t] = state[plan.output]
    return out, state


def _checked(plan: CellPlan, new) -> dict:
    """The reference's new states as float64 arrays; CellError naming what it got wrong otherwise."""
    name, want = plan.cell.name, (plan.batch, plan.hidden)
    if not isinstance(new, Mapping) or set(new) != {s.name for s in plan.states}:
        got = sorted(new) if isinstance(new, Mapping) else type(new).__name__
        raise CellError(f"cell '{name}': its reference returned {got}; it must return {{state: new value}} for "
                        f"the states {', '.join(s.name for s in plan.states)}")
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in new.items()}
    for k, v in arrays.items():
        if v.shape != want:
            raise CellError(f"cell '{name}': its reference returned state '{k}' of shape {v.shape}; states are "
                            f"(batch, hidden) = {want}")
    return arrays

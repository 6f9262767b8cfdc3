"""The cell plan: what the analysis found in a cell's TE graph, and what templates place.

Nothing here knows a cell's name: a plan is products, per-unit stages, leaves, phases.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from ..dtypes import DtypePolicy, policy
from ..errors import CellError
from .bias import bias_carriers
from .cell import Cell, Slot
from .texpr import free_vars


@dataclass(frozen=True)
class Leaf:
    """One hidden unit's value of a tensor at a gate slice (an input of the pointwise math).

    ``kind`` is the role of the tensor (``input``, ``state``, ``param``), ``reduction`` for
    a recurrent reduction's output, or ``stage`` for another pointwise stage.
    """

    kind: str
    name: str
    slice: int


@dataclass(frozen=True)
class Reduction:
    """A recurrent product ``out[n, s*H + u] = sum_k operand[n, k] * weight[s*H + u, k]``.

    The operand is a state (``phase`` 0) or a one-slice pointwise stage computed earlier in
    the same step: then the product runs in the phase after that stage's.
    """

    name: str
    operand: str
    weight: str
    slices: int
    phase: int = 0
    heads: int = 1  # block-diagonal: row s*H + u multiplies only the hidden / heads units of u's head

    def head_size(self, hidden: int) -> int:
        """Units per head: the columns of the weight, and the operand units one row multiplies."""
        return hidden // self.heads


@dataclass(frozen=True)
class UnitSum:
    """A sum over every hidden unit of a batch row (``c.sum``, ``c.mean``): ``sum_s sum_u exprs[s](u)``, each
    ``exprs[s]`` a pointwise expression in leaf variables of unit ``u``. Every unit of the row reads the total, as
    leaf ``Leaf("unit_sum", name, 0)``, from ``phase`` on: one phase after the latest of what it sums (the units
    of a row live in every block, so their partial sums meet across blocks between the two)."""

    name: str
    exprs: tuple
    phase: int = 1


@dataclass(frozen=True)
class Stage:
    """A pointwise stage, one expression per gate slice, written in leaf variables.

    ``phase`` is the latest phase of the products it depends on (0 without any).
    """

    name: str
    exprs: tuple  # PrimExpr per slice
    phase: int = 0


@dataclass(frozen=True)
class PointwiseGroup:
    """States whose new values one piece of pointwise work computes: no stage (and no private state)
    of a group is read by another, so a template may give each group's (batch row, unit) items to
    threads of their own (a stack's layers: :mod:`prnn_tvm.frontend.stack`). ``exchanged_stages``:
    the operand stages of later phases it publishes; ``leaves``: every leaf its math reads or makes."""

    states: tuple
    exchanged_stages: tuple
    leaves: frozenset

    def live_outs(self, plan: "CellPlan", phase: int) -> tuple:
        """The plan's live-outs of ``phase`` that this group computes."""
        return tuple(leaf for leaf in plan.live_outs(phase) if leaf in self.leaves)

    @classmethod
    def whole(cls, plan: "CellPlan") -> "PointwiseGroup":
        """All of a step's pointwise work as one group."""
        stages = {Leaf("stage", st.name, i) for st in plan.stages for i in range(len(st.exprs))}
        states = {Leaf("state", s.name, 0) for s in plan.states}
        return cls(
            tuple(s.name for s in plan.states), plan.exchanged_stages, frozenset(plan.leaf_vars) | stages | states
        )


@dataclass(frozen=True)
class CtaPart:
    """Work that CTAs of their own can do (:attr:`CellPlan.cta_parts`): pointwise groups, the products
    only their math reads and the operands those multiply (in workspace order)."""

    groups: tuple
    reductions: tuple
    operands: tuple


@dataclass(frozen=True)
class CellPlan:
    """Everything a schedule template needs to know about a cell, and nothing about its name.

    Attributes
    ----------
    input : Slot
        The input projection (its ``slices`` is the projection's width / hidden).
    states, weights, params : tuple of Slot
        Declared tensors by role, in declaration order.
    exchanged : tuple of str
        States read by a recurrent product: they cross thread blocks every step.
    exchanged_stages : tuple of str
        Stages read by a recurrent product of a later phase: they cross thread blocks
        between the phases of a step.
    reductions : tuple of Reduction
    stages : tuple of Stage
        Pointwise stages in dependency order.
    updates : dict
        State name -> the leaf holding its new value.
    leaf_vars : dict
        Leaf -> the variable standing for it inside stage expressions.
    """

    cell: Cell
    batch: int
    hidden: int
    dtype: str  # the storage dtype; ``policy`` gives the accumulation and compute types
    input: Slot
    states: tuple
    weights: tuple
    params: tuple
    exchanged: tuple
    exchanged_stages: tuple
    reductions: tuple
    stages: tuple
    updates: dict
    leaf_vars: dict
    unit_sums: tuple = ()  # UnitSum: sums over every unit of a row, in dependency order

    @property
    def output(self) -> str:
        """The output state of a cell with one (the backward templates and references take no other)."""
        if len(self.outputs) > 1:
            raise CellError(f"cell '{self.cell.name}' has outputs {', '.join(self.outputs)}, not one")
        return self.outputs[0]

    @property
    def outputs(self) -> tuple:
        """The output states, ``hidden`` columns each in the output sequence, in order."""
        return self.cell.outputs

    @property
    def reversed_states(self) -> frozenset:
        """States whose time runs backwards (:attr:`Cell.reversed_states`: a bidirectional layer's reverse
        direction)."""
        return frozenset(self.cell.reversed_states)

    @property
    def reversed_slices(self) -> frozenset:
        """Input slices read backwards in time (:attr:`Cell.reversed_slices`)."""
        return frozenset(self.cell.reversed_slices)

    @property
    def delays(self) -> dict:
        """State -> the steps it starts late (:attr:`Cell.delays`); every state is listed, most with 0."""
        given = dict(self.cell.delays)
        return {s.name: given.get(s.name, 0) for s in self.states}

    @property
    def lag(self) -> int:
        """Steps a layer runs beyond its sequence: the largest delay (0 but for stacks)."""
        return max(self.delays.values(), default=0)

    @property
    def untrainable(self) -> str | None:
        """Why no backward differentiates this cell, or None: a wavefront stack and both directions of a
        layer in one launch train their layers and directions one by one (``prnn_tvm.torch`` does)."""
        if self.lag:
            return (
                f"'{self.cell.name}' is a wavefront stack, which has no backward: train its layers one by one "
                "(prnn_tvm.torch does)"
            )
        if self.reversed_states:
            return (
                f"'{self.cell.name}' runs both directions of a layer in one launch, which has no backward: train "
                "each direction as a layer of its own (prnn_tvm.torch does)"
            )
        return None

    @property
    def policy(self) -> DtypePolicy:
        """Storage, accumulation and compute types (the stages and leaf variables are in the compute type)."""
        return policy(self.dtype)

    @property
    def private_states(self) -> tuple:
        return tuple(s.name for s in self.states if s.name not in self.exchanged)

    @property
    def needs_grid_barrier(self) -> bool:
        """A cell without recurrent reductions has no cross-unit dependency at all."""
        return bool(self.reductions)

    @property
    def phases(self) -> int:
        """Phases per step: products over this step's own results and sums over units add one each, with a grid
        sync before."""
        return 1 + max((x.phase for x in (*self.reductions, *self.unit_sums)), default=0)

    @property
    def product_phases(self) -> int:
        """Phases of a step that run products (a phase that only reads sums over units runs none)."""
        return max(1, len({r.phase for r in self.reductions}))

    @property
    def operands(self) -> tuple:
        """Everything a product multiplies, in workspace order: exchanged states, then stages."""
        return self.exchanged + self.exchanged_stages

    def phase_of(self, leaf: Leaf) -> int:
        """The phase in which a leaf's value becomes available."""
        if leaf.kind == "stage":
            return next(st.phase for st in self.stages if st.name == leaf.name)
        if leaf.kind == "reduction":
            return next(r.phase for r in self.reductions if r.name == leaf.name)
        if leaf.kind == "unit_sum":
            return next(x.phase for x in self.unit_sums if x.name == leaf.name)
        return 0

    def sums_of(self, phase: int) -> tuple:
        """The sums over units whose values a step's ``phase`` adds up (each unit its share): those read from the
        next phase on."""
        return tuple(x for x in self.unit_sums if x.phase == phase + 1)

    def live_outs(self, phase: int) -> tuple:
        """Stage leaves computed in ``phase`` that something after it reads.

        Readers are the stages of later phases, the products of later phases (their operand
        stage) and the state updates, which are written when the step ends.
        """
        inverse = {var: leaf for leaf, var in self.leaf_vars.items()}
        needed = set(self.updates.values())
        needed |= {Leaf("stage", r.operand, 0) for r in self.reductions if r.phase > 0}
        for st in self.stages:
            if st.phase > phase:
                needed |= {inverse[v] for e in st.exprs for v in free_vars(e)}
        for us in self.unit_sums:  # added up in the phase before its own
            if us.phase - 1 > phase:
                needed |= {inverse[v] for e in us.exprs for v in free_vars(e)}
        return tuple(
            sorted(
                (lf for lf in needed if lf.kind == "stage" and self.phase_of(lf) == phase),
                key=lambda lf: (lf.name, lf.slice),
            )
        )

    def saved_leaves(self) -> tuple:
        """What a training forward saves per step, in column order (``hidden`` columns each): every state at
        the step's start, every product's gate slices, then every stage a later phase multiplies (as it
        multiplied it). The GPU backward recomputes the other stages from these."""
        return (
            *(Leaf("state", s.name, 0) for s in self.states),
            *(Leaf("reduction", r.name, i) for r in self.reductions for i in range(r.slices)),
            *(Leaf("stage", name, 0) for name in self.exchanged_stages),
        )

    @cached_property  # a frozen instance: derived once (cached_property writes its __dict__ directly)
    def pointwise_groups(self) -> tuple:
        """The step's pointwise work as independent :class:`PointwiseGroup` s, in state order: one for most
        cells, one per layer for a stack. Two states (or operand stages of later phases) share a group when
        their math shares a stage or one reads the other's private state."""
        inverse = {var: leaf for leaf, var in self.leaf_vars.items()}
        reads = {st.name: [{inverse[v] for v in free_vars(e)} for e in st.exprs] for st in self.stages}
        reads.update({us.name: [{inverse[v] for e in us.exprs for v in free_vars(e)}] for us in self.unit_sums})

        def closure(leaf: Leaf, seen: set) -> set:
            if leaf not in seen:
                seen.add(leaf)
                if leaf.kind in ("stage", "unit_sum"):
                    for read in reads[leaf.name][leaf.slice]:
                        closure(read, seen)
            return seen

        private = set(self.private_states)
        # roots: each state (its update) and each operand stage of a later phase, with what its math reads
        roots = [("state", s.name, closure(self.updates[s.name], set())) for s in self.states]
        roots += [("stage", name, closure(Leaf("stage", name, 0), set())) for name in self.exchanged_stages]
        # what only one item may hold: stages and private states (a private state's own root holds it too)
        owned = [
            {lf for lf in leaves if lf.kind in ("stage", "unit_sum") or (lf.kind == "state" and lf.name in private)}
            | ({Leaf("state", name, 0)} if kind == "state" and name in private else set())
            for kind, name, leaves in roots
        ]
        groups: list[list[int]] = []  # root indices; a root joins every group it shares an owned leaf with
        for i in range(len(roots)):
            joined = [g for g in groups if any(owned[i] & owned[j] for j in g)]
            groups = [g for g in groups if g not in joined] + [sorted([i, *(j for g in joined for j in g)])]
        groups.sort()
        return tuple(
            PointwiseGroup(
                tuple(roots[i][1] for i in g if roots[i][0] == "state"),
                tuple(roots[i][1] for i in g if roots[i][0] == "stage"),
                frozenset().union(*(roots[i][2] for i in g)),
            )
            for g in groups
        )

    @cached_property
    def cta_parts(self) -> tuple:
        """The step split into :class:`CtaPart` s that CTAs of their own can run (a stack: one per layer): the
        pointwise groups, joined where their math reads the same product; () when that leaves one part. The
        parts meet only through the exchanged operands, so a template may give each its own CTAs."""
        groups = self.pointwise_groups
        readers = {
            r.name: {
                i
                for i, g in enumerate(groups)
                if any(Leaf("reduction", r.name, s) in g.leaves for s in range(r.slices))
            }
            for r in self.reductions
        }
        parts: list[set] = []  # group indices; a product's readers all join one part
        for members in [{i} for i in range(len(groups))] + list(readers.values()):
            joined = [part for part in parts if part & members]
            parts = [part for part in parts if part not in joined] + [set(members).union(*joined)]
        if len(parts) < 2:
            return ()
        found = []
        for part in sorted(parts, key=min):
            reductions = tuple(r for r in self.reductions if readers[r.name] & part)
            read = {r.operand for r in reductions}
            found.append(
                CtaPart(
                    tuple(groups[i] for i in sorted(part)),
                    reductions,
                    tuple(name for name in self.operands if name in read),
                )
            )
        return tuple(found)

    @cached_property
    def independent_parts(self) -> bool:
        """Whether every one of :attr:`cta_parts` multiplies only operands its own groups write (a
        bidirectional layer's directions; not a stack's layers, which read the layer below's output): no
        part ever waits for another's values, so a synchronization that only orders blocks reading each
        other's values (the ``tags`` exchange) is a barrier within each part."""
        return bool(self.cta_parts) and all(
            set(part.operands) <= {name for g in part.groups for name in (*g.states, *g.exchanged_stages)}
            for part in self.cta_parts
        )

    @cached_property
    def item_values(self) -> int:
        """Values a pointwise item keeps in registers through a step: its group's private states and
        live-outs (the most any group keeps)."""
        private = set(self.private_states)
        return max(
            len(private & set(g.states)) + sum(len(g.live_outs(self, p)) for p in range(self.phases))
            for g in self.pointwise_groups
        )

    @cached_property
    def input_bias(self) -> tuple:
        """The params that carry the input projection's bias (:class:`~prnn_tvm.frontend.bias.BiasCarrier` s, one
        per param, covering every input slice), or () where none can: where the cell reads each input slice only
        added to one slice of a param that it reads nowhere else (torch.nn's LSTM and RNN, not GRU), ``b_ih`` may
        be added to those params instead and the projection run without a bias (:mod:`prnn_tvm.frontend.bias`)."""
        return bias_carriers(self)

    def weight_shapes(self) -> dict:
        """Each recurrent weight's shape by name: (slices * hidden, hidden / heads)."""
        return {w.name: (w.slices * self.hidden, self.hidden // w.heads) for w in self.weights}

    def local_to(self, units: int) -> bool:
        """Whether a block of ``units`` consecutive hidden units (from a multiple of ``units``) holds every unit
        its products read: each product's heads are whole within it (its head size divides ``units``; a dense
        product's head is the whole hidden size). Heads never read each other, so such blocks need no grid
        barrier."""
        return all(units % r.head_size(self.hidden) == 0 for r in self.reductions) and (
            not self.unit_sums or units >= self.hidden
        )  # a sum over units reads every one

    @property
    def heads(self) -> int:
        """The most heads any recurrent product has (1: every product dense)."""
        return max((r.heads for r in self.reductions), default=1)

    def slot(self, name: str) -> Slot:
        for s in (self.input, *self.states, *self.weights, *self.params):
            if s.name == name:
                return s
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A hash of the cell's math (not its name or sizes): keys tuning records."""
        parts = [
            f"{s.role.value}:{s.name}:{s.slices}" + (f"/h{s.heads}" if s.heads > 1 else "")
            for s in (self.input, *self.states, *self.weights, *self.params)
        ]
        parts += [
            f"red:{r.name}={r.operand}*{r.weight}:{r.slices}@{r.phase}" + (f"/h{r.heads}" if r.heads > 1 else "")
            for r in self.reductions
        ]
        parts += [f"stage:{st.name}@{st.phase}=" + ";".join(str(e) for e in st.exprs) for st in self.stages]
        parts += [f"unit_sum:{us.name}@{us.phase}=" + ";".join(str(e) for e in us.exprs) for us in self.unit_sums]
        parts += [f"update:{k}={v.kind}.{v.name}.{v.slice}" for k, v in sorted(self.updates.items())]
        parts.append(f"output:{','.join(self.outputs)}")
        parts += [f"delay:{name}={d}" for name, d in self.delays.items() if d]
        parts += [f"reversed:{name}" for name in sorted(self.reversed_states)]
        parts += [f"reversed:x{s}" for s in sorted(self.reversed_slices)]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

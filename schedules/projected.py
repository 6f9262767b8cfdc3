"""Projected mode of the persistent templates: a layer's recurrent kernel that projects its own input, one launch a
layer where the input projection would be a launch of its own (what a call of one timestep pays most for: a
launch costs the host more than the projection's arithmetic).

The kernel is the template's own (its config, products, pointwise math and exchange, so the layer's launch state
serves it) with the input projection of a session's kernel (``schedules/session.py``): at each step every CTA loads
the step's input x_t (B x input values of its batch group, float32) from global memory into shared memory and
projects it for its own units with ``W_ih`` and ``b_ih`` read from global memory (float32 sums,
``prnn_tvm.codegen.session.project``) into shared memory, whence its items' registers. That shared memory comes on
top of the config's (:func:`~schedules.session.session_smem`): a config it does not fit beside raises ConfigError,
and the caller keeps the two launches. In a wavefront stack (``CellPlan.lag``) the first layer's input is projected
so (the upper layers' inputs are the kernel's own products already); a layer that runs both directions is refused.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from prnn_tvm.codegen.kernel import input_step
from prnn_tvm.errors import ConfigError
from prnn_tvm.signature import with_projected

from .session import InputProjection, session_gpu


def projected_problem(plan) -> str | None:
    """Why ``plan`` (a CellPlan) cannot project its own input in its recurrent kernel, or None."""
    if plan.reversed_states:
        return f"cell '{plan.cell.name}' runs both directions: its projected launch would serve one"
    return None


def projected_gpu(plan, gpu, input_size: int, units: int):
    """``gpu`` as a projected kernel's config sees it: a CTA's shared memory less the step's input and the CTA's
    part of its projection (the same as a session kernel's own)."""
    return session_gpu(plan, gpu, input_size, units)


def projected_builder(builder: type, input_size: int) -> type:
    """The template's kernel builder in projected mode, for inputs of ``input_size`` values a row."""
    return type(f"Projected{builder.__name__}", (ProjectedMode, builder), {"input_size": int(input_size)})


class ProjectedMode(InputProjection):
    """Mixin over a persistent template's builder (see the module's doc); ``input_size``: the layer's (set by
    :func:`projected_builder`)."""

    def __init__(self, plan, cfg, g, save: bool = False):
        problem = projected_problem(plan)
        if problem:
            raise ConfigError(problem)
        if save:
            raise ConfigError("a training forward reads a projection that autograd differentiates, not its own")
        super().__init__(plan, cfg, g, save)
        self.size_projection(plan, cfg, "projected kernel", "the projection runs as a launch of its own")

    def _launch(self):
        return with_projected(super()._launch(), self.input_size, self.p.input.slices * self.H)

    def batch_group_views(self, a):
        """The template's views, and ``x``'s: row ``b`` of this CTA's batch group is row ``group * B + b``."""
        a = super().batch_group_views(a)
        x = a.named["x"]
        first = self.bx // self.part.ctas * self.B * self.input_size
        a.named = {**a.named, "x": T.decl_buffer(x.shape, x.dtype, data=x.data, elem_offset=first)}
        return a

    def alloc_loop_state(self):
        super().alloc_loop_state()
        self.alloc_projection()

    def load_inputs(self, t):
        """Step ``t``'s input into shared memory (float32), projected for this CTA's units, and each item's
        projection values into its registers. CTA-wide: the template calls it where every thread of a CTA does."""
        a, n, threads, K = self.a, self.input_values, self.g.threads, self.input_size
        x, step = a.named["x"], input_step(self.p, a, t)  # a stack's first layer: its last step through the lag
        T.evaluate(T.tvm_storage_sync("shared"))  # the last step's values read by every thread before they change
        with T.serial(0, -(-n // threads)) as j:
            i = self.tx + j * threads
            with T.If(i < n):
                with T.Then():
                    T.buffer_store(self.x_shared, tirx.Cast("float32", x[step, i // K, i % K]), [i])
        T.evaluate(T.tvm_storage_sync("shared"))
        self.project_input()

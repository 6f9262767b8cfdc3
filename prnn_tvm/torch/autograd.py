"""A layer's recurrent kernel as a ``torch.autograd.Function``, on the CPU build and on the GPU: the backward is
compiled from the cell's plan (adjoints derived, no derivative written per cell). Gradients are first
derivatives: a backward that would itself be differentiated is refused."""

from __future__ import annotations

import torch  # PyTorch itself: absolute import

from prnn_tvm.deferred import compile_backward
from prnn_tvm.errors import UnsupportedError

from .arguments import aligned_state
from .projection import project, projection_gradients


class CpuBackprop(torch.autograd.Function):
    """One layer and direction's recurrent kernel on the CPU build, differentiable: the backward is the
    compiled backpropagation through time (:func:`prnn_tvm.compiler.compile_backward`; adjoints derived from
    the cell's plan, no derivative written per cell). Arguments: the layer, then the recurrent kernel's
    inputs in its signature's order (``xp``, weights, params, initial states, lengths or None)."""

    @staticmethod
    def forward(ctx, layer, xp, *args):
        ctx.layer = layer
        ctx.save_for_backward(xp, *args)
        out, finals = layer.recurrent(xp.detach(), *[None if a is None else a.detach() for a in args])
        return (torch.from_dlpack(out), *(torch.from_dlpack(f) for f in finals))

    @staticmethod
    def backward(ctx, d_out, *d_finals):
        refuse_double_backward(ctx.layer.plan.cell.name)
        layer, (xp, *args) = ctx.layer, ctx.saved_tensors
        backward = compile_backward(layer)
        grad_dtype = getattr(torch, backward.signature.launches[0].arg("d_out").dtype)
        grads = [g.to(grad_dtype).contiguous() for g in (d_out, *d_finals)]
        d_xp, d_inputs = backward(xp.detach(), *[None if a is None else a.detach() for a in args], *grads)
        d_inputs = [torch.from_dlpack(g) for g in d_inputs]  # weights, params, initial states: as in args
        return (
            None,
            torch.from_dlpack(d_xp).to(xp.dtype),
            *(None if a is None or a.dtype == torch.int32 else g.to(a.dtype) for a, g in zip(args, [*d_inputs, None])),
        )


class CudaBackprop(torch.autograd.Function):
    """One layer and direction's input projection and recurrent kernel on the GPU, differentiable. The forward is
    the projection (:func:`~prnn_tvm.torch.projection.project`: into float32, half GEMMs for a half layer) and the
    training forward (the layer's kernel, also saving each step's states and products); the backward is the
    persistent backward kernel (:func:`prnn_tvm.compiler.compile_training`; adjoints derived from the cell's plan),
    then one GEMM per product for the weights' gradients, a sum over the batch for the params', and the projection's
    gradients from the kernel's ``d_xp`` (:func:`~prnn_tvm.torch.projection.projection_gradients`). One Function for
    both: the kernel writes ``d_xp`` in the layer's type, which the projection's GEMMs take, and autograd would cast a
    half gradient of the float32 projection back to float32. Arguments: the module (which launches them,
    :meth:`~prnn_tvm.torch.dispatch.Dispatch._launch`), the layer's :class:`~prnn_tvm.compiler.Training`, ``x``,
    ``W_ih``, ``b_ih`` (None where the params carry it), the projection's ``biased_weight``, then the recurrent
    kernel's inputs after ``xp`` in its signature's order (weights, params, initial states, lengths)."""

    @staticmethod
    def forward(ctx, module, training, x, W_ih, b_ih, biased_weight, *args):
        ctx.module, ctx.training = module, training
        ctx.bias_dtype = None if b_ih is None else b_ih.dtype
        xp = project(x, W_ih, b_ih, biased_weight=biased_weight)
        inputs = [aligned_state(a.detach()) for a in args]
        out, *finals, saved = module._launch(training.forward, xp, inputs, "recurrent_save")
        ctx.save_for_backward(x, W_ih, xp, *inputs, saved)
        return (out, *finals)

    @staticmethod
    def backward(ctx, d_out, *d_finals):
        refuse_double_backward(ctx.training.plan.cell.name)
        module, training = ctx.module, ctx.training
        x, W_ih, xp, *args, saved = ctx.saved_tensors
        plan, H = training.plan, module.hidden_size
        names = _data_names(training.forward)[1:]  # the forward's arguments after xp
        # the backward computes in float32 and reads the outputs' gradients in the layer's type, as autograd gives
        # them (a half layer's come back as float32 gradients; its gate gradients, d_gates, may be in the half type)
        storage = getattr(torch, training.backward.signature.launches[0].arg("d_out").dtype)
        given = dict(zip(names, args), saved=saved, d_out=d_out.to(storage).contiguous())
        given.update({f"d_{s.name}_n": d.to(storage).contiguous() for s, d in zip(plan.states, d_finals)})
        launched = module._launch(
            training.backward, xp, [given[n] for n in _data_names(training.backward)[1:]], "recurrent_backward"
        )
        d = dict(zip((a.name for a in training.backward.signature.launches[0].args if a.role.written), launched))
        T, B, _ = d_out.shape
        # each operand's column in ``saved`` (CellPlan.saved_leaves: states and stages are one slice wide)
        where = {leaf.name: i for i, leaf in enumerate(plan.saved_leaves()) if leaf.kind in ("state", "stage")}
        column = 0
        for r in plan.reductions:  # each product's weights: sum over steps and rows of d_gates^T operand
            gates = d["d_gates"][:, :, column : column + r.slices * H].reshape(T * B, r.slices * H)
            i = where[r.operand]
            operand = saved[:, :, i * H : (i + 1) * H].reshape(T * B, H)
            dW = weight_gradient(gates, operand, r.slices, r.heads, given[r.weight].dtype)
            d[f"d_{r.weight}"] = d[f"d_{r.weight}"] + dW if f"d_{r.weight}" in d else dW
            column += r.slices * H
        d.update({f"d_{q.name}": d[f"d_{q.name}_rows"].sum(0) for q in plan.params})
        grads = [None if d.get(f"d_{n}") is None else d[f"d_{n}"].to(given[n].dtype) for n in names]
        projected = projection_gradients(d["d_xp"], x, W_ih, ctx.needs_input_grad[2:5], ctx.bias_dtype)
        return (None, None, *projected, None, *grads)  # lengths: none


def weight_gradient(gates, operand, slices: int, heads: int, weight_dtype) -> torch.Tensor:
    """A product's weight gradient, ``sum_rows gates^T operand`` over every step's batch rows: ``gates`` (rows,
    ``slices`` x H) the product's gate gradients, ``operand`` (rows, H) what it multiplied. For a head-wise weight
    (``heads`` > 1; shape (``slices`` x H, H / ``heads``)), only each head's block: per slice, one batched GEMM of
    ``heads`` products of (D, rows) by (rows, D), a ``heads``-th of the dense product's FLOPs (which then kept each
    row's head's columns). Each operand is a strided view of its tensor (a head's columns of a slice, transposed),
    which cuBLAS reads as it is: gathered head by head into one batch first, the gate gradients' copy (its rows
    moved to the last axis) took as long as the GEMMs and their casts together (slstm_h12 bf16 768 x 16, T=1024,
    H100: 376 us a step).

    In the half type where the weight is half (``weight_dtype``): the operands are the half values the forward
    multiplied (exact in it), and the gate gradients are rounded to it once (already, where the tensor-core backward
    made them), as the kernel rounds ``d_xp`` (``projection_gradients``); cuBLAS accumulates in float32. Widened, a
    head-wise layer's GEMM ran on CUDA cores (sLSTM 12 heads of 64, bf16, 768 x 16, T=1024: 1.5 ms on the H100)."""
    if weight_dtype in (torch.float16, torch.bfloat16):
        gates, operand = gates.to(weight_dtype), operand.to(weight_dtype)
    else:
        operand = operand.to(gates.dtype)
    if heads == 1:
        return gates.t() @ operand
    rows, H = operand.shape
    D = H // heads
    by_head = gates.view(rows, slices, heads, D)
    columns = operand.view(rows, heads, D).transpose(0, 1)  # (heads, rows, D)
    blocks = gates.new_empty(slices, heads, D, D)  # the weight's rows: slice, head, unit of the head
    for s in range(slices):
        torch.bmm(by_head[:, s].permute(1, 2, 0), columns, out=blocks[s])  # (heads, D, rows) x (heads, rows, D)
    return blocks.view(slices * H, D)


def refuse_double_backward(cell: str) -> None:
    """Autograd runs a backward with gradients enabled only where its result is to be differentiated again
    (``create_graph=True``): the kernels' backward is not differentiable, so that result would miss every term
    through the kernel (a gradient penalty's gradient on ``weight_hh`` and the biases would be zero)."""
    if torch.is_grad_enabled():
        raise UnsupportedError(
            f"double backward through '{cell}': the backward of a prnn_tvm.torch module is not "
            "differentiable (create_graph=True, as a gradient penalty asks, would give second "
            "derivatives without the kernel's terms); compute that loss with torch.nn's module, or "
            "without create_graph"
        )


def _data_names(layer) -> list:
    """The data arguments of a one-launch layer, in its order."""
    return [a.name for a in layer.signature.launches[0].args if a.role.data]

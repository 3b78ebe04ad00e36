"""softmax and log_softmax where torch's machinery sees them.

Plain tensors outside torch's transforms take the direct path of ``api``. Elsewhere two pieces
take the call:

* ``portable_softmax::softmax``, a torch operator: a fake kernel gives the result's shape (so
  ``torch.compile`` keeps the call in its graph, and fake or meta tensors pass) and a vmap rule
  moves the batch to the front and softmaxes a batch of rows at once.
* ``PortableSoftmax``, an autograd function over that operator for tensors autograd records:
  its backward is torch's own softmax backward, and it sets up its context apart from its
  forward, so ``torch.func.grad`` / ``jacrev`` / ``vmap`` go through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ._dtypes import storage_name

NAME = "portable_softmax::softmax"
# Set once on the first call (torch is imported lazily). Module globals, not closures: torch.compile
# reads them through the autograd function's forward and backward.
_operator = None  # torch.ops.portable_softmax.softmax.default
_function = None  # PortableSoftmax
_backward_ops: dict = {}  # op -> torch's own backward of it


def route(x) -> str | None:
    """'autograd' for a torch tensor autograd records; 'operator' for one wrapped by a torch.func
    transform, a fake or meta one, or any tensor while torch.compile traces; else None."""
    torch = sys.modules.get("torch")  # not imported: x is no torch tensor
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if x.requires_grad and torch.is_grad_enabled():
        return "autograd"
    if (torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x)
            or x.is_meta or torch._subclasses.fake_tensor.is_fake(x)):
        return "operator"
    return None


def call(how: str, forward: Callable, x, axis: int, op: str, safe: bool):
    """Softmax of ``x`` through the operator or the autograd function (``how`` as ``route`` says).
    ``forward`` is the eager computation on a plain tensor (normalised axis, 'softmax' |
    'log_softmax', safe -> a fresh tensor); the first call registers both pieces around it."""
    if _operator is None:
        _register(forward)
    return _function.apply(x, axis, op, safe) if how == "autograd" else _operator(x, axis, op, safe)


def _register(forward: Callable) -> None:
    global _operator, _function
    import torch

    @torch.library.custom_op(NAME, mutates_args=(), schema="(Tensor x, int axis, str op, bool safe) -> Tensor")
    def definition(x, axis, op, safe):
        y = forward(x, axis, op, safe)
        return y if y.is_contiguous() else y.contiguous()  # the fake kernel's layout

    @definition.register_fake
    def _(x, axis, op, safe):
        storage_name(x.dtype)  # the eager call's dtype error, at trace time
        return x.new_empty(x.shape)

    @definition.register_vmap
    def _(info, in_dims, x, axis, op, safe):
        batch_dim = in_dims[0]
        if batch_dim is None:
            return _operator(x, axis, op, safe), None
        x = x.movedim(batch_dim, 0)
        if x.dim() == 1:  # a batch of 0-d tensors: each is a row of one
            return _operator(x.unsqueeze(1), 1, op, safe).squeeze(1), 0
        return _operator(x, axis + 1, op, safe), 0

    definition.register_autograd(_backward, setup_context=_setup_context)  # for the operator called alone
    _backward_ops.update(softmax=torch.ops.aten._softmax_backward_data,
                         log_softmax=torch.ops.aten._log_softmax_backward_data)
    _operator, _function = torch.ops.portable_softmax.softmax.default, _portable_softmax_function(torch)


def _setup_context(ctx, inputs, output):
    x, axis, op, _ = inputs
    ctx.save_for_backward(output)
    ctx.axis, ctx.op, ctx.input_dtype = axis, op, x.dtype


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    dim = ctx.axis if y.dim() else 0
    return _backward_ops[ctx.op](grad.contiguous(), y, dim, ctx.input_dtype), None, None, None


def _portable_softmax_function(torch):
    class PortableSoftmax(torch.autograd.Function):  # grad_fn: PortableSoftmaxBackward
        generate_vmap_rule = True  # the forward is the operator, which has a vmap rule
        setup_context = staticmethod(_setup_context)  # apart from forward: torch.func.grad takes it
        backward = staticmethod(_backward)

        @staticmethod
        def forward(x, axis, op, safe):
            return _operator(x.detach(), axis, op, safe)

    return PortableSoftmax

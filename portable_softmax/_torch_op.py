"""softmax and log_softmax where torch's machinery sees them.

Plain tensors outside torch's transforms take the direct path of ``api``. Elsewhere:

* ``portable_softmax::softmax``, a torch operator: a fake kernel gives the result's shape (so
  ``torch.compile`` keeps the call in its graph, and fake or meta tensors pass) and a vmap rule
  moves the batch to the front and softmaxes a batch of rows at once. Eager vmap without autograd
  does the same without the operator: the batch is taken apart and put back directly.
* ``PortableSoftmax``, an autograd function over that operator, for tensors autograd records
  inside torch.func transforms or torch.compile: it sets up its context apart from its forward,
  as ``torch.func.grad`` / ``jacrev`` / ``vmap`` require.
* ``PortableSoftmaxEager``, the same gradient for plain eager tensors that require grad, its
  forward on the direct path: an autograd function of the classic form costs about a third of
  one with a separate context set-up, and the operator's dispatch is skipped.
* ``PortableSoftmaxForward``, ``PortableSoftmax`` with a forward-mode formula, for calls under
  ``torch.func.jvp`` / ``jacfwd`` or an eager forward-mode dual level. torch.compile cannot trace
  a jvp formula (other calls keep ``PortableSoftmax``), so under forward mode inside it the call
  is torch's own softmax, which carries the tangent.

The backwards run this package's gradient kernels through a second operator,
``portable_softmax::softmax_backward`` (fake kernel, vmap rule, and a double backward written in
torch ops), or directly on plain tensors outside transforms when no graph of the backward is recorded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from . import api
from ._dtypes import storage_name

NAME = "portable_softmax::softmax"
SCHEMA = "(Tensor x, int axis, str op, bool safe) -> Tensor"
BACKWARD_NAME = "portable_softmax::softmax_backward"
BACKWARD_SCHEMA = "(Tensor grad, Tensor y, int axis, str op) -> Tensor"
# Set once on the first call (torch is imported lazily). Module globals, not closures: torch.compile
# reads them through the autograd functions' forwards and backwards.
_operator = None  # torch.ops.portable_softmax.softmax.default
_functions: dict = {}  # route -> autograd function
_forward: Callable | None = None  # api._eager_forward: the direct path on a plain tensor
_backward_operator = None  # torch.ops.portable_softmax.softmax_backward.default
_registering = threading.Lock()
# torch once imported. A module global: torch.compile traces route(), and its wrapping of sys.modules
# (read while imports change it) failed with "dictionary changed size during iteration".
_torch = None
_library = None  # the torch.library.Library that holds the operator (registrations live as long as it)


def torch_module():
    """torch, if it is imported (else None); read from sys.modules only until it is."""
    global _torch
    if _torch is None:
        _torch = sys.modules.get("torch")
    return _torch


def route(x) -> str | None:
    """How a call on ``x`` goes: 'forward' where forward-mode AD may carry a tangent on it
    ('composite' inside torch.compile), 'autograd' for a plain torch tensor autograd records,
    'transform' for one it records inside a torch.func transform or torch.compile (or a fake or
    meta one), 'batched' for a vmapped tensor autograd does not record (outside torch.compile),
    'operator' for other tensors in those places; None for the rest."""
    torch = torch_module()  # not imported: x is no torch tensor
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    compiling = torch.compiler.is_compiling()  # first: torch.compile cannot trace the wrapper test
    if torch.autograd.forward_ad._current_level >= 0:  # a dual level: eager, torch.func.jvp, jacfwd
        # torch.compile drops an autograd function's jvp formula (pytorch#192985) and the operator has
        # none: there torch's own softmax carries the tangent
        return "composite" if compiling else "forward"
    # is_fake costs 2 us, and a fake tensor is of a subclass: a plain one skips it
    transformed = (compiling or torch._C._functorch.is_functorch_wrapped_tensor(x) or x.is_meta
                   or (type(x) is not torch.Tensor and torch._subclasses.fake_tensor.is_fake(x)))
    if x.requires_grad and torch.is_grad_enabled():
        return "transform" if transformed else "autograd"
    if transformed and not compiling and _in_live_vmap(torch, x):
        return "batched"
    return "operator" if transformed else None


def _in_live_vmap(torch, x) -> bool:
    """Whether ``x`` is batched by a vmap that is still running (not a tensor that escaped it)."""
    functorch = torch._C._functorch
    if not functorch.is_batchedtensor(x):
        return False
    current = functorch.maybe_current_level()
    return current is not None and functorch.maybe_get_level(x) <= current


def call(how: str, x, axis: int, op: str, safe: bool):
    """Softmax of ``x`` (axis normalised) the way ``route`` said."""
    if how == "composite":
        return _composite(torch_module(), x, axis, op, safe)
    if how == "batched":
        return _batched(torch_module(), x, axis, op, safe)
    if _operator is None:
        register()
    if how == "operator":
        return _operator(x, axis, op, safe)
    return _functions[how].apply(x, axis, op, safe)


def gradient_call(how: str, grad, y, axis: int, op: str):
    """softmax_backward / log_softmax_backward (axis normalised) of tensors that ``route`` sends
    through torch's machinery: the gradient operator's autograd function, with the double backward,
    jvp and vmap rules that the gradient of ps.softmax has (the operator registers no autograd of
    its own, so a torch.func transform that records none would see a constant)."""
    if how == "composite":  # torch.compile under forward-mode AD: only torch's operators carry a tangent
        return _composite_gradient(torch_module(), grad, y, axis, op)
    if _operator is None:
        register()
    compiling = torch_module().compiler.is_compiling()
    if compiling and how == "operator":  # nothing to record: the operator itself
        return _backward_operator(grad, y, axis, op)
    return _functions["backward_compiled" if compiling else "backward"].apply(grad, y, axis, op)


def _composite_gradient(torch, grad, y, axis: int, op: str):
    """The gradient in torch's operators, with the kernels' semantics (16-bit in float32; a
    log_softmax row with NaN in y NaN, of y all -inf 0)."""
    wide = grad.dtype if grad.element_size() >= 4 else torch.float32
    g, w = grad.to(wide), y.to(wide)
    if op == "softmax":
        return (w * (g - (g * w).sum(axis, keepdim=True))).to(grad.dtype)
    dx = g - w.exp() * g.sum(axis, keepdim=True)
    dx = dx.masked_fill(torch.isnan(w).any(axis, keepdim=True), float("nan"))
    return dx.masked_fill(torch.isneginf(w).all(axis, keepdim=True), 0).to(grad.dtype)


def register() -> None:
    """Register the operator and the autograd functions (once). The package does so on import when
    torch is imported already, so that a saved torch.export program that calls the operator loads;
    otherwise the first call with a tensor that needs them does."""
    with _registering:  # two threads' first calls: one registers, the other finds it done
        if _operator is None:
            _register()


def _register() -> None:
    global _operator, _forward, _torch, _library, _backward_operator
    import torch

    _torch, _forward = torch, api._eager_forward
    # torch.library's low-level form: the custom_op decorator's wrapper adds an alias check of the
    # result to every call (34 us of an H100 host's 90 a compiled call).
    _library = torch.library.Library("portable_softmax", "DEF")
    _library.define(f"softmax{SCHEMA}")
    _library.impl("softmax", _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(NAME, _fake_kernel, lib=_library)
    torch.library.register_vmap(NAME, _vmap_rule, lib=_library)
    # for the operator called alone (ps.softmax takes the autograd functions below)
    torch.library.register_autograd(NAME, _backward, setup_context=_setup_context, lib=_library)
    _library.define(f"softmax_backward{BACKWARD_SCHEMA}")
    _library.impl("softmax_backward", _backward_kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(BACKWARD_NAME, _backward_fake, lib=_library)
    torch.library.register_vmap(BACKWARD_NAME, _backward_vmap_rule, lib=_library)
    _backward_operator = torch.ops.portable_softmax.softmax_backward.default
    _functions["backward"] = _backward_function(torch)
    _functions["backward_compiled"] = _backward_function(torch, with_jvp=False)
    transform = _transform_function(torch)
    _functions.update(transform=transform, autograd=_eager_function(torch), forward=_forward_mode_function(transform))
    _operator = torch.ops.portable_softmax.softmax.default  # last: a set operator means all is ready


def _composite(torch, x, axis: int, op: str, safe: bool):
    """torch's own softmax / log_softmax with this package's semantics (a safe all -inf row gives 0,
    or -inf for log_softmax), for torch.compile under forward-mode AD, where only torch's operators
    carry a tangent."""
    f = torch.log_softmax if op == "log_softmax" else torch.softmax
    if not (safe and x.dim()):
        return f(x, axis)
    # the empty rows computed from zeros, so that no NaN reaches their (zero) derivatives
    empty = torch.isneginf(x).all(axis, keepdim=True)
    y = f(torch.where(empty, torch.zeros_like(x), x), axis)
    return torch.where(empty, torch.full_like(y, -float("inf") if op == "log_softmax" else 0.0), y)


def _batched(torch, x, axis: int, op: str, safe: bool):
    """vmap without the operator's dispatch (pytree flattening and a Python kernel at each of two
    levels, most of a vmapped call's 170 us): the batch taken apart with functorch's primitives,
    computed at once with the batch in front (the vmap rule's layout), and put back."""
    functorch = torch._C._functorch
    level = functorch.maybe_get_level(x)
    inner, batch_dim = functorch._unwrap_batched(x, level)
    inner = inner.movedim(batch_dim, 0)
    rows, rows_axis, unrow = _batch_rows(inner, axis)
    if inner.requires_grad and torch.is_grad_enabled():
        # autograd records underneath the batch (a leaf that requires grad, or torch.func.grad /
        # jacrev around the vmap): the autograd function with its own context set-up, the only
        # kind functorch takes while a vmap is active
        y = call("transform", rows, rows_axis, op, safe)
    else:  # the public entry points: the prepared launches; a lower vmap level comes back here
        y = (api.softmax if op == "softmax" else api.log_softmax)(rows, rows_axis, safe=safe)
    return functorch._add_batch_dim(unrow(y), 0, level)


def _batch_rows(batch_first, axis: int):
    """(rows, their axis, the inverse for the result) of a tensor whose batch leads and whose items
    reduce along ``axis``: a batch of 0-d items becomes rows of one."""
    if batch_first.dim() == 1:
        return batch_first.unsqueeze(1), 1, lambda y: y.squeeze(1)
    return batch_first, axis + 1, lambda y: y


def _kernel(x, axis, op, safe):
    y = _forward(x, axis, op, safe)
    return y if y.is_contiguous() else y.contiguous()  # the fake kernel's layout


def _fake_kernel(x, axis, op, safe):
    storage_name(x.dtype)  # the eager call's dtype error, at trace time
    return x.new_empty(x.shape)


def _vmap_rule(info, in_dims, x, axis, op, safe):
    batch_dim = in_dims[0]
    if batch_dim is None:
        return _operator(x, axis, op, safe), None
    rows, rows_axis, unrow = _batch_rows(x.movedim(batch_dim, 0), axis)
    return unrow(_operator(rows, rows_axis, op, safe)), 0


def _setup_context(ctx, inputs, output):
    x, axis, op, safe = inputs
    ctx.save_for_backward(output)
    ctx.axis, ctx.op, ctx.input_dtype, ctx.safe = axis, op, x.dtype, safe


def _zero_empty_rows(ctx, y, dim: int, derivative):
    """A safe log_softmax's rows of all -inf (constant there) get a zero derivative: torch's formula
    would pass the incoming one through, as exp(-inf) is 0."""
    if ctx.op == "log_softmax" and ctx.safe and y.dim():
        return derivative.masked_fill(torch_module().isneginf(y).all(dim, keepdim=True), 0)
    return derivative


def _setup_forward_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.save_for_forward(output)


def _backward(ctx, grad):
    (y,) = ctx.saved_tensors
    dim = ctx.axis if y.dim() else 0
    grad = grad.to(y.dtype)
    if route(grad) is None and route(y) is None:  # plain tensors, no graph of the backward recorded
        dx = _gradient(grad, y, dim, ctx.op)
    else:
        dx = _functions["backward"].apply(grad, y, dim, ctx.op)
    return dx, None, None, None


_bound = threading.local()  # the devices whose context this thread has bound


def _bind_device(t) -> None:
    """Bind the device's context on this thread once (torch's autograd thread for a device may hold
    none, and a gradient's kept launcher, built on another thread, launches through the driver)."""
    devices = _bound.__dict__.setdefault("devices", set())
    if not t.is_cuda or t.device.index in devices:
        return
    devices.add(t.device.index)
    from . import _probe

    try:
        rt = _probe.runtime("hip" if getattr(torch_module().version, "hip", None) else "cuda")
    except _probe.BackendUnavailableError:
        return  # the gradient takes torch's path, which binds its own
    rt.bind(t.device.index)


def _gradient(grad, y, dim: int, op: str):
    from ._backward import gradient_direct

    _bind_device(y)
    return gradient_direct(grad, y, dim, op)


def _backward_kernel(grad, y, axis, op):
    dx = _gradient(grad, y, axis, op)
    return dx if dx.is_contiguous() else dx.contiguous()  # the fake kernel's layout


def _backward_fake(grad, y, axis, op):
    storage_name(grad.dtype)
    return grad.new_empty(grad.shape)


def _backward_vmap_rule(info, in_dims, grad, y, axis, op):
    grad_dim, y_dim = in_dims[:2]
    if grad_dim is None and y_dim is None:
        return _backward_operator(grad, y, axis, op), None
    size = info.batch_size
    grad = grad.movedim(grad_dim, 0) if grad_dim is not None else grad.unsqueeze(0).expand(size, *grad.shape)
    y = y.movedim(y_dim, 0) if y_dim is not None else y.unsqueeze(0).expand(size, *y.shape)
    grad_rows, rows_axis, unrow = _batch_rows(grad, axis)
    y_rows = _batch_rows(y, axis)[0]
    return unrow(_backward_operator(grad_rows.contiguous(), y_rows.contiguous(), rows_axis, op)), 0


def _setup_backward_context(ctx, inputs, output):
    grad, y, axis, op = inputs
    ctx.save_for_backward(grad, y)
    ctx.save_for_forward(grad, y)
    ctx.axis, ctx.op = axis, op


def _backward_jvp(ctx, grad_tangent, y_tangent, *_):
    """Forward mode through the gradient (jacfwd of a gradient, hessian): the tangent of
    y (g - sum(g y)) or g - exp(y) sum(g) for tangents of g and y (None: zero)."""
    grad, y = ctx.saved_tensors
    dim = ctx.axis if y.dim() else 0
    wide = grad.dtype if grad.element_size() >= 4 else _torch.float32
    g, w = grad.to(wide), y.to(wide)
    tg = grad_tangent.to(wide) if grad_tangent is not None else _torch.zeros_like(g)
    ty = y_tangent.to(wide) if y_tangent is not None else _torch.zeros_like(w)
    if ctx.op == "softmax":
        out = ty * (g - (g * w).sum(dim, keepdim=True)) + w * (tg - (tg * w + g * ty).sum(dim, keepdim=True))
    else:
        e = w.exp()
        out = tg - e * ty * g.sum(dim, keepdim=True) - e * tg.sum(dim, keepdim=True)
        if y.dim():
            out = out.masked_fill(_torch.isneginf(w).all(dim, keepdim=True), 0)
    return out.to(grad.dtype)


def _double_backward(ctx, upstream):
    """The derivatives of dx = y (g - sum(g y)) (softmax) or g - exp(y) sum(g) (log_softmax) with
    respect to g and y, for an incoming v: softmax's g-part is its own backward of v; a log_softmax
    row of all -inf (safe, constant) has none."""
    grad, y = ctx.saved_tensors
    dim = ctx.axis if y.dim() else 0
    wide = grad.dtype if grad.element_size() >= 4 else _torch.float32
    g, w, v = grad.to(wide), y.to(wide), upstream.to(wide)
    if ctx.op == "softmax":
        d_grad = _functions["backward"].apply(upstream.to(y.dtype), y, dim, "softmax")
        d_y = v * (g - (g * w).sum(dim, keepdim=True)) - g * (v * w).sum(dim, keepdim=True)
        return d_grad, d_y.to(y.dtype), None, None
    e = w.exp()
    d_grad = v - (v * e).sum(dim, keepdim=True)
    d_y = -v * e * g.sum(dim, keepdim=True)
    if y.dim():
        empty = _torch.isneginf(w).all(dim, keepdim=True)
        d_grad, d_y = d_grad.masked_fill(empty, 0), d_y.masked_fill(empty, 0)
    return d_grad.to(grad.dtype), d_y.to(y.dtype), None, None


def _jvp(ctx, tangent, *_):
    """Forward mode: softmax's tangent y (t - sum(t y)), log_softmax's t - sum(t exp(y)), along the
    axis (16-bit in float32)."""
    (y,) = ctx.saved_tensors
    dim = ctx.axis if y.dim() else 0
    wide = y.float() if y.element_size() < 4 else y
    t = tangent.to(wide.dtype)
    if ctx.op == "softmax":
        out = wide * (t - (t * wide).sum(dim, keepdim=True))
    else:
        out = t - (t * wide.exp()).sum(dim, keepdim=True)
    return _zero_empty_rows(ctx, y, dim, out.to(y.dtype))


def _transform_function(torch):
    class PortableSoftmax(torch.autograd.Function):  # grad_fn: PortableSoftmaxBackward
        generate_vmap_rule = True  # the forward is the operator, which has a vmap rule
        setup_context = staticmethod(_setup_context)  # apart from forward: torch.func.grad takes it
        backward = staticmethod(_backward)

        @staticmethod
        def forward(x, axis, op, safe):
            return _operator(x.detach(), axis, op, safe)

    return PortableSoftmax


def _forward_mode_function(base):
    class PortableSoftmaxForward(base):  # grad_fn: PortableSoftmaxForwardBackward
        """PortableSoftmax with a forward-mode formula too (torch.compile cannot trace a jvp, so
        only calls under forward-mode AD take this one)."""

        setup_context = staticmethod(_setup_forward_context)
        jvp = staticmethod(_jvp)

    return PortableSoftmaxForward


def _eager_function(torch):
    class PortableSoftmaxEager(torch.autograd.Function):  # grad_fn: PortableSoftmaxEagerBackward
        backward = staticmethod(_backward)

        @staticmethod
        def forward(ctx, x, axis, op, safe):
            y = _forward(x.detach(), axis, op, safe)
            _setup_context(ctx, (x, axis, op, safe), y)
            return y

    return PortableSoftmaxEager


def _backward_function(torch, with_jvp: bool = True):
    class PortableSoftmaxGrad(torch.autograd.Function):  # grad_fn: PortableSoftmaxGradBackward
        """The gradient operator where autograd records it (double backward, torch.func, torch.compile:
        without the jvp, which torch.compile cannot trace)."""

        generate_vmap_rule = True  # the forward is the operator, which has a vmap rule
        setup_context = staticmethod(_setup_backward_context)
        backward = staticmethod(_double_backward)
        if with_jvp:
            jvp = staticmethod(_backward_jvp)

        @staticmethod
        def forward(grad, y, axis, op):
            return _backward_operator(grad.detach(), y.detach(), axis, op)

    return PortableSoftmaxGrad


api.register_torch(route, call, gradient_call)  # tensors that torch's machinery must see leave api's direct path here

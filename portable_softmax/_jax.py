"""JAX arrays inside jax.jit, jax.grad, jax.jvp and jax.vmap (tracers), and JAX arrays on a GPU.

A traced call binds one JAX primitive, ``portable_softmax``, whose lowering depends on the platform
XLA compiles for:

- CUDA and ROCm: the XLA FFI custom call of portable_softmax._jax_ffi, which launches the planned
  kernels on XLA's stream with XLA's workspace as scratch (no host round trip). Where the handler
  is not built, a host callback (``jax.pure_callback``) instead, with a one-time warning naming
  the build command;
- every other platform (CPU): the same computation in jax.numpy, which XLA compiles and fuses.

Differentiation goes through a custom JVP that is linear in the tangent, so JAX transposes it for
reverse mode: grad runs the gradient kernels (a second primitive, ``portable_softmax_grad``, the
same custom call with operands dy and y on a GPU, jax.numpy elsewhere); forward mode runs them too
for softmax, whose Jacobian is symmetric, and log_softmax's tangent t - sum(t exp(y)) in jax.numpy.
Where the GPU that JAX compiles for has a kernel of the gradient from the forward's input
(``planner_backward.plan_backward_from_input``: the last axis, rows held in registers), the JVP
keeps x instead of y (``portable_softmax_grad_from_input``, with log_softmax's tangent
``portable_softmax_log_tangent_from_input``): under jax.grad the forward's output is then unused
and XLA drops its call, so the gradient is one call reading dy and x once. The choice is
made when the JVP is traced (``takes_input_path``); without a GPU runtime the gradient keeps y.
vmap moves the batch dimension to the front, where it joins the rows (the axis is counted from the
end). A row-sharded input runs per shard under ``jax.shard_map`` (each shard its own custom call);
without it XLA gathers the operand of a custom call it cannot partition. A concrete JAX array on a
GPU where the FFI targets are registered takes the same primitive through jax.jit (compiled once
per shape and dtype).

>>> import jax, jax.numpy as jnp, portable_softmax as ps
>>> jax.jit(ps.softmax)(jnp.array([0.0, 0.0]))
Array([0.5, 0.5], dtype=float32)
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax_ffi, api
from ._dtypes import storage_name
from .layout import describe, normalize_axis

_traced = None  # the custom-JVP function over the primitives, built on the first traced call
#: (forward, gradient, log_softmax tangent, gradient from x, log_softmax tangent from x)
_primitives = None
#: (axis, op, safe), or ("gradient", axis, op) -> the jitted call that concrete GPU arrays take
_eager: dict[tuple, object] = {}
#: (vendor, shape, dtype, axis, op, safe) -> whether the JVP keeps x (takes_input_path)
_input_paths: dict[tuple, bool] = {}


def is_tracer(x) -> bool:
    """Whether x goes through JAX's own machinery: a JAX tracer (jit, grad, vmap pass these for
    arrays), or a concrete JAX array on a GPU whose FFI targets are registered (eager calls take
    the compiled custom call too). Found without importing JAX for other types."""
    kind = type(x)
    if not kind.__module__.startswith(("jax", "jaxlib")):
        return False
    if _is_traced(x):
        return True
    return _on_registered_gpu(x)


def _on_registered_gpu(x) -> bool:
    try:
        devices = x.devices()
    except (AttributeError, RuntimeError):  # deleted or not an array
        return False
    if len(devices) != 1:
        return False
    vendor = _jax_ffi.vendor_of(next(iter(devices)))
    return vendor is not None and _jax_ffi.library_path(vendor) is not None and _jax_ffi.register(vendor) is None


def traced(x, axis, op: str, safe: bool, out):
    """softmax / log_softmax of a tracer (or of a concrete GPU array, through jax.jit) as a JAX value."""
    concrete = not _is_traced(x)
    if out is not None:
        what = "JAX array on a GPU, which runs as a compiled JAX call," if concrete else "traced JAX array"
        raise ValueError(f"out= cannot take the {op} of a {what} (JAX arrays are immutable); "
                         "use the returned array")
    storage_name(x.dtype)  # the eager call's dtype error, at trace time
    axis = normalize_axis(axis, x.ndim)
    if concrete:
        return _eager_call(axis - x.ndim, op, bool(safe))(x)
    import jax.numpy as jnp

    if x.ndim == 0:  # softmax of a single value: 1 (log_softmax 0), whatever it is
        return jnp.ones_like(x) if op == "softmax" else jnp.zeros_like(x)
    if x.size == 0:
        return jnp.zeros_like(x)
    global _traced
    if _traced is None:
        _traced = _build()
    return _traced(x, axis - x.ndim, op, bool(safe))  # from the end: vmap adds leading dims


def _is_traced(x) -> bool:
    return any(c.__name__ == "Tracer" for c in type(x).__mro__)


def traced_gradient(dy, y, axis, op: str, out):
    """softmax_backward / log_softmax_backward of tracers (or of concrete GPU arrays, through
    jax.jit) as a JAX value: the gradient primitive that jax.grad of softmax runs, so the gradient
    kernels' custom call on CUDA and ROCm and jax.numpy on the CPU, with its vmap, JVP and transpose."""
    from ._backward import _named, check_shapes_and_dtypes, unsupported_dtypes

    name = f"{op}_backward"
    if not all(type(a).__module__.startswith(("jax", "jaxlib")) for a in (dy, y)):
        raise TypeError(f"dy and y must be arrays of one type; got {_named(dy)} and {_named(y)}")
    concrete = not (_is_traced(dy) or _is_traced(y))
    if out is not None:
        what = "JAX arrays on a GPU, which run as a compiled JAX call," if concrete else "traced JAX arrays"
        raise ValueError(f"out= cannot take the {name} of {what} (JAX arrays are immutable); "
                         "use the returned array")
    try:
        dtypes = storage_name(dy.dtype), storage_name(y.dtype)
    except TypeError:
        raise unsupported_dtypes(op, dy, y) from None
    check_shapes_and_dtypes(dy.shape, y.shape, *dtypes)
    axis = normalize_axis(axis, dy.ndim) - dy.ndim  # from the end: vmap adds leading dims
    if dy.ndim == 0 or dy.size == 0:  # the gradient of a constant (softmax of one value), or nothing
        import jax.numpy as jnp

        return jnp.zeros_like(dy)
    if concrete:
        key = ("gradient", axis, op)
        fn = _eager.get(key)
        if fn is None:
            import jax

            fn = _eager[key] = jax.jit(lambda d, w: traced_gradient(d, w, axis, op, None))
        return fn(dy, y)
    return _made_primitives()[1].bind(dy, y, axis=axis, op=op)


def _made_primitives():
    global _primitives
    if _primitives is None:
        _primitives = _make_primitives()
    return _primitives


def _eager_call(axis: int, op: str, safe: bool):
    key = (axis, op, safe)
    fn = _eager.get(key)
    if fn is None:
        import jax

        fn = _eager[key] = jax.jit(lambda a: traced(a, axis, op, safe, None))
    return fn


def reference_jnp(x, axis: int, op: str, safe: bool):
    """softmax / log_softmax in jax.numpy with the package's semantics: 16-bit inputs in float32,
    a NaN or +inf in a row gives NaN there, a row of all -inf NaN (0, or -inf for log_softmax, with safe)."""
    import jax
    import jax.numpy as jnp

    wide = jnp.promote_types(x.dtype, jnp.float32)
    a = x.astype(wide)
    m = jax.lax.stop_gradient(jnp.max(a, axis=axis, keepdims=True))
    shifted = a - m
    if op == "softmax":
        e = jnp.exp(shifted)
        y = e / jnp.sum(e, axis=axis, keepdims=True)
        empty = 0.0
    else:
        y = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))
        empty = -jnp.inf
    if safe:
        y = jnp.where(jnp.isneginf(m), empty, y)
    return y.astype(x.dtype)


def _host(x, axis: int, op: str, safe: bool):
    """The host callback: the package on the concrete array (the GPU through staging where present)."""
    import jax

    def compute(a):
        return api._apply(np.asarray(a), axis, op, None, safe)

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    # expand_dims: a vmapped call passes one array with the batch in front, computed at once
    return jax.pure_callback(compute, shape, x, vmap_method="expand_dims")


def _make_primitives():
    """The forward primitive, the gradient primitive (dx from dy and y, linear in dy) and log_softmax's
    tangent map (linear in t), the transpose of the gradient's: their lowerings, vmap, JVP and
    transpose rules."""
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    forward = Primitive("portable_softmax")
    forward.def_impl(functools.partial(_apply_jitted, forward))
    forward.def_abstract_eval(lambda x, *, axis, op, safe: x)  # y: the shape and dtype of x
    grad = Primitive("portable_softmax_grad")
    grad.def_impl(functools.partial(_apply_jitted, grad))
    grad.def_abstract_eval(lambda dy, y, *, axis, op: dy)
    tangent = Primitive("portable_softmax_log_tangent")
    tangent.def_impl(functools.partial(_apply_jitted, tangent))
    tangent.def_abstract_eval(lambda t, y, *, axis: t)
    # the same maps from the forward's input x in place of y
    grad_x = Primitive("portable_softmax_grad_from_input")
    grad_x.def_impl(functools.partial(_apply_jitted, grad_x))
    grad_x.def_abstract_eval(lambda dy, x, *, axis, op, safe: dy)
    tangent_x = Primitive("portable_softmax_log_tangent_from_input")
    tangent_x.def_impl(functools.partial(_apply_jitted, tangent_x))
    tangent_x.def_abstract_eval(lambda t, x, *, axis, safe: t)

    def front(x, d, size):  # the batch in front, where it joins the rows (the axis counts from the end)
        if d is None:
            return jnp.broadcast_to(x, (size, *x.shape))
        return x if d == 0 else jnp.moveaxis(x, d, 0)

    def batcher(prim):
        def batch(args, dims, **params):
            size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
            return prim.bind(*[front(a, d, size) for a, d in zip(args, dims)], **params), 0

        return batch

    for prim in (forward, grad, tangent, grad_x, tangent_x):
        batching.primitive_batchers[prim] = batcher(prim)

    # grad is linear in dy; its transpose is itself for softmax (the Jacobian is symmetric) and the
    # log_softmax tangent map for log_softmax, whose transpose is grad again.
    def transpose_grad(ct, dy, y, *, axis, op):
        if type(ct) is ad.Zero:
            return [ad.Zero(dy.aval), None]
        if op == "softmax":
            return [grad.bind(ct, y, axis=axis, op=op), None]
        return [tangent.bind(ct, y, axis=axis), None]

    def transpose_tangent(ct, t, y, *, axis):
        if type(ct) is ad.Zero:
            return [ad.Zero(t.aval), None]
        return [grad.bind(ct, y, axis=axis, op="log_softmax"), None]

    ad.primitive_transposes[grad] = transpose_grad
    ad.primitive_transposes[tangent] = transpose_tangent
    ad.defjvp(grad, lambda g, dy, y, *, axis, op: grad.bind(g, y, axis=axis, op=op),
              lambda g, dy, y, *, axis, op: _grad_by_y(g, dy, y, axis, op))
    ad.defjvp(tangent, lambda g, t, y, *, axis: tangent.bind(g, y, axis=axis),
              lambda g, t, y, *, axis: _tangent_by_y(g, t, y, axis))

    # the same from x: grad_x's transpose is itself for softmax, tangent_x for log_softmax
    def transpose_grad_x(ct, dy, x, *, axis, op, safe):
        if type(ct) is ad.Zero:
            return [ad.Zero(dy.aval), None]
        if op == "softmax":
            return [grad_x.bind(ct, x, axis=axis, op=op, safe=safe), None]
        return [tangent_x.bind(ct, x, axis=axis, safe=safe), None]

    def transpose_tangent_x(ct, t, x, *, axis, safe):
        if type(ct) is ad.Zero:
            return [ad.Zero(t.aval), None]
        return [grad_x.bind(ct, x, axis=axis, op="log_softmax", safe=safe), None]

    ad.primitive_transposes[grad_x] = transpose_grad_x
    ad.primitive_transposes[tangent_x] = transpose_tangent_x
    ad.defjvp(grad_x, lambda g, dy, x, **params: grad_x.bind(g, x, **params),
              lambda g, dy, x, **params: _by_x(grad_from_input_jnp, g, dy, x, params))
    ad.defjvp(tangent_x, lambda g, t, x, **params: tangent_x.bind(g, x, **params),
              lambda g, t, x, **params: _by_x(log_tangent_from_input_jnp, g, t, x, params))

    def jnp_rule(fn):
        def rule(ctx, *args, **params):
            return mlir.lower_fun(functools.partial(fn, **params), multiple_results=False)(ctx, *args)

        return rule

    def on_gpu(vendor, kind):
        def rule(ctx, *args, axis, op, safe=False):
            why = _jax_ffi.register(vendor)
            if why is not None:  # the forward goes to the host; a gradient is as good in jax.numpy
                if kind == "backward":
                    return jnp_rule(grad_jnp)(ctx, *args, axis=axis, op=op)
                if kind == "backward_from_input":
                    return jnp_rule(grad_from_input_jnp)(ctx, *args, axis=axis, op=op, safe=safe)
                _jax_ffi.warn_once(why)
                return jnp_rule(_host)(ctx, *args, axis=axis, op=op, safe=safe)
            aval = ctx.avals_in[0]
            if kind == "backward_from_input" and not _jax_ffi.kernels_take_from_input(
                    vendor, aval.shape, aval.dtype, axis, op, safe):
                return jnp_rule(grad_from_input_jnp)(ctx, *args, axis=axis, op=op, safe=safe)
            target, attributes, workspace = _jax_ffi.custom_call(vendor, aval.shape, aval.dtype, axis, op, safe,
                                                                 kind)
            return custom_call_lowering(ctx, args, target, attributes, workspace)

        return rule

    # every platform without a rule of its own (CPU) computes in jax.numpy, which XLA compiles
    mlir.register_lowering(forward, jnp_rule(reference_jnp))
    mlir.register_lowering(grad, jnp_rule(grad_jnp))
    mlir.register_lowering(tangent, jnp_rule(log_tangent_jnp))
    mlir.register_lowering(grad_x, jnp_rule(grad_from_input_jnp))
    mlir.register_lowering(tangent_x, jnp_rule(log_tangent_from_input_jnp))
    for platform, vendor in _jax_ffi.VENDORS.items():
        mlir.register_lowering(forward, on_gpu(vendor, "forward"), platform=platform)
        mlir.register_lowering(grad, on_gpu(vendor, "backward"), platform=platform)
        mlir.register_lowering(grad_x, on_gpu(vendor, "backward_from_input"), platform=platform)
    return forward, grad, tangent, grad_x, tangent_x


def _wide(*arrays):
    """The arrays in the compute type: float32 for 16-bit, float64 for float64."""
    import jax.numpy as jnp

    wide = jnp.promote_types(arrays[0].dtype, jnp.float32)
    return [a.astype(wide) for a in arrays]


def grad_jnp(dy, y, *, axis: int, op: str):
    """dx from dy and y in jax.numpy, as the gradient kernels compute it: softmax's y (dy - sum(dy y)),
    log_softmax's dy - exp(y) sum(dy), NaN on a row with NaN in y (softmax's sum carries it), zero on
    a row of y all -inf (a safe log_softmax's constant)."""
    import jax.numpy as jnp

    d, w = _wide(dy, y)
    if op == "softmax":
        dx = w * (d - jnp.sum(d * w, axis=axis, keepdims=True))
    else:
        dx = d - jnp.exp(w) * jnp.sum(d, axis=axis, keepdims=True)
        dx = jnp.where(jnp.isnan(w).any(axis=axis, keepdims=True), jnp.nan, dx)
        dx = jnp.where(jnp.isneginf(w).all(axis=axis, keepdims=True), 0.0, dx)
    return dx.astype(dy.dtype)


def log_tangent_jnp(t, y, *, axis: int):
    """log_softmax's tangent t - sum(t exp(y)) (the transpose of its gradient), zero on a row of y all -inf."""
    import jax.numpy as jnp

    s, w = _wide(t, y)
    dt = s - jnp.sum(s * jnp.exp(w), axis=axis, keepdims=True)
    return jnp.where(jnp.isneginf(w).all(axis=axis, keepdims=True), 0.0, dt).astype(t.dtype)


def _grad_by_y(g, dy, y, axis: int, op: str):
    """The gradient's derivative along a change g of y (second-order derivatives)."""
    import jax.numpy as jnp

    d, w, h = _wide(dy, y, g)
    if op == "softmax":
        out = h * (d - jnp.sum(d * w, axis=axis, keepdims=True)) - w * jnp.sum(d * h, axis=axis, keepdims=True)
    else:
        out = -jnp.exp(w) * h * jnp.sum(d, axis=axis, keepdims=True)
        out = jnp.where(jnp.isneginf(w).all(axis=axis, keepdims=True), 0.0, out)
    return out.astype(dy.dtype)


def _tangent_by_y(g, t, y, axis: int):
    """log_softmax's tangent map's derivative along a change g of y."""
    import jax.numpy as jnp

    s, w, h = _wide(t, y, g)
    out = -jnp.sum(s * jnp.exp(w) * h, axis=axis, keepdims=True) * jnp.ones_like(s)
    return jnp.where(jnp.isneginf(w).all(axis=axis, keepdims=True), 0.0, out).astype(t.dtype)


def _softmax_of_input(x, axis: int, safe: bool):
    """softmax(x) in the compute type (_wide), and whether each row of x is all -inf; with safe such a
    row's softmax is 0 (without, NaN)."""
    import jax
    import jax.numpy as jnp

    (a,) = _wide(x)
    m = jax.lax.stop_gradient(jnp.max(a, axis=axis, keepdims=True))  # the shift cancels: no derivative
    e = jnp.exp(a - m)
    p = e / jnp.sum(e, axis=axis, keepdims=True)
    empty = jnp.isneginf(m)
    return (jnp.where(empty, 0.0, p) if safe else p), empty


def grad_from_input_jnp(dy, x, *, axis: int, op: str, safe: bool):
    """dx from dy and the forward's input x in jax.numpy, as the kernels from x compute it: with
    p = softmax(x), softmax's p (dy - sum(dy p)), log_softmax's dy - p sum(dy). A row of x all -inf
    gets 0 with safe, NaN without; NaN in a row of x or dy makes it NaN."""
    import jax.numpy as jnp

    p, empty = _softmax_of_input(x, axis, safe)
    (d,) = _wide(dy)
    if op == "softmax":
        dx = p * (d - jnp.sum(d * p, axis=axis, keepdims=True))
    else:
        dx = d - p * jnp.sum(d, axis=axis, keepdims=True)
        if safe:
            dx = jnp.where(empty, 0.0, dx)
    return dx.astype(dy.dtype)


def log_tangent_from_input_jnp(t, x, *, axis: int, safe: bool):
    """log_softmax's tangent t - sum(t softmax(x)) (the transpose of its gradient from x); a row of
    x all -inf gets 0 with safe, NaN without."""
    import jax.numpy as jnp

    p, empty = _softmax_of_input(x, axis, safe)
    (s,) = _wide(t)
    dt = s - jnp.sum(s * p, axis=axis, keepdims=True)
    return (jnp.where(empty, 0.0, dt) if safe else dt).astype(t.dtype)


def _by_x(formula, g, v, x, params: dict):
    """A map from x's derivative along a change g of x (second-order derivatives): the JVP of its
    jax.numpy formula."""
    import jax

    return jax.jvp(lambda a: formula(v, a, **params), (x,), (g.astype(x.dtype),))[1]


def takes_input_path(shape: tuple[int, ...], dtype, axis: int, op: str, safe: bool, profile) -> bool:
    """Whether the gradient of ``op`` along ``axis`` of a C-contiguous array of ``shape`` and
    ``dtype`` keeps the forward's input x, on a GPU of ``profile`` (a planner.DeviceProfile): where
    the axis is the last and planner_backward plans the fused kernel for these rows."""
    from .planner import PlanError
    from .planner_backward import plan_backward_from_input

    ndim = len(shape)
    if ndim == 0 or axis % ndim != ndim - 1:
        return False
    layout = describe(tuple(shape), _jax_ffi.contiguous_strides(tuple(shape)), ndim - 1)
    name = storage_name(dtype if isinstance(dtype, str) else np.dtype(dtype))
    problem = _jax_ffi.from_input_problem(name, op, safe, layout)
    try:
        return plan_backward_from_input(problem, profile) is not None
    except PlanError:
        return False


def gpu_vendor() -> str | None:
    """The runtime vendor ('cuda' or 'hip') of the device JAX compiles for by default, or None where
    that is not a GPU."""
    import jax

    return _jax_ffi.vendor_of(jax.devices()[0])


def _input_path(x, axis: int, op: str, safe: bool) -> bool:
    """takes_input_path on the reference profile of the GPU runtime that the call lowers for
    (_jax_ffi plans on the same one), cached; False without a GPU (jax.numpy computes either path)."""
    vendor = gpu_vendor()
    if vendor is None:
        return False
    key = (vendor, tuple(x.shape), storage_name(x.dtype), axis, op, safe)
    found = _input_paths.get(key)
    if found is None:
        from . import _probe

        try:
            profile = _probe.runtime(vendor).profile(0)
        except _probe.BackendUnavailableError:
            found = False
        else:
            found = takes_input_path(tuple(x.shape), x.dtype, axis, op, safe, profile)
        _input_paths[key] = found
    return found


def custom_call_lowering(ctx, operands, target: str, attributes: dict, workspace: int):
    """The FFI custom call with results (the output, a uint8 workspace of ``workspace`` bytes); the
    output alone is returned."""
    import jax

    scratch = ctx.avals_out[0].update(shape=(workspace,), dtype=np.dtype(np.uint8), weak_type=False)
    with_workspace = ctx.replace(avals_out=[*ctx.avals_out, scratch])
    return jax.ffi.ffi_lowering(target)(with_workspace, *operands, **attributes)[:1]


def _apply_jitted(prim, *args, **params):
    """A primitive applied to concrete arrays (outside jit): compiled by jax.jit like any other."""
    import jax

    return jax.jit(functools.partial(prim.bind, **params))(*args)


def _build():
    import jax
    import jax.numpy as jnp

    forward, grad, tangent, grad_x, tangent_x = _made_primitives()

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
    def softmax(x, axis, op, safe):
        y = forward.bind(x, axis=axis, op=op, safe=safe)
        if op == "log_softmax" and safe:  # the kernels give NaN for a row of all -inf; safe asks for -inf
            y = jnp.where(jnp.isneginf(x).all(axis=axis, keepdims=True), -jnp.inf, y)
        return y

    @softmax.defjvp
    def jvp(axis, op, safe, primals, tangents):
        # Linear in the tangent, with y from the forward, so JAX transposes it for reverse mode into
        # the gradient kernels: softmax's tangent y (t - sum(t y)) is its own gradient (the Jacobian
        # is symmetric); log_softmax's t - sum(t exp(y)) transposes to g - exp(y) sum(g). From x
        # where a kernel of the gradient from x is planned: y is then left unused under jax.grad.
        (x,), (t,) = primals, tangents
        y = softmax(x, axis, op, safe)
        t = t.astype(y.dtype)
        if _input_path(x, axis, op, safe):
            if op == "softmax":
                return y, grad_x.bind(t, x, axis=axis, op=op, safe=safe)
            return y, tangent_x.bind(t, x, axis=axis, safe=safe)
        if op == "softmax":
            return y, grad.bind(t, y, axis=axis, op=op)
        return y, tangent.bind(t, y, axis=axis)

    return softmax


api.register_jax(is_tracer, traced, traced_gradient)  # JAX tracers and JAX GPU arrays leave api's direct path here

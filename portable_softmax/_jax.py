"""JAX arrays inside jax.jit, jax.grad, jax.jvp and jax.vmap (tracers), and JAX arrays on a GPU.

A traced call binds one JAX primitive, ``portable_softmax``, whose lowering depends on the platform
XLA compiles for:

- CUDA and ROCm: the XLA FFI custom call of portable_softmax._jax_ffi, which launches the planned
  kernels on XLA's stream with XLA's workspace as scratch (no host round trip). Where the handler
  is not built, a host callback (``jax.pure_callback``) instead, with a one-time warning naming
  the build command;
- every other platform (CPU): the same computation in jax.numpy, which XLA compiles and fuses.

Differentiation goes through a custom JVP written in jax.numpy, linear in the tangent, so JAX
transposes it for reverse mode (grad); vmap moves the batch dimension to the front, where it joins
the rows (the axis is counted from the end). A concrete JAX array on a GPU where the FFI targets
are registered takes the same primitive through jax.jit (compiled once per shape and dtype).

>>> import jax, jax.numpy as jnp, portable_softmax as ps
>>> jax.jit(ps.softmax)(jnp.array([0.0, 0.0]))
Array([0.5, 0.5], dtype=float32)
"""

from __future__ import annotations

import functools

import numpy as np

from . import _jax_ffi
from ._dtypes import storage_name
from .layout import normalize_axis

_traced = None  # the custom-JVP function over the primitive, built on the first traced call
_primitive = None
#: (axis, op, safe) -> the jitted call that concrete GPU arrays take
_eager: dict[tuple, object] = {}


def is_tracer(x) -> bool:
    """Whether x goes through JAX's own machinery: a JAX tracer (jit, grad, vmap pass these for
    arrays), or a concrete JAX array on a GPU whose FFI targets are registered (eager calls take
    the compiled custom call too). Found without importing JAX for other types."""
    kind = type(x)
    if not kind.__module__.startswith(("jax", "jaxlib")):
        return False
    if any(c.__name__ == "Tracer" for c in kind.__mro__):
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
    concrete = not any(c.__name__ == "Tracer" for c in type(x).__mro__)
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

    from .api import _apply

    def compute(a):
        return _apply(np.asarray(a), axis, op, None, safe)

    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    # expand_dims: a vmapped call passes one array with the batch in front, computed at once
    return jax.pure_callback(compute, shape, x, vmap_method="expand_dims")


def _make_primitive():
    import jax
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    prim = Primitive("portable_softmax")
    prim.def_impl(functools.partial(_apply_jitted, prim))
    prim.def_abstract_eval(lambda x, *, axis, op, safe: x)  # y: the shape and dtype of x

    def batch(args, dims, *, axis, op, safe):
        (x,), (d,) = args, dims
        if d != 0:  # the batch joins the rows in front; the axis counts from the end
            x = jax.numpy.moveaxis(x, d, 0)
        return prim.bind(x, axis=axis, op=op, safe=safe), 0

    batching.primitive_batchers[prim] = batch

    def on_cpu(ctx, x, *, axis, op, safe):
        return mlir.lower_fun(functools.partial(reference_jnp, axis=axis, op=op, safe=safe),
                              multiple_results=False)(ctx, x)

    def on_gpu(vendor):
        def rule(ctx, x, *, axis, op, safe):
            aval = ctx.avals_in[0]
            why = _jax_ffi.register(vendor)
            if why is not None:
                _jax_ffi.warn_once(why)
                return mlir.lower_fun(functools.partial(_host, axis=axis, op=op, safe=safe),
                                      multiple_results=False)(ctx, x)
            target, attributes, workspace = _jax_ffi.custom_call(vendor, aval.shape, aval.dtype, axis, op, safe)
            return custom_call_lowering(ctx, x, target, attributes, workspace)

        return rule

    mlir.register_lowering(prim, on_cpu)  # every platform without a rule of its own
    for platform, vendor in _jax_ffi.VENDORS.items():
        mlir.register_lowering(prim, on_gpu(vendor), platform=platform)
    return prim


def custom_call_lowering(ctx, x, target: str, attributes: dict, workspace: int):
    """The FFI custom call with results (y, a uint8 workspace of ``workspace`` bytes); y alone is returned."""
    import jax

    scratch = ctx.avals_out[0].update(shape=(workspace,), dtype=np.dtype(np.uint8), weak_type=False)
    with_workspace = ctx.replace(avals_out=[*ctx.avals_out, scratch])
    return jax.ffi.ffi_lowering(target)(with_workspace, x, **attributes)[:1]


def _apply_jitted(prim, x, *, axis, op, safe):
    """The primitive applied to a concrete array (outside jit): compiled by jax.jit like any other."""
    import jax

    return jax.jit(functools.partial(prim.bind, axis=axis, op=op, safe=safe))(x)


def _build():
    import jax
    import jax.numpy as jnp

    global _primitive
    if _primitive is None:
        _primitive = _make_primitive()
    prim = _primitive

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
    def softmax(x, axis, op, safe):
        y = prim.bind(x, axis=axis, op=op, safe=safe)
        if op == "log_softmax" and safe:  # the kernels give NaN for a row of all -inf; safe asks for -inf
            y = jnp.where(jnp.isneginf(x).all(axis=axis, keepdims=True), -jnp.inf, y)
        return y

    @softmax.defjvp
    def tangent(axis, op, safe, primals, tangents):
        # Linear in the tangent, with y from the primitive, so JAX transposes it for reverse mode:
        # softmax's y (t - sum(t y)) (J is symmetric), log_softmax's t - sum(t exp(y)), whose
        # transpose g - exp(y) sum(g) is the usual backward. In float32 for 16-bit values.
        (x,), (t,) = primals, tangents
        y = softmax(x, axis, op, safe)
        wide = jnp.promote_types(y.dtype, jnp.float32)
        y32, t32 = y.astype(wide), t.astype(wide)
        if op == "softmax":
            dy = y32 * (t32 - jnp.sum(t32 * y32, axis=axis, keepdims=True))
        else:
            dy = t32 - jnp.sum(t32 * jnp.exp(y32), axis=axis, keepdims=True)
            if safe:  # a safe log_softmax's rows of all -inf are constant: a zero tangent there
                dy = jnp.where(jnp.isneginf(y32).all(axis=axis, keepdims=True), 0.0, dy)
        return y, dy.astype(y.dtype)

    return softmax

"""JAX arrays inside jax.jit, jax.grad, jax.jvp and jax.vmap (tracers, not values).

The call becomes a host callback (``jax.pure_callback``) that runs this package on the concrete
array once the program runs, with a custom JVP written in jax.numpy (JAX transposes it for
reverse mode), so jit, grad, jvp, vmap and their compositions go through it. The callback
computes on the host backend (the GPU through staging where one is present): a JAX array on a GPU
makes a round trip through host memory inside a jitted program. Concrete JAX arrays outside
transformations keep the direct path.
"""

from __future__ import annotations

import functools

import numpy as np

from ._dtypes import storage_name
from .layout import normalize_axis

_traced = None  # the custom-JVP function, built on the first traced call


def is_tracer(x) -> bool:
    """A JAX tracer (jit, grad, vmap pass these for arrays); found without importing JAX."""
    return type(x).__module__.startswith("jax") and any(c.__name__ == "Tracer" for c in type(x).__mro__)


def traced(x, axis, op: str, safe: bool, out):
    """softmax / log_softmax of a tracer, as a traced JAX value."""
    if out is not None:
        raise ValueError(f"out= cannot take the {op} of a traced JAX array (JAX arrays are immutable); "
                         "use the returned array")
    storage_name(x.dtype)  # the eager call's dtype error, at trace time
    axis = normalize_axis(axis, x.ndim)
    if x.ndim == 0:  # softmax of a single value: 1 (log_softmax 0), whatever it is
        import jax.numpy as jnp

        return jnp.ones_like(x) if op == "softmax" else jnp.zeros_like(x)
    global _traced
    if _traced is None:
        _traced = _build()
    return _traced(x, axis - x.ndim, op, safe)  # from the end: vmap adds leading dims


def _build():
    import jax
    import jax.numpy as jnp

    from .api import _apply

    def on_host(x, axis, op, safe):
        def compute(a):
            return _apply(np.asarray(a), axis, op, None, safe)

        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        # expand_dims: a vmapped call passes one array with the batch in front, computed at once
        return jax.pure_callback(compute, shape, x, vmap_method="expand_dims")

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
    def softmax(x, axis, op, safe):
        return on_host(x, axis, op, safe)

    @softmax.defjvp
    def tangent(axis, op, safe, primals, tangents):
        # Linear in the tangent, with y from the callback, so JAX transposes it for reverse mode:
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

"""JAX inside jax.jit: the FFI custom call on CUDA / ROCm, jax.numpy on CPU, and the handler's build.

Without a GPU: the StableHLO lowered for cuda and rocm holds the custom call with the plan as its
attributes (planned on a stand-in runtime with an H100's profile), the CPU lowering holds no callback
and matches jax.nn in values, gradients and vmap, the gradient from the forward's input x (its
jax.numpy formula, its transposes and derivatives, and the choice of it) matches jax.nn and a float64
reference, and the handler compiles against the local jaxlib headers. On a GPU (``pytest -m gpu
tests/test_jax_ffi.py``): values against the float64 reference, gradients against jax.nn, vmap, a
jitted two-layer model, eager arrays through the compiled call, and the compiled HLO holding the
custom call (one under jax.grad where the gradient from x is planned) and no host callback.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from checks import assert_matches, gradient_reference, random_input

import portable_softmax as ps
from portable_softmax import _jax, _jax_ffi, _probe, _tolerance
from portable_softmax.api import problem_for
from portable_softmax.layout import describe
from portable_softmax.planner import DeviceProfile, one_wave, plan, resident_launch
from portable_softmax.planner_backward import GradRowProblem, plan_backward, plan_backward_from_input

jax = pytest.importorskip("jax", reason="jax is not installed")
jnp = jax.numpy

REPO = Path(__file__).resolve().parents[1]
OPS = ("softmax", "log_softmax")
#: where values of the lowering tests run: their stand-in runtime's kernels exist on no device
CPU = jax.devices("cpu")[0]


# ---- CPU: jax.numpy, no callback --------------------------------------------------------------
def _cpu_text(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cpu",)).as_text()


@pytest.mark.parametrize("op", OPS)
def test_cpu_lowering_is_jax_numpy_without_a_callback(op):
    text = _cpu_text(getattr(ps, op), jax.ShapeDtypeStruct((8, 33), jnp.float32))
    assert "callback" not in text and "custom_call" not in text, text
    assert "stablehlo.exponential" in text and "stablehlo.reduce" in text


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cpu_values_match_the_float64_reference(rng, op, dtype):
    x = random_input(rng, (6, 4, 33), dtype)
    for axis in (-1, 1, 0):
        y = jax.jit(lambda t, a=axis: getattr(ps, op)(t, axis=a))(jnp.asarray(x))
        assert y.dtype == jnp.dtype(dtype)
        assert_matches(np.asarray(y), x, axis=axis, op=op)


def test_cpu_semantics_of_special_rows():
    rows = jnp.array([[-jnp.inf, -jnp.inf], [jnp.nan, 0.0], [jnp.inf, 0.0], [0.0, 1.0]])
    y = jax.jit(ps.softmax)(rows)
    assert np.isnan(y[:3]).all() and np.allclose(y[3], jax.nn.softmax(rows[3]))
    assert jax.jit(lambda t: ps.softmax(t, safe=True))(rows)[0].tolist() == [0.0, 0.0]
    assert jax.jit(lambda t: ps.log_softmax(t, safe=True))(rows)[0].tolist() == [-np.inf, -np.inf]
    assert np.isnan(jax.jit(ps.log_softmax)(rows)[0]).all()


@pytest.mark.parametrize("op", OPS)
def test_cpu_grads_vmap_and_jvp_match_jax_nn(op):
    ours, theirs = getattr(ps, op), getattr(jax.nn, op)
    x = 3 * jax.random.normal(jax.random.key(5), (5, 3, 12))
    w = jax.random.normal(jax.random.key(6), (5, 3, 12))
    for axis in (-1, 1):
        g = jax.jit(jax.grad(lambda t, a=axis: (ours(t, axis=a) * w).sum()))(x)
        ref = jax.grad(lambda t, a=axis: (theirs(t, axis=a) * w).sum())(x)
        np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-5)
    v = jax.jit(jax.vmap(lambda t: ours(t, axis=0), in_axes=2, out_axes=2))(x)
    np.testing.assert_allclose(v, theirs(x, axis=0), atol=1e-6, rtol=1e-5)
    _, tangent = jax.jvp(ours, (x,), (w,))
    _, ref_tangent = jax.jvp(theirs, (x,), (w,))
    np.testing.assert_allclose(tangent, ref_tangent, atol=1e-5, rtol=1e-5)


# ---- the gradient from the forward's input x (jax.numpy on CPU) ------------------------------------
@pytest.fixture
def input_path(monkeypatch):
    """Every gradient along the last axis through the primitives from x, whatever the GPU (on CPU they
    lower to their jax.numpy formulas)."""
    monkeypatch.setattr(_jax, "_input_path", lambda x, axis, op, safe: axis == -1)


def _uses_input_path(f, *args) -> bool:
    text = str(jax.make_jaxpr(f)(*args))
    uses_x = "portable_softmax_grad_from_input" in text or "portable_softmax_log_tangent_from_input" in text
    uses_y = re.search(r"portable_softmax_(grad|log_tangent)\[", text) is not None
    assert uses_x != uses_y, text
    return uses_x


def _f64_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(4, 33), (3, 5, 257), (7, 1), (1, 2), (2, 1024)])
def test_the_gradient_from_input_formula_matches_a_float64_reference(rng, op, safe, dtype, shape):
    x, dy = random_input(rng, shape, dtype), random_input(rng, shape, dtype, scale=1.0)
    wide_x, wide_dy = x.astype(np.float64), dy.astype(np.float64)
    p = _f64_softmax(wide_x)
    if op == "softmax":
        ref = p * (wide_dy - (wide_dy * p).sum(axis=-1, keepdims=True))
    else:
        ref = wide_dy - p * wide_dy.sum(axis=-1, keepdims=True)
    dx = _jax.grad_from_input_jnp(jnp.asarray(dy), jnp.asarray(x), axis=-1, op=op, safe=safe)
    tangent = _jax.log_tangent_from_input_jnp(jnp.asarray(dy), jnp.asarray(x), axis=-1, safe=safe)
    tangent_ref = wide_dy - (wide_dy * p).sum(axis=-1, keepdims=True)
    assert dx.dtype == tangent.dtype == jnp.dtype(dtype)
    tol = 1e-5 if dtype == "float32" else 2e-2  # bfloat16: its output's rounding
    scale = 1 + np.abs(wide_dy).sum(axis=-1, keepdims=True)
    for got, want in ((dx, ref), (tangent, tangent_ref)):
        error = np.abs(np.asarray(got.astype(jnp.float32), np.float64) - want)
        assert (error <= tol * scale).all(), f"{op} {dtype} safe={safe}: off by {(error / scale).max():.3g}"


def test_the_gradient_from_input_formula_on_special_rows():
    """A row of x all -inf: dx = 0 with safe (both ops), NaN without; NaN in x or dy: the row is NaN."""
    x = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [jnp.nan, 0.0, 1.0], [0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    dy = jnp.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [jnp.nan, 1.0, 1.0], [1.0, -1.0, 0.5]])
    for op in OPS:
        for safe in (False, True):
            for dx in (_jax.grad_from_input_jnp(dy, x, axis=-1, op=op, safe=safe),
                       _jax.log_tangent_from_input_jnp(dy, x, axis=-1, safe=safe)):
                dx = np.asarray(dx)
                assert (dx[0] == 0).all() if safe else np.isnan(dx[0]).all(), (op, safe, dx)
                assert np.isnan(dx[1:3]).all() and np.isfinite(dx[3]).all(), (op, safe, dx)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(3, 7, 33), (6, 1), (1, 3), (2, 257)])
@pytest.mark.usefixtures("input_path")
def test_grad_and_vjp_from_input_match_jax_nn(op, safe, dtype, shape):
    ours = functools.partial(getattr(ps, op), safe=safe)
    theirs = getattr(jax.nn, op)
    x = (3 * jax.random.normal(jax.random.key(11), shape)).astype(dtype)
    w = jax.random.normal(jax.random.key(12), shape).astype(dtype)
    wide = x.astype(jnp.float32)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == "float32" else dict(atol=3e-2, rtol=3e-2)
    loss = jax.grad(lambda t: (ours(t).astype(jnp.float32) * w.astype(jnp.float32)).sum())
    assert _uses_input_path(loss, x)
    g = jax.jit(loss)(x)
    ref = jax.grad(lambda t: (theirs(t) * w.astype(jnp.float32)).sum())(wide)
    assert g.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(np.asarray(g, np.float32), ref, **tol)
    y, pullback = jax.vjp(ours, x)
    ref_y, ref_pullback = jax.vjp(theirs, wide)
    np.testing.assert_allclose(np.asarray(y, np.float32), ref_y, **tol)
    np.testing.assert_allclose(np.asarray(pullback(w)[0], np.float32), ref_pullback(w.astype(jnp.float32))[0], **tol)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.usefixtures("input_path")
def test_vmap_jvp_and_second_order_from_input_match_jax_nn(op):
    ours, theirs = getattr(ps, op), getattr(jax.nn, op)
    x = 3 * jax.random.normal(jax.random.key(13), (4, 3, 9))
    w = jax.random.normal(jax.random.key(14), (4, 3, 9))
    tol = dict(atol=1e-5, rtol=1e-5)
    assert _uses_input_path(jax.grad(lambda t: (ours(t) * w[0]).sum()), x[0])
    # vmap outside and inside the gradient, with the batch in front or not
    per_item = jax.vmap(jax.grad(lambda t, v: (ours(t) * v).sum()))(x, w)
    ref = jax.vmap(jax.grad(lambda t, v: (theirs(t) * v).sum()))(x, w)
    np.testing.assert_allclose(jax.jit(lambda a: per_item)(x), ref, **tol)
    moved = jax.jit(jax.grad(lambda t: (jax.vmap(ours, in_axes=1, out_axes=1)(t) * w).sum()))(x)
    np.testing.assert_allclose(moved, jax.grad(lambda t: (theirs(t) * w).sum())(x), **tol)
    _, tangent = jax.jit(lambda a, b: jax.jvp(ours, (a,), (b,)))(x, w)
    _, ref_tangent = jax.jvp(theirs, (x,), (w,))
    np.testing.assert_allclose(tangent, ref_tangent, **tol)
    small, weights = x[0, 0, :5], w[0, 0, :5]
    np.testing.assert_allclose(jax.hessian(lambda t: (ours(t) * weights).sum())(small),
                               jax.hessian(lambda t: (theirs(t) * weights).sum())(small), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(jax.jit(jax.hessian(lambda t: (ours(t) * w[0, :2, :4]).sum()))(x[0, :2, :4]),
                               jax.hessian(lambda t: (theirs(t) * w[0, :2, :4]).sum())(x[0, :2, :4]),
                               atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(jax.jacfwd(ours)(small), jax.jacfwd(theirs)(small), **tol)
    np.testing.assert_allclose(jax.jacrev(ours)(small), jax.jacrev(theirs)(small), **tol)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.usefixtures("input_path")
def test_grad_from_input_keeps_the_semantics_of_special_rows(op):
    rows = jnp.array([[-jnp.inf, -jnp.inf], [0.0, 1.0]])
    safe = jax.grad(lambda t: (getattr(ps, op)(t, safe=True) * jnp.array([1.0, 2.0])).sum())(rows)
    assert safe[0].tolist() == [0.0, 0.0] and np.isfinite(safe[1]).all()
    unsafe = jax.grad(lambda t: (getattr(ps, op)(t) * jnp.array([1.0, 2.0])).sum())(rows)
    assert np.isnan(unsafe[0]).all() and np.isfinite(unsafe[1]).all()


# ---- the choice of x or y ---------------------------------------------------------------------------
def test_the_choice_of_the_gradient_from_input():
    h100 = DeviceProfile.h100()
    assert _jax.takes_input_path((8192, 8192), "float32", -1, "softmax", False, h100)
    assert _jax.takes_input_path((8192, 8192), jnp.float32, -1, "log_softmax", False, h100)
    assert _jax.takes_input_path((8192, 8192), "float32", 1, "softmax", True, h100), "axis 1 of 2 is the last"
    assert _jax.takes_input_path((4, 200_000), "float32", -1, "softmax", False, h100), "the on-chip split"
    assert not _jax.takes_input_path((4, 4_194_304), "float32", -1, "softmax", False, h100), "the two passes"
    assert _jax.takes_input_path((8192, 8192), "float32", -1, "log_softmax", True, h100), "safe log_softmax"
    assert not _jax.takes_input_path((8192, 8192), "float32", -2, "softmax", False, h100), "not the last axis"
    assert not _jax.takes_input_path((8192, 8192), "float32", 0, "softmax", False, h100), "not the last axis"
    assert not _jax.takes_input_path((5, 1), "float32", -1, "softmax", False, h100), "rows of one float32"
    assert _jax.takes_input_path((64, 1000), "float32", -1, "log_softmax", False, DeviceProfile.mi300x())
    assert _jax.takes_input_path((64, 1000), "bfloat16", -1, "log_softmax", False, h100), "whole 16-byte slots"
    assert _jax.takes_input_path((64, 8192), jnp.float16, -1, "softmax", False, h100), "whole 16-byte slots"
    assert not _jax.takes_input_path((64, 1001), "bfloat16", -1, "log_softmax", False, h100), "16-bit, partial slots"
    assert _jax.takes_input_path((64, 50257), "bfloat16", -1, "softmax", False, h100), "on chip, partial slots"


def test_the_choice_is_made_once_per_shape_on_the_runtime_profile(stand_in, monkeypatch):
    asked = []
    real = _jax.takes_input_path
    monkeypatch.setattr(_jax, "takes_input_path", lambda *a: asked.append(a) or real(*a))
    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    assert _jax._input_path(x, -1, "softmax", False) and _jax._input_path(x, -1, "softmax", False)
    assert asked == [((16, 128), jnp.dtype(jnp.float32), -1, "softmax", False, DeviceProfile.h100())]
    assert not _jax._input_path(x, 0, "log_softmax", True) and len(asked) == 2  # not the last axis


def test_without_a_gpu_the_gradient_keeps_y(monkeypatch):
    def no_runtime(vendor):
        raise AssertionError("no runtime is opened for a CPU")

    monkeypatch.setattr(_jax, "gpu_vendor", lambda: None)
    monkeypatch.setattr(_probe, "runtime", no_runtime)
    x = jnp.ones((16, 128))
    assert not _uses_input_path(jax.grad(lambda t: ps.log_softmax(t).sum()), x)
    assert _jax.gpu_vendor is not None and _jax_ffi.vendor_of(jax.devices("cpu")[0]) is None


def test_a_gpu_runtime_that_does_not_open_keeps_y(monkeypatch):
    def unavailable(vendor):
        raise _probe.BackendUnavailableError("no driver")

    monkeypatch.setattr(_jax, "gpu_vendor", lambda: "cuda")
    monkeypatch.setattr(_jax, "_input_paths", {})
    monkeypatch.setattr(_probe, "runtime", unavailable)
    assert not _uses_input_path(jax.grad(lambda t: ps.softmax(t).sum()), jnp.ones((16, 128)))


def test_bad_dtype_and_axis_fail_at_trace_time_with_the_eager_errors():
    with pytest.raises(TypeError) as eager:
        ps.softmax(np.ones(3, np.int32))
    with pytest.raises(TypeError) as traced:
        jax.jit(ps.softmax).trace(jax.ShapeDtypeStruct((3,), jnp.int32))
    assert str(traced.value) == str(eager.value)
    with pytest.raises(IndexError, match="axis 2 is out of bounds for array of dimension 2"):
        jax.jit(lambda t: ps.softmax(t, axis=2)).trace(jax.ShapeDtypeStruct((3, 4), jnp.float32))


def test_concrete_cpu_arrays_keep_the_direct_path():
    x = jax.device_put(jnp.arange(6.0).reshape(2, 3), jax.devices("cpu")[0])  # on the host, even beside a GPU
    assert not _jax.is_tracer(x)
    assert isinstance(ps.softmax(x), jax.Array)


# ---- softmax_backward / log_softmax_backward on JAX arrays under jit, vmap and grad --------------
def _gradient_case(rng, shape, axis, op, dtype):
    """y of random values (float64, rounded to dtype) and a random dy, as numpy arrays."""
    x = rng.standard_normal(shape) * 3
    y = ps.reference.softmax(x, axis) if op == "softmax" else ps.reference.log_softmax(x, axis)
    return random_input(rng, shape, dtype, scale=1.0), y.astype(random_input(rng, (1,), dtype).dtype)


def _assert_gradient(got, dy, y, axis, op):
    ref = gradient_reference(np.asarray(dy), np.asarray(y), axis, op)
    bad = _tolerance.outside(np.asarray(got), ref)
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} outside {_tolerance.describe(np.asarray(got).dtype.name)}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape, axis", [((6, 33), -1), ((4, 5, 7), 1), ((9, 3), 0), ((1, 1), -1)])
def test_cpu_gradient_functions_under_jit_match_the_float64_reference(rng, op, dtype, shape, axis):
    """The gradient functions take traced JAX arrays as the forward does (jax.numpy on the CPU,
    no callback), with the result in their dtype."""
    dy, y = _gradient_case(rng, shape, axis, op, dtype)
    fn = getattr(ps, f"{op}_backward")
    got = jax.jit(lambda d, w: fn(d, w, axis))(jnp.asarray(dy), jnp.asarray(y))
    assert isinstance(got, jax.Array) and got.dtype == jnp.dtype(dtype)
    _assert_gradient(got, dy, y, axis, op)
    text = _cpu_text(lambda d, w: fn(d, w, axis), *(jax.ShapeDtypeStruct(shape, dtype),) * 2)
    assert "callback" not in text and "custom_call" not in text


@pytest.mark.parametrize("op", OPS)
def test_cpu_gradient_functions_under_vmap_and_grad(rng, op):
    """vmap folds its batch into rows; jax.grad through a gradient function (a double backward) is
    the derivative of its formula."""
    fn = getattr(ps, f"{op}_backward")
    dy, y = _gradient_case(rng, (5, 3, 12), -1, op, "float32")
    dy, y = jnp.asarray(dy), jnp.asarray(y)
    batched = jax.jit(jax.vmap(lambda d, w: fn(d, w, 0), in_axes=2, out_axes=2))(dy, y)
    _assert_gradient(batched, dy, y, 0, op)
    v = jax.random.normal(jax.random.key(3), y.shape)

    def formula(d, w):
        if op == "softmax":
            return w * (d - (d * w).sum(-1, keepdims=True))
        return d - jnp.exp(w) * d.sum(-1, keepdims=True)

    for argnum in (0, 1):  # the derivative by dy (the map's transpose) and by y
        ours = jax.jit(jax.grad(lambda d, w: (fn(d, w) * v).sum(), argnums=argnum))(dy, y)
        theirs = jax.grad(lambda d, w: (formula(d, w) * v).sum(), argnums=argnum)(dy, y)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)


def test_cpu_gradient_functions_keep_the_row_semantics():
    """NaN in dy or y makes its row NaN; a log_softmax row of y all -inf (safe: a constant) gets 0."""
    y = np.log(np.full((4, 3), 1 / 3, np.float32))
    y[1, 2], y[2] = np.nan, -np.inf
    dy = np.ones((4, 3), np.float32)
    dy[3, 0] = np.nan
    for op in OPS:
        fn = getattr(ps, f"{op}_backward")
        w = np.exp(y) if op == "softmax" else y
        got = np.asarray(jax.jit(fn)(jnp.asarray(dy), jnp.asarray(w)))
        eager = fn(dy, w)
        assert np.isnan(got[1]).all() and np.isnan(got[3]).all()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
        np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(eager), atol=1e-6)
        if op == "log_softmax":
            assert got[2].tolist() == [0.0, 0.0, 0.0]


def test_bad_gradient_input_fails_at_trace_time_with_the_eager_errors():
    f32 = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    cases = [  # (dy shape, y shape, dy dtype, y dtype, axis): shapes, dtypes, a dtype no kernel takes, the axis
        ((3, 4), (3, 5), "float32", "float32", -1),
        ((3, 4), (3, 4), "float32", "float16", -1),
        ((3, 4), (3, 4), "int32", "int32", -1),
        ((3, 4), (3, 4), "float32", "float32", 2),
    ]
    for dy_shape, y_shape, dy_dtype, y_dtype, axis in cases:
        eager_args = (np.ones(dy_shape, dy_dtype), np.ones(y_shape, y_dtype))
        traced_args = (jax.ShapeDtypeStruct(dy_shape, dy_dtype), jax.ShapeDtypeStruct(y_shape, y_dtype))
        with pytest.raises((TypeError, ValueError, IndexError)) as eager:
            ps.softmax_backward(*eager_args, axis)
        with pytest.raises(type(eager.value)) as traced:
            jax.jit(lambda d, w, a=axis: ps.softmax_backward(d, w, a)).trace(*traced_args)
        assert str(traced.value) == str(eager.value)
    with pytest.raises(ValueError, match="out= cannot take the log_softmax_backward of traced JAX arrays"):
        jax.jit(lambda d, w: ps.log_softmax_backward(d, w, out=d)).trace(f32, f32)
    with pytest.raises(TypeError, match="dy and y must be arrays of one type"):
        jax.jit(lambda d: ps.softmax_backward(d, np.ones((3, 4), np.float32))).trace(f32)


# ---- CUDA / ROCm lowering, planned on a stand-in runtime ----------------------------------------
class StandInRuntime:
    """What the lowering asks of a runtime adapter: profiles, function handles, resident grids."""

    def __init__(self, profile: DeviceProfile, devices: int = 2):
        self.device_count = devices
        self._profile = profile
        self.handles: dict[tuple[int, str], int] = {}

    def profile(self, device: int) -> DeviceProfile:
        return self._profile

    def function(self, device: int, dtype: str, name: str, shared_mem: int = 0) -> int:
        return self.handles.setdefault((device, name), 0x1000 * (len(self.handles) + 1) + device)

    def resident_step(self, step, dtype: str, device: int):
        return stand_in_step(step, self._profile)

    def resident_grid(self, fn: int, step, device: int) -> int:
        return stand_in_grid(step, self._profile)


def stand_in_blocks(step, block: int, device: DeviceProfile) -> int:
    """The stand-in's occupancy: blocks a multiprocessor as threads and shared memory (and the
    runtime's 1 KiB reserve a block) allow, at most the 5 of the on-chip split's launch bound."""
    return min(5, device.max_threads_per_multiprocessor // block,
               device.shared_mem_per_multiprocessor // (step.shared_mem + 1024 + 256))


def stand_in_step(step, device: DeviceProfile):
    """planner.resident_launch with the stand-in's occupancy."""
    return resident_launch(step, lambda kernel, block: stand_in_blocks(step, block, device))


def stand_in_grid(step, device: DeviceProfile) -> int:
    """planner.one_wave with the stand-in's occupancy."""
    return one_wave(step, stand_in_blocks(step, step.block, device), device.multiprocessors)


@pytest.fixture
def stand_in(monkeypatch):
    """Lowering for cuda / rocm with a stand-in runtime (an H100's profile, two devices), the targets
    taken as registered, and the stand-in as the GPU JAX compiles for (the gradient's choice of x or
    y asks for its profile)."""
    rt = StandInRuntime(DeviceProfile.h100())
    monkeypatch.setattr(_probe, "runtime", lambda vendor: rt)
    monkeypatch.setattr(_jax_ffi, "register", lambda vendor: None)
    monkeypatch.setattr(_jax_ffi, "_calls", {})
    monkeypatch.setattr(_jax, "gpu_vendor", lambda: "cuda")
    monkeypatch.setattr(_jax, "_input_paths", {})
    return rt


def _lowered(f, shape, dtype, platforms) -> str:
    return jax.jit(f).trace(jax.ShapeDtypeStruct(shape, dtype)).lower(lowering_platforms=platforms).as_text()


def _attribute(text: str, name: str) -> list[int]:
    """An integer attribute of the custom call: a scalar, a dense tensor (a splat written once) or an array."""
    pattern = r"(dense<(\[?)([-\d, ]*)\]?> : tensor<(\d+)xi64>|array<i64(?:: ([-\d, ]*))?>|(-?\d+) : i64)"
    found = re.search(rf"\b{name} = {pattern}", text)
    assert found, f"no {name} attribute in {text}"
    if found.group(6) is not None:
        return [int(found.group(6))]
    if found.group(5) is not None or found.group(1).startswith("array"):
        return [int(v) for v in (found.group(5) or "").split(",") if v.strip()]
    values = [int(v) for v in found.group(3).split(",") if v.strip()]
    return values if found.group(2) else values * int(found.group(4))


def _expected_plan(shape, dtype, axis, op, safe=False):
    strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    layout = describe(shape, strides, axis % len(shape))
    return plan(problem_for(dtype, op, safe, layout, layout, 0, 0), DeviceProfile.h100())


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
@pytest.mark.parametrize("shape, axis, dtype", [((64, 1000), -1, "float32"), ((8, 300, 24), 1, "bfloat16"),
                                                ((2, 1 << 22), -1, "float16")])
@pytest.mark.parametrize("op", OPS)
def test_cuda_and_rocm_lowering_holds_the_custom_call_with_the_plan(stand_in, platform, shape, axis, dtype, op):
    text = _lowered(lambda t: getattr(ps, op)(t, axis=axis), shape, jnp.dtype(dtype), (platform,))
    assert f"stablehlo.custom_call @{_jax_ffi.TARGET}(" in text, text
    assert "callback" not in text
    expected = _expected_plan(shape, dtype, axis, op)
    nbytes = expected.scratch_layout()[0] if expected.scratch else 0
    assert f"tensor<{max(1, nbytes)}xui8>" in text, "the workspace result holds the plan's scratch"
    made = [stand_in_step(s, DeviceProfile.h100()) for s in expected.launches]
    assert _attribute(text, "blocks") == [s.block for s in made]
    assert _attribute(text, "shared") == [s.shared_mem for s in expected.launches]
    assert _attribute(text, "devices") == [0, 1]
    assert len(_attribute(text, "functions")) == 2 * len(expected.launches)
    assert _attribute(text, "grids") == [stand_in_grid(s, DeviceProfile.h100()) for s in made] * 2
    assert _attribute(text, "zero_bytes") == [nbytes if expected.scratch_zeroed else 0]
    starts, kinds = _attribute(text, "arg_starts"), _attribute(text, "arg_kinds")
    assert starts[-1] == len(kinds) == sum(len(s.args) for s in expected.launches)
    assert _jax_ffi.OPERAND in kinds and _jax_ffi.RESULT in kinds
    assert f'op = "{op}"' in text


def test_a_long_row_takes_scratch_that_the_handler_zeroes(stand_in):
    shape = (2, 1 << 22)
    expected = _expected_plan(shape, "float32", -1, "softmax")
    assert expected.scratch, "a row this long is split across blocks, which exchange partials in scratch"
    text = _lowered(ps.softmax, shape, jnp.float32, ("cuda",))
    assert _jax_ffi.SCRATCH in _attribute(text, "arg_kinds")


def test_lowering_for_cuda_and_cpu_at_once_holds_both(stand_in):
    text = _lowered(ps.softmax, (16, 128), jnp.float32, ("cuda", "cpu"))
    assert f"@{_jax_ffi.TARGET}(" in text and "stablehlo.exponential" in text


def _calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if f"custom_call @{_jax_ffi.TARGET}(" in line]


def _kernels(rt: StandInRuntime, line: str) -> list[str]:
    """The kernels a custom call launches on device 0, by the stand-in's handles in its attributes."""
    names = {handle: name for (device, name), handle in rt.handles.items() if device == 0}
    return [names[f] for f in _attribute(line, "functions") if f in names]


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
@pytest.mark.parametrize("shape, axis, dtype", [((64, 1000), -1, "float32"), ((8, 300, 24), 1, "bfloat16")])
@pytest.mark.parametrize("op", OPS)
def test_traced_gradient_functions_lower_to_the_gradient_custom_call(stand_in, platform, shape, axis, dtype, op):
    """ps.softmax_backward / ps.log_softmax_backward under jax.jit: one custom call (operands dy and
    y), planned by planner_backward as an eager call of the same layout is."""
    fn = getattr(ps, f"{op}_backward")
    args = (jax.ShapeDtypeStruct(shape, dtype),) * 2
    text = jax.jit(lambda d, w: fn(d, w, axis)).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    calls = _calls(text)
    assert len(calls) == 1 and f'op = "{op}_backward"' in calls[0], calls
    assert "callback" not in text
    strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    layout = describe(shape, strides, axis % len(shape))
    from portable_softmax._backward import _problem

    expected = plan_backward(_problem(dtype, op, layout, layout, layout, (0, 0, 0)), DeviceProfile.h100())
    assert _kernels(stand_in, calls[0]) == [stand_in_step(s, DeviceProfile.h100()).kernel for s in expected.launches]


@pytest.mark.parametrize("op", OPS)
def test_grad_of_a_long_row_lowers_to_the_forward_and_the_gradient_kernels(stand_in, op):
    """Reverse mode where no kernel of the gradient from x is planned (rows the two-pass split takes):
    the forward's custom call, then the gradient's (operands dy and y), planned by planner_backward."""
    shape = (4, 4_194_304)
    loss = jax.grad(lambda t: (getattr(ps, op)(t) * jnp.cos(jnp.arange(shape[1], dtype=jnp.float32))).sum())
    text = _lowered(loss, shape, jnp.float32, ("cuda",))
    calls = _calls(text)
    assert len(calls) == 2, calls
    backward = next(line for line in calls if f'op = "{op}_backward"' in line)
    assert "(tensor<4x4194304xf32>, tensor<4x4194304xf32>) -> (tensor<4x4194304xf32>" in backward
    strides = (shape[1],) * 3
    problem = GradRowProblem("float32", op, *shape, strides, (0, 0, 0), safe=True)
    assert plan_backward_from_input(problem, DeviceProfile.h100()) is None
    expected = plan_backward(problem, DeviceProfile.h100())
    assert _attribute(backward, "blocks") == [stand_in_step(s, DeviceProfile.h100()).block for s in expected.launches]
    assert _kernels(stand_in, backward) == [stand_in_step(s, DeviceProfile.h100()).kernel for s in expected.launches]
    kinds = _attribute(backward, "arg_kinds")
    assert kinds.count(_jax_ffi.OPERAND) == 2 * len(expected.launches) and _jax_ffi.RESULT in kinds
    cpu = _cpu_text(loss, jax.ShapeDtypeStruct(shape, jnp.float32))
    assert "custom_call" not in cpu and "callback" not in cpu


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, dtype", [((16, 128), "float32"), ((6, 40, 257), "float32"), ((4, 33), "float32"),
                                          ((16, 1024), "bfloat16"), ((3, 8, 4096), "float16"),
                                          ((4, 200_000), "float32"), ((2, 131072), "bfloat16"),
                                          ((4, 50257), "bfloat16"), ((3, 100_001), "float16")])
def test_grad_from_input_lowers_to_one_custom_call(stand_in, op, shape, dtype):
    """Where a kernel of the gradient from x is planned, jax.grad keeps x, not y: the forward's call
    is left unused and dropped, and one call reads dy and x (operands 0 and 1) and writes dx."""
    w = jnp.cos(jnp.arange(shape[-1], dtype=jnp.float32)).astype(dtype)
    loss = jax.grad(lambda t: (getattr(ps, op)(t) * w).sum())
    text = _lowered(loss, shape, jnp.dtype(dtype), ("cuda",))
    calls = _calls(text)
    assert len(calls) == 1, calls
    assert f'op = "{op}_backward_from_input"' in calls[0]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    expected = plan_backward_from_input(GradRowProblem(dtype, op, rows, cols, (cols,) * 3, (0, 0, 0)),
                                        DeviceProfile.h100())
    kernels = _kernels(stand_in, calls[0])
    assert kernels == [expected.launches[0].kernel]
    assert kernels[0].startswith("ps_bwd_from_input_cached_" if cols >= 50_000 else "ps_bwd_from_input_rows_")
    pointers = [(k, v) for k, v in zip(_attribute(calls[0], "arg_kinds"), _attribute(calls[0], "arg_values"))
                if k in (_jax_ffi.OPERAND, _jax_ffi.RESULT)]
    assert pointers == [(_jax_ffi.OPERAND, 0), (_jax_ffi.OPERAND, 1), (_jax_ffi.RESULT, 0)]
    assert _attribute(calls[0], "devices") == [0, 1] and len(_attribute(calls[0], "functions")) == 2


@pytest.mark.parametrize("op, safe, axis", [("softmax", False, 0), ("log_softmax", False, 0)])
def test_grad_keeps_y_for_a_non_last_axis(stand_in, op, safe, axis):
    loss = jax.grad(lambda t: (getattr(ps, op)(t, axis=axis, safe=safe) * jnp.cos(t)).sum())
    calls = _calls(_lowered(loss, (64, 128), jnp.float32, ("cuda",)))
    assert len(calls) == 2 and any(f'op = "{op}_backward"' in line for line in calls), calls


@pytest.mark.parametrize("op", OPS)
def test_grad_keeps_y_for_16_bit_rows_of_partial_slots(stand_in, op):
    """16-bit rows held in registers whose length is not a whole number of 16-byte slots have no
    kernel from x: the forward's call, then the gradient from y."""
    loss = jax.grad(lambda t: (getattr(ps, op)(t) * jnp.cos(t)).sum())
    calls = _calls(_lowered(loss, (16, 1001), jnp.bfloat16, ("cuda",)))
    assert len(calls) == 2 and any(f'op = "{op}_backward"' in line for line in calls), calls


def test_forward_mode_takes_the_gradient_from_input_too(stand_in):
    """jax.jvp of softmax: y from the forward, the tangent from t and x (the Jacobian is symmetric)."""
    text = jax.jit(lambda a, b: jax.jvp(ps.softmax, (a,), (b,))).trace(
        *[jax.ShapeDtypeStruct((16, 128), jnp.float32)] * 2).lower(lowering_platforms=("cuda",)).as_text()
    calls = _calls(text)
    assert len(calls) == 2 and any('op = "softmax_backward_from_input"' in line for line in calls), calls


def test_a_gradient_from_input_without_its_kernel_runs_the_forward_into_dx_then_the_gradient(stand_in):
    """The lowering's safety net: where the JVP chose x for a shape whose lowered shape has no fused
    kernel (here vmap: per element one row of one column, which has one; five such rows have not), one
    call runs the forward into dx and the gradient from y there, with values as jax.nn's."""
    loss = jax.vmap(jax.grad(lambda t: (ps.softmax(t) * jnp.float32(2.0)).sum()))
    assert _jax.takes_input_path((1, 1), "float32", -1, "softmax", False, DeviceProfile.h100())
    assert not _jax.takes_input_path((5, 1), "float32", -1, "softmax", False, DeviceProfile.h100())
    calls = _calls(_lowered(loss, (5, 1, 1), jnp.float32, ("cuda",)))
    assert len(calls) == 1 and 'op = "softmax_backward_from_input"' in calls[0], calls
    layout = describe((5, 1), (1, 1), 1)
    forward = plan(problem_for("float32", "softmax", False, layout, layout, 0, 0), DeviceProfile.h100())
    backward = plan_backward(GradRowProblem("float32", "softmax", 5, 1, (1, 1, 1), (0, 0, 0), safe=True),
                             DeviceProfile.h100())
    assert _kernels(stand_in, calls[0]) == [s.kernel for s in (*forward.launches, *backward.launches)]
    x = jax.device_put(jnp.arange(5.0).reshape(5, 1, 1), CPU)  # the stand-in's kernels run nowhere
    ref = jax.vmap(jax.grad(lambda t: (jax.nn.softmax(t) * 2.0).sum()))(x)
    np.testing.assert_allclose(jax.jit(loss)(x), ref, atol=1e-6)


def test_a_safe_log_softmax_without_its_kernel_takes_the_gradient_from_input_in_jax_numpy(stand_in):
    """Where the fused kernel is missing for a safe log_softmax (vmap batched one-column rows), the
    gradient from x is XLA's jax.numpy (no custom call: the forward's is dropped), its rows of all
    -inf zero."""
    loss = jax.vmap(jax.grad(lambda t: (ps.log_softmax(t, safe=True) * jnp.float32(2.0)).sum()))
    assert _jax.takes_input_path((1, 1), "float32", -1, "log_softmax", True, DeviceProfile.h100())
    assert _calls(_lowered(loss, (5, 1, 1), jnp.float32, ("cuda",))) == []
    x = jax.device_put(jnp.arange(5.0).reshape(5, 1, 1).at[2].set(-jnp.inf), CPU)
    got = jax.jit(loss)(x)
    assert got[2].tolist() == [[0.0]]
    np.testing.assert_allclose(np.delete(np.asarray(got), 2, 0), np.zeros((4, 1, 1)), atol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_the_forward_then_gradient_plan_keeps_its_buffers_apart(op):
    """The safety net's plan: the forward writes y into dx and the gradient reads it there; each plan's
    scratch under its own name (both of a long row's plans name theirs alike), zeroed where either
    plan needs it; none for a safe log_softmax, whose forward gives its rows of all -inf NaN."""
    shape = (4, 4_194_304)
    layout = describe(shape, _jax_ffi.contiguous_strides(shape), 1)
    combined = _jax_ffi.plan_from_input("float32", op, False, layout, DeviceProfile.h100())
    forward, backward = combined.notes["forward"], combined.notes["backward"]
    assert [s.kernel for s in combined.launches] == [s.kernel for s in (*forward.launches, *backward.launches)]
    assert [n for n, _ in combined.scratch] == [f"forward_{n}" for n, _ in forward.scratch] + \
        [f"backward_{n}" for n, _ in backward.scratch]
    assert len({n for n, _ in combined.scratch}) == len(combined.scratch)
    assert combined.scratch_zeroed == any(p.scratch and p.scratch_zeroed for p in (forward, backward))
    pointers = {v for s in combined.launches for k, v in s.args if k == "ptr"}
    assert pointers == {"x", "dy", "dx", *(n for n, _ in combined.scratch)}, "y lives in dx"
    assert _jax_ffi.plan_from_input("float32", "log_softmax", True, layout, DeviceProfile.h100()) is None
    fused = _jax_ffi.plan_from_input("float32", op, False, describe((64, 128), (128, 1), 1), DeviceProfile.h100())
    assert [s.kernel.startswith("ps_bwd_from_input_rows_") for s in fused.launches] == [True]


def test_the_custom_call_of_the_forward_then_gradient_zeroes_both_scratch_buffers(stand_in):
    target, attributes, workspace = _jax_ffi.custom_call("cuda", (4, 4_194_304), "float32", -1, "softmax", False,
                                                         "backward_from_input")
    layout = describe((4, 4_194_304), (4_194_304, 1), 1)
    combined = _jax_ffi.plan_from_input("float32", "softmax", False, layout, DeviceProfile.h100())
    nbytes, _ = combined.scratch_layout()
    assert workspace == nbytes and attributes["zero_bytes"] == (nbytes if combined.scratch_zeroed else 0)
    assert attributes["op"] == "softmax_backward_from_input"
    assert len(attributes["cooperative"]) == len(combined.launches) >= 2
    assert target == (_jax_ffi.TARGET_UNCAPTURED if attributes["cooperative"].any() else _jax_ffi.TARGET)


def test_vmap_lowers_to_the_custom_call_with_rows_folded(stand_in):
    batched = jax.vmap(ps.softmax)  # (16, 128) per element of a batch of 4: 64 rows of 128
    text = _lowered(batched, (4, 16, 128), jnp.float32, ("cuda",))
    assert "tensor<4x16x128xf32>" in text and f"@{_jax_ffi.TARGET}(" in text
    assert _attribute(text, "blocks") == [s.block for s in _expected_plan((64, 128), "float32", -1, "softmax").launches]


def test_calls_are_planned_once_per_shape(stand_in, monkeypatch):
    planned = []
    real = _jax_ffi._plan_call
    monkeypatch.setattr(_jax_ffi, "_plan_call", lambda *a: planned.append(a) or real(*a))
    for _ in range(2):
        _lowered(ps.softmax, (16, 128), jnp.float32, ("cuda",))
    assert len(planned) == 1


# ---- sharded inputs: per shard through shard_map --------------------------------------------------
SHARDED = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"  # four host devices, whatever GPUs the machine has
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import portable_softmax as ps
from portable_softmax import _jax_ffi, _probe
from portable_softmax.planner import DeviceProfile, one_wave, resident_launch

mesh = jax.make_mesh((4,), ("d",), devices=jax.devices()[:4])
rows = NamedSharding(mesh, P("d", None))
f = jax.jit(jax.shard_map(ps.log_softmax, mesh=mesh, in_specs=P("d", None), out_specs=P("d", None)))
x = jax.device_put(3 * jax.random.normal(jax.random.key(0), (8, 128)), rows)
host = np.asarray(x)
np.testing.assert_allclose(np.asarray(f(x)), jax.nn.log_softmax(host), atol=1e-6, rtol=1e-5)
w = np.cos(np.arange(128.0)).astype(np.float32)
g = jax.jit(jax.grad(lambda t: (f(t) * w).sum()))(x)
np.testing.assert_allclose(np.asarray(g), jax.grad(lambda t: (jax.nn.log_softmax(t) * w).sum())(host),
                           atol=1e-5, rtol=1e-5)
assert "tensor<2x128xf32>" in f.lower(x).as_text()

class StandIn:
    device_count = 1
    def profile(self, device): return DeviceProfile.h100()
    def function(self, device, dtype, name, shared_mem=0): return 4096
    def resident_step(self, step, dtype, device): return resident_launch(step, lambda kernel, block: 2)
    def resident_grid(self, fn, step, device): return one_wave(step, 2, 132)

_probe.runtime = lambda vendor: StandIn()
_jax_ffi.register = lambda vendor: None
text = f.trace(jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=rows)).lower(lowering_platforms=("cuda",)).as_text()
calls = [line for line in text.splitlines() if "custom_call @portable_softmax_launch" in line]
assert len(calls) == 1 and "(tensor<2x128xf32>) -> (tensor<2x128xf32>" in calls[0], calls
print("per shard")
"""


def test_shard_map_runs_each_shard_through_its_own_call(tmp_path):
    """A row-sharded input under jax.shard_map: each device computes its own rows (the custom call is
    planned for the shard's shape), values and gradients as jax.nn's. Four host devices, in a process
    of their own (the device count is fixed when JAX starts)."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and "per shard" in proc.stdout, proc.stdout + proc.stderr


# ---- registration, status and the fallback -------------------------------------------------------
def test_without_the_handler_the_status_names_the_build_command(monkeypatch):
    monkeypatch.setattr(_jax_ffi, "library_path", lambda vendor: None)
    monkeypatch.setattr(_jax_ffi, "_registered", {})
    assert _jax_ffi.BUILD_COMMAND in _jax_ffi.status() and _jax_ffi.status().startswith("not built")
    why = _jax_ffi.register("cuda")
    assert why is not None and _jax_ffi.BUILD_COMMAND in why
    assert "not registered for CUDA" in _jax_ffi.status()


def test_the_fallback_warning_is_given_once(recwarn):
    _jax_ffi._warned.discard("a reason")
    _jax_ffi.warn_once("a reason")
    _jax_ffi.warn_once("a reason")
    messages = [str(w.message) for w in recwarn.list if "a reason" in str(w.message)]
    assert len(messages) == 1 and "host callback" in messages[0]


# ---- the handler's build -------------------------------------------------------------------------
CXX = shutil.which("g++") or shutil.which("c++")
NVCC = shutil.which("nvcc")
HIP_HEADER = next((p for p in (Path("/opt/rocm/include"), Path("/usr/include")) if (p / "hip/hip_runtime.h").is_file()),
                  None)


def _cuda_include() -> Path | None:
    """The folder holding cuda.h: the toolkit's beside nvcc, or $CUDA_HOME's / $CUDA_PATH's."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if NVCC is not None:
        roots.append(str(Path(NVCC).resolve().parent.parent))
    for root in filter(None, roots):
        for candidate in (Path(root) / "include", Path(root) / "targets/x86_64-linux/include"):
            if (candidate / "cuda.h").is_file():
                return candidate
    return None


def _compile(source: Path, include: Path, out: Path, *defines: str) -> subprocess.CompletedProcess:
    system = [] if include == Path("/usr/include") else ["-isystem", str(include)]  # the compiler's own: as it is
    cmd = [CXX, "-std=c++17", "-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", "-x", "c++", *defines,
           "-isystem", jax.ffi.include_dir(), *system, str(source), "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True)


def _exported(library: Path) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is needed to list the library's symbols")
    listing = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}


EXPORTS = {"PortableSoftmaxLaunch", "PortableSoftmaxLaunchUncaptured", "PortableSoftmaxFfiInit"}


REGISTER = """
import ctypes, sys
from portable_softmax import _jax_ffi
stand_in = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0)
address = ctypes.cast(stand_in, ctypes.c_void_p).value
_jax_ffi._entry_points = lambda vendor: [address, None, address, None]
why = _jax_ffi.register("cuda")
print(why if why is not None else _jax_ffi.status())
"""


@pytest.mark.build
@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) to build the handler with")
@pytest.mark.skipif(_cuda_include() is None, reason="no cuda.h (the CUDA toolkit) beside nvcc")
def test_the_cuda_handler_builds_against_the_local_jaxlib_headers_and_registers(tmp_path):
    library = tmp_path / "jax_ffi_cuda.so"
    proc = _compile(REPO / "src_cuda" / "jax_ffi.cu", _cuda_include(), library)
    assert proc.returncode == 0, proc.stderr
    assert EXPORTS <= _exported(library)
    header = (Path(jax.ffi.include_dir()) / "xla/ffi/api/c_api.h").read_text()
    major = int(re.search(r"#define XLA_FFI_API_MAJOR (\d+)", header).group(1))
    minor = int(re.search(r"#define XLA_FFI_API_MINOR (\d+)", header).group(1))
    # registration on this jaxlib with stand-in entry points (nothing is launched), in a process of its
    # own: jaxlib refuses a second handler under a name this process may have registered already
    env = {**os.environ, _jax_ffi.LIBRARY_ENV: str(library), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", REGISTER], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().startswith(f"registered for CUDA ({library}, XLA FFI API {major}.{minor})"), done.stdout


@pytest.mark.build
@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) to build the handler with")
@pytest.mark.skipif(HIP_HEADER is None, reason="no hip/hip_runtime.h (ROCm, or apt-get install hipcc)")
def test_the_hipified_handler_builds_for_rocm(tmp_path):
    library = tmp_path / "jax_ffi_hip.so"
    proc = _compile(REPO / "src_hip" / "jax_ffi.hip", HIP_HEADER, library, "-D__HIP_PLATFORM_AMD__")
    assert proc.returncode == 0, proc.stderr
    assert EXPORTS <= _exported(library)


CMAKE = shutil.which("cmake")


@pytest.mark.build
@pytest.mark.skipif(CMAKE is None, reason="cmake is not installed (pip install cmake)")
def test_cmake_builds_the_handler_when_jax_is_importable(tmp_path):
    cmd = [CMAKE, "-S", str(REPO), "-B", str(tmp_path), "-DPORTABLE_SOFTMAX_FASTLAUNCH=off",
           "-DPORTABLE_SOFTMAX_BACKEND=none", f"-DPython_EXECUTABLE={sys.executable}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if _cuda_include() is None and HIP_HEADER is None:
        assert "the JAX FFI handler is not built (neither cuda.h" in proc.stdout
    else:
        assert "the JAX FFI handler is built for" in proc.stdout, proc.stdout
    off = subprocess.run([*cmd, "-DPORTABLE_SOFTMAX_JAX_FFI=sometimes"], capture_output=True, text=True)
    assert off.returncode != 0 and "PORTABLE_SOFTMAX_JAX_FFI=sometimes: use auto, on or off" in off.stderr


# ---- on a GPU ----------------------------------------------------------------------------------------
def _gpu_device():
    for platform in ("cuda", "rocm"):
        try:
            return jax.devices(platform)[0]
        except RuntimeError:
            continue
    return None


GPU = _gpu_device()
needs_gpu = pytest.mark.skipif(GPU is None, reason="JAX sees no CUDA or ROCm device")


@pytest.fixture
def registered():
    why = _jax_ffi.register(_jax_ffi.vendor_of(GPU))
    if why is not None:
        pytest.fail(f"the FFI targets are not registered on this GPU machine: {why}")


def _on_gpu(x):
    return jax.device_put(jnp.asarray(x), GPU)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape, axis", [((4, 33), -1), ((1000, 1000), -1), ((3, 1 << 20), -1), ((64, 8, 50), 1),
                                         ((3000, 64), 0), ((2, 5, 7), None)])
@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_values_match_the_float64_reference(rng, op, dtype, shape, axis):
    x = random_input(rng, shape, dtype)
    y = jax.jit(lambda t: getattr(ps, op)(t, axis=axis))(_on_gpu(x))
    assert y.dtype == jnp.dtype(dtype) and next(iter(y.devices())) == GPU
    assert_matches(np.asarray(y), x, axis=axis, op=op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_special_rows(op):
    rows = _on_gpu(jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [jnp.nan, 0.0, 1.0], [0.0, 1.0, 2.0]]))
    y = np.asarray(jax.jit(getattr(ps, op))(rows))
    assert np.isnan(y[:2]).all()
    np.testing.assert_allclose(y[2], getattr(jax.nn, op)(np.array([0.0, 1.0, 2.0])), rtol=1e-6)
    safe = np.asarray(jax.jit(lambda t: getattr(ps, op)(t, safe=True))(rows))
    assert safe[0].tolist() == ([0.0] * 3 if op == "softmax" else [-np.inf] * 3)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_grads_vmap_and_jvp_match_jax_nn(op):
    ours, theirs = getattr(ps, op), getattr(jax.nn, op)
    x = _on_gpu(3 * jax.random.normal(jax.random.key(7), (6, 40, 257)))
    w = _on_gpu(jax.random.normal(jax.random.key(8), (6, 40, 257)))
    for axis in (-1, 1):
        g = jax.jit(jax.grad(lambda t, a=axis: (ours(t, axis=a) * w).sum()))(x)
        ref = jax.jit(jax.grad(lambda t, a=axis: (theirs(t, axis=a) * w).sum()))(x)
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-5, rtol=1e-4)
    v = jax.jit(jax.vmap(lambda t: ours(t, axis=0), in_axes=1, out_axes=1))(x)
    np.testing.assert_allclose(np.asarray(v), np.asarray(theirs(x, axis=0)), atol=1e-6, rtol=1e-5)
    _, tangent = jax.jit(lambda a, b: jax.jvp(ours, (a,), (b,)))(x, w)
    _, ref_tangent = jax.jvp(theirs, (x,), (w,))
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(ref_tangent), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(4, 33), (512, 4096), (300, 1000), (6, 40, 257), (3, 1), (4, 200_000),
                                   (5, 50257), (2, 4_194_304)])
@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_grads_from_input_match_jax_nn_in_one_call(op, safe, dtype, shape):
    """jax.grad where the gradient from x is planned: one custom call in the compiled program (the
    forward's dropped), values as jax.nn's; elsewhere (rows the two-pass split takes, rows of one
    float32 column, 16-bit rows of partial slots held in registers) the forward's call and the
    gradient's from y."""
    x = _on_gpu((3 * jax.random.normal(jax.random.key(21), shape)).astype(dtype))
    w = _on_gpu(jax.random.normal(jax.random.key(22), shape).astype(dtype))
    ours = jax.jit(jax.grad(lambda t: (getattr(ps, op)(t, safe=safe) * w).sum()))
    theirs = jax.jit(jax.grad(lambda t: (getattr(jax.nn, op)(t) * w.astype(jnp.float32)).sum()))
    g, ref = ours(x), theirs(x.astype(jnp.float32))
    assert g.dtype == jnp.dtype(dtype)
    profile = _probe.runtime(_jax_ffi.vendor_of(GPU)).profile(0)
    fused = _jax.takes_input_path(shape, dtype, -1, op, safe, profile)
    if not fused and dtype != "float32":  # from the stored 16-bit y, whose rounding reaches exp(y) sum(dy)
        y = np.asarray(getattr(jax.nn, op)(x.astype(jnp.float32), axis=-1).astype(dtype))
        ref = gradient_reference(np.asarray(w), y, -1, op)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == "float32" else dict(atol=3e-2, rtol=3e-2)
    np.testing.assert_allclose(np.asarray(g.astype(jnp.float32)), np.asarray(ref), **tol)
    text = ours.lower(x).compile().as_text()
    assert text.count('custom_call_target="portable_softmax_launch') == (1 if fused else 2), text[:2000]
    safe_rows = _on_gpu(jnp.full((2, shape[-1]), -jnp.inf, dtype))
    if safe:
        assert (np.asarray(jax.jit(jax.grad(lambda t: getattr(ps, op)(t, safe=True).sum()))(safe_rows)) == 0).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_two_layer_model_trains_like_jax_nn():
    k1, k2, k3 = jax.random.split(jax.random.key(9), 3)
    params = {"w1": _on_gpu(0.1 * jax.random.normal(k1, (64, 128))),
              "w2": _on_gpu(0.1 * jax.random.normal(k2, (128, 10)))}
    x = _on_gpu(jax.random.normal(k3, (256, 64)))
    labels = jnp.arange(256) % 10

    def loss(p, log_softmax, softmax):
        hidden = softmax(x @ p["w1"])  # a softmax activation, then a log_softmax cross-entropy
        logits = hidden @ p["w2"]
        return -jnp.take_along_axis(log_softmax(logits), labels[:, None], axis=1).mean()

    ours = jax.jit(jax.value_and_grad(lambda p: loss(p, ps.log_softmax, ps.softmax)))
    theirs = jax.jit(jax.value_and_grad(lambda p: loss(p, jax.nn.log_softmax, jax.nn.softmax)))
    (value, grads), (ref_value, ref_grads) = ours(params), theirs(params)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(grads[name]), np.asarray(ref_grads[name]), atol=1e-6, rtol=1e-4)
    assert "portable_softmax_launch" in ours.lower(params).compile().as_text()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_eager_arrays_take_the_compiled_call(rng):
    x = random_input(rng, (128, 300), "float32")
    on_gpu = _on_gpu(x)
    assert _jax.is_tracer(on_gpu), "a concrete GPU array goes through the compiled call"
    _jax._eager.clear()
    for _ in range(2):
        y = ps.log_softmax(on_gpu)
    assert isinstance(y, jax.Array) and next(iter(y.devices())) == GPU
    assert list(_jax._eager) == [(-1, "log_softmax", False)]
    assert_matches(np.asarray(y), x, op="log_softmax")
    with pytest.raises(ValueError, match="out= cannot take the softmax of a JAX array on a GPU"):
        ps.softmax(on_gpu, out=np.empty_like(x))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_gradient_functions_on_traced_and_eager_arrays(rng, op):
    """ps.softmax_backward / ps.log_softmax_backward of JAX GPU arrays, under jax.jit and eagerly
    (the compiled call, cached per axis and op): the gradient kernels' custom call, no callback."""
    fn = getattr(ps, f"{op}_backward")
    for shape, axis, dtype in [((512, 4096), -1, "float32"), ((6, 40, 257), 1, "bfloat16"),
                               ((4, 200_000), -1, "float32"), ((3000, 64), 0, "float16")]:
        dy, y = _gradient_case(rng, shape, axis, op, dtype)
        args = (_on_gpu(dy), _on_gpu(y))
        jitted = jax.jit(lambda d, w, a=axis: fn(d, w, a))
        for got in (jitted(*args), fn(*args, axis)):
            assert isinstance(got, jax.Array) and next(iter(got.devices())) == GPU and got.dtype == jnp.dtype(dtype)
            _assert_gradient(got, dy, y, axis, op)
        assert ("gradient", axis % len(shape) - len(shape), op) in _jax._eager
        text = jitted.lower(*args).compile().as_text()
        assert text.count('custom_call_target="portable_softmax_launch"') == 1, text[:2000]
        assert "callback" not in text


@pytest.mark.gpu
@needs_gpu
@pytest.mark.usefixtures("registered")
def test_gpu_compiled_hlo_holds_the_custom_call_and_no_callback():
    x = _on_gpu(jnp.ones((512, 4096), jnp.float32))
    profile = _probe.runtime(_jax_ffi.vendor_of(GPU)).profile(0)
    grad_calls = 1 if _jax.takes_input_path(x.shape, "float32", -1, "log_softmax", False, profile) else 2
    for f, calls in ((ps.softmax, 1), (ps.log_softmax, 1), (jax.grad(lambda t: ps.log_softmax(t).sum()), grad_calls)):
        text = jax.jit(f).lower(x).compile().as_text()
        assert text.count('custom_call_target="portable_softmax_launch"') == calls, text[:2000]
        targets = set(re.findall(r'custom_call_target="([^"]+)"', text))
        assert not {t for t in targets if "callback" in t}, f"a host callback in the compiled program: {targets}"
    assert _jax_ffi.status().startswith(f"registered for {_jax_ffi.FFI_PLATFORMS[_jax_ffi.vendor_of(GPU)]}")


def test_docstring_examples_of_the_jax_modules():
    import doctest

    from portable_softmax import _jax_ffi_bench

    for module in (_jax, _jax_ffi, _jax_ffi_bench):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, module.__name__
    assert doctest.testmod(_jax).attempted and doctest.testmod(_jax_ffi).attempted


def test_the_bench_refuses_a_machine_without_a_gpu_and_a_bad_shape(capsys):
    from portable_softmax import _jax_ffi_bench

    assert _jax_ffi_bench.main(["--shape", "8192by8192"]) == 2
    assert "--shape takes ROWSxCOLS" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse: usage and the accepted names, exit status 2
        _jax_ffi_bench.main(["--only", "grad softmax"])
    assert refused.value.code == 2
    assert "invalid choice: 'grad softmax'" in capsys.readouterr().err
    if GPU is None:
        assert _jax_ffi_bench.main(["--shape", "4x4", "--calls", "1", "--repeats", "1"]) == 1
        assert "JAX sees no CUDA or ROCm device" in capsys.readouterr().err
        assert _jax_ffi_bench.main(["--shape", "4x4", "--only", "grad ps.softmax"]) == 1

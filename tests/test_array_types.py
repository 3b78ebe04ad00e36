"""The caller's array type comes back: numpy, numpy scalars, torch CPU tensors, DLPack producers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from checks import assert_matches, random_input

import portable_softmax as ps


def test_numpy_in_numpy_out(rng):
    x = random_input(rng, (3, 17), "float32")
    y = ps.softmax(x)
    assert type(y) is np.ndarray and y.dtype == np.float32
    assert_matches(y, x)


def test_numpy_bfloat16(rng):
    x = random_input(rng, (3, 17), "bfloat16")
    y = ps.softmax(x)
    assert y.dtype == x.dtype
    assert_matches(y, x)


def test_numpy_scalar_gives_scalar():
    y = ps.softmax(np.float32(2.0))
    assert isinstance(y, np.float32) and y == 1.0
    y = ps.log_softmax(np.float16(2.0), axis=None)
    assert isinstance(y, np.float16) and y == 0.0


def test_python_numbers_and_lists_give_numpy():
    """array_like input, as scipy.special.softmax takes it: integers and bools become float64."""
    y = ps.softmax([[1, 2, 3], [0, 0, 0]])
    assert type(y) is np.ndarray and y.dtype == np.float64
    assert_matches(y, np.array([[1, 2, 3], [0, 0, 0]], np.float64))
    y = ps.log_softmax((0.5, 1.5), axis=0)
    assert type(y) is np.ndarray and y.dtype == np.float64
    assert_matches(y, np.array([0.5, 1.5]), op="log_softmax")
    assert type(ps.softmax(3.0)) is np.float64 and ps.softmax(3) == 1.0
    y = ps.softmax([[0.0, 1.0], [2.0, 3.0]], axis=None, dtype="float32")
    assert y.dtype == np.float32
    assert_matches(y, np.array([[0.0, 1.0], [2.0, 3.0]], np.float32), axis=None)


@pytest.mark.filterwarnings("ignore:the matrix subclass is not the recommended way:PendingDeprecationWarning")
def test_np_matrix_gives_np_matrix(rng):
    """A matrix comes back a matrix (as numpy's ufuncs and scipy.special.softmax give it); every
    axis keyword means what it means for its 2-D array."""
    x = random_input(rng, (4, 6), "float32")
    for axis in (0, 1, None, (0, 1)):
        y = ps.softmax(np.asmatrix(x), axis=axis)
        assert type(y) is np.matrix and y.shape == x.shape
        assert_matches(np.asarray(y), x, axis=axis)
    out = np.asmatrix(np.full_like(x, np.nan))
    assert ps.log_softmax(np.asmatrix(x), out=out) is out
    assert_matches(np.asarray(out), x, op="log_softmax")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_cpu_tensor_in_torch_out(rng, dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = random_input(rng, (4, 50), "float32")
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    y = ps.softmax(t, axis=1)
    assert isinstance(y, torch.Tensor) and y.dtype == t.dtype and y.device == t.device
    expected = torch.softmax(t.double(), dim=1)
    tol = 1e-5 if dtype in ("float32", "float64") else 1e-2
    assert torch.allclose(y.double(), expected, atol=1e-6, rtol=tol)


def test_dlpack_producer_round_trips(rng):
    x = random_input(rng, (2, 9), "float32")

    class Producer:
        """A minimal DLPack producer with no array namespace of its own."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

        def __array_namespace__(self):
            return np

    y = ps.softmax(Producer(x))
    assert isinstance(y, np.ndarray)
    assert_matches(y, x)


def test_jax_array_in_jax_out(rng):
    jax = pytest.importorskip("jax", reason="jax is not installed")
    x = random_input(rng, (3, 40), "float32")
    y = ps.softmax(jax.numpy.asarray(x))
    assert isinstance(y, jax.Array)
    assert_matches(np.asarray(y), x)


# ---- the conventions of torch, scipy and JAX users -----------------------------------------------------
def _joint(f, t, axes):
    """``f`` (a library's own softmax) over the joint set of ``axes`` of ``t``: moved to the end,
    flattened, computed along the last axis, and put back."""
    keep = [d for d in range(t.ndim) if d not in axes]
    perm = (*keep, *axes)
    moved = t.permute(perm) if hasattr(t, "permute") else t.transpose(perm)
    y = f(moved.reshape(*moved.shape[:len(keep)], -1)).reshape(moved.shape)
    inverse = tuple(np.argsort(perm).tolist())
    return y.permute(inverse) if hasattr(y, "permute") else y.transpose(inverse)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_dim_dtype_and_several_axes_with_autograd(op):
    """dim= is axis=, dtype= is torch.softmax's (the cast is part of the graph), tuple axes and
    None are the joint set: values and gradients (gradcheck) as torch's on the same layout."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ours, theirs = getattr(ps, op), getattr(torch, op)
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    for axis in (None, (0, 2), (2, 1), (0, 1, 2)):
        axes = tuple(range(3)) if axis is None else axis
        torch.testing.assert_close(ours(x, axis=axis), _joint(lambda t: theirs(t, -1), x, axes))
        assert torch.autograd.gradcheck(lambda t, a=axis: ours(t, dim=a), (x,))
    y = ours(x.float(), dim=1, dtype=torch.float64)
    assert y.dtype == torch.float64 and y.requires_grad
    torch.testing.assert_close(y, theirs(x.float(), 1, dtype=torch.float64))
    single = x.detach().float().requires_grad_()
    (ours_grad,) = torch.autograd.grad(ours(single, dim=0, dtype=torch.float64)[0, 1, 2], single)
    (torch_grad,) = torch.autograd.grad(theirs(single, 0, dtype=torch.float64)[0, 1, 2], single)
    assert ours_grad.dtype == torch.float32
    torch.testing.assert_close(ours_grad, torch_grad)
    assert ours(x.detach(), dtype="float32").dtype == torch.float32  # a name works for torch too
    out = torch.full((3, 4, 5), float("nan"), dtype=torch.float64)
    assert ours(x.detach(), axis=(0, 2), out=out) is out
    torch.testing.assert_close(out, _joint(lambda t: theirs(t, -1), x.detach(), (0, 2)))
    with pytest.raises(ValueError, match="out= cannot take the"):
        ours(x, axis=(0, 2), out=out)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_operator_path_takes_the_new_keywords(torch_fast_path, op):
    """torch.func.grad, vmap and torch.compile (fullgraph) with tuple axes, dim= and dtype=."""
    torch = torch_fast_path
    ours, theirs = getattr(ps, op), getattr(torch, op)
    x = torch.randn(4, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    ref = _joint(lambda t: theirs(t, -1), x, (0, 2))
    torch.testing.assert_close(torch.func.grad(lambda t: ours(t, axis=(0, 2))[1, 2, 3])(x),
                               torch.func.grad(lambda t: _joint(lambda u: theirs(u, -1), t, (0, 2))[1, 2, 3])(x))
    torch.testing.assert_close(torch.vmap(lambda t: ours(t, axis=None), in_dims=1)(x),
                               torch.vmap(lambda t: theirs(t.reshape(-1), 0).reshape(t.shape), in_dims=1)(x))
    torch._dynamo.reset()
    f = torch.compile(lambda t: ours(t, dim=(0, 2), dtype=torch.float32), fullgraph=True, backend="aot_eager")
    y = f(x.requires_grad_())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, ref.float())
    (g,) = torch.autograd.grad(y[0, 0, 0], x)
    (g_ref,) = torch.autograd.grad(_joint(lambda u: theirs(u, -1), x, (0, 2)).float()[0, 0, 0], x)
    torch.testing.assert_close(g, g_ref)


def test_torch_safe_log_softmax_gives_minus_inf_and_zero_derivatives():
    """log_softmax(safe=True): a row of all -inf gives -inf (the log of softmax's 0), and its
    gradient and tangent are 0, eagerly, under torch.func and inside torch.compile."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch.autograd.forward_ad as forward_ad

    x = torch.tensor([[0.0, 1.0, 2.0], [-float("inf")] * 3])
    expected = torch.cat([torch.log_softmax(x[:1], -1), torch.full((1, 3), -float("inf"))])
    weights = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])

    def loss(t):
        y = ps.log_softmax(t, safe=True)
        return (torch.where(torch.isinf(y), 0.0, y * weights)).sum() + y[0].sum()

    leaf = x.clone().requires_grad_()
    torch.testing.assert_close(ps.log_softmax(leaf, safe=True), expected)
    loss(leaf).backward()
    assert torch.equal(leaf.grad[1], torch.zeros(3)) and leaf.grad[0].abs().max() > 0
    torch.testing.assert_close(torch.func.grad(loss)(x), leaf.grad)
    batch = torch.stack([x, x.flip(0)])
    torch.testing.assert_close(torch.vmap(lambda t: ps.log_softmax(t, safe=True))(batch),
                               torch.stack([expected, expected.flip(0)]))
    tangent = torch.ones(2, 3) + torch.arange(6.0).reshape(2, 3)
    _, got = torch.func.jvp(lambda t: ps.log_softmax(t, safe=True), (x,), (tangent,))
    assert torch.equal(got[1], torch.zeros(3)) and got[0].abs().max() > 0
    with forward_ad.dual_level():
        dual = ps.log_softmax(forward_ad.make_dual(x, tangent), safe=True)
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, got)
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.func.jvp(lambda t: ps.log_softmax(t, safe=True), (a,), (b,)),
                      fullgraph=True, backend="aot_eager")
    primal, compiled_tangent = f(x, tangent)
    torch.testing.assert_close(primal, expected)
    torch.testing.assert_close(compiled_tangent, got)


def test_jax_several_axes_dim_dtype_and_safe_log_softmax():
    """JAX arrays, eagerly and under jit, grad and jvp: tuple axes and None against jax.nn's own
    tuple axes, dim= and dtype=, and log_softmax(safe=True) with zero tangents on empty rows."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = jax.numpy
    x = 3 * jax.random.normal(jax.random.key(23), (3, 4, 5))
    for op in ("softmax", "log_softmax"):
        ours, theirs = getattr(ps, op), getattr(jax.nn, op)
        for axis in (None, (0, 2), (2, 1)):
            np.testing.assert_allclose(ours(x, axis=axis), theirs(x, axis=axis), atol=1e-6, rtol=1e-5)
            np.testing.assert_allclose(jax.jit(lambda t, a=axis, f=ours: f(t, axis=a))(x), theirs(x, axis=axis),
                                       atol=1e-6, rtol=1e-5)
            g = jax.grad(lambda t, a=axis, f=ours: (f(t, axis=a) * jnp.arange(5.0)).sum())(x)
            ref = jax.grad(lambda t, a=axis, f=theirs: (f(t, axis=a) * jnp.arange(5.0)).sum())(x)
            np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(jax.jit(lambda t, f=ours: f(t, dim=(2, 0)))(x), theirs(x, axis=(0, 2)),
                                   atol=1e-6, rtol=1e-5)
        y = ours(x, dim=0, dtype=jnp.bfloat16)
        assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
        assert jax.jit(lambda t, f=ours: f(t, dtype="float16"))(x).dtype == jnp.float16
    rows = jnp.array([[0.0, 1.0, 2.0], [-jnp.inf] * 3])
    for f in (ps.log_softmax, jax.jit(lambda t: ps.log_softmax(t, safe=True))):
        y = f(rows, safe=True) if f is ps.log_softmax else f(rows)
        assert jnp.isneginf(y[1]).all()
        np.testing.assert_allclose(y[0], jax.nn.log_softmax(rows[0]), atol=1e-6)
    _, tangent = jax.jvp(lambda t: ps.log_softmax(t, safe=True), (rows,), (jnp.ones_like(rows),))
    assert (tangent[1] == 0).all()


# ---- torch autograd ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((4, 7), -1), ((4, 7), 0), ((3, 5, 2), 1), ((5,), 0), ((), 0)])
def test_gradients_flow_through_a_tensor_that_requires_grad(op, shape, axis):
    """A tensor that requires grad gets a result autograd can go back through (first and second
    derivatives, checked numerically in float64), not one silently cut from its graph."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    f = getattr(ps, op)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    assert type(f(x, axis).grad_fn).__name__ == "PortableSoftmaxEagerBackward"  # the classic form: cheaper
    assert torch.autograd.gradcheck(lambda t: f(t, axis), (x,))
    assert torch.autograd.gradgradcheck(lambda t: f(t, axis), (x,))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_gradients_match_torchs(op, dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gen = torch.Generator().manual_seed(5)
    x = (4 * torch.randn(6, 300, generator=gen)).to(getattr(torch, dtype)).requires_grad_()
    g = torch.randn(6, 300, generator=gen).to(x.dtype)
    (ours,) = torch.autograd.grad(getattr(ps, op)(x), x, g)
    (theirs,) = torch.autograd.grad(getattr(torch, op)(x, -1), x, g)
    assert ours.dtype == x.dtype
    tol = 1e-5 if dtype == "float32" else 2e-2
    torch.testing.assert_close(ours.double(), theirs.double(), atol=tol, rtol=tol)


def test_safe_softmax_of_an_all_minus_inf_row_has_zero_gradient():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.tensor([[0.0, 1.0], [-float("inf"), -float("inf")]], requires_grad=True)
    y = ps.softmax(x, safe=True)
    y.backward(torch.ones_like(y))
    assert torch.equal(y[1].detach(), torch.zeros(2)) and torch.equal(x.grad[1], torch.zeros(2))


def test_out_with_a_tensor_that_requires_grad_is_refused_and_no_grad_mode_takes_it():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.randn(3, 4, requires_grad=True)
    out = torch.empty(3, 4)
    with pytest.raises(ValueError, match="out= cannot take the softmax of a tensor that autograd differentiates"):
        ps.softmax(x, out=out)
    with torch.no_grad():
        assert ps.softmax(x, out=out) is out and not out.requires_grad
        assert ps.log_softmax(x).grad_fn is None
    torch.testing.assert_close(out, torch.softmax(x.detach(), -1))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_jax_arrays_of_each_dtype_come_back_as_jax(rng, dtype):
    """numpy imports no bfloat16 over DLPack: JAX's comes through its array protocol (ml_dtypes)."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    x = random_input(rng, (5, 33), dtype)
    y = ps.log_softmax(jax.numpy.asarray(x), axis=0)
    assert isinstance(y, jax.Array) and y.dtype == jax.numpy.dtype(dtype)
    assert_matches(np.asarray(y), x, axis=0, op="log_softmax")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_jit_matches_the_eager_call(rng, op, dtype):
    """Inside jax.jit the call is a host callback: the same numbers as outside, float64-checked."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    x = random_input(rng, (6, 4, 33), dtype)
    for axis in (-1, 1, 0):
        y = jax.jit(lambda t, axis=axis: getattr(ps, op)(t, axis=axis))(jax.numpy.asarray(x))
        assert y.dtype == jax.numpy.dtype(dtype)
        assert_matches(np.asarray(y), x, axis=axis, op=op)


def test_jax_vmap_on_the_cpu_is_jax_numpy_with_the_batch_folded_in(rng):
    """vmap of a traced call on the CPU: values over the batch, and a lowering with no host callback."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    x = random_input(rng, (5, 3, 40), "float32")
    f = jax.vmap(lambda t: ps.log_softmax(t, axis=0), in_axes=1)
    y = f(jax.numpy.asarray(x))
    assert_matches(np.asarray(y), np.moveaxis(x, 1, 0), axis=1, op="log_softmax")
    text = jax.jit(f).lower(jax.numpy.asarray(x)).as_text()
    assert "callback" not in text.lower()


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_jax_gradients_match_jax_nns(op):
    """jax.grad, jacrev and grad under jit through the custom VJP, against jax.nn's."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = jax.numpy
    x = 4 * jax.random.normal(jax.random.key(16), (4, 9))
    weights = jnp.arange(9.0)
    ours = getattr(ps, op)
    theirs = getattr(jax.nn, op)
    for axis in (-1, 0):
        g = jax.grad(lambda t, a=axis: (ours(t, axis=a) * weights).sum())(x)
        ref = jax.grad(lambda t, a=axis: (theirs(t, axis=a) * weights).sum())(x)
        np.testing.assert_allclose(g, ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(jax.jacrev(ours)(x[0]), jax.jacrev(theirs)(x[0]), atol=1e-6, rtol=1e-5)
    g = jax.jit(jax.grad(lambda t: (ours(t) ** 2).sum()))(x)
    np.testing.assert_allclose(g, jax.grad(lambda t: (theirs(t) ** 2).sum())(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_jax_forward_mode_matches_jax_nns(op):
    """jax.jvp, jacfwd and hessian through the custom JVP (16-bit tangents in float32), against
    jax.nn's; the reverse mode that JAX transposes from it is the test above."""
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = jax.numpy
    x = 4 * jax.random.normal(jax.random.key(17), (4, 9))
    t = jax.random.normal(jax.random.key(18), (4, 9))
    ours, theirs = getattr(ps, op), getattr(jax.nn, op)
    for axis in (-1, 0):
        primal, tangent = jax.jvp(lambda a, ax=axis: ours(a, axis=ax), (x,), (t,))
        ref_primal, ref_tangent = jax.jvp(lambda a, ax=axis: theirs(a, axis=ax), (x,), (t,))
        np.testing.assert_allclose(primal, ref_primal, atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(tangent, ref_tangent, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(jax.jacfwd(ours)(x[0]), jax.jacfwd(theirs)(x[0]), atol=1e-6, rtol=1e-5)
    weights = jnp.arange(9.0)
    np.testing.assert_allclose(jax.hessian(lambda a: (ours(a) * weights).sum())(x[0]),
                               jax.hessian(lambda a: (theirs(a) * weights).sum())(x[0]), atol=1e-5, rtol=1e-4)
    half = x.astype(jnp.bfloat16)
    _, tangent = jax.jit(lambda a, b: jax.jvp(ours, (a,), (b,)))(half, t.astype(jnp.bfloat16))
    _, ref_tangent = jax.jvp(theirs, (half.astype(jnp.float32),), (t,))
    assert tangent.dtype == jnp.bfloat16
    np.testing.assert_allclose(tangent.astype(jnp.float32), ref_tangent, atol=5e-2, rtol=5e-2)


def test_jax_transformations_keep_the_semantics_and_the_errors():
    jax = pytest.importorskip("jax", reason="jax is not installed")
    jnp = jax.numpy
    rows = jnp.array([[-jnp.inf, -jnp.inf], [0.0, 1.0]])
    assert jax.jit(lambda t: ps.softmax(t, safe=True))(rows)[0].tolist() == [0.0, 0.0]
    assert jax.grad(lambda t: ps.softmax(t, safe=True)[0].sum())(rows).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    scalar = jnp.float32(3.0)
    assert float(jax.jit(ps.softmax)(scalar)) == 1.0 and float(jax.jit(ps.log_softmax)(scalar)) == 0.0
    with pytest.raises(TypeError, match="got dtype int32. Supported dtypes"):
        jax.jit(ps.softmax)(jnp.ones(3, jnp.int32))
    with pytest.raises(IndexError, match="axis 2 is out of bounds for array of dimension 2"):
        jax.jit(lambda t: ps.softmax(t, axis=2))(rows)
    with pytest.raises(ValueError, match="out= cannot take the softmax of a traced JAX array"):
        jax.jit(lambda t: ps.softmax(t, out=t))(rows)


def test_a_dlpack_producer_numpy_cannot_import_is_named():
    class Unimportable:
        def __dlpack__(self, **_):
            raise BufferError("no capsule today")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="numpy cannot import this Unimportable over DLPack"):
        ps.softmax(Unimportable())


def test_torch_func_transforms_of_gradients_match_torchs():
    """torch.func.grad and jacrev take the autograd function (it sets up its context apart)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.randn(6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda t: ps.softmax(t)[2])(x),
                               torch.func.grad(lambda t: torch.softmax(t, -1)[2])(x))
    torch.testing.assert_close(torch.func.jacrev(ps.log_softmax)(x),
                               torch.func.jacrev(lambda t: torch.log_softmax(t, -1))(x))


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((4, 30), -1), ((4, 30), 0), ((3, 5, 2), 1), ((), 0)])
def test_forward_mode_tangents_match_torchs(torch_fast_path, op, dtype, shape, axis):
    """torch.func.jvp and an eager forward-mode dual level carry the tangent through the call (the
    operator alone would give a zero tangent): softmax's y (t - sum(t y)), log_softmax's
    t - sum(t exp(y)), 16-bit in float32."""
    torch = torch_fast_path
    gen = torch.Generator().manual_seed(13)
    x = (3 * torch.randn(shape, dtype=torch.float64, generator=gen)).to(getattr(torch, dtype))
    tangent = torch.randn(shape, dtype=torch.float64, generator=gen).to(x.dtype)
    ours, theirs = getattr(ps, op), (lambda t: getattr(torch, op)(t, axis))
    expected = torch.func.jvp(lambda t: getattr(torch, op)(t.double(), axis), (x,), (tangent,))[1]
    tol = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 2e-2}[dtype]
    primal, got = torch.func.jvp(lambda t: ours(t, axis), (x,), (tangent,))
    torch.testing.assert_close(primal, theirs(x), atol=tol, rtol=tol)
    assert got.dtype == x.dtype and got.abs().max() > 0 or x.dim() == 0
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)
    import torch.autograd.forward_ad as forward_ad

    with forward_ad.dual_level():
        y = ours(forward_ad.make_dual(x, tangent), axis)
        got = forward_ad.unpack_dual(y).tangent
        with pytest.raises(ValueError, match="forward-mode dual level"):
            ours(forward_ad.make_dual(x, tangent), axis, out=torch.empty_like(x))
    torch.testing.assert_close(got.double(), expected, atol=tol, rtol=tol)


def _compile_takes_dual_inputs(torch) -> bool:
    """Whether this torch's torch.compile(fullgraph=True) takes an input that carries a forward-mode
    tangent: torch 2.13 does; 2.14 refuses it (torch._dynamo.exc.Unsupported: "Attempted to wrap a
    dual tensor input"), for torch.softmax itself as for any function."""
    import torch.autograd.forward_ad as forward_ad

    torch._dynamo.reset()
    f = torch.compile(lambda t: torch.softmax(t, -1), fullgraph=True, backend="aot_eager")
    with forward_ad.dual_level():
        try:
            f(forward_ad.make_dual(torch.zeros(2, 3), torch.ones(2, 3)))
        except torch._dynamo.exc.Unsupported:
            return False
    return True


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_forward_mode_inside_torch_compile_carries_the_tangent(op):
    """torch.compile drops an autograd function's jvp (pytorch#192985) and the operator has none:
    under forward mode inside it the call is torch's own softmax, whose tangent is right. A dual
    tensor passed into a compiled function is what torch decides: where its torch.compile refuses
    one (torch 2.14), ours is refused with the same torch error, and without fullgraph the call
    falls back to eager and carries the tangent."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch.autograd.forward_ad as forward_ad

    gen = torch.Generator().manual_seed(15)
    x, tangent = torch.randn(4, 30, generator=gen), torch.randn(4, 30, generator=gen)
    x[1] = -float("inf")  # an empty row: safe softmax gives 0 there, and a zero tangent
    safe = op == "softmax"
    ours = (lambda t: ps.softmax(t, safe=True)) if safe else ps.log_softmax
    expected_primal = ps.softmax(x, safe=True) if safe else ps.log_softmax(x)
    live = torch.ones(4, 1, dtype=torch.bool)
    live[1] = False
    theirs = getattr(torch, op)
    _, expected = torch.func.jvp(lambda t: theirs(torch.where(live, t, 0.0), -1), (x,), (tangent,))
    expected = torch.where(live, expected, 0.0) if safe else expected
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.func.jvp(ours, (a,), (b,)), fullgraph=True, backend="aot_eager")
    primal, got = f(x, tangent)
    torch.testing.assert_close(primal, expected_primal, equal_nan=True)
    rows = [0, 2, 3] if not safe else [0, 1, 2, 3]
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-5, rtol=1e-5)
    assert got[rows].abs().max() > 0  # (the operator alone gave zeros)

    def dual_through(compiled):
        with forward_ad.dual_level():
            return forward_ad.unpack_dual(compiled(forward_ad.make_dual(x, tangent))).tangent

    takes_dual_inputs = _compile_takes_dual_inputs(torch)
    torch._dynamo.reset()
    g = torch.compile(ours, fullgraph=True, backend="aot_eager")
    if takes_dual_inputs:
        got = dual_through(g)
    else:
        with pytest.raises(torch._dynamo.exc.Unsupported, match="dual tensor input"):
            dual_through(g)
        torch._dynamo.reset()
        got = dual_through(torch.compile(ours, backend="aot_eager"))  # the graph break runs it eagerly
    torch.testing.assert_close(got[rows], expected[rows], atol=1e-5, rtol=1e-5)


def test_jacfwd_and_hessian_match_torchs():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(14))
    torch.testing.assert_close(torch.func.jacfwd(ps.softmax)(x), torch.func.jacfwd(lambda t: torch.softmax(t, -1))(x))
    torch.testing.assert_close(torch.vmap(torch.func.jacfwd(ps.log_softmax))(x),
                               torch.vmap(torch.func.jacfwd(lambda t: torch.log_softmax(t, -1)))(x))

    def loss(f, g):
        return lambda t: (f(t) * torch.arange(7.0, dtype=t.dtype)).sum() + g(t)[1, 2]

    ours = torch.func.hessian(loss(ps.softmax, ps.log_softmax))(x)
    theirs = torch.func.hessian(loss(lambda t: torch.softmax(t, -1), lambda t: torch.log_softmax(t, -1)))(x)
    torch.testing.assert_close(ours, theirs)


# ---- torch.func.vmap, torch.compile, fake tensors: the operator portable_softmax::softmax ----------
@pytest.fixture(params=["unarmed", "armed"])
def torch_fast_path(request):
    """Each test twice: before and after the repeat-call path's checks are armed (a CUDA tensor's
    first call arms them; here a CPU tensor's, whose keys then miss)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from portable_softmax import api

    if request.param == "armed":
        api._is_torch_cuda(torch.ones(1))
        assert api._TORCH_TENSOR is torch.Tensor and api._torch_is_compiling is not None
    return torch


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("in_dims, axis", [(0, -1), (1, 0), (2, 1), (0, 0)])
def test_vmap_matches_torchs(torch_fast_path, op, in_dims, axis):
    """vmap moves the batch to the front and computes every batch at once (no per-item loop)."""
    torch = torch_fast_path
    x = 4 * torch.randn(3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    ours = torch.vmap(lambda t: getattr(ps, op)(t, axis=axis), in_dims=in_dims)(x)
    theirs = torch.vmap(lambda t: getattr(torch, op)(t, axis), in_dims=in_dims)(x)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)


def test_eager_vmap_takes_the_batch_apart_without_the_operator(monkeypatch):
    """vmap of a tensor autograd does not record skips the operator's dispatch (most of a vmapped
    call's host time): its batch is unwrapped, computed at once and wrapped again, nested too."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from portable_softmax import _torch_op

    ps.softmax(torch.ones(2, 2, requires_grad=True))  # registers the operator
    monkeypatch.setattr(_torch_op, "_operator", lambda *_: pytest.fail("vmap went through the operator"))
    x = torch.randn(4, 3, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(16))
    torch.testing.assert_close(torch.vmap(ps.log_softmax, in_dims=2)(x), torch.log_softmax(x, 1).movedim(2, 0))
    torch.testing.assert_close(torch.vmap(torch.vmap(lambda t: ps.softmax(t, axis=0)))(x),
                               torch.softmax(x, 2))
    torch.testing.assert_close(torch.vmap(ps.softmax)(x[0, 0]), torch.ones(9, dtype=torch.float64))


def test_eager_vmap_of_a_tensor_that_requires_grad_keeps_the_gradient():
    """A leaf that requires grad under vmap, and jacrev around a vmap: autograd records underneath
    the batch, and the gradient is torch's (the operator's own vmap rule took neither)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gen = torch.Generator().manual_seed(19)
    x = torch.randn(3, 5, 7, dtype=torch.float64, generator=gen)
    w = torch.randn(3, 5, 7, dtype=torch.float64, generator=gen)
    for op in ("softmax", "log_softmax"):
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        (torch.vmap(getattr(ps, op), in_dims=1, out_dims=1)(ours) * w).sum().backward()
        (getattr(torch, op)(theirs, -1) * w).sum().backward()
        torch.testing.assert_close(ours.grad, theirs.grad)
        assert torch.vmap(getattr(ps, op))(ours).requires_grad
        torch.testing.assert_close(torch.func.jacrev(torch.vmap(getattr(ps, op)))(x[0]),
                                   torch.func.jacrev(torch.vmap(lambda t, op=op: getattr(torch, op)(t, -1)))(x[0]))


def test_nested_vmap_a_batch_of_scalars_and_vmap_of_jacrev():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(2, 3, 6, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(torch.vmap(torch.vmap(ps.log_softmax))(x), torch.log_softmax(x, -1))
    torch.testing.assert_close(torch.vmap(ps.softmax)(torch.randn(5, generator=gen)), torch.ones(5))
    jac = torch.vmap(torch.func.jacrev(ps.softmax))(x[0])
    torch.testing.assert_close(jac, torch.vmap(torch.func.jacrev(lambda t: torch.softmax(t, -1)))(x[0]))
    grads = torch.vmap(torch.func.grad(lambda t: ps.log_softmax(t)[1]))(x[1])
    torch.testing.assert_close(grads, torch.vmap(torch.func.grad(lambda t: torch.log_softmax(t, -1)[1]))(x[1]))


def test_vmap_refuses_what_the_eager_call_refuses():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    with pytest.raises(TypeError, match="got dtype int32. Supported dtypes"):
        torch.vmap(ps.softmax)(torch.ones(3, 2, dtype=torch.int32))
    with pytest.raises(IndexError, match="axis 1 is out of bounds for array of dimension 1"):
        torch.vmap(lambda t: ps.softmax(t, axis=1))(torch.ones(3, 2))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_compile_keeps_the_call_in_one_graph_forward_and_backward(torch_fast_path, op):
    """fullgraph=True fails on any graph break: the call must trace as the operator, with its fake
    kernel for shapes and the autograd function for the backward."""
    torch = torch_fast_path
    torch._dynamo.reset()
    x = (4 * torch.randn(5, 33, generator=torch.Generator().manual_seed(13))).requires_grad_()
    loss = torch.compile(lambda t: (getattr(ps, op)(t, axis=0) ** 2).sum(), fullgraph=True, backend="aot_eager")
    (ours,) = torch.autograd.grad(loss(x), x)
    (theirs,) = torch.autograd.grad((getattr(torch, op)(x, 0) ** 2).sum(), x)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        out = torch.full_like(x, float("nan"))
        compiled = torch.compile(lambda t, o: getattr(ps, op)(t, out=o), fullgraph=True, backend="aot_eager")
        assert compiled(x, out) is out
        torch.testing.assert_close(out, getattr(torch, op)(x, -1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_the_operator_passes_torchs_opcheck(dtype):
    """torch.library.opcheck: the schema, the fake kernel against the real result (shape, dtype,
    strides), the autograd registration and AOT dispatch, on a 2-D and a 3-D input."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ps.softmax(torch.ones(2, 2, requires_grad=True))  # registers the operator
    gen = torch.Generator().manual_seed(14)
    for shape, axis, op, safe in [((4, 9), 1, "softmax", False), ((3, 4, 5), 0, "log_softmax", False),
                                  ((2, 6), 1, "softmax", True)]:
        x = torch.randn(shape, generator=gen).to(getattr(torch, dtype)).requires_grad_()
        torch.library.opcheck(torch.ops.portable_softmax.softmax.default, (x, axis, op, safe))


def test_fake_and_meta_tensors_get_the_results_shape_and_dtype():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from torch._subclasses.fake_tensor import FakeTensorMode

    y = ps.log_softmax(torch.empty(3, 4, dtype=torch.bfloat16, device="meta"), axis=0)
    assert (y.shape, y.dtype, y.device.type) == ((3, 4), torch.bfloat16, "meta")
    with FakeTensorMode():
        y = ps.softmax(torch.empty(6, 2))
    assert type(y).__name__ == "FakeTensor" and y.shape == (6, 2)


def test_torch_export_keeps_the_operator_and_a_saved_program_loads_in_a_new_process(tmp_path):
    """The exported graph calls portable_softmax::softmax; a process that imports torch and then
    the package (which registers the operator on import) loads and runs the saved program."""
    torch = pytest.importorskip("torch", reason="torch is not installed")

    class LogSoftmaxPlusOne(torch.nn.Module):
        def forward(self, x):
            return ps.log_softmax(x, axis=0) + 1

    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(15))
    program = torch.export.export(LogSoftmaxPlusOne(), (x,))
    assert "torch.ops.portable_softmax.softmax.default" in program.graph_module.code
    torch.testing.assert_close(program.module()(x), torch.log_softmax(x, 0) + 1)
    torch.export.save(program, tmp_path / "program.pt2")
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys, torch, portable_softmax\n"
            f"d = {str(tmp_path)!r}\n"
            "y = torch.export.load(d + '/program.pt2').module()(torch.load(d + '/x.pt'))\n"
            "torch.save(y, d + '/y.pt')\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), torch.log_softmax(x, 0) + 1)


def test_importing_the_package_imports_no_torch():
    """numpy users do not pay for torch's import: the operator is registered only where torch is."""
    code = "import sys, portable_softmax; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "False"


def test_first_calls_from_several_threads_register_the_operator_once():
    """torch imported after the package: the first calls register the operator, under a lock."""
    pytest.importorskip("torch", reason="torch is not installed")
    code = ("import sys, threading, portable_softmax as ps, torch\n"
            "sys.setswitchinterval(1e-6)  # threads switch inside the registration, if unguarded\n"
            "x = torch.randn(4, 5, requires_grad=True)\n"
            "errors, start = [], threading.Barrier(8)\n"
            "def first_call():\n"
            "    start.wait()\n"
            "    try:\n"
            "        ps.softmax(x).sum().backward()\n"
            "    except Exception as e:\n"
            "        errors.append(repr(e))\n"
            "threads = [threading.Thread(target=first_call) for _ in range(8)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "print(errors or 'ok', x.grad.abs().max().item() < 1e-6)\n")
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
                 for _ in range(4)]  # an unguarded registration failed about one start in three
    for process in processes:
        stdout, _ = process.communicate(timeout=300)
        assert stdout.split() == ["ok", "True"]  # each softmax row sums to 1: its gradient is 0

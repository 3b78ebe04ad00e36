"""The caller's array type comes back: numpy, numpy scalars, torch CPU tensors, DLPack producers."""

from __future__ import annotations

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


# ---- torch autograd ----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((4, 7), -1), ((4, 7), 0), ((3, 5, 2), 1), ((5,), 0), ((), 0)])
def test_gradients_flow_through_a_tensor_that_requires_grad(op, shape, axis):
    """A tensor that requires grad gets a result autograd can go back through (first and second
    derivatives, checked numerically in float64), not one silently cut from its graph."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    f = getattr(ps, op)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    assert f(x, axis).grad_fn is not None
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
    with pytest.raises(ValueError, match="out= cannot take the softmax of a tensor that requires grad"):
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


def test_jax_transformations_get_a_clear_error():
    jax = pytest.importorskip("jax", reason="jax is not installed")
    for transformed in (jax.jit(ps.softmax), jax.grad(lambda t: ps.softmax(t)[0])):
        with pytest.raises(TypeError, match="got a JAX tracer .*call it outside the transformation"):
            transformed(jax.numpy.ones(3))


def test_a_dlpack_producer_numpy_cannot_import_is_named():
    class Unimportable:
        def __dlpack__(self, **_):
            raise BufferError("no capsule today")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="numpy cannot import this Unimportable over DLPack"):
        ps.softmax(Unimportable())


def test_torch_func_transforms_of_gradients_match_torchs():
    """torch.func.grad and jacrev take the autograd function too (it sets up its context apart)."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.randn(6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda t: ps.softmax(t)[2])(x),
                               torch.func.grad(lambda t: torch.softmax(t, -1)[2])(x))
    torch.testing.assert_close(torch.func.jacrev(ps.log_softmax)(x),
                               torch.func.jacrev(lambda t: torch.log_softmax(t, -1))(x))

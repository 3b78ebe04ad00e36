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

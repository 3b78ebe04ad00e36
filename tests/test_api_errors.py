"""Bad input gets a clear error naming what was wrong and what is accepted."""

from __future__ import annotations

import numpy as np
import pytest

import portable_softmax as ps


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64, np.complex128])
def test_non_float_dtypes_raise_type_error_naming_supported(dtype):
    with pytest.raises(TypeError, match=r"float32, float16, bfloat16, float64"):
        ps.softmax(np.zeros((2, 3), dtype=dtype))


def test_axis_out_of_range_is_numpy_style():
    x = np.zeros((2, 3), np.float32)
    for axis in (2, -3, 10):
        with pytest.raises(IndexError, match=f"axis {axis} is out of bounds for array of dimension 2"):
            ps.softmax(x, axis=axis)
    with pytest.raises(TypeError, match="axis must be an integer"):
        ps.softmax(x, axis=1.5)


@pytest.mark.parametrize(
    "out, message",
    [
        (np.zeros((3, 2), np.float32), "out has shape"),
        (np.zeros((2, 3), np.float64), "out has dtype"),
        (np.broadcast_to(np.zeros(3, np.float32), (2, 3)), "broadcast"),
    ],
)
def test_bad_out_raises_value_error(out, message):
    with pytest.raises(ValueError, match=message):
        ps.softmax(np.zeros((2, 3), np.float32), out=out)


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (0, 4)])
def test_out_of_no_elements_is_filled_and_returned(shape):
    """numpy gives an array of no elements strides of 0: out= of one is still no broadcast view."""
    torch = pytest.importorskip("torch", reason="torch's CPU tensors are one of the array types checked")
    x = np.ones(shape, np.float32)
    for axis in range(-len(shape), len(shape)):
        out = np.empty_like(x)
        assert ps.softmax(x, axis=axis, out=out) is out
        assert ps.log_softmax_backward(x, x, axis, out=out) is out
        t = torch.ones(shape)
        t_out = torch.empty_like(t)
        assert ps.log_softmax(t, axis=axis, out=t_out) is t_out
        assert ps.softmax_backward(t, t, axis, out=t_out) is t_out


def test_what_is_no_array_or_numbers_is_rejected():
    for value in ("1 2 3", b"12", {"a": 1.0}, object(), None):
        with pytest.raises(TypeError, match="expected an array"):
            ps.softmax(value)
    with pytest.raises(TypeError, match="cannot make an array of this list"):
        ps.softmax([[1.0, 2.0], [3.0]])  # ragged
    with pytest.raises(TypeError, match="got dtype complex128. Supported dtypes"):
        ps.softmax([1j, 2.0])


def test_axis_and_dim_together_are_refused():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="got axis=0 and dim=1: dim is a synonym of axis, give one of them"):
        ps.softmax(x, 0, dim=1)
    with pytest.raises(TypeError, match="got axis=None and dim=0"):
        ps.log_softmax(x, axis=None, dim=0)


@pytest.mark.parametrize("dtype", [np.int32, "int64", bool, "complex64", "float8", object])
def test_a_dtype_keyword_that_is_no_supported_float_names_the_supported_ones(dtype):
    with pytest.raises(TypeError, match=r"dtype= takes a floating-point dtype; got .*Supported dtypes: float32, "
                                        r"float16, bfloat16, float64"):
        ps.softmax(np.zeros(3, np.float32), dtype=dtype)


def test_bad_axis_tuples_are_numpy_style():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"duplicate value in axis=\(0, -3\)"):
        ps.softmax(x, axis=(0, -3))
    with pytest.raises(IndexError, match="axis 3 is out of bounds for array of dimension 3"):
        ps.softmax(x, axis=(0, 3))
    with pytest.raises(TypeError, match="axis must be an integer, got float"):
        ps.softmax(x, axis=(0, 1.0))


def test_masked_arrays_are_refused_with_what_to_pass_instead():
    x = np.ma.masked_array(np.zeros((2, 3), np.float32), mask=[[0, 1, 0], [0, 0, 0]])
    for f in (ps.softmax, ps.log_softmax):
        with pytest.raises(TypeError, match=r"masked arrays are not supported: the mask would be ignored. "
                                            r"Pass x.filled\(-numpy.inf\)"):
            f(x)
    with pytest.raises(TypeError, match="masked arrays are not supported"):
        ps.softmax(np.zeros((2, 3), np.float32), out=np.ma.masked_array(np.zeros((2, 3), np.float32)))


def test_a_read_only_out_is_refused():
    out = np.zeros((2, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        ps.softmax(np.zeros((2, 3), np.float32), out=out)


def test_a_jax_out_is_refused_as_immutable():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    x = jnp.zeros((2, 3))
    for value in (x, np.zeros((2, 3), np.float32)):
        for axis in (-1, None):
            with pytest.raises(ValueError, match="out= cannot be a JAX array: JAX arrays are immutable"):
                ps.softmax(value, axis=axis, out=jnp.zeros((2, 3)))


def test_the_public_namespace_holds_only_the_api():
    """No module the package uses for itself (sys, ...) shows through ``ps.``; what ``__all__``
    names is there, and every other public name is a submodule of the package."""
    import types

    assert not hasattr(ps, "sys")
    assert set(ps.__all__) <= set(dir(ps))
    for name in dir(ps):
        if name.startswith("_") or name in ps.__all__:
            continue
        value = getattr(ps, name)
        assert isinstance(value, types.ModuleType) and value.__name__ == f"portable_softmax.{name}", name


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'metal'"):
        with ps.use_backend("metal"):
            pass


def test_forcing_a_backend_that_cannot_run_is_a_clear_error(monkeypatch):
    from portable_softmax import _probe

    for vendor in ("cuda", "hip"):
        try:
            _probe.runtime(vendor)
            continue  # it can run here: forcing it is fine
        except _probe.BackendUnavailableError:
            pass
        monkeypatch.setenv(_probe.ENV_VAR, vendor)
        with pytest.raises(_probe.BackendUnavailableError, match=f"{_probe.ENV_VAR}={vendor} but that backend"):
            ps.softmax(np.zeros(3, np.float32))
    monkeypatch.setenv(_probe.ENV_VAR, "opencl")
    with pytest.raises(_probe.BackendUnavailableError, match="not one of cuda, hip, cpu"):
        ps.backend_info()
    monkeypatch.setenv(_probe.ENV_VAR, "cpu")
    assert ps.backend_info()["backend"] == "cpu"


def test_backend_info_reports_why():
    info = ps.backend_info()
    assert info["backend"] in ("cuda", "hip", "cpu")
    assert set(info["why"]) <= {"cuda", "hip", "cpu"} and info["why"]
    assert info["package_version"] == ps.__version__

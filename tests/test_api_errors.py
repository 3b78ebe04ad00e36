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


def test_non_arrays_are_rejected():
    with pytest.raises(TypeError, match="expected an array"):
        ps.softmax([1.0, 2.0])
    with pytest.raises(TypeError, match="expected an array"):
        ps.softmax("1 2 3")


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

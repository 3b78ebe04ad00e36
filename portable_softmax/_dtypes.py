"""Dtype names shared by every array library, and the error for unsupported ones."""

from __future__ import annotations

import numpy as np

SUPPORTED = ("float32", "float16", "bfloat16", "float64")


class UnsupportedDtypeError(TypeError):
    pass


def storage_name(dtype) -> str:
    """'float32' | 'float16' | 'bfloat16' | 'float64' for a numpy/cupy/torch/ml_dtypes dtype."""
    name = str(dtype).removeprefix("torch.")
    if name in SUPPORTED:
        return name
    raise UnsupportedDtypeError(
        f"softmax needs a floating-point input; got dtype {name}. Supported dtypes: {', '.join(SUPPORTED)}"
    )


def dtype_name(dtype) -> str:
    """The storage name of a ``dtype=`` argument: a name, or a numpy, ml_dtypes, torch or JAX dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in SUPPORTED:
        try:
            name = np.dtype(dtype).name
        except (TypeError, ValueError):
            pass
    if name in SUPPORTED:
        return name
    raise UnsupportedDtypeError(
        f"dtype= takes a floating-point dtype; got {dtype!r}. Supported dtypes: {', '.join(SUPPORTED)} "
        "(as names, or numpy, torch or JAX dtypes)"
    )


def host_dtype(name: str) -> np.dtype:
    """The numpy dtype for a storage name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def itemsize(name: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[name]

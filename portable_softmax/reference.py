"""NumPy softmax with the package's semantics: the float64 reference and the CPU backend.

>>> import numpy as np
>>> from portable_softmax import reference
>>> reference.softmax(np.array([0.0, np.log(3.0)]))
array([0.25, 0.75])
"""

from __future__ import annotations

import numpy as np

from ._dtypes import host_dtype, storage_name


def _normalized(x: np.ndarray, axis: int, compute: np.dtype, op: str, safe: bool) -> np.ndarray:
    """softmax / log_softmax of ``x`` along ``axis``, computed in ``compute``."""
    xc = np.asarray(x).astype(compute, copy=False)
    if xc.ndim == 0:
        return np.asarray(1.0 if op == "softmax" else 0.0, dtype=compute)
    if xc.size == 0:
        return np.empty(xc.shape, dtype=compute)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(xc, axis=axis, keepdims=True)  # NaN-propagating, like the kernels
        empty = m == -np.inf  # rows of all -inf
        shifted = xc - np.where(empty, 0, m)
        e = np.exp(shifted)
        d = np.sum(e, axis=axis, keepdims=True)
        if op == "softmax":
            out = e / d
            fill = 0.0 if safe else np.nan
        else:
            out = shifted - np.log(d)
            fill = np.nan
        out = np.where(empty, fill, out)
    return out.astype(compute, copy=False)


def softmax(x, axis: int = -1, *, safe: bool = False) -> np.ndarray:
    """Softmax of ``x`` along ``axis`` in float64 (the reference every backend is checked against)."""
    return _normalized(np.asarray(x), axis, np.dtype(np.float64), "softmax", safe)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """log_softmax of ``x`` along ``axis`` in float64."""
    return _normalized(np.asarray(x), axis, np.dtype(np.float64), "log_softmax", False)


def compute_on_host(x: np.ndarray, axis: int, op: str, safe: bool) -> np.ndarray:
    """The CPU backend: float64 inputs compute in float64, the rest in float32; the result keeps x's dtype."""
    compute = np.float64 if storage_name(x.dtype) == "float64" else np.float32
    return _normalized(x, axis, np.dtype(compute), op, safe).astype(host_dtype(storage_name(x.dtype)))

"""The accuracy every backend is held to against the float64 reference.

float32 and float64 results lie within ``ATOL + RTOL * |reference|``; float16 and bfloat16 results
within ``ULP_BOUND`` units in the last place of the output dtype, plus ``ATOL`` (log_softmax near 0
loses digits there). The test suite and the ``portable-softmax run`` demo both check against this.

>>> import numpy as np
>>> from portable_softmax import _tolerance
>>> ref = np.array([0.5, 0.25])
>>> _tolerance.outside(np.array([0.5, 0.25], np.float16), ref).tolist()
[False, False]
>>> _tolerance.outside(np.array([0.5 + 2e-7, 0.25], np.float32), ref).tolist()
[False, False]
>>> _tolerance.outside(np.array([0.5 + 1e-4, 0.25], np.float32), ref).tolist()
[True, False]
>>> _tolerance.describe("float16")
'1 ulp of float16 + atol 1e-06'
"""

from __future__ import annotations

import numpy as np

ATOL, RTOL = 1e-6, 1e-5
#: float16 / bfloat16 results lie within this many units in the last place of the output dtype
ULP_BOUND = 1
#: explicit mantissa bits and the smallest normal exponent of the 16-bit dtypes
MANTISSA = {"float16": (10, -14), "bfloat16": (7, -126)}


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` ('float16' or 'bfloat16') at each |value| (subnormal spacing below the normal range).

    >>> ulp(np.array([1.0, 0.75]), "float16").tolist()
    [0.0009765625, 0.00048828125]
    """
    mantissa, min_exp = MANTISSA[dtype]
    a = np.abs(values)
    exp = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return 2.0 ** (np.maximum(exp, min_exp) - mantissa)


def bound(got: np.ndarray, ref: np.ndarray, dtype: str) -> np.ndarray:
    """The largest |got - ref| allowed at each element of a result of ``dtype``."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype in MANTISSA:
            return ULP_BOUND * ulp(np.maximum(np.abs(ref), np.abs(got)), dtype) + ATOL
        return ATOL + RTOL * np.abs(ref)


def outside(got, ref) -> np.ndarray:
    """Boolean mask of the elements of ``got`` (any supported dtype) outside the tolerance of the float64
    ``ref``: NaN must meet NaN, and an infinity the same infinity."""
    got = np.asarray(got)
    dtype = got.dtype.name
    g, r = got.astype(np.float64), np.asarray(ref, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (np.abs(g - r) <= bound(g, r, dtype)) | (np.isnan(r) & np.isnan(g)) | ((r == g) & np.isinf(r))
    return ~ok


def describe(dtype: str) -> str:
    """The tolerance of a result of ``dtype`` in words."""
    if dtype in MANTISSA:
        return f"{ULP_BOUND} ulp of {dtype} + atol {ATOL:g}"
    return f"atol {ATOL:g}, rtol {RTOL:g}"

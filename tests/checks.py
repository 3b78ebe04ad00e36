"""Comparison with the float64 reference, and shapes that straddle the planner's tiers."""

from __future__ import annotations

import numpy as np

from portable_softmax import planner, reference
from portable_softmax._dtypes import host_dtype
from portable_softmax._tolerance import ATOL, RTOL, ULP_BOUND, outside  # noqa: F401  (the package's bounds)
from portable_softmax.planner import DeviceProfile, RowProblem, plan

DTYPES = ("float32", "float16", "bfloat16", "float64")
OPS = ("softmax", "log_softmax")


#: the planner's small-input rules as committed, and the few-tiles rule that extends them (tests of the
#: tiers larger inputs take turn them off)
SMALL_INPUT_RULES = {name: getattr(planner, name)
                     for name in ("SMALL_INPUT_BLOCKS_PER_SM", "SMALL_INPUT_UNSTAGED_BYTES", "SMALL_INPUT_GROUP_BYTES",
                                  "SMALL_INPUT_BLOCK_BYTES", "SMALL_INPUT_BLOCK_BYTES_BY_ITEMSIZE",
                                  "STAGED_MIN_TILES_PER_SM",
                                  "STAGED_MIN_TILES_PER_SM_ONE_WARP", "FEW_TILES_BLOCKS_PER_SM",
                                  "SMALL_INPUT_ONE_ROW_A_WARP_WAVES", "SMALL_INPUT_ONE_ROW_GROUP_WAVES")}


def set_small_input_rules(monkeypatch, on: bool) -> None:
    """The planner's small-input rules as committed (on) or off, its cached plans dropped."""
    for name, value in SMALL_INPUT_RULES.items():
        monkeypatch.setattr(planner, name, value if on else type(value)())  # off: 0, or no entries
    plan.cache_clear()


def random_input(rng, shape, dtype: str, scale: float = 4.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(host_dtype(dtype))


def _reference(x, axis, op: str, safe: bool) -> np.ndarray:
    """The float64 reference; ``axis`` may be a tuple of axes or None (their joint set, computed
    here by moving them to the end and flattening them, apart from the package's own way)."""
    f = reference.softmax if op == "softmax" else reference.log_softmax
    if axis is None or isinstance(axis, tuple):
        axes = range(x.ndim) if axis is None else [a % x.ndim for a in axis]
        keep = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, (*keep, *axes))
        rows = f(moved.reshape(*moved.shape[:len(keep)], -1), -1, safe=safe).reshape(moved.shape)
        return np.transpose(rows, np.argsort((*keep, *axes)))
    return f(x, axis, safe=safe)


def mismatches(y, x, axis: int | tuple[int, ...] | None = -1, op: str = "softmax", safe: bool = False) -> np.ndarray:
    """Boolean mask of outputs outside the tolerance (NaN must meet NaN)."""
    y = np.asarray(y)
    assert y.shape == x.shape, f"shape {y.shape} != {x.shape}"
    assert y.dtype == x.dtype, f"dtype {y.dtype} != {x.dtype}"
    return outside(y, _reference(x, axis, op, safe))


def assert_matches(y, x, axis: int | tuple[int, ...] | None = -1, op: str = "softmax", safe: bool = False,
                   what: str = "") -> None:
    bad = mismatches(y, x, axis, op, safe)
    if bad.any():
        ref = _reference(x, axis, op, safe)
        idx = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what} {op} {x.dtype} shape {x.shape} axis {axis}: {int(bad.sum())} of {bad.size} outputs off; "
            f"first at {idx}: got {np.asarray(y)[idx]!r}, reference {ref[idx]!r}"
        )


def boundary_cols(profile: DeviceProfile, dtype: str, rows: int, limit: int) -> list[int]:
    """Column counts on both sides of every change of kernel the planner makes up to ``limit``."""

    def kernel(cols: int) -> str:
        return plan(RowProblem(dtype, "softmax", rows, cols), profile).launches[0].kernel

    found: set[int] = set()
    probe = [1]
    while probe[-1] < limit:
        probe.append(min(limit, probe[-1] * 2))
    for lo, hi in zip(probe, probe[1:]):
        if kernel(lo) == kernel(hi):
            continue
        a, b = lo, hi  # kernel(a) != kernel(b): find the first column count that changes it
        while b - a > 1:
            mid = (a + b) // 2
            a, b = (mid, b) if kernel(mid) == kernel(lo) else (a, mid)
        found.update((b - 1, b, b + 1))
    return sorted(c for c in found if 1 <= c <= limit)

"""Comparison with the float64 reference, shapes that straddle the planner's tiers, and the Tunings tests plan with."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from portable_softmax import api, planner, reference
from portable_softmax._dtypes import host_dtype
from portable_softmax._tolerance import ATOL, RTOL, ULP_BOUND, outside  # noqa: F401  (the package's bounds)
from portable_softmax.planner import DEFAULT_TUNING, DeviceProfile, RowProblem, Tuning, default_tuning, plan

DTYPES = ("float32", "float16", "bfloat16", "float64")
OPS = ("softmax", "log_softmax")


#: the Tuning fields of the planner's small-input rules and of the few-tiles rule that extends them,
#: each off (0, or no entries): tests of the tiers that larger inputs take plan without them
SMALL_INPUT_OFF = {name: type(getattr(DEFAULT_TUNING, name))()
                   for name in ("small_input_blocks_per_sm", "small_input_unstaged_bytes", "small_input_group_bytes",
                                "small_input_block_bytes", "small_input_block_bytes_by_itemsize",
                                "staged_min_tiles_per_sm", "staged_min_tiles_per_sm_one_warp",
                                "few_tiles_blocks_per_sm", "small_input_one_row_a_warp_waves",
                                "small_input_one_row_group_waves")}


def without_small_input_rules(tuning: Tuning) -> Tuning:
    """`tuning` with the small-input rules off (SMALL_INPUT_OFF)."""
    return replace(tuning, **SMALL_INPUT_OFF)


def large_input_tuning(device: DeviceProfile) -> Tuning:
    """The device's Tuning without the small-input rules."""
    return without_small_input_rules(default_tuning(device))


def tune_defaults(monkeypatch, **changes) -> None:
    """For the rest of the test, plan with `changes` to each device's Tuning wherever no Tuning is
    passed (the API's calls), on top of earlier calls' changes; cached plans are dropped here and
    after every test (conftest)."""
    before = planner.default_tuning
    monkeypatch.setattr(planner, "default_tuning", lambda device: replace(before(device), **changes))
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


def gradient_reference(dy: np.ndarray, y: np.ndarray, axis: int, op: str) -> np.ndarray:
    """float64 dx from the same dy and y: softmax y (dy - sum(dy y)), log_softmax dy - exp(y) sum(dy),
    a log_softmax row of all -inf (safe: constant) zero."""
    d, w = dy.astype(np.float64), y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if op == "softmax":
            return w * (d - np.sum(d * w, axis=axis, keepdims=True))
        dx = d - np.exp(w) * np.sum(d, axis=axis, keepdims=True)
        dx = np.where(np.isnan(w).any(axis=axis, keepdims=True), np.nan, dx)
        return np.where(np.isneginf(w).all(axis=axis, keepdims=True), 0.0, dx)


def keep_recording_launcher(key, bound_to=None, contiguous=True, windows=((0, 0, True),) * 2) -> list:
    """A launcher kept under key as LauncherCache.build keeps one, recording the pointers and stream
    of each call in the list returned. The default ``windows`` let out= be anywhere."""
    launched = []
    api.launchers.entries[key] = (lambda *pointers: launched.append(pointers), contiguous, bound_to, None,
                                  ("cuda", 0), windows)
    return launched

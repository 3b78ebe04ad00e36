"""The shared suite: every test runs on each backend that can run here (see conftest)."""

from __future__ import annotations

import numpy as np
import pytest
from checks import DTYPES, OPS, assert_matches, boundary_cols, random_input
from conftest import profile_of

import portable_softmax as ps
from portable_softmax import reference
from portable_softmax._dtypes import host_dtype

#: column counts beyond the tier boundaries: odd, prime, vocabulary sizes, not multiples of 4/32/64
EXTRA_COLS = (1, 2, 3, 5, 7, 31, 33, 63, 65, 127, 129, 1000, 1025, 4097, 50257)


def _op(op):
    return ps.softmax if op == "softmax" else ps.log_softmax


def _col_limit(backend: str) -> int:
    # The emulation runs one fiber per GPU thread: it reaches its (small) tiers early.
    return 1 << 14 if backend.startswith("emu") else 1 << 20


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_columns_across_every_tier_boundary(backend, rng, dtype, op):
    limit = _col_limit(backend)
    profile = profile_of(backend)
    cols_list = sorted(set(boundary_cols(profile, dtype, 5, limit)) | {c for c in EXTRA_COLS if c <= limit} | {limit})
    failures = []
    for cols in cols_list:
        rows = 5 if cols <= 70000 else 2
        x = random_input(rng, (rows, cols), dtype)
        try:
            assert_matches(_op(op)(x), x, op=op, what=f"cols={cols}")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_axis_of_3d(backend, rng, dtype, op):
    x = random_input(rng, (6, 37, 70), dtype)
    for axis in (0, 1, 2, -1, -2, -3):
        assert_matches(_op(op)(x, axis=axis), x, axis=axis, op=op, what=f"axis={axis}")


#: lengths of a strided axis: sums of up to 10^5 terms, where float32 accumulation drifts out of tolerance
_LONG_AXIS = ((1000, 33), (4096, 1000), (65537, 5), (100000, 3))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_reductions_along_axis_0(backend, rng, dtype, op):
    """Every backend meets the tolerance however long the axis, strided (axis 0) or not."""
    failures = []
    for rows, cols in _LONG_AXIS:
        if backend.startswith("emu") and rows * cols > 1 << 18:
            continue  # the emulation runs a fiber per GPU thread; its tiers are all reached below this
        x = random_input(rng, (rows, cols), dtype)
        for axis, view in ((0, x), (1, np.ascontiguousarray(x.T))):
            try:
                assert_matches(_op(op)(view, axis=axis), view, axis=axis, op=op, what=f"{view.shape}")
            except AssertionError as e:
                failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_several_axes_and_all_of_them(backend, rng, dtype, op):
    """axis=(a, b, ...) is the softmax over the joint set of those axes, axis=None over every
    element (scipy.special.softmax's meaning), on contiguous and strided inputs; dim= is axis."""
    base = random_input(rng, (5, 6, 70), dtype)
    for x in (base, base[:, ::2, 1:]):
        for axis in (None, (0, 2), (2, 0), (-1, -2), (0, 1, 2), (1,), ()):
            y = _op(op)(x, axis=axis)
            assert type(y) is np.ndarray and y.shape == x.shape and y.dtype == x.dtype
            assert_matches(y, np.ascontiguousarray(x), axis=axis, op=op, what=f"axis={axis}")
        out = np.full_like(x, np.nan)
        assert _op(op)(x, dim=(0, 2), out=out) is out
        assert_matches(out, np.ascontiguousarray(x), axis=(0, 2), op=op, what="dim=(0, 2), out=")


@pytest.mark.parametrize("op", OPS)
def test_the_dtype_keyword_computes_in_that_dtype(backend, rng, op):
    """dtype= casts first and returns that dtype, as torch.softmax(x, dim, dtype=...)."""
    x = random_input(rng, (7, 300), "float16")
    for dtype in ("float32", np.float64, np.dtype("float16"), host_dtype("bfloat16")):
        y = _op(op)(x, dtype=dtype, dim=0)
        wanted = np.dtype(dtype)
        assert y.dtype == wanted
        assert_matches(y, x.astype(wanted), axis=0, op=op, what=f"dtype={dtype}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_views_strides_and_offsets(backend, rng, dtype):
    base = random_input(rng, (64, 300), dtype)
    views = {
        "column offset": base[:, 1:],
        "flat offset": base.reshape(-1)[3 : 3 + 63 * 299].reshape(63, 299),
        "every other column": base[:, ::2],
        "every third row": base[::3, 5:250],
        "reversed rows": base[::-1],
        "transposed": base.T,
        "fortran order": np.asfortranarray(base),
    }
    for name, x in views.items():
        for axis in (-1, 0):
            assert_matches(ps.softmax(x, axis=axis), np.ascontiguousarray(x), axis=axis, what=name)


_SPECIAL_COLS = (5, 300, 3000, 70000)


@pytest.mark.parametrize("cols", _SPECIAL_COLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_inf_and_all_negative_infinity_rows(backend, rng, dtype, cols):
    if backend.startswith("emu") and cols > 3000:
        pytest.skip("the emulation reaches every tier below 3000 columns")
    x = random_input(rng, (6, cols), dtype)
    x[0, cols // 2] = np.nan  # NaN in a row -> that row is NaN
    x[1, -1] = np.inf  # +inf -> NaN, like torch
    x[2, :] = -np.inf  # all -inf -> NaN, or 0 with safe=True
    x[3, : cols - 1] = -np.inf  # one finite element -> exactly 1 there
    x[4, ::2] = -np.inf  # -inf elements -> exactly 0 there
    for safe in (False, True):
        y = np.asarray(ps.softmax(x, safe=safe)).astype(np.float64)
        assert np.isnan(y[0]).all() and np.isnan(y[1]).all()
        assert (y[2] == 0).all() if safe else np.isnan(y[2]).all()
        assert y[3, -1] == 1.0 and (y[3, :-1] == 0).all()
        assert (y[4, ::2] == 0).all()
        assert_matches(ps.softmax(x, safe=safe), x, safe=safe, what=f"specials safe={safe}")
        z = np.asarray(ps.log_softmax(x, safe=safe)).astype(np.float64)
        assert np.isnan(z[0]).all() and np.isnan(z[1]).all()
        assert (z[2] == -np.inf).all() if safe else np.isnan(z[2]).all()  # the log of softmax's 0
        assert z[3, -1] == 0.0 and (z[3, :-1] == -np.inf).all()
        assert_matches(ps.log_softmax(x, safe=safe), x, op="log_softmax", safe=safe, what=f"specials safe={safe}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_and_zero_dimensional(backend, dtype):
    dt = host_dtype(dtype)
    for shape in [(0,), (0, 5), (5, 0), (3, 0, 4)]:
        for axis in range(-len(shape), len(shape)):
            y = ps.softmax(np.empty(shape, dt), axis=axis)
            assert y.shape == shape and y.dtype == dt
    y = ps.softmax(np.asarray(3.5, dtype=dt))
    assert y.shape == () and y.dtype == dt and float(y) == 1.0
    assert float(ps.log_softmax(np.asarray(-2.0, dtype=dt))) == 0.0


def test_out_argument_is_filled_and_returned(backend, rng):
    x = random_input(rng, (33, 257), "float32")
    out = np.full_like(x, np.nan)
    assert ps.softmax(x, out=out) is out
    assert_matches(out, x)
    view_out = np.full((33, 514), np.nan, np.float32)[:, ::2]
    assert ps.log_softmax(x, out=view_out) is view_out
    assert_matches(view_out, x, op="log_softmax")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", OPS)
def test_the_cpu_backend_needs_no_more_memory_than_its_output(rng, op, dtype):
    """The CPU backend writes its output in place and works in pieces: beyond the output (none
    with out=) it holds a piece's worth of temporaries, on every axis (numpy's allocations, as
    tracemalloc counts them)."""
    import tracemalloc

    x = random_input(rng, (1024, 1024), dtype)
    piece = reference.CHUNK_ELEMENTS * 4 + (256 << 10)  # a float32 piece; numpy's cast buffers and small arrays
    out = np.empty_like(x)
    with ps.use_backend("cpu"):
        for axis in (-1, 0):
            for target in (None, out):
                tracemalloc.start()
                try:
                    y = _op(op)(x, axis=axis, out=target)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                extra = peak - (x.nbytes if target is None else 0)
                assert extra <= piece, f"axis {axis}, out={target is not None}: {peak} bytes at peak"
                assert_matches(y, x, axis=axis, op=op)


def test_big_endian_input_is_converted_and_big_endian_out_is_filled(backend, rng):
    x = random_input(rng, (9, 130), "float32")
    big = x.astype(">f4")
    y = ps.softmax(big, axis=0)
    assert y.dtype == np.float32 and y.dtype.isnative
    assert_matches(y, x, axis=0)
    out = np.full(x.shape, np.nan, ">f4")
    assert ps.log_softmax(x, out=out) is out
    assert_matches(out.astype(np.float32), x, op="log_softmax")


def test_large_magnitudes_stay_finite(backend, rng):
    x = random_input(rng, (4, 1000), "float32", scale=1e4)
    assert_matches(ps.softmax(x), x)
    x64 = random_input(rng, (4, 1000), "float64", scale=1e300)
    assert_matches(ps.softmax(x64), x64)

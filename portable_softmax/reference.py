"""NumPy softmax with the package's semantics: the float64 reference and the CPU backend.

>>> import numpy as np
>>> from portable_softmax import reference
>>> reference.softmax(np.array([0.0, np.log(3.0)]))
array([0.25, 0.75])
"""

from __future__ import annotations

import numpy as np

from ._dtypes import host_dtype, storage_name

#: the CPU backend works on pieces of about this many elements: a float32 piece and its output stay
#: in a core's L2 cache across the passes, and no temporary is larger than a piece
CHUNK_ELEMENTS = 1 << 17


def _normalized(x: np.ndarray, axis: int, compute: np.dtype, op: str, safe: bool) -> np.ndarray:
    """softmax / log_softmax of ``x`` along ``axis``, computed in ``compute`` (whole-array numpy)."""
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
            fill = -np.inf if safe else np.nan
        out = np.where(empty, fill, out)
    return out.astype(compute, copy=False)


def softmax(x, axis: int = -1, *, safe: bool = False) -> np.ndarray:
    """Softmax of ``x`` along ``axis`` in float64 (the reference every backend is checked against)."""
    return _normalized(np.asarray(x), axis, np.dtype(np.float64), "softmax", safe)


def log_softmax(x, axis: int = -1, *, safe: bool = False) -> np.ndarray:
    """log_softmax of ``x`` along ``axis`` in float64 (a row of all -inf: NaN, or -inf with ``safe``)."""
    return _normalized(np.asarray(x), axis, np.dtype(np.float64), "log_softmax", safe)


# ---- the CPU backend ---------------------------------------------------------------------------
def compute_on_host(x: np.ndarray, axis: int, op: str, safe: bool, out: np.ndarray | None = None) -> np.ndarray:
    """The CPU backend: float64 inputs compute in float64, the rest in float32 with float64 sums;
    the result keeps x's dtype. Written into ``out`` (x's shape, a float dtype) where given.

    The work goes piece by piece (about CHUNK_ELEMENTS each): pieces of whole rows where the axis
    allows, else blocks along the axis after a pass that takes the maximum. The output is written
    in place, so the temporaries stay the size of a piece.

    >>> import numpy as np
    >>> compute_on_host(np.array([[0.0, 0.0], [1.0, -np.inf]], np.float32), 1, "softmax", False)
    array([[0.5, 0.5],
           [1. , 0. ]], dtype=float32)
    """
    name = storage_name(x.dtype)
    dtype = host_dtype(name)
    compute = np.dtype(np.float64 if name == "float64" else np.float32)
    y = out
    if y is None or np.may_share_memory(x, y) and (y.__array_interface__["data"][0], y.strides) != (
            x.__array_interface__["data"][0], x.strides):
        y = np.empty(x.shape, dtype)  # a partial overlap with x: computed apart, then copied
    if x.ndim == 0:
        y[...] = 1.0 if op == "softmax" else 0.0
    elif x.size:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            _pieces(x, y, axis, op, safe, compute)
    if out is not None and y is not out:
        out[...] = y
        return out
    return y


def _pieces(x, y, axis: int, op: str, safe: bool, compute: np.dtype) -> None:
    """Split along the outermost dimension (in memory) that is not the axis and lies outside it,
    into pieces of about CHUNK_ELEMENTS; a piece of one index that is still large splits again."""
    if x.size <= CHUNK_ELEMENTS:
        return _along_axis(x, y, axis, op, safe, compute)
    stride = abs(x.strides[axis])
    outer = [d for d in range(x.ndim) if d != axis and x.shape[d] > 1 and abs(x.strides[d]) > stride]
    if not outer:
        return _along_axis(x, y, axis, op, safe, compute)  # blocks along the axis itself
    d = max(outer, key=lambda k: abs(x.strides[k]))
    step = max(1, x.shape[d] * CHUNK_ELEMENTS // x.size)
    index = [slice(None)] * x.ndim
    for start in range(0, x.shape[d], step):
        index[d] = slice(start, start + step)
        piece = tuple(index)
        _pieces(x[piece], y[piece], axis, op, safe, compute)


def _along_axis(x, y, axis: int, op: str, safe: bool, compute: np.dtype) -> None:
    """softmax of one piece. A piece of more than CHUNK_ELEMENTS goes in blocks along the axis:
    its maximum first, then the sums of the blocks, then the outputs."""
    n = x.shape[axis]
    block = max(1, n * CHUNK_ELEMENTS // x.size) if x.size > CHUNK_ELEMENTS else n
    blocks = [(start, min(n, start + block)) for start in range(0, n, block)]
    direct = y.dtype == compute and y.flags.writeable  # y itself holds the float32 / float64 work
    m = np.max(x, axis=axis, keepdims=True).astype(compute, copy=False)  # NaN-propagating, like the kernels
    empty = m == -np.inf  # rows of all -inf: shifted by 0, so their exp is 0, not NaN
    has_empty = bool(empty.any())
    if has_empty:
        m = np.where(empty, 0, m).astype(compute)
    index = [slice(None)] * x.ndim

    def part(a, lo, hi):
        index[axis] = slice(lo, hi)
        return a[tuple(index)]

    buffer = np.empty(0, compute)  # the work array of a block, reused

    def work(shape):
        nonlocal buffer
        size = int(np.prod(shape))
        if buffer.size < size:
            buffer = np.empty(size, compute)
        return buffer[:size].reshape(shape)

    s = w = None  # the sums, in float64
    for lo, hi in blocks:
        xb = part(x, lo, hi)
        if not direct:
            w = work(xb.shape)
            np.subtract(xb, m, out=w, dtype=compute)
            np.exp(w, out=w)
        elif op == "softmax":  # exp(x - m) straight into y, scaled at the end
            w = part(y, lo, hi)
            np.subtract(xb, m, out=w)
            np.exp(w, out=w)
        else:  # x - m into y, its exp apart
            yb, w = part(y, lo, hi), work(xb.shape)
            np.subtract(xb, m, out=yb)
            np.exp(yb, out=w)
        partial = np.add.reduce(w, axis=axis, dtype=np.float64, keepdims=True)
        s = partial if s is None else s + partial
    if op == "softmax":
        scale = (1.0 / s).astype(compute)
        if direct:
            np.multiply(y, scale, out=y)
        elif len(blocks) == 1:  # the work array holds exp(x - m) still
            np.multiply(w, scale, out=w)
            np.copyto(y, w, casting="unsafe")
        else:  # exp(x - m) again, a block at a time, scaled and rounded into y's dtype
            for lo, hi in blocks:
                xb = part(x, lo, hi)
                w = work(xb.shape)
                np.subtract(xb, m, out=w, dtype=compute)
                np.exp(w, out=w)
                np.multiply(w, scale, out=w)
                np.copyto(part(y, lo, hi), w, casting="unsafe")
        if safe and has_empty:
            np.copyto(y, 0, where=empty)
    else:  # (x - m) - log(s): the shift first, exact where x is near m
        log_s = np.log(s).astype(compute)
        if direct:
            np.subtract(y, log_s, out=y)
        else:
            for lo, hi in blocks:
                xb = part(x, lo, hi)
                w = work(xb.shape)
                np.subtract(xb, m, out=w, dtype=compute)
                np.subtract(w, log_s, out=w)
                np.copyto(part(y, lo, hi), w, casting="unsafe")
        if safe and has_empty:
            np.copyto(y, -np.inf, where=empty)

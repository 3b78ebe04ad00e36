"""How a strided array maps onto the kernels' two layouts (pure functions).

Rows: (rows, cols) with unit column stride and one row stride.
Strided: (outer, cols, inner) with one stride each.
Anything else (outer or inner dimensions that do not collapse) is copied to a
contiguous array by the caller's library first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rows:
    rows: int
    cols: int
    row_stride: int


@dataclass(frozen=True)
class Strided:
    outer: int
    cols: int
    inner: int
    strides: tuple[int, int, int]


def collapse(dims: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(size, stride) of dims that behave as one, or None. Size-1 dims are free."""
    dims = [(n, s) for n, s in dims if n != 1]
    if not dims:
        return (1, 0)
    size, stride = dims[-1]
    for n, s in reversed(dims[:-1]):
        if s != size * stride:
            return None
        size *= n
    return (size, stride)


def normalize_axis(axis, ndim: int) -> int:
    """numpy's rule: -ndim <= axis < ndim (0-d arrays accept 0 and -1)."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        import operator

        try:
            axis = operator.index(axis)
        except TypeError:
            raise TypeError(f"axis must be an integer, got {type(axis).__name__}") from None
    limit = max(ndim, 1)
    if not -limit <= axis < limit:
        raise IndexError(f"axis {axis} is out of bounds for array of dimension {ndim}")
    return axis % limit


def describe(shape: tuple[int, ...], strides: tuple[int, ...], axis: int) -> Rows | Strided | None:
    """The kernel layout of an array (strides in elements) reduced along ``axis``."""
    outer = collapse(list(zip(shape[:axis], strides[:axis])))
    inner = collapse(list(zip(shape[axis + 1:], strides[axis + 1:])))
    if outer is None or inner is None:
        return None
    cols, col_stride = shape[axis], strides[axis]
    (n_outer, s_outer), (n_inner, s_inner) = outer, inner
    if n_inner == 1 and (col_stride == 1 or cols == 1):
        row_stride = s_outer if n_outer > 1 else cols
        return Rows(n_outer, cols, row_stride)
    return Strided(n_outer, cols, n_inner, (s_outer, col_stride, s_inner))

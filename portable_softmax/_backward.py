"""The gradients of softmax and log_softmax: dx from the forward's output y and its gradient dy."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import numpy as np

from . import _probe, api
from ._arrays import (
    ARRAY_LIKE,
    DeviceArray,
    Host,
    array_like,
    classify,
    element_misalign,
    host_view,
    write_window,
)
from ._dtypes import SUPPORTED, UnsupportedDtypeError, storage_name
from .layout import Rows, Strided, describe, normalize_axis
from .planner_backward import GradRowProblem, GradStridedProblem, plan_backward

if TYPE_CHECKING:
    from ._runtime import HostRuntime

ArrayT = TypeVar("ArrayT")


def softmax_backward(dy: ArrayT, y: ArrayT, axis: api.Axis = -1, *, out: ArrayT | None = None) -> ArrayT:
    """The gradient of softmax along ``axis``: ``dx = y * (dy - sum(dy * y, axis))``.

    ``y`` is ``softmax(x, axis)`` and ``dy`` the gradient of a loss with respect to it; both of the
    same array type, shape, dtype and device. ``axis`` is one axis, or a tuple of axes or None as
    the forward takes them (their joint set). The result is of that type, computed on the caller's
    current stream (float16 and bfloat16 in float32, sums in float32; float64 in float64). Tensors
    that require grad get a result autograd differentiates (double backward); JAX arrays under
    ``jax.jit`` / ``grad`` / ``vmap`` the gradient kernels' custom call.

    >>> import numpy as np, portable_softmax as ps
    >>> y = ps.softmax(np.array([[1.0, 2.0, 3.0]]))
    >>> dx = ps.softmax_backward(np.array([[0.0, 0.0, 1.0]]), y)
    >>> bool(abs(dx.sum()) < 1e-12)
    True
    """
    return _gradient(dy, y, axis, "softmax", out)


def log_softmax_backward(dy: ArrayT, y: ArrayT, axis: api.Axis = -1, *, out: ArrayT | None = None) -> ArrayT:
    """The gradient of log_softmax along ``axis``: ``dx = dy - exp(y) * sum(dy, axis)``.

    ``y`` is ``log_softmax(x, axis)``; a row of y that is all -inf (``log_softmax(..., safe=True)``
    of a row of all -inf, a constant) gets a zero gradient. Otherwise as ``softmax_backward``.

    >>> import numpy as np, portable_softmax as ps
    >>> y = ps.log_softmax(np.array([[1.0, 2.0, 3.0]]))
    >>> dx = ps.log_softmax_backward(np.array([[1.0, 0.0, 0.0]]), y)  # of the loss y[0, 0]
    >>> bool(abs(dx.sum()) < 1e-12)
    True
    """
    return _gradient(dy, y, axis, "log_softmax", out)


def _named(a) -> str:
    return f"{type(a).__module__.split('.')[0]}.{type(a).__name__}"


def _dtype_of(a) -> str:
    return str(getattr(a, "dtype", type(a).__name__)).removeprefix("torch.")


def _where(a: Host | DeviceArray) -> str:
    return f"{a.vendor}:{a.device_index}" if a.on_device else "host"


def unsupported_dtypes(op: str, dy, y) -> UnsupportedDtypeError:
    """The error of a dy or y whose dtype no kernel takes (eager calls and traced ones alike)."""
    return UnsupportedDtypeError(
        f"{op}_backward needs floating-point dy and y; got dy {_dtype_of(dy)} and y {_dtype_of(y)}. "
        f"Supported dtypes: {', '.join(SUPPORTED)}")


def check_shapes(dy_shape, y_shape) -> None:
    """dy and y of one shape (a ValueError naming both)."""
    if tuple(dy_shape) != tuple(y_shape):
        raise ValueError(f"dy and y must have one shape; got dy {tuple(dy_shape)} and y {tuple(y_shape)}")


def check_shapes_and_dtypes(dy_shape, y_shape, dy_dtype: str, y_dtype: str) -> None:
    """dy and y of one shape (ValueError naming both) and one dtype (TypeError naming both)."""
    check_shapes(dy_shape, y_shape)
    if dy_dtype != y_dtype:
        raise TypeError(f"dy and y must have one dtype; got dy {dy_dtype} and y {y_dtype} "
                        "(cast one: the gradient is computed in the dtype of both)")


def gradient_direct(dy, y, axis: int, op: str):
    """dx on the caller's arrays with no torch machinery around it (the gradient operator's kernel)."""
    return _gradient(dy, y, axis, op, None, direct=True)


def _gradient(dy, y, axis, op: str, out, direct: bool = False):
    if type(axis) is not int and (axis is None or isinstance(axis, (tuple, list))):
        return _over_axes(dy, y, axis, op, out)
    # plain torch CUDA tensors and cupy arrays of a layout seen before: the launcher kept for it
    if type(dy) is api._TORCH_TENSOR:
        dx = _repeat_torch(dy, y, axis, op, out)
        if dx is not None:
            return dx
    elif type(dy) is api._CUPY_NDARRAY:
        dx = _repeat_cupy(dy, y, axis, op, out)
        if dx is not None:
            return dx
    return _full(dy, y, axis, op, out, direct)


def _over_axes(dy, y, axis, op: str, out):
    """The gradient over the joint set of several axes (None: all of them), as the forward takes
    them: those axes of dy and y moved to the end and flattened into one (a copy where the layout
    needs one), computed, and put back."""
    dy = array_like(dy) if isinstance(dy, ARRAY_LIKE) else dy
    y = array_like(y) if isinstance(y, ARRAY_LIKE) else y
    if not all(hasattr(a, "ndim") and hasattr(a, "reshape") for a in (dy, y)):  # bare DLPack producers
        src, ys = classify(dy), classify(y)
        dx = _over_axes(src.array, ys.array, axis, op, None if out is None else api._out_array(out))
        return out if out is not None else (src.wrap(dx) if isinstance(src, Host) else src.result(dx))
    if out is not None and (api._jax_is_tracer(dy) or api._jax_is_tracer(y)):
        return _full(dy, y, -1, op, out)  # its error: out= cannot take a traced array
    check_shapes(dy.shape, y.shape)
    axes = api.joint_axes(axis, dy.ndim)
    if len(axes) == 1:
        return _gradient(dy, y, axes[0], op, out)
    dy_rows, back = api.axes_to_rows(dy, axes)
    dx = back(_gradient(dy_rows, api.axes_to_rows(y, axes)[0], -1, op, None))
    if isinstance(dy, np.generic):
        dx = dx[()]
    return dx if out is None else api._write_out(dy, dx, out, f"{op}_backward", "dy")


#: torch routes (api._torch_route) of two tensors: the one that records more wins
_ROUTES_BY_WEIGHT = ("composite", "forward", "autograd", "transform", "batched", "operator")


def _torch_route_of(dy, y) -> str | None:
    routes = {api._torch_route(dy), api._torch_route(y)}
    return next((how for how in _ROUTES_BY_WEIGHT if how in routes), None)


def _through_torch(how: str, dy, y, axis, op: str, out):
    """Tensors that torch's machinery must see: the eager calls' checks, then the gradient operator
    (the torch adapter's gradient_call), so that the result is differentiable as torch's own
    backward is."""
    if not (api._framework_of(dy) == "torch" and api._framework_of(y) == "torch"):
        raise TypeError(f"dy and y must be arrays of one type; got {_named(dy)} and {_named(y)}")
    if dy.device != y.device:
        raise ValueError(f"dy and y must be on one device; dy is on {dy.device}, y on {y.device}")
    try:
        storage_name(dy.dtype)
        storage_name(y.dtype)
    except UnsupportedDtypeError:
        raise unsupported_dtypes(op, dy, y) from None
    check_shapes_and_dtypes(dy.shape, y.shape, _dtype_of(dy), _dtype_of(y))
    axis = normalize_axis(axis, dy.dim())
    if out is None:
        return api._torch_gradient_call(how, dy, y, axis, op)
    api._check_torch_out(how, dy, out, f"{op}_backward")
    return out.copy_(api._torch_gradient_call(how, dy, y, axis, op))


def _full(dy, y, axis, op: str, out, direct: bool = False):
    """Every check, the layouts and the plan; a torch or cupy call's launcher kept for its repeats.
    ``direct``: no torch routing (the operator's own kernel)."""
    if api._jax_is_tracer(dy) or api._jax_is_tracer(y):  # jax.jit, grad, vmap, or a JAX GPU array
        return api._jax_traced_gradient(dy, y, axis, op, out)
    how = None if direct else _torch_route_of(dy, y)
    if how is not None:  # autograd records it, or torch.func / torch.compile transform it
        return _through_torch(how, dy, y, axis, op, out)
    given_axis = axis
    dy = array_like(dy) if isinstance(dy, ARRAY_LIKE) else dy
    y = array_like(y) if isinstance(y, ARRAY_LIKE) else y
    if type(dy) is not type(y) and not (isinstance(dy, np.ndarray) and isinstance(y, np.ndarray)):
        raise TypeError(f"dy and y must be arrays of one type; got {_named(dy)} and {_named(y)}")
    if isinstance(dy, np.ma.MaskedArray) or isinstance(y, np.ma.MaskedArray):
        raise TypeError("numpy masked arrays are not supported: pass plain arrays (x.data or x.filled(...))")
    try:
        src, ys = classify(dy), classify(y)
    except UnsupportedDtypeError:
        raise unsupported_dtypes(op, dy, y) from None
    if src.on_device != ys.on_device or (src.on_device and _where(src) != _where(ys)):
        raise ValueError(f"dy and y must be on one device; dy is on {_where(src)}, y on {_where(ys)}")
    check_shapes_and_dtypes(src.shape, ys.shape, src.dtype, ys.dtype)
    axis = normalize_axis(axis, len(src.shape))
    dst = api._check_out(src, out, "dy")
    if src.on_device:
        return _run_device(src, ys, axis, op, dst, out, given_axis)
    return _run_host(src, ys, axis, op, dst, out)


# ---- host arrays -----------------------------------------------------------------------------------
def gradient_on_host(dy: np.ndarray, y: np.ndarray, axis: int, op: str) -> np.ndarray:
    """The gradient in numpy: sums in float64, elementwise in the compute type (float64 for float64,
    else float32), the result in dy's dtype."""
    compute = np.float64 if dy.dtype == np.float64 else np.float32
    d, w = dy.astype(compute), y.astype(compute)
    if dy.ndim == 0:
        return np.zeros_like(dy)
    with np.errstate(invalid="ignore", over="ignore"):
        if op == "softmax":
            total = np.sum(d * w, axis=axis, keepdims=True, dtype=np.float64).astype(compute)
            dx = w * (d - total)
        else:
            total = np.sum(d, axis=axis, keepdims=True, dtype=np.float64).astype(compute)
            top = np.max(w, axis=axis, keepdims=True) if w.shape[axis] else np.full_like(total, -np.inf)
            total = np.where(np.isnan(top), np.nan, total).astype(compute)
            dx = np.where(top == -np.inf, compute(0), d - np.exp(w) * total)
    return dx.astype(dy.dtype, copy=False)


def _run_host(src: Host, ys: Host, axis: int, op: str, dst: Host | None, out):
    dy, y = (np.asarray(a.array) for a in (src, ys))
    dy = dy if dy.dtype.isnative else dy.astype(dy.dtype.newbyteorder("="))
    y = y if y.dtype.isnative else y.astype(y.dtype.newbyteorder("="))
    name = api._forced_host_backend.get()
    rt = api.host_runtimes.get(name) if name else None
    if rt is not None and dy.ndim and dy.size:
        dx = _run_staged(rt, dy, y, axis, op)
    else:
        dx = gradient_on_host(dy, y, axis, op)
    if dst is not None:
        dst.array[...] = dx
        return out
    return src.wrap(dx)


def _run_staged(rt: HostRuntime, dy: np.ndarray, y: np.ndarray, axis: int, op: str) -> np.ndarray:
    """A runtime that takes host arrays (the emulation) through its kernels."""
    dy, y = np.ascontiguousarray(dy), np.ascontiguousarray(y)
    shape, strides = host_view(dy)
    layout = describe(shape, strides, axis)
    problem = _problem(storage_name(dy.dtype), op, layout, layout, layout, (0, 0, 0))
    return rt.run_backward(dy, y, plan_backward(problem, rt.profile(rt.current_device())))


def _problem(dtype: str, op: str, dl, yl, xl, misaligns) -> GradRowProblem | GradStridedProblem:
    if isinstance(dl, Rows):
        return GradRowProblem(dtype, op, dl.rows, dl.cols, (dl.row_stride, yl.row_stride, xl.row_stride),
                              misaligns, safe=True)
    return GradStridedProblem(dtype, op, dl.outer, dl.cols, dl.inner, dl.strides, yl.strides, xl.strides, safe=True,
                              misaligns=misaligns)


# ---- device arrays ---------------------------------------------------------------------------------
def _run_device(src: DeviceArray, ys: DeviceArray, axis: int, op: str, dst: DeviceArray | None, out,
                given_axis=None):
    rt = _probe.runtime(src.vendor)
    dy, y = src.array, ys.array
    shape = tuple(src.shape)
    if len(shape) == 0 or 0 in shape:
        dx = dst.array if dst is not None else src.empty(shape)
        if len(shape) == 0:
            dx[...] = 0.0  # softmax of one value is a constant
        return src.result(dx) if dst is None else out
    layouts = [describe(shape, a.strides, axis) for a in (src, ys)]
    if any(lay is None or (isinstance(lay, Strided) and lay.inner == 1) for lay in layouts):
        src, ys = src.contiguous(), ys.contiguous()
        layouts = [describe(shape, a.strides, axis) for a in (src, ys)]
    dl, yl = layouts
    if isinstance(dl, Rows) != isinstance(yl, Rows):  # one strided, one in rows: both as strided views
        dl, yl = api._as_strided(dl), api._as_strided(yl)
    target = dst
    xl = describe(shape, dst.strides, axis) if dst is not None else None
    windows = () if dst is None else (write_window(src, dst), write_window(ys, dst))
    # out's dims do not collapse, or it shares bytes with dy or y without being that array: dx apart
    if xl is None or (isinstance(xl, Strided) and xl.inner == 1) or _shares_bytes(
            windows, dst.ptr - src.ptr, dst.ptr - ys.ptr):
        target = type(src)(src.empty(shape))
        xl = describe(shape, target.strides, axis)
    if not (isinstance(dl, Rows) and isinstance(xl, Rows)):  # a strided one: all three as strided views
        dl, yl, xl = api._as_strided(dl), api._as_strided(yl), api._as_strided(xl)
    misaligns = tuple(element_misalign(a.ptr, src.dtype) for a in (src, ys, target))
    problem = _problem(src.dtype, op, dl, yl, xl, misaligns)
    the_plan = plan_backward(problem, rt.profile(src.device_index))
    key = None
    # a call the repeat path can take next time (nothing copied): its launcher built, kept and replayed
    if src.array is dy and ys.array is y and (dst is None or target is dst) and type(y) is type(dy) \
            and api._preparable(dy, out):
        key = _repeat_key(dy, y, axis if given_axis is None else given_axis, op, out)
    api.launch_keeping(rt, src, the_plan, {"dy": src.ptr, "y": ys.ptr, "dx": target.ptr}, src.stream(), key,
                       windows)
    if dst is not None:
        if target is not dst:
            target.copy_into(dst.array)
        return out
    return src.result(target.array)


# ---- repeat calls on torch CUDA tensors and cupy arrays ------------------------------------------
# As the forward's (api._run_prepared): a call whose (dy, y, out) layouts, axis and op were seen
# replays the launcher kept for them, launcher(dy_ptr, y_ptr, dx_ptr, stream). A key holds dy's
# (dtype, shape, strides, alignment), y's (dtype, shape, strides, alignment, device), the axis as
# the caller wrote it, op and dy's device, then out's five where given: twelve fields, so it never
# meets a forward key (eight).


def _repeat_key(dy, y, axis, op: str, out=None) -> tuple:
    """The key of a call; _repeat_torch and _repeat_cupy build the same tuple inline."""
    if type(dy) is api._CUPY_NDARRAY:
        key = (dy.dtype, dy.shape, dy.strides, dy.data.ptr & 15, y.dtype, y.shape, y.strides, y.data.ptr & 15,
               y.data.device_id, axis, op, dy.data.device_id)
        if out is None:
            return key
        return key + (out.dtype, out.shape, out.strides, out.data.ptr & 15, out.data.device_id)
    key = (dy.dtype, dy.shape, dy.stride(), dy.data_ptr() & 15, y.dtype, y.shape, y.stride(), y.data_ptr() & 15,
           y.get_device(), axis, op, dy.get_device())
    if out is None:
        return key
    return key + (out.dtype, out.shape, out.stride(), out.data_ptr() & 15, out.get_device())


def _shares_bytes(windows, from_dy: int, from_y: int) -> bool:
    """Whether out, ``from_dy`` and ``from_y`` bytes past dy's and y's pointers, shares bytes with
    either without being that array (the full path computes such a dx apart): _arrays.shares_bytes
    of both windows, in one call for the repeat paths."""
    (dy_low, dy_high, dy_same), (y_low, y_high, y_same) = windows
    return (dy_low < from_dy < dy_high and (from_dy or not dy_same)) or (
        y_low < from_y < y_high and (from_y or not y_same))


def _repeat_torch(dy, y, axis, op: str, out):
    """dx from the launcher kept for this call of plain torch tensors (out, where given), or None
    (the full path checks, plans and keeps one)."""
    tensor = api._TORCH_TENSOR
    if type(y) is not tensor or type(axis) is not int or dy.requires_grad or y.requires_grad or (
            out is not None and (type(out) is not tensor or out.requires_grad)):
        return None
    try:
        dy_ptr, y_ptr = dy.data_ptr(), y.data_ptr()
        out_ptr = None if out is None else out.data_ptr()
    except RuntimeError:  # a functorch wrapper: no storage
        return None
    device = dy.get_device()
    key = (dy.dtype, dy.shape, dy.stride(), dy_ptr & 15, y.dtype, y.shape, y.stride(), y_ptr & 15,
           y.get_device(), axis, op, device)  # _repeat_key
    if out is not None:
        key += (out.dtype, out.shape, out.stride(), out_ptr & 15, out.get_device())
    entry = api._entries.get(key)
    if entry is None or not dy_ptr or not y_ptr or out_ptr == 0:
        return None
    launcher, contiguous, bound_to, _, _, windows = entry
    stream = api._current_stream(device)
    if bound_to is not None and api.stream_key(stream) != bound_to:
        return None  # its scratch belongs to another stream's launches
    if out is not None:
        if _shares_bytes(windows, out_ptr - dy_ptr, out_ptr - y_ptr):
            return None
        launcher(dy_ptr, y_ptr, out_ptr, stream)
        return out
    torch = api._TORCH
    dx = torch.empty_like(dy) if contiguous else torch.empty_like(dy, memory_format=torch.contiguous_format)
    launcher(dy_ptr, y_ptr, dx.data_ptr(), stream)
    return dx


def _repeat_cupy(dy, y, axis, op: str, out):
    """_repeat_torch for cupy arrays, where dy lives on the current device (cupy allocates dx there)."""
    ndarray = api._CUPY_NDARRAY
    if type(y) is not ndarray or type(axis) is not int or (out is not None and type(out) is not ndarray):
        return None
    memory, y_memory = dy.data, y.data
    dy_ptr, y_ptr, device = memory.ptr, y_memory.ptr, memory.device_id
    key = (dy.dtype, dy.shape, dy.strides, dy_ptr & 15, y.dtype, y.shape, y.strides, y_ptr & 15,
           y_memory.device_id, axis, op, device)  # _repeat_key
    out_ptr = None
    if out is not None:
        out_memory = out.data
        out_ptr = out_memory.ptr
        key += (out.dtype, out.shape, out.strides, out_ptr & 15, out_memory.device_id)
    entry = api._entries.get(key)
    if entry is None or not dy_ptr or not y_ptr or out_ptr == 0 or api._cupy_device() != device:
        return None
    launcher, _, bound_to, _, _, windows = entry
    stream = api._cupy_current_stream().ptr
    if bound_to is not None and api.stream_key(stream) != bound_to:
        return None
    if out is not None:
        if _shares_bytes(windows, out_ptr - dy_ptr, out_ptr - y_ptr):
            return None
        launcher(dy_ptr, y_ptr, out_ptr, stream)
        return out
    dx = api._CUPY.empty(dy.shape, dy.dtype)
    launcher(dy_ptr, y_ptr, dx.data.ptr, stream)
    return dx

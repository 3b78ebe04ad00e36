"""The public calls: softmax, log_softmax and the backend switch."""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import _probe
from ._arrays import (
    ARRAY_LIKE,
    MASKED_ARRAY_ERROR,
    DeviceArray,
    Host,
    array_like,
    cast,
    classify,
    element_misalign,
    host_view,
    shares_bytes,
    torch_stream_reader,
    write_window,
)
from ._dtypes import dtype_name, storage_name
from ._launcher import LauncherCache
from ._scratch import PER_THREAD_DEFAULT_STREAM, ScratchPool  # noqa: F401 -- the handle, for callers of stream_key
from .layout import Rows, Strided, describe, normalize_axis
from .planner import Plan, RowProblem, StridedProblem, plan
from .reference import compute_on_host

if TYPE_CHECKING:  # the runtimes' module loads the compiled launcher: only when a runtime opens
    from ._runtime import HostRuntime, Runtime

ArrayT = TypeVar("ArrayT")

_forced_host_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("host_backend", default=None)
#: extra host backends by name (the emulated runtimes of the tests)
host_runtimes: dict[str, HostRuntime] = {}


#: what ``axis`` takes: one axis, several (softmax over their joint set), or None (all elements)
Axis = int | tuple[int, ...] | None


def softmax(x: ArrayT, axis: Axis = -1, *, out: ArrayT | None = None, safe: bool = False,
            dim: Axis = None, dtype: Any = None) -> ArrayT:
    """Softmax of ``x`` along ``axis``, as an array of the caller's type on the caller's device.

    numpy, cupy and torch arrays and any ``__dlpack__`` producer are accepted; so are Python
    numbers and lists (a numpy result). float16 and bfloat16 compute in float32, float64 in
    float64. ``axis`` is one axis, a tuple of axes (softmax over their joint set, as
    scipy.special.softmax) or None (over all elements); ``dim`` is a synonym (give one of the two).
    ``dtype`` casts the input first and returns that dtype (as ``torch.softmax(x, dim, dtype=...)``).
    Device arrays are computed in place on their device, on the caller's current stream. A row of
    all -inf gives NaN (like torch), or 0 with ``safe=True``. A torch tensor that requires grad
    gets a result autograd goes back through (this package's gradient kernels, as
    ``softmax_backward``); torch.func transforms and torch.compile see the call as the operator
    ``torch.ops.portable_softmax.softmax``; forward-mode AD carries the tangent. Inside jax.jit,
    grad, jvp and vmap it is an XLA FFI custom call on CUDA and ROCm and jax.numpy on the CPU.

    >>> import numpy as np, portable_softmax as ps
    >>> ps.softmax(np.array([[1.0, 1.0], [0.0, -np.inf]], dtype=np.float32))
    array([[0.5, 0.5],
           [1. , 0. ]], dtype=float32)
    >>> ps.softmax([[0.0, 0.0], [0.0, 0.0]], axis=None)
    array([[0.25, 0.25],
           [0.25, 0.25]])
    >>> ps.softmax(np.zeros((2, 2), np.float16), dim=0, dtype="float32")
    array([[0.5, 0.5],
           [0.5, 0.5]], dtype=float32)
    """
    if dim is not None or dtype is not None:  # the plain call pays for these two tests only
        x, axis = _conventions(x, axis, dim, dtype)
    # plain torch tensors, outside torch.compile's tracing and forward-mode AD: the prepared launches
    if type(x) is _TORCH_TENSOR and not _torch_is_compiling() and _TORCH_FORWARD_AD._current_level < 0:
        y = _run_prepared(x, axis, "softmax", out, safe)
        if y is not None:
            return y
    elif type(x) is _CUPY_NDARRAY:
        y = _run_prepared_cupy(x, axis, "softmax", out, safe)
        if y is not None:
            return y
    return _apply(x, axis, "softmax", out, bool(safe))


def log_softmax(x: ArrayT, axis: Axis = -1, *, out: ArrayT | None = None, safe: bool = False,
                dim: Axis = None, dtype: Any = None) -> ArrayT:
    """log(softmax(x)) along ``axis``, computed stably as x - max - log(sum(exp(x - max))).

    The keywords are softmax's. A row of all -inf gives NaN, or -inf (the log of softmax's 0)
    with ``safe=True``.

    >>> import numpy as np, portable_softmax as ps
    >>> ps.log_softmax(np.array([0.0, 0.0]))
    array([-0.69314718, -0.69314718])
    >>> ps.log_softmax(np.array([[-np.inf, -np.inf]]), safe=True)
    array([[-inf, -inf]])
    """
    if dim is not None or dtype is not None:
        x, axis = _conventions(x, axis, dim, dtype)
    if type(x) is _TORCH_TENSOR and not _torch_is_compiling() and _TORCH_FORWARD_AD._current_level < 0:
        y = _run_prepared(x, axis, "log_softmax", out, safe)
        if y is not None:
            return y
    elif type(x) is _CUPY_NDARRAY:
        y = _run_prepared_cupy(x, axis, "log_softmax", out, safe)
        if y is not None:
            return y
    return _apply(x, axis, "log_softmax", out, bool(safe))


def _conventions(x, axis, dim, dtype):
    """(x, axis) after torch's keywords: ``dim`` for ``axis``, and ``dtype`` as a cast of x."""
    if dim is not None:
        if axis != -1:
            raise TypeError(f"got axis={axis!r} and dim={dim!r}: dim is a synonym of axis, give one of them")
        axis = dim
    if dtype is not None:
        x = cast(array_like(x) if isinstance(x, ARRAY_LIKE) else x, dtype_name(dtype))
    return x, axis


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run host (numpy) inputs on backend ``name`` inside the block ('cpu', 'cuda', 'hip', ...).

    >>> import numpy as np, portable_softmax as ps
    >>> with ps.use_backend("cpu"):
    ...     ps.softmax(np.zeros(4, np.float32))
    array([0.25, 0.25, 0.25, 0.25], dtype=float32)
    """
    if name not in _probe.BACKENDS and name not in host_runtimes:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join((*_probe.BACKENDS, *host_runtimes))}")
    if name in ("cuda", "hip"):
        _probe.runtime(name)  # a clear error now if it cannot run here
    token = _forced_host_backend.set(name)
    try:
        yield
    finally:
        _forced_host_backend.reset(token)


# ---- framework adapters ------------------------------------------------------------------------
# The torch and JAX adapters sit above this module: they import it and register their hooks here
# (register_torch, register_jax) when they are imported. This module imports neither; the first
# array of a framework whose adapter has not registered yet loads that adapter by name.
_ADAPTERS = {"torch": "._torch_op", "jax": "._jax", "jaxlib": "._jax"}


def _framework_of(x) -> str:
    return type(x).__module__.partition(".")[0]


def _load_adapter(framework: str) -> None:
    importlib.import_module(_ADAPTERS[framework], __package__)  # its import registers its hooks


def _torch_route_unloaded(x) -> str | None:
    if _framework_of(x) != "torch":
        return None
    _load_adapter("torch")
    return _torch_route(x)


def _jax_is_tracer_unloaded(x) -> bool:
    if _framework_of(x) not in ("jax", "jaxlib"):
        return False
    _load_adapter("jax")
    return _jax_is_tracer(x)


#: the torch adapter's route(x) -> how | None, call(how, x, axis, op, safe) and
#: gradient_call(how, dy, y, axis, op)
_torch_route: Any = _torch_route_unloaded
_torch_call: Any = None
_torch_gradient_call: Any = None
#: the JAX adapter's is_tracer(x) -> bool, traced(x, axis, op, safe, out) and
#: traced_gradient(dy, y, axis, op, out)
_jax_is_tracer: Any = _jax_is_tracer_unloaded
_jax_traced: Any = None
_jax_traced_gradient: Any = None


def register_torch(route: Any, call: Any, gradient_call: Any) -> None:
    """The torch adapter's hooks: ``route(x)`` says how a call on tensor x leaves the direct path
    (None: it does not), ``call(how, x, axis, op, safe)`` makes that call and
    ``gradient_call(how, dy, y, axis, op)`` a gradient's."""
    global _torch_route, _torch_call, _torch_gradient_call
    _torch_call, _torch_gradient_call = call, gradient_call
    _torch_route = route  # the route last: a set route finds its calls


def register_jax(is_tracer: Any, traced: Any, traced_gradient: Any) -> None:
    """The JAX adapter's hooks: ``is_tracer(x)`` says whether x goes through JAX's machinery,
    ``traced(x, axis, op, safe, out)`` computes it there, ``traced_gradient(dy, y, axis, op, out)``
    a gradient."""
    global _jax_is_tracer, _jax_traced, _jax_traced_gradient
    _jax_traced, _jax_traced_gradient = traced, traced_gradient
    _jax_is_tracer = is_tracer


def _apply(x, axis, op: str, out, safe: bool):
    if type(x) is not np.ndarray:
        if isinstance(x, ARRAY_LIKE):
            x = array_like(x)
        elif isinstance(x, np.ndarray):  # a subclass: masked arrays refused, np.matrix kept
            return _ndarray_subclass(x, axis, op, out, safe)
    if type(axis) is not int and (axis is None or isinstance(axis, (tuple, list))):
        return _over_axes(x, axis, op, out, safe)
    how = _torch_route(x)
    if how is not None:
        return _through_torch(how, x, axis, op, out, safe)
    return _direct(x, axis, op, out, safe)


def _ndarray_subclass(x: np.ndarray, axis, op: str, out, safe: bool):
    """np.matrix in, np.matrix out; other subclasses of ndarray give an ndarray."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(MASKED_ARRAY_ERROR)
    y = _apply(x.view(np.ndarray), axis, op, out, safe)
    return y.view(np.matrix) if isinstance(x, np.matrix) and out is None else y


def _over_axes(x, axis, op: str, out, safe: bool):
    """softmax over the joint set of several axes (None: all of them): those axes moved to the end
    and flattened into one (a copy where the layout needs one), computed, and put back."""
    if not hasattr(x, "ndim") or not hasattr(x, "reshape"):  # a bare DLPack producer
        src = classify(x)
        y = _over_axes(src.array, axis, op, None if out is None else _out_array(out), safe)
        return out if out is not None else (src.wrap(y) if isinstance(src, Host) else src.result(y))
    if out is not None and _jax_is_tracer(x):
        return _jax_traced(x, 0, op, safe, out)  # its error: out= cannot take a traced array
    axes = joint_axes(axis, x.ndim)
    if len(axes) == 1:
        return _apply(x, axes[0], op, out, safe)
    rows, back = axes_to_rows(x, axes)
    y = back(_apply(rows, -1, op, None, safe))
    if isinstance(x, np.generic):
        y = y[()]
    return y if out is None else _write_out(x, y, out, op)


def joint_axes(axis, ndim: int) -> tuple[int, ...]:
    """A tuple of axes (None: all of them), normalised; a repeated one is a ValueError."""
    axes = tuple(range(ndim)) if axis is None else tuple([normalize_axis(a, ndim) for a in axis])
    if len(set(axes)) != len(axes):
        raise ValueError(f"duplicate value in axis={axis!r}")
    return axes


def axes_to_rows(a, axes: tuple[int, ...]):
    """``a`` with ``axes`` moved to the end and flattened into one (a copy where the layout needs
    one), and the function that puts a result of that layout back. Lists rather than generators
    throughout: torch.compile traces this function."""
    ndim = a.ndim
    keep = [d for d in range(ndim) if d not in axes]
    perm = (*keep, *axes)
    shape = tuple(a.shape)
    kept = [shape[d] for d in keep]
    joint = [shape[d] for d in axes]
    identity = perm == tuple(range(ndim))

    def back(r):
        r = r.reshape((*kept, *joint))
        return r if identity else _permute(r, tuple([perm.index(d) for d in range(ndim)]))

    return (a if identity else _permute(a, perm)).reshape((*kept, math.prod(joint))), back


def _permute(a, perm):
    return a.permute(perm) if type(a).__module__.split(".")[0] == "torch" else a.transpose(perm)


def _out_array(out):
    """The array an out= of a bare DLPack producer writes into."""
    _refuse_jax_out(out)
    return classify(out).array


def _write_out(x, y, out, op: str, source: str = "the input"):
    """Copy a computed result into out=, after the checks the direct path makes of out (against
    ``x``, named ``source`` in the errors)."""
    how = _torch_route(x)
    if how is not None:
        _check_torch_out(how, x, out, op)
        return out.copy_(y)
    dst = _check_out(classify(x), out, source)
    dst.array[...] = classify(y).array
    return out


def _direct(x, axis, op: str, out, safe: bool):
    """The computation on the caller's array, with no torch machinery around it."""
    if _jax_is_tracer(x):
        return _jax_traced(x, axis, op, safe, out)
    src = classify(x)
    given_axis, axis = axis, normalize_axis(axis, len(src.shape))
    dst = _check_out(src, out)
    if src.on_device:
        return _run_device(src, axis, op, safe, dst, out, given_axis)
    return _run_host(src, axis, op, safe, dst, out)


def _eager_forward(x, axis: int, op: str, safe: bool):
    """The torch operator's computation: a plain tensor on the direct path."""
    y = _run_prepared(x, axis, op, None, safe) if type(x) is _TORCH_TENSOR else None
    return y if y is not None else _direct(x, axis, op, None, safe)


def _through_torch(how: str, x, axis, op: str, out, safe: bool):
    """A tensor autograd records, one inside a torch.func transform or torch.compile, or a fake one:
    the call goes through the registered torch operator (portable_softmax::softmax)."""
    storage_name(x.dtype)  # an unsupported dtype is refused here, before torch traces the operator
    axis = normalize_axis(axis, x.dim())
    if out is None:
        return _torch_call(how, x, axis, op, safe)
    _check_torch_out(how, x, out, op)
    return out.copy_(_torch_call(how, x, axis, op, safe))


def _check_torch_out(how: str, x, out, op: str) -> None:
    if how in ("autograd", "forward", "composite"):
        raise ValueError(f"out= cannot take the {op} of a tensor that autograd differentiates (one that "
                         "requires grad, or inside a forward-mode dual level): autograd does not record a "
                         "write into out (torch's out= arguments refuse it too); call without out=, or "
                         "under torch.no_grad() outside the dual level")
    import torch  # imported already: x is a tensor

    if not isinstance(out, torch.Tensor) or (out.shape, out.dtype, out.device) != (x.shape, x.dtype, x.device):
        raise ValueError(f"out must be a torch tensor of the input's shape {tuple(x.shape)}, dtype {x.dtype} "
                         f"and device {x.device}; got {_described(out)}")


def _described(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        where = f" on {value.device}" if hasattr(value, "device") else ""
        return f"{type(value).__name__} of shape {tuple(value.shape)}, dtype {value.dtype}{where}"
    return type(value).__name__


def _refuse_jax_out(out) -> None:
    if type(out).__module__.split(".")[0] in ("jax", "jaxlib"):
        raise ValueError("out= cannot be a JAX array: JAX arrays are immutable; use the returned array "
                         "(a JAX input gives a JAX result)")


def _check_out(src, out, source: str = "the input"):
    """out= checked against the classified array ``src`` (named ``source`` in the errors)."""
    if out is None:
        return None
    _refuse_jax_out(out)
    dst = classify(out, writes=True)
    if dst.on_device != src.on_device or (
        src.on_device and (dst.vendor, dst.device_index) != (src.vendor, src.device_index)
    ):
        where = f"{src.vendor}:{src.device_index}" if src.on_device else "host"
        raise ValueError(f"out must live where {source} does ({where}); got {type(out).__name__} elsewhere")
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"out has shape {tuple(dst.shape)}; {source}'s shape {tuple(src.shape)} is required")
    if dst.dtype != src.dtype:
        raise ValueError(f"out has dtype {dst.dtype}; {source}'s dtype {src.dtype} is required")
    strides = dst.strides if dst.on_device else host_view(dst.array)[1]
    # an array of no elements has none to collide (numpy gives such arrays strides of 0)
    if 0 not in dst.shape and any(s == 0 and n > 1 for s, n in zip(strides, dst.shape)):
        raise ValueError("out must not be a broadcast view (a stride of 0 would make elements collide)")
    if not dst.on_device and not dst.array.flags.writeable:
        raise ValueError("out is read-only; pass a writeable array")
    return dst


# ---- host arrays ---------------------------------------------------------------------
def _run_host(src: Host, axis: int, op: str, safe: bool, dst: Host | None, out):
    name = _forced_host_backend.get() or _probe.host_backend()
    x = src.array
    if name == "cpu" or x.ndim == 0 or x.size == 0:
        result = compute_on_host(x, axis, op, safe, None if dst is None else dst.array)
        return out if dst is not None else src.wrap(result)
    rt = host_runtimes[name] if name in host_runtimes else _probe.runtime(name)
    result = run_host_array(rt, x, axis, op, safe)
    if op == "log_softmax" and safe:  # the kernels give NaN for a row of all -inf; safe asks for -inf
        np.copyto(result, -np.inf, where=np.isneginf(x).all(axis=axis, keepdims=True))
    if dst is not None:
        dst.array[...] = result
        return out
    return src.wrap(result)


def problem_for(dtype: str, op: str, safe: bool, xl: Rows | Strided, yl: Rows | Strided,
                x_ptr: int, y_ptr: int) -> RowProblem | StridedProblem:
    """The planner's problem for input and output layouts of the same shape."""
    if isinstance(xl, Rows) and isinstance(yl, Rows):
        return RowProblem(dtype, op, xl.rows, xl.cols, xl.row_stride, yl.row_stride,
                          element_misalign(x_ptr, dtype), element_misalign(y_ptr, dtype), safe)
    xs, ys = (_as_strided(xl), _as_strided(yl))
    return StridedProblem(dtype, op, xs.outer, xs.cols, xs.inner, xs.strides, ys.strides, safe,
                          element_misalign(x_ptr, dtype), element_misalign(y_ptr, dtype))


def _as_strided(layout: Rows | Strided) -> Strided:
    if isinstance(layout, Strided):
        return layout
    return Strided(layout.rows, layout.cols, 1, (layout.row_stride, 1, 0))


def run_host_array(rt: HostRuntime | Runtime, x: np.ndarray, axis: int, op: str, safe: bool) -> np.ndarray:
    """Compute a host array on a runtime that stages it (GPU runtimes, the emulation)."""
    x = np.ascontiguousarray(x)
    axis = normalize_axis(axis, x.ndim)
    shape, strides = host_view(x)
    layout = describe(shape, strides, axis)
    dtype = storage_name(x.dtype)
    device = rt.current_device()
    # Staging buffers are 256-byte aligned, so both sides start aligned.
    problem = problem_for(dtype, op, safe, layout, layout, 0, 0)
    return rt.run_host(x, plan(problem, rt.profile(device)), dtype, device)


# ---- device arrays -------------------------------------------------------------------------
def _run_device(src: DeviceArray, axis: int, op: str, safe: bool, dst: DeviceArray | None, out,
                given_axis: int | None = None):
    rt = _probe.runtime(src.vendor)
    original = src.array
    shape = tuple(src.shape)
    if len(shape) == 0 or 0 in shape:
        y = dst.array if dst is not None else src.empty(shape)
        if len(shape) == 0:
            y[...] = 1.0 if op == "softmax" else 0.0
        return src.result(y) if dst is None else out
    xl = describe(shape, src.strides, axis)
    if xl is None or (isinstance(xl, Strided) and xl.inner == 1):
        src = src.contiguous()  # dims that do not collapse, or a strided last axis
        xl = describe(shape, src.strides, axis)
    target, yl, window = None, None, None
    if dst is not None:  # out written directly unless its layout differs in kind or it shares bytes with x
        yl = describe(shape, dst.strides, axis)
        window = write_window(src, dst)
        if yl is not None and isinstance(yl, Rows) == isinstance(xl, Rows) and not shares_bytes(
                window, dst.ptr - src.ptr):
            target = dst
    if target is None:
        target = type(src)(src.empty(shape))  # a fresh C-contiguous output, read like the input
        yl = describe(shape, target.strides, axis)
    problem = problem_for(src.dtype, op, safe, xl, yl, src.ptr, target.ptr)
    the_plan = plan(problem, rt.profile(src.device_index))
    stream = src.stream()
    # A call the repeat path can take next time builds its launcher (in `launchers`) and replays it
    # now; one whose output is made whole afterwards (safe log_softmax), or whose input or out was
    # copied, launches once.
    key, windows = None, ()
    if src.array is original and (dst is None or target is dst) and not (op == "log_softmax" and safe) \
            and _preparable(original, out):
        key = _prepared_key(original, axis if given_axis is None else given_axis, op, safe, out)
        windows = () if dst is None else (window,)
    launch_keeping(rt, src, the_plan, {"x": src.ptr, "y": target.ptr}, stream, key, windows)
    if op == "log_softmax" and safe:  # the kernels give NaN for a row of all -inf; safe asks for -inf
        src.fill_empty_rows(target.array, axis, -float("inf"))
    if dst is not None:
        if target is not dst:
            target.copy_into(dst.array)
        return out
    return src.result(target.array)


def launch_keeping(rt: Runtime, src: DeviceArray, the_plan: Plan, arrays: dict[str, int], stream: int,
                   key=None, windows: tuple = ()) -> None:
    """The plan's launches with the ``arrays`` pointers (named as the launches name them, in the
    repeat path's order): through the launcher kept under ``key`` in `launchers`, built now, where
    one can be kept; else once (launch_plan). A contiguous input's empty_like is the output the
    launcher was planned for (cupy's repeat call allocates with cupy.empty, C-contiguous whatever
    the input). ``windows``: each input's `write_window` against out=, where out= is given."""
    entry = None
    if key is not None:
        original = src.array
        contiguous = True if type(original) is _CUPY_NDARRAY else original.is_contiguous()
        entry = launchers.build(key, rt, src, the_plan, stream, tuple(arrays), contiguous, windows)
    if entry is not None:
        entry[0](*arrays.values(), stream)
    else:
        launch_plan(rt, src, the_plan, arrays, stream)  # adds the scratch's pointers to arrays


def launch_plan(rt: Runtime, src: DeviceArray, the_plan: Plan, buffers: dict[str, int], stream: int) -> None:
    """The plan's launches on ``stream`` with the named array ``buffers`` and the plan's scratch
    (the kept zeroed scratch where the plan leaves it zero, else its own allocation)."""
    keep = None
    if the_plan.scratch:
        nbytes, offsets = the_plan.scratch_layout()
        if not the_plan.scratch_zeroed:
            base, keep = src.scratch(nbytes, zeroed=False)
        elif src.capturing():  # a fill captured in a graph zeroes nothing until the graph runs
            base, keep = src.scratch(nbytes)
        else:
            base = scratch_pool.zeroed(src, nbytes, stream, rt)
        buffers.update((name, base + offset) for name, offset in offsets.items())
    rt.launch(the_plan, src.dtype, buffers, stream, src.device_index)
    del keep  # stream-ordered allocators reuse scratch only after the launches above


# ---- scratch and the launchers of repeat calls ----------------------------------------------------
#: the zeroed scratch of one-off launches, one buffer a stream (_scratch.ScratchPool)
scratch_pool = ScratchPool()
#: the launchers of repeat calls with the scratch each owns (_launcher.LauncherCache)
launchers = LauncherCache(scratch_pool)
_entries = launchers.entries  # the repeat paths' one dict probe a call
stream_key = scratch_pool.stream_key


# ---- the repeat-call path for torch CUDA tensors and cupy arrays ------------------------------
# A model calls softmax on tensors of the same shape again and again. The first call of a
# (dtype, shape, strides, alignment, axis, op, safe, device) builds its launcher in `launchers`
# and replays it; a repeat call reads a few attributes, allocates the output and replays it too.
# Calls with out= keep theirs under the same key and out's (dtype, shape, strides, alignment,
# device): the full path's checks of out need not run again. torch's and cupy's keys never meet:
# their dtypes are objects of different types.
_TORCH = None
_TORCH_TENSOR: type | None = None  # torch.Tensor once torch is seen (plain tensors take the prepared path)
_torch_is_compiling = None  # torch.compiler.is_compiling
_TORCH_FORWARD_AD = None  # torch.autograd.forward_ad (its _current_level: -1 outside dual levels)


def _is_torch_cuda(x) -> bool:
    global _TORCH, _TORCH_TENSOR, _current_stream, _torch_is_compiling, _TORCH_FORWARD_AD
    if _TORCH is None:
        if type(x).__module__.split(".")[0] != "torch":
            return False
        import torch

        _TORCH, _TORCH_TENSOR, _current_stream = torch, torch.Tensor, torch_stream_reader(torch)
        _torch_is_compiling = torch.compiler.is_compiling
        _TORCH_FORWARD_AD = torch.autograd.forward_ad
    return isinstance(x, _TORCH_TENSOR) and x.is_cuda


def _preparable(x, out) -> bool:
    """Whether the launches of this call on device array x (writing out itself, where given) are
    kept for repeat calls: those of plain torch CUDA tensors and cupy arrays."""
    if _is_torch_cuda(x):
        return out is None or type(out) is _TORCH_TENSOR
    return _is_cupy(x) and (out is None or type(out) is _CUPY_NDARRAY)


def _prepared_key(x, axis, op, safe, out=None):
    """(dtype, shape, strides, alignment, axis, op, safe, device), and the same five of out where
    given: what a plan depends on, and what the full path checked of out. _run_prepared and
    _run_prepared_cupy build the same tuple inline (a call costs as much as a field); a test holds
    the three to one key."""
    if type(x) is _CUPY_NDARRAY:
        key = (x.dtype, x.shape, x.strides, x.data.ptr & 15, axis, op, safe, x.data.device_id)
        if out is None:
            return key
        return key + (out.dtype, out.shape, out.strides, out.data.ptr & 15, out.data.device_id)
    key = (x.dtype, x.shape, x.stride(), x.data_ptr() & 15, axis, op, safe, x.get_device())
    if out is None:
        return key
    return key + (out.dtype, out.shape, out.stride(), out.data_ptr() & 15, out.get_device())


def _run_prepared(x, axis, op, out, safe):
    """The output of the prepared launches of this plain torch tensor's call (out, where given), or
    None (the full path plans, checks and remembers). The axis is the caller's: an axis out of range
    never has launches kept. Each torch call here costs 0.1-0.2 us, so a call makes as few as it can."""
    # bools and other types equal to ints go the checked way; so does an out that is no plain tensor
    if type(axis) is not int or x.requires_grad or (
            out is not None and (type(out) is not _TORCH_TENSOR or out.requires_grad)):
        return None
    try:
        ptr = x.data_ptr()
        out_ptr = None if out is None else out.data_ptr()
    except RuntimeError:  # a functorch wrapper of vmap, grad or jvp: no storage
        return None
    device = x.get_device()
    key = (x.dtype, x.shape, x.stride(), ptr & 15, axis, op, safe, device)  # _prepared_key
    if out is not None:
        key += (out.dtype, out.shape, out.stride(), out_ptr & 15, out.get_device())
    entry = _entries.get(key)
    # (CPU tensors' keys miss.) A functionalize wrapper's data pointer reads 0, and a tensor of no
    # elements never has launches kept: a null pointer always takes the full path.
    if entry is None or not ptr or out_ptr == 0:
        return None
    launcher, contiguous, bound_to, _, _, windows = entry
    stream = _current_stream(device)
    if bound_to is not None and stream_key(stream) != bound_to:
        return None  # its scratch belongs to another stream's launches
    if out is not None:
        low, high, same = windows[0]
        delta = out_ptr - ptr
        if low < delta < high and (delta or not same):  # _arrays.shares_bytes, inline
            return None  # out shares bytes with x but is not x: the full path computes it apart
        launcher(ptr, out_ptr, stream)
        return out
    # empty_like costs 2-3 us less than torch.empty(shape, ...); its plain form less than with a format
    y = _TORCH.empty_like(x) if contiguous else _TORCH.empty_like(x, memory_format=_TORCH.contiguous_format)
    launcher(ptr, y.data_ptr(), stream)
    return y


def _current_stream(device_index: int) -> int:  # replaced by torch's reader once torch is seen
    raise RuntimeError("torch has not been seen")


_CUPY = None
_CUPY_NDARRAY: type | None = None  # cupy.ndarray once cupy is seen (its arrays take the prepared path)
_cupy_device = None  # cupy.cuda.runtime.getDevice: the host thread's current device
_cupy_current_stream = None  # cupy.cuda.get_current_stream: the current device's current stream


def _is_cupy(x) -> bool:
    global _CUPY, _CUPY_NDARRAY, _cupy_device, _cupy_current_stream
    if _CUPY_NDARRAY is None:
        if type(x).__module__.split(".")[0] != "cupy":
            return False
        import cupy

        _CUPY, _CUPY_NDARRAY = cupy, cupy.ndarray
        _cupy_device, _cupy_current_stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
    return type(x) is _CUPY_NDARRAY


def _run_prepared_cupy(x, axis, op, out, safe):
    """_run_prepared for a cupy array: the output of its call's prepared launches (out, where
    given), or None (the full path). Only where x lives on the current device: cupy allocates
    the output there, and its current stream is that device's."""
    if type(axis) is not int or (out is not None and type(out) is not _CUPY_NDARRAY):
        return None
    memory = x.data
    ptr, device = memory.ptr, memory.device_id
    key = (x.dtype, x.shape, x.strides, ptr & 15, axis, op, safe, device)  # _prepared_key
    out_ptr = None
    if out is not None:
        out_memory = out.data
        out_ptr = out_memory.ptr
        key += (out.dtype, out.shape, out.strides, out_ptr & 15, out_memory.device_id)
    entry = _entries.get(key)
    if entry is None or not ptr or out_ptr == 0 or _cupy_device() != device:
        return None
    launcher, _, bound_to, _, _, windows = entry
    stream = _cupy_current_stream().ptr
    if bound_to is not None and stream_key(stream) != bound_to:
        return None  # its scratch belongs to another stream's launches
    if out is not None:
        low, high, same = windows[0]
        delta = out_ptr - ptr
        if low < delta < high and (delta or not same):  # _arrays.shares_bytes, inline
            return None  # out shares bytes with x but is not x: the full path computes it apart
        launcher(ptr, out_ptr, stream)
        return out
    y = _CUPY.empty(x.shape, x.dtype)
    launcher(ptr, y.data.ptr, stream)
    return y

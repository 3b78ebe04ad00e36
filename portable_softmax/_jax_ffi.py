"""The XLA FFI custom call that runs the package's kernels inside compiled JAX programs on CUDA and ROCm.

One handler (src_cuda/jax_ffi.cu, hipified to src_hip/jax_ffi.hip) is built as a plain shared
library against the headers of the jax installed at build time, and registered here with
``jax.ffi.register_ffi_target`` for platform "CUDA" or "ROCM". It replays a plan: this module
plans the call when XLA lowers it (shapes are static then), resolves each launch's function
handle and grid on every device of the runtime adapter (cupy; hip-python), and passes them as the
custom call's attributes. The scratch is a workspace result XLA allocates; the handler zeroes it
on XLA's stream where the plan needs it zero. The gradient is the same handler over the gradient
kernels' plan (planner_backward), with operands dy and y; the gradient from the forward's input
(kind "backward_from_input", which _jax takes where ``plan_backward_from_input`` plans it) has
operands dy and x and one launch that reads each once. Where that plan is missing (the JVP chose x
for a shape that vmap then batched into rows without the kernel) the call runs the forward into dx
and the gradient from y there (a safe log_softmax, which the forward cannot serve, in jax.numpy).

>>> from portable_softmax import _jax_ffi
>>> _jax_ffi.status().startswith(("registered", "built", "not built", "not registered"))
True
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import _launch
from ._dtypes import storage_name
from ._launch import KERNEL_DIR, PACKAGE_DIR
from .layout import Rows, describe
from .planner import I32, I64, PTR, DeviceProfile, Launch, Plan

#: the handler as a command buffer (CUDA graph) may hold it, and the same handler outside them
TARGET = "portable_softmax_launch"
TARGET_UNCAPTURED = "portable_softmax_launch_uncaptured"
#: a handler library to load instead of the installed one
LIBRARY_ENV = "PORTABLE_SOFTMAX_JAX_FFI_LIBRARY"
#: the command that builds the handler into the package
BUILD_COMMAND = 'pip install --no-build-isolation ".[jax]"'
#: without build isolation the build sees the environment's packages: jax's FFI headers among them
BUILD_WHERE = "in an environment that has jax and scikit-build-core installed"
#: runtime vendor -> the platform name jax.ffi.register_ffi_target takes
FFI_PLATFORMS = {"cuda": "CUDA", "hip": "ROCM"}
#: JAX lowering platform -> runtime vendor
VENDORS = {"cuda": "cuda", "rocm": "hip"}
#: the driver entry points PortableSoftmaxFfiInit takes: launch, cooperative launch, byte fill, error name
ENTRY_POINTS = {
    "cuda": ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuMemsetD8Async", "cuGetErrorName"),
    "hip": ("hipModuleLaunchKernel", "hipModuleLaunchCooperativeKernel", "hipMemsetD8Async", "hipDrvGetErrorName"),
}
#: kinds of a kernel argument in the custom call's attributes (src_cuda/jax_ffi.cu)
OPERAND, RESULT, SCRATCH, INT64, INT32 = range(5)

_lock = threading.Lock()
#: vendor -> None (registered) or why not
_registered: dict[str, str | None] = {}
_libraries: dict[str, ctypes.CDLL] = {}
_api_versions: dict[str, str] = {}
#: (vendor, shape, dtype, axis, op, safe) -> (target, attributes, workspace bytes)
_calls: dict[tuple, tuple[str, dict, int]] = {}


def vendor_of(device) -> str | None:
    """The runtime vendor ('cuda' or 'hip') of a JAX device, or None for other platforms. CUDA and
    ROCm devices both report the platform "gpu"; the client's platform version tells them apart."""
    platform = getattr(device, "platform", "")
    if platform in VENDORS:
        return VENDORS[platform]
    if platform != "gpu":
        return None
    version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
    return "hip" if "rocm" in version or "hip" in version else "cuda"


def library_path(vendor: str) -> Path | None:
    """The handler library for ``vendor`` ('cuda' or 'hip'): $PORTABLE_SOFTMAX_JAX_FFI_LIBRARY, else the one the
    build installed beside the kernels; None where there is none."""
    given = os.environ.get(LIBRARY_ENV)
    if given:
        return Path(given)
    name = f"jax_ffi_{vendor}.so"
    for folder in (KERNEL_DIR, PACKAGE_DIR / "kernels"):
        if (folder / name).is_file():
            return folder / name
    return None


def _entry_points(vendor: str) -> list[int | None]:
    if vendor == "cuda":
        from ._cuda import cuda_launch_entry_point

        return [cuda_launch_entry_point(symbol) for symbol in ENTRY_POINTS[vendor]]
    from ._hip import hip_launch_entry_point

    return [hip_launch_entry_point(symbol=symbol) for symbol in ENTRY_POINTS[vendor]]


def register(vendor: str) -> str | None:
    """Load the handler library and register its targets with JAX for ``vendor``'s platform, once.
    None when registered; otherwise why not (the message names the build command)."""
    with _lock:
        if vendor in _registered:
            return _registered[vendor]
        _registered[vendor] = why = _register(vendor)
        return why


def _register(vendor: str) -> str | None:
    path = library_path(vendor)
    if path is None:
        return (f"the JAX FFI handler for {FFI_PLATFORMS[vendor]} is not built (jax was not importable when the "
                f"package was built); build it with `{BUILD_COMMAND}` {BUILD_WHERE}")
    try:
        library = ctypes.CDLL(str(path))
        init = library.PortableSoftmaxFfiInit
    except (OSError, AttributeError) as e:
        return f"the JAX FFI handler {path} does not load ({e}); rebuild it with `{BUILD_COMMAND}`"
    launch, cooperative, fill, name = _entry_points(vendor)
    if not launch or not fill:
        return (f"{ENTRY_POINTS[vendor][0]} / {ENTRY_POINTS[vendor][2]} were not found in a loaded "
                f"{'CUDA driver' if vendor == 'cuda' else 'HIP runtime'} library")
    init.restype = ctypes.c_int
    init.argtypes = [ctypes.c_void_p] * 4
    version = init(launch, cooperative if _launch.COOPERATIVE_LAUNCHES else None, fill, name)
    import jax

    platform = FFI_PLATFORMS[vendor]
    try:
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.PortableSoftmaxLaunch), platform=platform)
        jax.ffi.register_ffi_target(TARGET_UNCAPTURED, jax.ffi.pycapsule(library.PortableSoftmaxLaunchUncaptured),
                                    platform=platform)
    except Exception as e:  # noqa: BLE001 -- jaxlib's own errors: say which and go on without the FFI path
        return f"jax.ffi.register_ffi_target refused {path}: {type(e).__name__}: {e}"
    _libraries[vendor] = library
    _api_versions[vendor] = f"{version // 1000}.{version % 1000}"
    return None


def status() -> str:
    """Whether the FFI targets are registered, and for which platform (``portable-softmax info``)."""
    lines = []
    for vendor, platform in FFI_PLATFORMS.items():
        if vendor in _registered:
            why = _registered[vendor]
            lines.append(f"registered for {platform} ({library_path(vendor)}, XLA FFI API "
                         f"{_api_versions[vendor]})" if why is None else f"not registered for {platform}: {why}")
            continue
        path = library_path(vendor)
        if path is not None:
            lines.append(f"built for {platform} ({path}); registered on the first JAX call on such a GPU")
    if not lines:
        return (f"not built (jax was not importable when the package was built); build it with `{BUILD_COMMAND}` "
                f"{BUILD_WHERE}")
    return "; ".join(lines)


def custom_call(vendor: str, shape: tuple[int, ...], dtype, axis: int, op: str, safe: bool,
                kind: str = "forward") -> tuple[str, dict, int]:
    """(target, attributes, workspace bytes) of the custom call computing ``op`` of a C-contiguous
    array along ``axis`` (counted from the end) on every device of ``vendor``'s runtime: the forward
    (operand x, result y) or, for ``kind="backward"``, its gradient (operands dy and y, result dx),
    or for ``kind="backward_from_input"`` its gradient from the forward's input (operands dy and x,
    result dx). Planned on the profile of device 0: devices of another profile are left out (the
    handler refuses them)."""
    name = storage_name(dtype)
    key = (vendor, tuple(shape), name, axis, op, bool(safe), kind)
    found = _calls.get(key)
    if found is None:
        found = _calls[key] = _plan_call(vendor, tuple(shape), name, axis, op, bool(safe), kind)
    return found


#: where each buffer a plan names comes from: (argument kind, operand or result index)
BUFFERS = {"forward": {"x": (OPERAND, 0), "y": (RESULT, 0)},
           "backward": {"dy": (OPERAND, 0), "y": (OPERAND, 1), "dx": (RESULT, 0)},
           "backward_from_input": {"dy": (OPERAND, 0), "x": (OPERAND, 1), "dx": (RESULT, 0)}}
#: the kinds' op attribute (error messages name it): op plus this
OP_SUFFIXES = {"forward": "", "backward": "_backward", "backward_from_input": "_backward_from_input"}


def _plan_call(vendor: str, shape: tuple[int, ...], dtype: str, axis: int, op: str, safe: bool, kind: str):
    from . import _probe
    from ._backward import _problem
    from .api import problem_for
    from .planner import plan
    from .planner_backward import plan_backward

    if kind not in BUFFERS:
        raise ValueError(f"unknown custom call kind {kind!r}; one of {', '.join(BUFFERS)}")
    rt = _probe.runtime(vendor)
    ndim = len(shape)
    axis = axis % ndim
    layout = describe(shape, contiguous_strides(shape), axis)
    reference = rt.profile(0)
    # XLA's buffers are at least 16-byte aligned (the handler checks): no misaligned head
    if kind == "backward":
        the_plan = plan_backward(_problem(dtype, op, layout, layout, layout, (0, 0, 0)), reference)
    elif kind == "backward_from_input":
        the_plan = plan_from_input(dtype, op, safe, layout, reference)
        if the_plan is None:
            raise ValueError(f"no kernels compute the gradient of a safe log_softmax of {shape} from x "
                             "(kernels_take_from_input tells; jax.numpy computes it)")
    else:
        the_plan = plan(problem_for(dtype, op, safe, layout, layout, 0, 0), reference)
    nbytes, offsets = the_plan.scratch_layout() if the_plan.scratch else (0, {})
    devices, functions, grids, made = [], [], [], None
    for device in range(rt.device_count):
        if rt.profile(device) != reference:
            continue
        devices.append(device)
        steps = []
        for i, step_ in enumerate(the_plan.launches):
            # one kernel and block a launch for all devices: those of one profile hold a kernel's blocks alike
            step_ = rt.resident_step(step_, dtype, device) if made is None else made[i]
            fn = (rt.function(device, dtype, step_.kernel, step_.shared_mem) if vendor == "cuda"
                  else rt.function(device, dtype, step_.kernel))
            functions.append(int(fn))
            steps.append(step_)
            grids.append(rt.resident_grid(fn, step_, device))
        made = made or steps
    if made:
        the_plan = replace(the_plan, launches=tuple(made))
    buffers = BUFFERS[kind]
    starts, kinds, values = [0], [], []
    for step_ in the_plan.launches:
        for arg_kind, value in step_.args:
            if arg_kind == PTR:
                where, index = buffers[value] if value in buffers else (SCRATCH, offsets[value])
                kinds.append(where)
                values.append(index)
            elif arg_kind in (I64, I32):
                kinds.append(INT64 if arg_kind == I64 else INT32)
                values.append(int(value))
            else:
                raise ValueError(f"unknown kernel argument kind {arg_kind!r}")
        starts.append(len(kinds))
    cooperative = [int(s.cooperative and _launch.COOPERATIVE_LAUNCHES) for s in the_plan.launches]
    attributes = {
        "op": op + OP_SUFFIXES[kind], "axis": np.int64(axis - ndim), "safe": bool(safe),
        "zero_bytes": np.int64(nbytes if the_plan.scratch_zeroed else 0),
        "devices": _i64(devices), "functions": _i64(functions), "grids": _i64(grids),
        "blocks": _i64([s.block for s in the_plan.launches]),
        "shared": _i64([s.shared_mem for s in the_plan.launches]),
        "cooperative": _i64(cooperative), "arg_starts": _i64(starts),
        "arg_kinds": _i64(kinds), "arg_values": _i64(values),
    }
    # cooperative launches stay out of command buffers; plain launches and the fill are captured
    target = TARGET_UNCAPTURED if any(cooperative) else TARGET
    return target, attributes, max(1, nbytes)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element strides of a C-contiguous array of ``shape`` (XLA's default layout)."""
    strides, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d], step = step, step * shape[d]
    return tuple(strides)


def from_input_problem(dtype: str, op: str, safe: bool, layout: Rows):
    """The planner_backward problem of the gradient from x along contiguous rows (dy, x and dx of
    one layout, 16-byte aligned): the gradient from y's, with the forward's ``safe``."""
    from ._backward import _problem

    return replace(_problem(dtype, op, layout, layout, layout, (0, 0, 0)), safe=safe)


def plan_from_input(dtype: str, op: str, safe: bool, layout, device: DeviceProfile) -> Plan | None:
    """The plan of the gradient from the forward's input x (buffers "dy", "x", "dx"): the fused
    kernel's where planner_backward has one, else the forward writing y into dx and the gradient
    from y reading it there (each gradient kernel reads an element before it writes its place).
    None for a safe log_softmax without the fused kernel: the forward kernels give its rows of all
    -inf NaN, whose gradient safe asks to be 0 (the caller computes it in jax.numpy)."""
    from .planner_backward import plan_backward_from_input

    if isinstance(layout, Rows):
        fused = plan_backward_from_input(from_input_problem(dtype, op, safe, layout), device)
        if fused is not None:
            return fused
    if op == "log_softmax" and safe:
        return None
    return _forward_then_gradient(dtype, op, safe, layout, device)


def kernels_take_from_input(vendor: str, shape: tuple[int, ...], dtype, axis: int, op: str, safe: bool) -> bool:
    """Whether plan_from_input has kernels for this call on ``vendor``'s reference device."""
    from . import _probe

    layout = describe(tuple(shape), contiguous_strides(tuple(shape)), axis % len(shape))
    return plan_from_input(storage_name(dtype), op, safe, layout, _probe.runtime(vendor).profile(0)) is not None


def _forward_then_gradient(dtype: str, op: str, safe: bool, layout, device: DeviceProfile) -> Plan:
    from ._backward import _problem
    from .api import problem_for
    from .planner import plan
    from .planner_backward import plan_backward

    forward = plan(problem_for(dtype, op, safe, layout, layout, 0, 0), device)
    backward = plan_backward(_problem(dtype, op, layout, layout, layout, (0, 0, 0)), device)
    # y lives in dx; each plan's scratch under a name of its own, so that the two cannot share bytes
    forward_names = {"y": "dx", **{name: f"forward_{name}" for name, _ in forward.scratch}}
    backward_names = {"y": "dx", **{name: f"backward_{name}" for name, _ in backward.scratch}}
    launches = (*_renamed(forward.launches, forward_names), *_renamed(backward.launches, backward_names))
    scratch = (*((forward_names[n], b) for n, b in forward.scratch),
               *((backward_names[n], b) for n, b in backward.scratch))
    zeroed = any(p.scratch and p.scratch_zeroed for p in (forward, backward))
    return Plan(backward.tier, launches, scratch, notes={"forward": forward, "backward": backward},
                scratch_zeroed=zeroed)


def _renamed(launches, names: dict[str, str]) -> tuple[Launch, ...]:
    return tuple(replace(s, args=tuple((k, names.get(v, v)) if k == PTR else (k, v) for k, v in s.args))
                 for s in launches)


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


_warned: set[str] = set()


def warn_once(why: str) -> None:
    """One warning per reason that a jitted call on a GPU takes the host callback instead."""
    if why not in _warned:
        _warned.add(why)
        warnings.warn(f"portable_softmax: inside jax.jit on a GPU the call is a host callback (a round trip "
                      f"through host memory): {why}", RuntimeWarning, stacklevel=3)

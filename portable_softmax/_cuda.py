"""NVIDIA runtime adapter, through cupy.

Loads the AOT fatbin of a dtype (``kernels/softmax_<tag>.fatbin``) as a module;
when it holds no code for the device, compiles the packaged source with NVRTC
for the device's arch (cupy caches the binary on disk). Launches go through
cuLaunchKernel on the caller's stream with the plan's packed arguments (launches whose blocks
wait on each other through cuLaunchCooperativeKernel where PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1
asks for it); prepared repeat-call launchers call them from C (``_fastlaunch``) where that module
is built.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from . import _launch
from . import _variants as V
from ._launch import KERNEL_DIR, inline_source, source_dir
from ._runtime import DriverRuntime
from .planner import DeviceProfile, Launch, Plan

_STATIC_SHARED = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
#: a block's static and dynamic shared memory together, without opting in
_DEFAULT_SHARED = 48 * 1024
#: the CUDA driver library, where cuLaunchKernel lives (cupy has it loaded already)
_DRIVER_LIBRARIES = ("nvcuda.dll",) if os.name == "nt" else ("libcuda.so.1", "libcuda.so")


def cuda_launch_entry_point(symbol: str = "cuLaunchKernel") -> int | None:
    """The address of the driver's cuLaunchKernel (or ``symbol``: cuLaunchCooperativeKernel), for
    the compiled launcher; None if not found."""
    for name in _DRIVER_LIBRARIES:
        try:
            return ctypes.cast(getattr(ctypes.CDLL(name), symbol), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


class CudaRuntime(DriverRuntime):
    vendor = "cuda"

    def __init__(self):
        import cupy
        import cupyx

        self.cupyx = cupyx
        if cupy.cuda.runtime.is_hip:
            raise RuntimeError("the installed cupy is built for ROCm, not CUDA")
        self.cupy = cupy
        self.driver = cupy.cuda.driver
        self.device_count = cupy.cuda.runtime.getDeviceCount()
        self._profiles: dict[int, DeviceProfile] = {}
        self._modules: dict[tuple[int, str], Any] = {}
        self._functions: dict[tuple[int, str], int] = {}
        self._occupancy: dict[tuple[int, int, int], int] = {}
        self._dynamic_shared_limit: dict[int, int] = {}
        self._loading = threading.RLock()  # module loads and function look-ups of threads' first calls
        self.sources: dict[tuple[int, str], str] = {}  # (device, dtype) -> "aot:PATH" | "jit:nvrtc"
        self._entry_point: int | None = None
        self._cooperative_entry_point: int | None = None
        # cupy 9 and newer; without it, launches whose blocks wait on each other launch plainly
        self._launch_cooperative = getattr(self.driver, "launchCooperativeKernel", None)

    # ---- probe ---------------------------------------------------------------------
    def profile(self, device: int) -> DeviceProfile:
        prof = self._profiles.get(device)
        if prof is None:
            p = self.cupy.cuda.runtime.getDeviceProperties(device)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            prof = DeviceProfile(
                name=name,
                vendor="nvidia",
                arch=f"sm_{p['major']}{p['minor']}",
                warp_size=int(p["warpSize"]),
                multiprocessors=int(p["multiProcessorCount"]),
                max_threads_per_block=int(p["maxThreadsPerBlock"]),
                shared_mem_per_block=int(p["sharedMemPerBlock"]),
                shared_mem_per_block_optin=int(p.get("sharedMemPerBlockOptin", p["sharedMemPerBlock"])),
                max_grid_x=int(p["maxGridSize"][0]),
                max_threads_per_multiprocessor=int(p["maxThreadsPerMultiProcessor"]),
                shared_mem_per_multiprocessor=int(p["sharedMemPerMultiprocessor"]),
            )
            self._profiles[device] = prof
        return prof

    def versions(self) -> dict[str, str]:
        rt = self.cupy.cuda.runtime
        return {
            "runtime_package": f"cupy {self.cupy.__version__}",
            "driver_version": str(rt.driverGetVersion()),
            "runtime_version": str(rt.runtimeGetVersion()),
        }

    # ---- modules ---------------------------------------------------------------------
    def _module(self, device: int, dtype: str):
        key = (device, dtype)
        mod = self._modules.get(key)
        if mod is not None:
            return mod
        with self._loading:  # one load: a second module would replace the first, unloading it under
            mod = self._modules.get(key)  # the function handles taken from it
            return mod if mod is not None else self._load_module(device, dtype)

    def _load_module(self, device: int, dtype: str):
        key = (device, dtype)
        mod = None
        tag = V.DTYPES[dtype][0]
        fatbin = KERNEL_DIR / f"softmax_{tag}.fatbin"
        with self.cupy.cuda.Device(device):
            if fatbin.is_file() and not os.environ.get("PORTABLE_SOFTMAX_FORCE_JIT"):
                try:
                    mod = self.cupy.RawModule(path=str(fatbin))
                    mod.get_function(V.strided_name(dtype, "softmax"))  # loads; fails without code for the arch
                    self.sources[key] = f"aot:{fatbin}"
                except self.cupy.cuda.driver.CUDADriverError:
                    mod = None
            if mod is None:
                code = inline_source(source_dir("cuda") / V.source_file_name(dtype))
                mod = self.cupy.RawModule(code=code, options=("-std=c++17",), backend="nvrtc")
                mod.get_function(V.strided_name(dtype, "softmax"))  # compile now, errors here
                self.sources[key] = "jit:nvrtc"
        self._modules[key] = mod
        return mod

    def function(self, device: int, dtype: str, name: str, shared_mem: int = 0) -> int:
        key = (device, name)
        ptr = self._functions.get(key)
        if ptr is None or shared_mem > self._dynamic_shared_limit[ptr]:
            with self._loading:  # threads' first calls: each handle and limit set once, whole
                ptr = self._functions.get(key)
                if ptr is None:
                    kernel = self._module(device, dtype).get_function(name)  # a RawKernel around a driver Function
                    ptr = kernel.kernel.ptr
                    # Without opting in, static and dynamic shared memory share 48 KiB.
                    static = self.driver.funcGetAttribute(_STATIC_SHARED, ptr)
                    self._dynamic_shared_limit[ptr] = _DEFAULT_SHARED - static
                    self._functions[key] = ptr  # last: whoever finds the handle finds its limit
                if shared_mem > self._dynamic_shared_limit[ptr]:
                    self.driver.funcSetAttribute(ptr, _MAX_DYNAMIC_SHARED, shared_mem)
                    self._dynamic_shared_limit[ptr] = shared_mem  # raised once, not on every launch
        return ptr

    def kernel_source(self, device: int, dtype: str) -> str:
        self._module(device, dtype)
        return self.sources[(device, dtype)]

    # ---- launch (the shared parts: _runtime.DriverRuntime) ----------------------------------------
    LAUNCH_SYMBOL = "cuLaunchKernel"
    COOPERATIVE_SYMBOL = "cuLaunchCooperativeKernel"
    MISSING_LAUNCH = "cuLaunchKernel not found in the CUDA driver library"

    def _steps(self, plan: Plan, dtype: str, device: int) -> list[tuple[int, int, Launch]]:
        """(function, grid, step) per launch, each function's dynamic shared memory raised as it needs."""
        steps = []
        for step in plan.launches:
            step = self.resident_step(step, dtype, device)
            fn = self.function(device, dtype, step.kernel, step.shared_mem)
            steps.append((fn, self.resident_grid(fn, step, device), step))
        return steps

    def _launch_one(self, fn: int, grid: int, block: int, shared_mem: int, stream: int, params: int,
                    cooperative: bool) -> None:
        if cooperative and _launch.COOPERATIVE_LAUNCHES and self._launch_cooperative is not None:
            self._launch_cooperative(fn, grid, 1, 1, block, 1, 1, shared_mem, stream, params)
        else:
            self.driver.launchKernel(fn, grid, 1, 1, block, 1, 1, shared_mem, stream, params, 0)

    def _switch_to(self, device: int):
        return self.cupy.cuda.Device(device)  # restores the previous device on exit

    def bind(self, device: int) -> None:
        # A thread may report a device without holding its context (torch's autograd thread for
        # device 0 skips cudaSetDevice as a no-op): cudaSetDevice binds the primary context.
        if self.driver.ctxGetCurrent() == 0 and self.current_device() == device:
            self.cupy.cuda.runtime.setDevice(device)

    def _find_entry_point(self, symbol: str) -> int | None:
        return cuda_launch_entry_point(symbol)

    def _has_cooperative_call(self) -> bool:
        return self._launch_cooperative is not None

    def _missing_cooperative(self) -> str:
        return f"cupy {self.cupy.__version__} has no driver.launchCooperativeKernel"

    def _describe_error(self, code: int) -> str:
        return str(self.driver.CUDADriverError(code))  # "CUDA_ERROR_...: text", from the driver

    def _handle(self, device: int, dtype: str, kernel: str, shared_mem: int) -> int:
        return self.function(device, dtype, kernel, shared_mem)

    def _blocks_per_multiprocessor(self, fn: int, kernel: str, block: int, shared_mem: int, device: int) -> int:
        key = (fn, block, shared_mem)
        per_sm = self._occupancy.get(key)
        if per_sm is None:
            per_sm = self.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn, block, shared_mem)
            self._occupancy[key] = per_sm
        return per_sm

    def run_host(self, x: np.ndarray, plan: Plan, dtype: str, device: int) -> np.ndarray:
        """A C-contiguous host array through pinned buffers and async copies on the current stream."""
        cupy = self.cupy
        with cupy.cuda.Device(device):
            stream = cupy.cuda.get_current_stream()
            pinned = self.cupyx.empty_pinned(x.nbytes, np.uint8)
            pinned[...] = x.reshape(-1).view(np.uint8)
            x_dev = cupy.empty(x.nbytes, np.uint8)
            y_dev = cupy.empty(x.nbytes, np.uint8)
            x_dev.set(pinned, stream=stream)
            buffers = {"x": x_dev.data.ptr, "y": y_dev.data.ptr}
            scratch = None
            if plan.scratch:  # one zero fill for every buffer
                scratch_bytes, offsets = plan.scratch_layout()
                scratch = cupy.zeros(scratch_bytes, np.uint8)
                buffers.update((name, scratch.data.ptr + offset) for name, offset in offsets.items())
            self.launch(plan, dtype, buffers, stream.ptr, device)
            y_dev.get(stream=stream, out=pinned)
            stream.synchronize()
            return pinned.view(x.dtype).reshape(x.shape).copy()

    def synchronize_stream(self, device: int, stream: int) -> None:
        """Wait for the work queued on ``stream`` of ``device`` (a per-thread handle: this thread's)."""
        with self.cupy.cuda.Device(device):
            self.cupy.cuda.runtime.streamSynchronize(stream)

    def current_device(self) -> int:
        return self.cupy.cuda.runtime.getDevice()

    def cache_dir(self) -> str:
        return os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))

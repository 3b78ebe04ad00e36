"""AMD runtime adapter, through hip-python (and hipRTC through ctypes).

Loads the AOT code-object bundle of a dtype (``kernels/softmax_<tag>.hsaco``)
with hipModuleLoadData when it holds code for the device's target; otherwise
compiles the packaged ``src_hip/`` source with hipRTC for exactly that target
and caches the code object on disk. Launches go through hipModuleLaunchKernel
on the caller's stream with the plan's packed arguments (launches whose blocks wait
on each other through hipModuleLaunchCooperativeKernel where the runtime has it and
PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1 asks for it; ROCm 5.2's runtime has not);
prepared repeat-call launchers call them from C (``_fastlaunch``) where that module
is built.

Everything that does not need a GPU (error mapping, target matching, bundle
parsing, the device profile, hipRTC compilation and its cache) is a plain
function or class here, tested on machines without one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import struct
import tempfile
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import _launch
from . import _variants as V
from ._launch import KERNEL_DIR, inline_source, source_dir
from ._runtime import DriverRuntime
from .planner import DeviceProfile, Launch, Plan

# hipError_t values the adapter treats specially (hip/hip_runtime_api.h)
HIP_SUCCESS = 0
HIP_ERROR_NO_DEVICE = 100
HIP_ERROR_INSUFFICIENT_DRIVER = 35
#: load failures that mean "this image has no code for the device": fall back to hipRTC
HIP_ERRORS_NO_CODE_FOR_DEVICE = {
    200: "hipErrorInvalidImage",
    209: "hipErrorNoBinaryForGpu",
    218: "hipErrorInvalidKernelFile",
}
HIP_MEMCPY_HOST_TO_DEVICE = 1
HIP_MEMCPY_DEVICE_TO_HOST = 2
HIP_STREAM_NON_BLOCKING = 1

#: HIP refuses launches whose gridDim.x * blockDim.x reaches 2**32 (hipModuleLaunchKernel)
HIP_MAX_WORK_ITEMS_X = 2**32 - 1

FORCE_JIT_ENV = "PORTABLE_SOFTMAX_FORCE_JIT"
CACHE_DIR_ENV = "PORTABLE_SOFTMAX_CACHE_DIR"
HIPRTC_LIBRARY_ENV = "PORTABLE_SOFTMAX_HIPRTC_LIBRARY"


# ---- errors -----------------------------------------------------------------------------------
class HipError(RuntimeError):
    """A HIP runtime call failed; names the call, the hipError_t and its text."""

    def __init__(self, call: str, code: int, name: str, detail: str = ""):
        self.call, self.code, self.name = call, code, name
        text = f"{call} failed: {name} ({code})"
        super().__init__(f"{text}: {detail}" if detail and detail != name else text)


class HipRtcError(RuntimeError):
    """hipRTC could not be loaded or could not compile; carries the compiler log."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(f"{message}\n{log}" if log else message)


def error_name(err) -> str:
    """'hipErrorNoBinaryForGpu' for hip-python's hipError_t enum member, or for a plain int."""
    name = getattr(err, "name", None)
    if name:
        return str(name)
    return HIP_ERRORS_NO_CODE_FOR_DEVICE.get(int(err), f"hipError_t {int(err)}")


def hip_check(call: str, result, describe=None):
    """Unwrap a hip-python result tuple ``(hipError_t, *values)``.

    Returns None, the one value, or the tuple of values; raises HipError naming
    ``call`` when the status is not hipSuccess. ``describe(err)`` may supply
    the runtime's own text for the error (hipGetErrorString).
    """
    if not isinstance(result, tuple):
        result = (result,)
    err, values = result[0], result[1:]
    code = int(err)
    if code != HIP_SUCCESS:
        detail = ""
        if describe is not None:
            try:
                detail = describe(err)
            except Exception:  # the message is a courtesy; the code is what counts
                detail = ""
        raise HipError(call, code, error_name(err), detail)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def hip_source_name(dtype: str) -> str:
    """src_hip/ name of a dtype's entry points (tools/hipify_sources.py turns .cu into .hip)."""
    return f"softmax_{V.DTYPES[dtype][0]}.hip"


def code_object_name(dtype: str) -> str:
    """The AOT bundle CMake installs into kernels/ for a dtype."""
    return f"softmax_{V.DTYPES[dtype][0]}.hsaco"


# ---- targets and code-object bundles --------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """An AMD GPU target ID: processor plus the features it fixes (gfx90a:sramecc+:xnack-)."""

    processor: str
    features: tuple[tuple[str, bool], ...] = ()

    @classmethod
    def parse(cls, target_id: str) -> Target:
        parts = target_id.strip().split(":")
        features = []
        for part in parts[1:]:
            if part and part[-1] in "+-":
                features.append((part[:-1], part[-1] == "+"))
        return cls(parts[0], tuple(sorted(features)))

    def __str__(self) -> str:
        return ":".join([self.processor] + [f"{name}{'+' if on else '-'}" for name, on in self.features])

    def runs_on(self, device: Target) -> bool:
        """Whether code built for this target loads on ``device``: same processor, and every
        feature this code fixes set the same way on the device (an unfixed feature means 'any')."""
        if self.processor != device.processor:
            return False
        device_features = dict(device.features)
        return all(device_features.get(name, on) == on for name, on in self.features)


_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"


def bundle_code_objects(image: bytes) -> dict[str, bytes] | None:
    """The AMD GPU code objects of a clang offload bundle (uncompressed, as hipcc and clang write
    it), by target ID ('gfx90a', 'gfx90a:xnack+').

    None when ``image`` is no such bundle (a bare code object, or a compressed bundle), in which
    case only loading it can tell what it holds.
    """
    if not image.startswith(_BUNDLE_MAGIC):
        return None
    (count,) = struct.unpack_from("<Q", image, len(_BUNDLE_MAGIC))
    pos = len(_BUNDLE_MAGIC) + 8
    objects = {}
    for _ in range(count):
        offset, size, id_len = struct.unpack_from("<QQQ", image, pos)
        pos += 24
        bundle_id = image[pos : pos + id_len].decode("ascii", "replace")
        pos += id_len
        # "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+": kind-triple, then the target ID; the host
        # entry ("host-x86_64-unknown-linux") carries no GPU code.
        kind_triple, _, target_id = bundle_id.partition("--")
        if "amdgcn" in kind_triple and target_id:
            objects[target_id] = image[offset : offset + size]
    return objects


def bundle_targets(image: bytes) -> list[Target] | None:
    """The targets a bundle holds code for; None when ``image`` is no readable bundle."""
    objects = bundle_code_objects(image)
    return None if objects is None else [Target.parse(t) for t in objects]


def bundle_runs_on(image: bytes, device: Target) -> bool | None:
    """Whether the bundle holds code for ``device``; None when the image cannot be read as a bundle."""
    targets = bundle_targets(image)
    if targets is None:
        return None
    return any(t.runs_on(device) for t in targets)


# ---- the device profile -------------------------------------------------------------------------
def _text(value) -> str:
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def profile_from_properties(props) -> DeviceProfile:
    """The planner's view of a device from hipDeviceProp_t (hip-python's object or anything with
    its attribute names).

    Shared memory: AMD GPUs need no opt-in for dynamic LDS beyond 48 KiB; a workgroup may use up
    to sharedMemPerBlock (64 KiB on CDNA and RDNA), so that is also the 'opt-in' limit. Grid: HIP
    launches at most 2**32 - 1 work-items along x, whatever maxGridSize says.
    """
    arch = Target.parse(_text(props.gcnArchName)).processor
    threads = int(props.maxThreadsPerBlock)
    shared = int(props.sharedMemPerBlock)
    max_grid = min(int(list(props.maxGridSize)[0]), HIP_MAX_WORK_ITEMS_X // max(1, threads))
    # Older HIP reports 0 for some per-CU limits; a compute unit holds at least one full
    # workgroup's threads twice over and its LDS (64 KiB on CDNA / RDNA) is sharedMemPerBlock.
    threads_per_cu = int(getattr(props, "maxThreadsPerMultiProcessor", 0) or 2 * threads)
    shared_per_cu = int(getattr(props, "maxSharedMemoryPerMultiProcessor", 0) or shared)
    return DeviceProfile(
        name=_text(props.name),
        vendor="amd",
        arch=arch,
        warp_size=int(props.warpSize),
        multiprocessors=int(props.multiProcessorCount),
        max_threads_per_block=threads,
        shared_mem_per_block=shared,
        shared_mem_per_block_optin=shared,
        max_grid_x=max_grid,
        max_threads_per_multiprocessor=threads_per_cu,
        shared_mem_per_multiprocessor=shared_per_cu,
    )


# ---- hipRTC -------------------------------------------------------------------------------------
def hiprtc_library_candidates() -> list[str]:
    """Where hipRTC may live, most specific first. ROCm 6+ ships libhiprtc.so; ROCm 5.2 and older
    (Debian 12's packages) keep hipRTC inside libamdhip64."""
    names = []
    if os.environ.get(HIPRTC_LIBRARY_ENV):
        names.append(os.environ[HIPRTC_LIBRARY_ENV])
    try:  # hip-python's own finder also knows pip-installed ROCm (rocm-sdk wheels)
        from rocm.bindings.util.paths import get_library_path

        names.append(os.fsdecode(get_library_path("hiprtc")))
    except Exception:
        pass
    for root in filter(None, (os.environ.get("ROCM_PATH"), os.environ.get("HIP_PATH"), "/opt/rocm")):
        names.append(str(Path(root) / "lib" / "libhiprtc.so"))
    names += ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"]
    found = ctypes.util.find_library("hiprtc")
    if found:
        names.append(found)
    names += ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"]
    return list(dict.fromkeys(names))


def hip_runtime_library_candidates() -> list[str]:
    """Names under which the HIP runtime hip-python drives may be loaded: its own finder's path
    first, then the sonames of ROCm 7, 6 and 5."""
    names = []
    try:
        from rocm.bindings.util.paths import get_library_path

        names.append(os.fsdecode(get_library_path("amdhip64")))
    except Exception:  # older hip-python opens the library by soname
        pass
    names += ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"]
    return list(dict.fromkeys(names))


def hip_launch_entry_point(names: list[str] | None = None, symbol: str = "hipModuleLaunchKernel") -> int | None:
    """The address of hipModuleLaunchKernel (or ``symbol``: hipModuleLaunchCooperativeKernel) in
    the HIP runtime this process has already loaded, for the compiled launcher; None if none is
    loaded or it lacks the symbol.

    Only an already-loaded library will do (RTLD_NOLOAD): a second copy of the runtime would not
    know the modules and streams that hip-python's copy created.
    """
    mode = getattr(os, "RTLD_NOLOAD", 0)
    for name in hip_runtime_library_candidates() if names is None else names:
        try:
            return ctypes.cast(getattr(ctypes.CDLL(name, mode=mode), symbol), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def hiprtc_options(target: str) -> list[str]:
    """hipRTC options for one target ID (features included, so the code loads on that device)."""
    return [f"--gpu-architecture={target}", "-O3", "-std=c++17"]


class HipRtc:
    """The five hipRTC calls the adapter needs, through ctypes.

    ctypes rather than hip-python's hiprtc module: the latter opens libhiprtc.so only, which ROCm
    5.x does not have, and it needs no GPU or driver, so it is also what the CPU-only tests run.
    """

    def __init__(self, library: str | None = None):
        errors = []
        for name in [library] if library else hiprtc_library_candidates():
            try:
                lib = ctypes.CDLL(name)
                lib.hiprtcCompileProgram  # noqa: B018 - the symbol decides, not the file name
            except (OSError, AttributeError) as e:
                errors.append(f"{name}: {e}")
                continue
            self.lib, self.path = lib, name
            break
        else:
            raise HipRtcError("hipRTC was not found; set " + HIPRTC_LIBRARY_ENV + ". Tried:\n  " + "\n  ".join(errors))
        lib = self.lib
        lib.hiprtcGetErrorString.restype = ctypes.c_char_p
        lib.hiprtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.hiprtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.hiprtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.hiprtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.hiprtcGetCodeSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.hiprtcGetCode.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.hiprtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def _check(self, call: str, status: int, log: str = "") -> None:
        if status != 0:
            text = (self.lib.hiprtcGetErrorString(status) or b"").decode(errors="replace")
            raise HipRtcError(f"{call} failed: {text} ({status})", log)

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check("hiprtcVersion", self.lib.hiprtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return major.value, minor.value

    def compile(self, source: str, name: str, options: list[str]) -> bytes:
        """The code object (ELF) of ``source``; HipRtcError with the compiler's log on failure."""
        prog = ctypes.c_void_p()
        self._check("hiprtcCreateProgram",
                    self.lib.hiprtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None))
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = self.lib.hiprtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.lib.hiprtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            self.lib.hiprtcGetProgramLog(prog, log)
            self._check(f"hiprtcCompileProgram({name}, {' '.join(options)})", status,
                        log.value.decode(errors="replace"))
            self._check("hiprtcGetCodeSize", self.lib.hiprtcGetCodeSize(prog, ctypes.byref(size)))
            code = ctypes.create_string_buffer(size.value)
            self._check("hiprtcGetCode", self.lib.hiprtcGetCode(prog, code))
            return code.raw
        finally:
            self.lib.hiprtcDestroyProgram(ctypes.byref(prog))


def default_cache_dir() -> Path:
    base = os.environ.get(CACHE_DIR_ENV)
    if base:
        return Path(base) / "hiprtc"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "portable_softmax" / "hiprtc"


class HipRtcCache:
    """Code objects compiled by hipRTC, on disk, keyed by what decides their bytes."""

    def __init__(self, directory: Path | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()

    @staticmethod
    def key(source: str, target: str, compiler_version: str, options: list[str]) -> str:
        h = hashlib.sha256()
        for part in (source, target, compiler_version, "\0".join(options)):
            h.update(part.encode())
            h.update(b"\0\1")
        return h.hexdigest()

    def path(self, key: str, target: str) -> Path:
        return self.directory / f"{Target.parse(target).processor}-{key[:32]}.co"

    def get_or_compile(self, source: str, name: str, target: str, hiprtc: HipRtc, compiler_version: str) -> bytes:
        options = hiprtc_options(target)
        path = self.path(self.key(source, target, compiler_version, options), target)
        if path.is_file():
            return path.read_bytes()
        code = hiprtc.compile(source, name, options)
        try:  # write-then-rename: a concurrent reader sees the old state or the whole file
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(code)
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache costs a recompile next time, not a failure now
        return code


# ---- the runtime ----------------------------------------------------------------------------------
class HipRuntime(DriverRuntime):
    vendor = "hip"

    def __init__(self):
        from hip import hip  # hip-python; its library loads lazily, so errors surface below

        self.hip = hip
        err, count = hip.hipGetDeviceCount()
        if int(err) in (HIP_ERROR_NO_DEVICE, HIP_ERROR_INSUFFICIENT_DRIVER):
            count = 0  # a ROCm runtime without a usable GPU: the probe says so and moves on
        else:
            hip_check("hipGetDeviceCount", (err,), self._describe)
        self.device_count = int(count)
        self._profiles: dict[int, DeviceProfile] = {}
        self._targets: dict[int, str] = {}
        self._modules: dict[tuple[int, str], Any] = {}
        self._images: dict[tuple[int, str], bytes] = {}  # kept alive as long as their module
        self._functions: dict[tuple[int, str], Any] = {}
        self._loading = threading.RLock()  # module loads and function look-ups of threads' first calls
        self._streams: dict[int, Any] = {}
        self._occupancy: dict[tuple[int, str, int, int], int] = {}
        self._hiprtc: HipRtc | None = None
        self.jit_cache = HipRtcCache()
        self.sources: dict[tuple[int, str], str] = {}  # (device, dtype) -> "aot:PATH" | "jit:hiprtc ..."
        self._entry_point: int | None = None
        self._cooperative_entry_point: int | None = None
        self._launch_cooperative: Any = None  # hip-python's hipModuleLaunchCooperativeKernel, or False

    def _describe(self, err) -> str:
        result = self.hip.hipGetErrorString(err)
        return _text(result[-1] if isinstance(result, tuple) else result)

    def _call(self, name: str, *args):
        return hip_check(name, getattr(self.hip, name)(*args), self._describe)

    # ---- probe --------------------------------------------------------------------------------
    def profile(self, device: int) -> DeviceProfile:
        prof = self._profiles.get(device)
        if prof is None:
            props = self._call("hipGetDeviceProperties", device)
            prof = profile_from_properties(props)
            self._targets[device] = _text(props.gcnArchName)
            self._profiles[device] = prof
        return prof

    def target(self, device: int) -> str:
        """The device's full target ID (gfx90a:sramecc+:xnack-), what hipRTC compiles for."""
        self.profile(device)
        return self._targets[device]

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        package = "hip-python"
        try:
            package = f"hip-python {version('hip-python')}"
        except PackageNotFoundError:
            pass
        return {
            "runtime_package": package,
            "driver_version": str(self._call("hipDriverGetVersion")),
            "runtime_version": str(self._call("hipRuntimeGetVersion")),
        }

    def synchronize_stream(self, device: int, stream: int) -> None:
        """Wait for the work queued on ``stream`` of ``device`` (a per-thread handle: this thread's)."""
        with _on_device(self, device):
            self._call("hipStreamSynchronize", stream)

    def current_device(self) -> int:
        return int(self._call("hipGetDevice"))

    def cache_dir(self) -> str:
        return str(self.jit_cache.directory)

    # ---- modules ------------------------------------------------------------------------------
    def hiprtc(self) -> HipRtc:
        if self._hiprtc is None:
            self._hiprtc = HipRtc()
        return self._hiprtc

    def _jit_image(self, device: int, dtype: str) -> tuple[bytes, str]:
        rtc = self.hiprtc()
        name = hip_source_name(dtype)
        source = inline_source(source_dir("hip") / name)
        compiler = f"hiprtc {'.'.join(map(str, rtc.version()))} hip {self._call('hipRuntimeGetVersion')}"
        target = self.target(device)
        code = self.jit_cache.get_or_compile(source, name, target, rtc, compiler)
        return code, f"jit:hiprtc {target} ({self.jit_cache.directory})"

    def _module(self, device: int, dtype: str):
        key = (device, dtype)
        mod = self._modules.get(key)
        if mod is not None:
            return mod
        with self._loading:  # one load a (device, dtype), however many threads' first calls ask
            mod = self._modules.get(key)
            return mod if mod is not None else self._load_module(device, dtype)

    def _load_module(self, device: int, dtype: str):
        key, mod = (device, dtype), None
        with _on_device(self, device):
            bundle = KERNEL_DIR / code_object_name(dtype)
            image = None
            if bundle.is_file() and not os.environ.get(FORCE_JIT_ENV):
                image = bundle.read_bytes()
                if bundle_runs_on(image, Target.parse(self.target(device))) is False:
                    image = None  # no code for this target: compile it instead
            if image is not None:
                try:
                    mod = self._call("hipModuleLoadData", image)
                    self.sources[key] = f"aot:{bundle}"
                except HipError as e:
                    if e.code not in HIP_ERRORS_NO_CODE_FOR_DEVICE:
                        raise
                    mod = None
            if mod is None:
                image, self.sources[key] = self._jit_image(device, dtype)
                mod = self._call("hipModuleLoadData", image)
        self._images[key] = image
        self._modules[key] = mod
        return mod

    def function(self, device: int, dtype: str, name: str, shared_mem: int = 0):
        """The kernel's handle; ``shared_mem`` needs no opt-in on AMD (plans stay within sharedMemPerBlock)."""
        key = (device, name)
        fn = self._functions.get(key)
        if fn is None:
            with self._loading:
                fn = self._functions.get(key)
                if fn is None:
                    fn = self._call("hipModuleGetFunction", self._module(device, dtype), name.encode())
                    self._functions[key] = fn
        return fn

    def kernel_source(self, device: int, dtype: str) -> str:
        self._module(device, dtype)
        return self.sources[(device, dtype)]

    # ---- launch (the shared parts: _runtime.DriverRuntime) ----------------------------------------
    LAUNCH_SYMBOL = "hipModuleLaunchKernel"
    COOPERATIVE_SYMBOL = "hipModuleLaunchCooperativeKernel"
    MISSING_LAUNCH = "hipModuleLaunchKernel not found in a loaded HIP runtime library"

    def _steps(self, plan: Plan, dtype: str, device: int) -> list[tuple[Any, int, Launch]]:
        """(function, grid, step) per launch. No shared-memory opt-in on AMD: the profile already
        caps plans at sharedMemPerBlock."""
        steps = []
        for step in plan.launches:
            step = self.resident_step(step, dtype, device)
            fn = self.function(device, dtype, step.kernel)
            grid = self.resident_grid(fn, step, device)
            steps.append((fn, grid, step))
        return steps

    def _launch_one(self, fn, grid: int, block: int, shared_mem: int, stream: int, params: int,
                    cooperative: bool) -> None:
        if cooperative and self._cooperative_launcher() is not None:
            hip_check("hipModuleLaunchCooperativeKernel",
                      self._launch_cooperative(fn, grid, 1, 1, block, 1, 1, shared_mem, stream, params),
                      self._describe)
        else:
            self._call("hipModuleLaunchKernel", fn, grid, 1, 1, block, 1, 1, shared_mem, stream, params, None)

    def _cooperative_launcher(self):
        """hip-python's hipModuleLaunchCooperativeKernel where the loaded runtime has it and
        cooperative launches are asked for, else None."""
        if not _launch.COOPERATIVE_LAUNCHES:
            return None
        if self._launch_cooperative is None:
            found = getattr(self.hip, "hipModuleLaunchCooperativeKernel", None)
            if found is not None and isinstance(self.hip, types.ModuleType) and not self.cooperative_entry_point():
                found = None  # hip-python binds it; this ROCm's runtime lacks it (5.2)
            self._launch_cooperative = found or False
        return self._launch_cooperative or None

    def _switch_to(self, device: int):
        return _on_device(self, device)

    def _find_entry_point(self, symbol: str) -> int | None:
        """``symbol``'s address in the library hip-python loaded; None for a stand-in for hip-python,
        which has no library."""
        return hip_launch_entry_point(symbol=symbol) if isinstance(self.hip, types.ModuleType) else None

    def _has_cooperative_call(self) -> bool:
        return True  # where the runtime lacks the entry point, cooperative_entry_point finds none

    def _cooperative_available(self) -> bool:
        return self._cooperative_launcher() is not None

    def _missing_cooperative(self) -> str:
        return "hipModuleLaunchCooperativeKernel is not in this HIP runtime"

    def _describe_error(self, code: int) -> str:
        try:
            err = self.hip.hipError_t(code)
            return f"{error_name(err)}: {self._describe(err)}"
        except Exception:  # a code hip-python does not know
            return error_name(code)

    def _handle(self, device: int, dtype: str, kernel: str, shared_mem: int):
        return self.function(device, dtype, kernel)

    def _blocks_per_multiprocessor(self, fn, kernel: str, block: int, shared_mem: int, device: int) -> int:
        key = (device, kernel, block, shared_mem)
        per_cu = self._occupancy.get(key)
        if per_cu is None:
            per_cu = int(self._call("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", fn, block, shared_mem))
            self._occupancy[key] = per_cu
        return per_cu

    def _stream(self, device: int):
        s = self._streams.get(device)
        if s is None:
            with _on_device(self, device):
                s = self._call("hipStreamCreateWithFlags", HIP_STREAM_NON_BLOCKING)
            self._streams[device] = s
        return s

    def run_host(self, x: np.ndarray, plan: Plan, dtype: str, device: int) -> np.ndarray:
        """A C-contiguous host array through pinned buffers and async copies on the adapter's stream."""
        nbytes = x.nbytes
        owned = []  # (free call, pointer), released in reverse order
        with _on_device(self, device):
            stream = self._stream(device)
            try:
                pinned = self._call("hipHostMalloc", max(1, nbytes), 0)
                owned.append(("hipHostFree", pinned))
                host = np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(int(pinned)))[:nbytes]
                host[...] = x.reshape(-1).view(np.uint8)
                scratch_bytes, offsets = plan.scratch_layout()
                sizes = {"x": nbytes, "y": nbytes} | ({"scratch": scratch_bytes} if scratch_bytes else {})
                buffers = {}
                for name, size in sizes.items():
                    ptr = self._call("hipMalloc", max(1, size))
                    owned.append(("hipFree", ptr))
                    buffers[name] = int(ptr)
                if scratch_bytes:  # one zero fill for every scratch buffer (counters, partial sums)
                    self._call("hipMemsetAsync", buffers["scratch"], 0, scratch_bytes, stream)
                    buffers.update((name, buffers["scratch"] + offset) for name, offset in offsets.items())
                self._call("hipMemcpyAsync", buffers["x"], int(pinned), nbytes, HIP_MEMCPY_HOST_TO_DEVICE, stream)
                self.launch(plan, dtype, buffers, int(stream), device)
                self._call("hipMemcpyAsync", int(pinned), buffers["y"], nbytes, HIP_MEMCPY_DEVICE_TO_HOST, stream)
                self._call("hipStreamSynchronize", stream)
                return host.view(x.dtype).reshape(x.shape).copy()
            finally:
                for free, ptr in reversed(owned):
                    self._call(free, ptr)


class _on_device:
    """Makes ``device`` current for a block and restores the previous device (HIP's is per thread)."""

    def __init__(self, rt: HipRuntime, device: int):
        self.rt, self.device, self.previous = rt, device, None

    def __enter__(self):
        if self.rt.device_count == 1:
            return  # one device: it is current, and the launch path skips a hipGetDevice
        current = self.rt.current_device()
        if current != self.device:
            self.previous = current
            self.rt._call("hipSetDevice", self.device)

    def __exit__(self, *exc):
        if self.previous is not None:
            self.rt._call("hipSetDevice", self.previous)

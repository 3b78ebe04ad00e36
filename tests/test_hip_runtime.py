"""The AMD runtime adapter without an AMD GPU: what each piece decides, checked for real.

Error mapping, target matching, bundle reading, the device profile and the hipRTC cache are plain
Python; hipRTC itself compiles on the CPU wherever a ROCm runtime library is installed (Debian's
libamdhip64 carries it), and hip-python's no-device answer is what the probe reports here. The
launch sequence runs against a stand-in for hip-python that moves real bytes, so the wiring of
buffers, streams and code objects is checked; the kernels themselves only run on an AMD GPU.
"""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from portable_softmax import _hip, _launch, _probe
from portable_softmax import _variants as V
from portable_softmax.planner import DeviceProfile, RowProblem, plan
from portable_softmax.planner_backward import GradRowProblem, plan_backward


# ---- errors --------------------------------------------------------------------------------------
class FakeErr(int):
    """hip-python's hipError_t is an int enum with a name."""

    def __new__(cls, code, name):
        obj = int.__new__(cls, code)
        obj.name = name
        return obj


def test_hip_check_unwraps_values():
    ok = FakeErr(0, "hipSuccess")
    assert _hip.hip_check("hipDeviceSynchronize", (ok,)) is None
    assert _hip.hip_check("hipGetDevice", (ok, 3)) == 3
    assert _hip.hip_check("hipMemGetInfo", (ok, 1, 2)) == (1, 2)


def test_hip_check_names_the_call_the_error_and_the_runtime_text():
    err = FakeErr(209, "hipErrorNoBinaryForGpu")
    with pytest.raises(_hip.HipError) as info:
        _hip.hip_check("hipModuleLoadData", (err, None), describe=lambda e: "no kernel image for this GPU")
    e = info.value
    assert (e.call, e.code, e.name) == ("hipModuleLoadData", 209, "hipErrorNoBinaryForGpu")
    assert str(e) == "hipModuleLoadData failed: hipErrorNoBinaryForGpu (209): no kernel image for this GPU"


def test_hip_check_survives_a_failing_describe_and_plain_int_codes():
    def broken(_):
        raise RuntimeError("runtime gone")

    with pytest.raises(_hip.HipError, match=r"hipMalloc failed: hipError_t 2 \(2\)$"):
        _hip.hip_check("hipMalloc", (2, None), describe=broken)
    assert _hip.error_name(218) == "hipErrorInvalidKernelFile"


# ---- targets and bundles --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code, device, runs",
    [
        ("gfx90a", "gfx90a:sramecc+:xnack-", True),  # no feature fixed: runs on any setting
        ("gfx90a:xnack-", "gfx90a:sramecc+:xnack-", True),
        ("gfx90a:xnack+", "gfx90a:sramecc+:xnack-", False),
        ("gfx940", "gfx942:sramecc+:xnack-", False),  # the ISA name must match exactly
        ("gfx1100", "gfx1100", True),
        ("gfx1030", "gfx1100", False),
    ],
)
def test_code_for_a_target_runs_only_on_matching_devices(code, device, runs):
    assert _hip.Target.parse(code).runs_on(_hip.Target.parse(device)) is runs


def test_target_parse_round_trips():
    t = _hip.Target.parse("gfx942:xnack-:sramecc+")
    assert t.processor == "gfx942" and dict(t.features) == {"sramecc": True, "xnack": False}
    assert str(t) == "gfx942:sramecc+:xnack-"


def make_bundle(entries: dict[str, bytes]) -> bytes:
    """A clang offload bundle as clang-offload-bundler writes it (format version 1)."""
    ids = [e.encode() for e in entries]
    header = len(b"__CLANG_OFFLOAD_BUNDLE__") + 8 + sum(24 + len(i) for i in ids)
    out, table, offset = b"", b"", header
    for bundle_id, data in zip(ids, entries.values()):
        table += struct.pack("<QQQ", offset, len(data), len(bundle_id)) + bundle_id
        out += data
        offset += len(data)
    return b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids)) + table + out


def test_bundle_reading_finds_each_code_object():
    image = make_bundle({
        "host-x86_64-unknown-linux": b"",
        "hipv4-amdgcn-amd-amdhsa--gfx90a": b"\x7fELF-cdna2",
        "hipv4-amdgcn-amd-amdhsa--gfx1030:xnack-": b"\x7fELF-rdna2",
    })
    assert _hip.bundle_code_objects(image) == {"gfx90a": b"\x7fELF-cdna2", "gfx1030:xnack-": b"\x7fELF-rdna2"}
    assert _hip.bundle_runs_on(image, _hip.Target.parse("gfx90a:sramecc+:xnack+")) is True
    assert _hip.bundle_runs_on(image, _hip.Target.parse("gfx942:sramecc+:xnack-")) is False
    assert _hip.bundle_runs_on(b"\x7fELF...", _hip.Target.parse("gfx90a")) is None  # a bare code object


# ---- device profile -----------------------------------------------------------------------------
def props(**overrides):
    base = dict(
        name=b"AMD Instinct MI300X\0\0", gcnArchName=b"gfx942:sramecc+:xnack-\0", warpSize=64,
        multiProcessorCount=304, maxThreadsPerBlock=1024, sharedMemPerBlock=65536,
        sharedMemPerBlockOptin=0, maxGridSize=[2147483647, 65536, 65536], maxThreadsPerMultiProcessor=2048,
        maxSharedMemoryPerMultiProcessor=65536,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def test_profile_takes_warp_size_and_arch_from_the_device():
    mi300 = _hip.profile_from_properties(props())
    assert (mi300.name, mi300.vendor, mi300.arch, mi300.warp_size) == ("AMD Instinct MI300X", "amd", "gfx942", 64)
    assert mi300.multiprocessors == 304
    rdna3 = _hip.profile_from_properties(props(name=b"Radeon RX 7900 XTX", gcnArchName=b"gfx1100", warpSize=32))
    assert (rdna3.arch, rdna3.warp_size) == ("gfx1100", 32)


def test_profile_needs_no_shared_memory_opt_in_and_caps_the_grid_at_hips_work_item_limit():
    p = _hip.profile_from_properties(props())
    assert p.shared_mem_per_block == p.shared_mem_per_block_optin == 65536
    assert p.max_grid_x * p.max_threads_per_block < 2**32


# ---- hipRTC -------------------------------------------------------------------------------------
def test_hiprtc_library_override_comes_first(monkeypatch):
    monkeypatch.setenv(_hip.HIPRTC_LIBRARY_ENV, "/opt/custom/libhiprtc.so")
    assert _hip.hiprtc_library_candidates()[0] == "/opt/custom/libhiprtc.so"


def test_hiprtc_compiles_for_the_full_target_id():
    assert _hip.hiprtc_options("gfx90a:sramecc+:xnack-")[0] == "--gpu-architecture=gfx90a:sramecc+:xnack-"


class CountingCompiler:
    def __init__(self):
        self.calls = []

    def compile(self, source, name, options):
        self.calls.append((name, tuple(options)))
        return b"\x7fELF" + source.encode()


def test_hiprtc_cache_compiles_once_per_source_target_and_compiler(tmp_path):
    cache, rtc = _hip.HipRtcCache(tmp_path), CountingCompiler()
    first = cache.get_or_compile("kernel A", "a.hip", "gfx90a:xnack-", rtc, "hiprtc 6.4")
    assert cache.get_or_compile("kernel A", "a.hip", "gfx90a:xnack-", rtc, "hiprtc 6.4") == first
    assert len(rtc.calls) == 1
    cache.get_or_compile("kernel B", "a.hip", "gfx90a:xnack-", rtc, "hiprtc 6.4")
    cache.get_or_compile("kernel A", "a.hip", "gfx90a:xnack+", rtc, "hiprtc 6.4")
    cache.get_or_compile("kernel A", "a.hip", "gfx90a:xnack-", rtc, "hiprtc 7.0")
    assert len(rtc.calls) == 4
    assert sorted(p.name[:7] for p in tmp_path.iterdir()) == ["gfx90a-"] * 4
    assert not list(tmp_path.glob("*.tmp"))


def test_an_unwritable_cache_still_returns_the_code(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = _hip.HipRtcCache(blocker / "sub").get_or_compile("k", "a.hip", "gfx90a", CountingCompiler(), "v")
    assert code.startswith(b"\x7fELF")


def _hiprtc_or_skip() -> _hip.HipRtc:
    try:
        return _hip.HipRtc()
    except _hip.HipRtcError as e:
        pytest.skip(f"no hipRTC library here (apt-get install hipcc, or ROCm): {str(e).splitlines()[0]}")


TINY_KERNEL = 'extern "C" __global__ void ps_probe_add(float* p) { p[threadIdx.x] += 1.0f; }\n'


@pytest.mark.parametrize("target, wave", [("gfx90a", 64), ("gfx1030", 32)])
def test_hiprtc_compiles_on_the_cpu(target, wave):
    code = _hiprtc_or_skip().compile(TINY_KERNEL, "probe.hip", _hip.hiprtc_options(target))
    assert code.startswith(b"\x7fELF")
    assert b"ps_probe_add" in code
    assert b".wavefront_size" + bytes([wave]) in code  # the code object's own metadata (msgpack)


def test_hiprtc_errors_carry_the_compiler_log():
    rtc = _hiprtc_or_skip()
    with pytest.raises(_hip.HipRtcError) as info:
        rtc.compile('extern "C" __global__ void k(float* p) { undeclared_thing(p); }\n', "bad.hip",
                    _hip.hiprtc_options("gfx90a"))
    assert "hiprtcCompileProgram(bad.hip" in str(info.value)
    assert "undeclared_thing" in info.value.log


# ---- hip-python without a device ------------------------------------------------------------------
def test_probe_reports_why_hip_cannot_run_here():
    pytest.importorskip("hip", reason="hip-python is not installed (pip install hip-python)")
    try:
        rt = _hip.HipRuntime()
    except Exception as e:  # e.g. no ROCm runtime library for hip-python to open
        rt, why = None, f"{type(e).__name__}: {e}"
    if rt is not None and rt.device_count > 0:
        pytest.skip("an AMD GPU is present: the gpu tests cover it")
    _probe.runtime.cache_clear()
    try:
        with pytest.raises(_probe.BackendUnavailableError) as info:
            _probe.runtime("hip")
    finally:
        _probe.runtime.cache_clear()
    expected = "hip-python found no HIP device" if rt is not None else why.split(":")[0]
    assert expected in str(info.value)


# ---- the launch path against a stand-in for hip-python ---------------------------------------------
class FakeHip:
    """hip-python's calling convention ((hipError_t, *values)) over host memory: allocations are real
    buffers, copies move bytes, and a launch copies its first pointer argument to its second."""

    def __init__(self, device_count=1, arch=b"gfx90a:sramecc+:xnack-"):
        self.device_count, self.arch = device_count, arch
        self.calls, self.buffers, self.freed, self.loaded = [], {}, [], []
        self.cooperative = []  # the kernels launched through hipModuleLaunchCooperativeKernel
        self.launch_bytes = 0
        self.blocks_per_cu = 2
        self.blocks_by_kernel: dict[str, int] = {}  # where a kernel's occupancy differs
        self.occupancy_asked: list[tuple[str, int]] = []
        self.current = 0

    def _ok(self, *values):
        return (FakeErr(0, "hipSuccess"), *values)

    def _alloc(self, size):
        buf = ctypes.create_string_buffer(size)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def hipGetDeviceCount(self):
        return self._ok(self.device_count)

    def hipGetDeviceProperties(self, device):
        return self._ok(props(gcnArchName=self.arch))

    def hipGetDevice(self):
        return self._ok(self.current)

    def hipSetDevice(self, device):
        self.calls.append(("hipSetDevice", device))
        self.current = device
        return self._ok()

    def hipRuntimeGetVersion(self):
        return self._ok(70000000)

    def hipGetErrorString(self, err):
        return self._ok("fake")

    def hipModuleLoadData(self, image):
        self.loaded.append(bytes(image[:64]))
        return self._ok(("module", len(self.loaded)))

    def hipModuleGetFunction(self, module, name):
        return self._ok((module, name.decode()))

    def hipModuleLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("launch", fn[1], gx, bx, shared, stream))
        args = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        x = ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0]
        y = ctypes.cast(args[1], ctypes.POINTER(ctypes.c_void_p))[0]
        ctypes.memmove(y, x, self.launch_bytes)
        return self._ok()

    def hipModuleLaunchCooperativeKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params):
        self.cooperative.append(fn[1])
        return self.hipModuleLaunchKernel(fn, gx, gy, gz, bx, by, bz, shared, stream, params, None)

    def hipMemsetAsync(self, ptr, value, size, stream):
        self.calls.append(("memset", ptr, size, stream))
        ctypes.memset(ptr, value, size)
        return self._ok()

    def hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(self, fn, block, smem):
        self.occupancy_asked.append((fn[1], block))
        return self._ok(self.blocks_by_kernel.get(fn[1], self.blocks_per_cu))

    def hipStreamCreateWithFlags(self, flags):
        return self._ok(0x5EED)

    def hipHostMalloc(self, size, flags):
        return self._ok(self._alloc(size))

    def hipMalloc(self, size):
        return self._ok(self._alloc(size))

    def hipMemcpyAsync(self, dst, src, size, kind, stream):
        self.calls.append(("copy", kind, stream))
        ctypes.memmove(dst, src, size)
        return self._ok()

    def hipStreamSynchronize(self, stream):
        self.calls.append(("sync", stream))
        return self._ok()

    def hipFree(self, ptr):
        self.freed.append(("hipFree", ptr))
        return self._ok()

    def hipHostFree(self, ptr):
        self.freed.append(("hipHostFree", ptr))
        return self._ok()


@pytest.fixture
def fake_runtime(monkeypatch, tmp_path):
    import sys

    fake = FakeHip()
    monkeypatch.setitem(sys.modules, "hip", SimpleNamespace(hip=fake))
    bundle = make_bundle({"hipv4-amdgcn-amd-amdhsa--gfx90a": b"\x7fELF-aot-gfx90a"})
    for dtype in V.DTYPES:
        (tmp_path / _hip.code_object_name(dtype)).write_bytes(bundle)
    monkeypatch.setattr(_hip, "KERNEL_DIR", tmp_path)
    rt = _hip.HipRuntime()
    rt.jit_cache = _hip.HipRtcCache(tmp_path / "cache")
    return rt, fake


def test_aot_bundle_is_loaded_when_it_has_the_devices_target(fake_runtime):
    rt, fake = fake_runtime
    assert rt.device_count == 1 and rt.profile(0).warp_size == 64
    assert rt.kernel_source(0, "float32").startswith("aot:")
    assert fake.loaded[0].startswith(b"__CLANG_OFFLOAD_BUNDLE__")


def test_devices_missing_from_the_bundle_compile_through_hiprtc(fake_runtime, monkeypatch):
    rt, fake = fake_runtime
    fake.arch = b"gfx942:sramecc+:xnack-"
    rtc = CountingCompiler()
    rtc.version = lambda: (7, 0)
    monkeypatch.setattr(rt, "_hiprtc", rtc)
    assert rt.kernel_source(0, "bfloat16").startswith("jit:hiprtc gfx942:sramecc+:xnack-")
    (name, options), = rtc.calls
    assert name == "softmax_bf16.hip" and options[0] == "--gpu-architecture=gfx942:sramecc+:xnack-"
    assert fake.loaded[0].startswith(b"\x7fELF")


def test_force_jit_skips_the_bundle(fake_runtime, monkeypatch):
    rt, fake = fake_runtime
    monkeypatch.setenv(_hip.FORCE_JIT_ENV, "1")
    rtc = CountingCompiler()
    rtc.version = lambda: (7, 0)
    monkeypatch.setattr(rt, "_hiprtc", rtc)
    assert rt.kernel_source(0, "float32").startswith("jit:")


def test_synchronize_stream_waits_on_the_stream_of_the_device(monkeypatch, tmp_path):
    import sys

    fake = FakeHip(device_count=2)
    monkeypatch.setitem(sys.modules, "hip", SimpleNamespace(hip=fake))
    rt = _hip.HipRuntime()
    rt.synchronize_stream(1, 2)  # hipStreamPerThread on device 1, then device 0 current again
    assert fake.calls == [("hipSetDevice", 1), ("sync", 2), ("hipSetDevice", 0)]


def test_run_host_stages_through_pinned_memory_launches_on_one_stream_and_frees_everything(fake_runtime):
    rt, fake = fake_runtime
    x = np.arange(2 * 300, dtype=np.float32).reshape(2, 300)
    fake.launch_bytes = x.nbytes
    the_plan = plan(RowProblem("float32", "softmax", rows=2, cols=300), rt.profile(0))
    y = rt.run_host(x, the_plan, "float32", 0)
    np.testing.assert_array_equal(y, x)  # the stand-in kernel copies x to y: the buffers are wired
    launches = [c for c in fake.calls if c[0] == "launch"]
    assert [c[1] for c in launches] == [step.kernel for step in the_plan.launches]
    assert {c[-1] for c in fake.calls if c[0] in ("launch", "copy", "sync")} == {0x5EED}
    assert [c[1] for c in fake.calls if c[0] == "copy"] == [_hip.HIP_MEMCPY_HOST_TO_DEVICE,
                                                            _hip.HIP_MEMCPY_DEVICE_TO_HOST]
    assert fake.calls[-1] == ("sync", 0x5EED)
    assert len(fake.freed) == len(fake.buffers) and fake.freed[-1][0] == "hipHostFree"


def test_launch_on_another_device_switches_and_restores(fake_runtime):
    rt, fake = fake_runtime
    rt.device_count = fake.device_count = 2
    the_plan = plan(RowProblem("float32", "softmax", rows=1, cols=8), rt.profile(0))
    rt.launch(the_plan, "float32", {"x": 0, "y": 0}, 0, 1)
    switches = [c for c in fake.calls if c[0] == "hipSetDevice"]
    assert switches == [("hipSetDevice", 1), ("hipSetDevice", 0)]


def test_planner_profiles_from_the_adapter_pick_the_devices_warp(fake_runtime):
    rt, _ = fake_runtime
    prof: DeviceProfile = rt.profile(0)
    step = plan(RowProblem("float32", "softmax", rows=4096, cols=1000), prof).launches[0]
    assert "_w64_" in step.kernel


def test_cooperative_launches_fit_the_resident_grid_and_get_zeroed_scratch(fake_runtime, monkeypatch):
    rt, fake = fake_runtime
    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", True)  # PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1
    prof = rt.profile(0)
    the_plan = plan(RowProblem("float32", "softmax", rows=4, cols=200_000), prof)
    coop = [s for s in the_plan.launches if s.cooperative]
    if not coop or not the_plan.scratch:
        pytest.skip(f"the planner chose the {the_plan.tier} tier for this shape")
    fake.blocks_per_cu = 1  # fewer resident blocks than the plan asks for: the grid must shrink
    resident = fake.blocks_per_cu * prof.multiprocessors
    assert coop[0].grid > resident >= coop[0].min_grid
    x = np.zeros((4, 200_000), np.float32)
    rt.run_host(x, the_plan, "float32", 0)
    grids = [c[2] for c in fake.calls if c[0] == "launch"]
    for step, grid in zip(the_plan.launches, grids):
        if step.cooperative:
            assert grid <= resident and grid % step.min_grid == 0 and grid >= step.min_grid
    zeroed = [size for _, _, size, _ in (c for c in fake.calls if c[0] == "memset")]
    total, _ = the_plan.scratch_layout()
    assert zeroed == [total] and total >= the_plan.scratch_bytes  # one fill for every scratch buffer
    # blocks that wait on each other launch cooperatively: resident together whatever else runs
    assert fake.cooperative == [s.kernel for s in the_plan.launches if s.cooperative]
    assert rt.cooperative_launch().startswith("cooperative (")


@pytest.mark.parametrize("asked, in_runtime", [(False, True), (True, False)],
                         ids=["not-asked-for", "not-in-the-runtime"])
def test_otherwise_every_launch_is_plain(fake_runtime, monkeypatch, asked, in_runtime):
    """Cooperative launches not asked for (the default), or asked for where the runtime lacks
    hipModuleLaunchCooperativeKernel (ROCm 5.2): every launch takes hipModuleLaunchKernel."""
    rt, fake = fake_runtime
    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", asked)
    if not in_runtime:
        fake.hipModuleLaunchCooperativeKernel = None  # as hip-python where the runtime lacks it
    the_plan = plan(RowProblem("float32", "softmax", rows=4, cols=200_000), rt.profile(0))
    assert any(s.cooperative for s in the_plan.launches), the_plan.tier
    rt.run_host(np.zeros((4, 200_000), np.float32), the_plan, "float32", 0)
    assert fake.cooperative == []
    assert [c[1] for c in fake.calls if c[0] == "launch"] == [s.kernel for s in the_plan.launches]
    assert rt.cooperative_launch().startswith("plain (")


@pytest.mark.parametrize("fitted_holds, takes_fitted", [(3, True), (2, False)], ids=["more-blocks", "as-many"])
def test_a_block_a_row_takes_its_fitted_kernel_where_that_holds_more_blocks(fake_runtime, fitted_holds, takes_fitted):
    """The adapter asks the occupancy of the shape's kernel at its block and of the fitted kernel at
    the fitted block, and launches the fitted pair only where it holds more blocks a multiprocessor
    (a block per row then, two or more being resident)."""
    rt, fake = fake_runtime
    the_plan = plan_backward(GradRowProblem("float32", "log_softmax", 4096, 8200), rt.profile(0))
    (step,) = the_plan.launches
    assert the_plan.tier == "block" and step.fitted_block < step.block, step
    fake.blocks_by_kernel = {step.kernel: 2, step.fitted_kernel: fitted_holds}
    rt.launch(the_plan, "float32", {"dy": 0, "y": 0, "dx": 0}, 0, 0)
    assert (step.kernel, step.block) in fake.occupancy_asked
    assert (step.fitted_kernel, step.fitted_block) in fake.occupancy_asked
    launches = [c for c in fake.calls if c[0] == "launch"]
    expected = (step.fitted_kernel, step.fitted_block) if takes_fitted else (step.kernel, step.block)
    assert [(c[1], c[3]) for c in launches] == [expected]
    assert launches[0][2] == step.row_grid == 4096  # two or more resident: a block per row


def test_prepared_launcher_reuses_the_plan_with_new_pointers(fake_runtime):
    rt, fake = fake_runtime
    the_plan = plan(RowProblem("float32", "softmax", rows=2, cols=300), rt.profile(0))
    launcher = rt.prepare(the_plan, "float32", 0)
    for _ in range(2):
        x = np.random.default_rng().standard_normal(600).astype(np.float32)
        y = np.full_like(x, np.nan)
        fake.launch_bytes = x.nbytes
        launcher(x.ctypes.data, y.ctypes.data, 0x5EED)
        np.testing.assert_array_equal(y, x)  # the stand-in kernel saw this call's pointers


def test_every_hip_call_the_adapter_makes_exists_in_hip_python():
    hip = pytest.importorskip("hip", reason="hip-python is not installed (pip install hip-python)").hip
    import inspect
    import re

    source = inspect.getsource(_hip)
    calls = set(re.findall(r'_call\(\s*"(hip\w+)"', source)) | set(re.findall(r"self\.hip\.(hip\w+)", source))
    assert {"hipModuleLoadData", "hipModuleLaunchKernel", "hipHostMalloc", "hipMemcpyAsync"} <= calls
    missing = sorted(name for name in calls if not hasattr(hip, name))
    assert not missing, f"hip-python has no {missing}"


def test_threads_first_calls_load_each_module_and_function_once(fake_runtime, monkeypatch):
    """Threads that ask for the same kernel at once: one module load and one look-up, every thread
    given that handle (a second load would leave handles of a module nothing keeps)."""
    import threading
    import time

    rt, fake = fake_runtime
    load, get = fake.hipModuleLoadData, fake.hipModuleGetFunction
    lookups = []

    def slow_load(image):
        time.sleep(0.05)  # the other threads reach the empty cache meanwhile
        return load(image)

    def counted_get(module, name):
        lookups.append(name)
        time.sleep(0.01)
        return get(module, name)

    monkeypatch.setattr(fake, "hipModuleLoadData", slow_load)
    monkeypatch.setattr(fake, "hipModuleGetFunction", counted_get)
    name = V.strided_name("float32", "softmax")
    handles = []
    threads = [threading.Thread(target=lambda: handles.append(rt.function(0, "float32", name))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake.loaded) == 1 and lookups == [name.encode()]
    assert len(handles) == 8 and len(set(handles)) == 1

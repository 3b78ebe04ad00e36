"""The compiled repeat-call launcher (portable_softmax._fastlaunch) without a GPU.

A Launcher calls the launch entry point it is given by address; here that is the module's
recording stub, which keeps every value a launch passes (function, grid, block, shared memory,
stream and the bytes behind each kernel parameter), or its error stub. Plans are the planner's
own for an H100 and an MI300X, so every argument list the runtime adapters hand over is checked
value by value. The build must provide the module: a missing one fails here, unless
PORTABLE_SOFTMAX_BUILT_WITHOUT_FASTLAUNCH=1 says the package was built with
-C cmake.define.PORTABLE_SOFTMAX_FASTLAUNCH=off.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import sysconfig
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from portable_softmax import _cuda, _hip, _launch, _probe
from portable_softmax.planner import I32, I64, PTR, DeviceProfile, Plan, RowProblem, StridedProblem, one_wave, plan
from portable_softmax.planner_backward import GradRowProblem, GradStridedProblem, plan_backward

WITHOUT_ENV = "PORTABLE_SOFTMAX_BUILT_WITHOUT_FASTLAUNCH"
DEVICES = {"h100": DeviceProfile.h100(), "mi300x": DeviceProfile.mi300x()}


@pytest.fixture(scope="module")
def fl():
    module = _launch.fastlaunch_module()
    if module is None:
        if os.environ.get(WITHOUT_ENV) == "1":
            pytest.skip(f"{WITHOUT_ENV}=1: the package was built without the compiled launcher")
        pytest.fail(f"the build did not provide portable_softmax._fastlaunch: {_launch.launcher_status()}")
    return module


@pytest.fixture
def stub(fl):
    """The recording stub's address, with its record emptied."""
    fl._reset_recording()
    yield fl._recording_stub_address()
    fl._reset_recording()


@pytest.fixture
def cooperative_stub(stub, fl):
    """The cooperative recording stub's address (same record as `stub`, calls marked cooperative)."""
    return fl._recording_cooperative_stub_address()


# ---- helpers ------------------------------------------------------------------------------------
_FORMATS = {PTR: "P", I64: "q", I32: "i"}


def decode(params: tuple[bytes, ...], kinds: list[str]) -> list[int]:
    """Each recorded parameter read as its kind says: the kernel reads a pointer or an i64 as 8
    bytes and an i32 as the first 4 bytes behind its kernel_params entry."""
    assert len(params) == len(kinds), f"{len(params)} parameters passed, the kernel takes {len(kinds)}"
    return [struct.unpack_from("@" + _FORMATS[k], raw)[0] for raw, k in zip(params, kinds)]


def expected_values(args, buffers: dict[str, int]) -> list[int]:
    return [buffers[v] if k == PTR else v for k, v in args]


def fake_handles(the_plan: Plan, device: DeviceProfile) -> tuple[list[int], list[int]]:
    """A distinct function handle per launch and the grid a runtime would launch it with."""
    functions = [0x7F3A_0000_0000 + 0x1000 * (i + 1) + len(s.kernel) for i, s in enumerate(the_plan.launches)]
    grids = [one_wave(s, 3, device.multiprocessors) for s in the_plan.launches]
    return functions, grids


def random_address(rng, align: int = 1) -> int:
    """A 64-bit address with high bits set (a pointer cut to 32 bits would show)."""
    return (int(rng.integers(1 << 40, 1 << 47)) | (1 << 47)) // align * align


def check_calls(calls, the_plan: Plan, functions, grids, buffers, stream, cooperative: bool = True) -> None:
    """`cooperative`: the launcher had a cooperative entry point, which cooperative steps must take."""
    assert len(calls) == len(the_plan.launches)
    for call, step, fn, grid in zip(calls, the_plan.launches, functions, grids):
        where = f"{the_plan.tier}: {step.kernel}"
        assert call["cooperative"] == (cooperative and step.cooperative), where
        assert call["function"] == fn, where
        assert call["grid"] == (grid, 1, 1), where
        assert call["block"] == (step.block, 1, 1), where
        assert call["shared_bytes"] == step.shared_mem, where
        assert call["stream"] == stream, where
        assert call["extra"] == 0, where
        kinds = [k for k, _ in step.args]
        assert decode(call["params"], kinds) == expected_values(step.args, buffers), where


def _problems():
    """Problems that take every row tier on both devices, with i32 flags set both ways."""
    out = []
    for dtype, cols in [("float32", 1), ("float32", 5), ("float32", 300), ("float32", 1000), ("float32", 5000),
                        ("float32", 50257), ("float32", 200_000), ("float32", 10_000_000), ("float16", 1),
                        ("float16", 3), ("bfloat16", 120_011), ("float64", 2049)]:
        for rows in (1, 2, 4096):
            if rows * cols <= 50_000_000:
                out.append(RowProblem(dtype, "softmax", rows=rows, cols=cols))
    out.append(RowProblem("float32", "log_softmax", rows=7, cols=1000, safe=True))
    out.append(RowProblem("float32", "softmax", rows=3, cols=200_000, safe=True))
    out.append(StridedProblem("float32", "softmax", outer=4, cols=300, inner=64,
                              x_strides=(300 * 64, 64, 1), y_strides=(300 * 64, 64, 1)))
    return out


def _plans():
    params, seen = [], set()
    for dev_name, dev in DEVICES.items():
        for problem in _problems():
            the_plan = plan(problem, dev)
            key = (dev_name, the_plan.tier, tuple(s.kernel for s in the_plan.launches))
            if key not in seen:
                seen.add(key)
                params.append(pytest.param(dev_name, problem, id=f"{dev_name}-{the_plan.tier}-{len(seen)}"))
    return params


PLANS = _plans()


def split_plan(dev_name: str) -> Plan:
    """A plan of two launches with a scratch buffer (the split tier) on that device."""
    for problem in _problems():
        the_plan = plan(problem, DEVICES[dev_name])
        if len(the_plan.launches) >= 2 and the_plan.scratch:
            return the_plan
    raise AssertionError(f"no problem takes the split tier on {dev_name}")


def test_the_plans_cover_the_multi_launch_split_and_scratch_on_both_devices():
    for dev_name, dev in DEVICES.items():
        plans = [plan(p, dev) for p in _problems()]
        assert any(len(p.launches) >= 2 and p.scratch for p in plans), f"{dev_name}: no multi-launch plan with scratch"
        assert {"split", "warp", "block"} <= {p.tier for p in plans}, dev_name
        kinds = {k for p in plans for s in p.launches for k, _ in s.args}
        assert kinds == {PTR, I64, I32}, kinds
        assert {v for p in plans for s in p.launches for k, v in s.args if k == I32} >= {0, 1}


# ---- the build ------------------------------------------------------------------------------------
@pytest.fixture
def slots(fl):
    """The compiled launcher with pointer slots (ABI 3): an extension built before them (ABI 2,
    still driven for x / y launchers) skips, saying so."""
    if fl.ABI < _launch.FASTLAUNCH_ABI:
        pytest.skip(f"{fl.__file__} has ABI {fl.ABI}, built before this source's ABI {_launch.FASTLAUNCH_ABI} "
                    "(pointer slots): reinstall the package to rebuild it")
    return fl


def test_the_build_provides_the_compiled_launcher(fl):
    assert fl.ABI in (_launch.FASTLAUNCH_ABI, _launch.FASTLAUNCH_ABI_XY)
    assert _launch.launcher_status().startswith("compiled (")
    assert issubclass(fl.LaunchError, RuntimeError)


@pytest.mark.skipif(bool(sysconfig.get_config_var("Py_GIL_DISABLED")), reason="free-threaded CPython has no abi3")
def test_the_installed_extension_uses_the_stable_abi(fl):
    """One wheel serves CPython 3.10 and newer (wheel.py-api = "cp310")."""
    assert ".abi3." in Path(fl.__file__).name, fl.__file__


def test_backend_info_names_the_launcher(fl, monkeypatch):
    monkeypatch.setenv(_probe.ENV_VAR, "cpu")
    assert _probe.backend_info()["repeat_call_launcher"] == f"compiled ({fl.__file__})"
    monkeypatch.setenv(_launch.LAUNCHER_ENV, "python")
    assert _probe.backend_info()["repeat_call_launcher"].startswith("python (")


# ---- every value of real plans ---------------------------------------------------------------------
@pytest.mark.parametrize("dev_name, problem", PLANS)
def test_every_value_of_a_plan_reaches_the_entry_point(fl, stub, cooperative_stub, rng, dev_name, problem):
    dev = DEVICES[dev_name]
    the_plan = plan(problem, dev)
    functions, grids = fake_handles(the_plan, dev)
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    launcher = _launch.compiled_launcher(stub, the_plan, functions, grids, scratch,
                                         cooperative_entry_point=cooperative_stub)
    assert launcher is not None
    for call in range(3):  # new pointers and stream every call; the scratch stays
        x, y = random_address(rng, 16) + 4 * call, random_address(rng, 16)
        stream = int(rng.integers(0, 1 << 62))
        (launcher.launch if call % 2 else launcher)(x, y, stream)
        calls = fl._recorded()[-len(the_plan.launches):]
        check_calls(calls, the_plan, functions, grids, {"x": x, "y": y, **scratch}, stream)
    assert len(fl._recorded()) == 3 * len(the_plan.launches)


def test_the_plans_cover_cooperative_and_plain_launches():
    steps = [s for dev in DEVICES.values() for p in _problems() for s in plan(p, dev).launches]
    assert {s.cooperative for s in steps} == {True, False}


def test_cooperative_steps_launch_plainly_without_a_cooperative_entry_point(fl, stub, rng):
    """A runtime without cuLaunchCooperativeKernel / hipModuleLaunchCooperativeKernel (ROCm 5.2)
    hands over none: every step then takes the plain entry point."""
    for dev in DEVICES.values():
        the_plan = next(p for p in (plan(q, dev) for q in _problems()) if any(s.cooperative for s in p.launches))
        functions, grids = fake_handles(the_plan, dev)
        scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
        _launch.compiled_launcher(stub, the_plan, functions, grids, scratch)(0x1000, 0x2000, 7)
        calls = fl._recorded()[-len(the_plan.launches):]
        check_calls(calls, the_plan, functions, grids, {"x": 0x1000, "y": 0x2000, **scratch}, 7, cooperative=False)


def test_a_cooperative_step_needs_a_cooperative_entry_point(fl, stub, cooperative_stub):
    with pytest.raises(ValueError, match="ps_wait.*cooperative_entry_point"):
        fl.Launcher(stub, [("ps_plain", 1, 1, 1, 0, []), ("ps_wait", 2, 1, 1, 0, [], True)])
    with pytest.raises(ValueError, match="null"):
        fl.Launcher(stub, [("k", 1, 1, 1, 0, [], True)], None, 0)
    with pytest.raises(TypeError, match="bool"):
        fl.Launcher(stub, [("k", 1, 1, 1, 0, [], 1)], None, cooperative_stub)
    fl.Launcher(stub, [("k", 1, 1, 1, 0, [], False), ("w", 2, 4, 1, 0, [], True)], None, cooperative_stub)(0, 0, 9)
    assert [(c["function"], c["cooperative"], c["grid"][0]) for c in fl._recorded()] == [(1, False, 1), (2, True, 4)]


def test_a_plan_with_scratch_needs_its_addresses(fl, stub):
    the_plan = split_plan("h100")
    functions, grids = fake_handles(the_plan, DEVICES["h100"])
    with pytest.raises(KeyError, match="partials"):
        _launch.compiled_launcher(stub, the_plan, functions, grids)


def test_x_and_y_reach_every_position(fl, stub, rng):
    """x and y at every parameter position, between i64, i32 and fixed pointers, up to MAX_ARGS."""
    fixed_ptr = random_address(rng, 8)
    for n in (1, 2, 3, 11, fl.MAX_ARGS):
        for p in range(n):
            q = n - 1 - p
            args, kinds = [], []
            for i in range(n):
                if i == p:
                    arg = (PTR, "x")
                elif i == q:
                    arg = (PTR, "y")
                else:
                    arg = [(I64, -(1 << 62) + i), (I32, -(1 << 31) + i), (PTR, fixed_ptr + i), (I32, i)][i % 4]
                args.append(arg)
                kinds.append(arg[0])
            launcher = fl.Launcher(stub, [("k", 0x10, 1, 1, 0, args)])
            x, y = random_address(rng), random_address(rng)
            launcher.launch(x, y, 5)
            got = decode(fl._recorded()[-1]["params"], kinds)
            want = [x if i == p else y if i == q else v for i, (_, v) in enumerate(args)]
            assert got == want, (n, p)


def test_i32_parameters_occupy_their_first_four_bytes(fl, stub):
    fl.Launcher(stub, [("k", 1, 1, 1, 0, [(I32, -2), (I32, 0x7FFFFFFF)])])(0, 0, 0)
    native = sys.byteorder
    got = [int.from_bytes(raw[:4], native, signed=True) for raw in fl._recorded()[-1]["params"]]
    assert got == [-2, 0x7FFFFFFF]


def test_three_dimensional_grids_and_blocks_pass_through(fl, stub):
    fl.Launcher(stub, [("k", 1, (7, 5, 3), (32, 4, 2), 12345, [])]).launch(0, 0, 0)
    call = fl._recorded()[-1]
    assert (call["grid"], call["block"], call["shared_bytes"], call["params"]) == ((7, 5, 3), (32, 4, 2), 12345, ())


# ---- errors ------------------------------------------------------------------------------------------
def test_a_failing_launch_names_its_kernel_and_code(fl):
    the_plan = plan(RowProblem("float32", "softmax", rows=4, cols=1000), DEVICES["mi300x"])
    functions, grids = fake_handles(the_plan, DEVICES["mi300x"])
    launcher = _launch.compiled_launcher(fl._error_stub_address(), the_plan, functions, grids,
                                         describe=lambda code: f"hipErrorFake{code}")
    kernel = the_plan.launches[0].kernel
    with pytest.raises(fl.LaunchError, match=rf"\({kernel}\) failed: error {fl.ERROR_STUB_CODE} "
                                             rf"\(hipErrorFake{fl.ERROR_STUB_CODE}\)") as info:
        launcher(1, 2, 3)
    assert isinstance(info.value, RuntimeError)
    assert (info.value.kernel, info.value.code, info.value.step) == (kernel, fl.ERROR_STUB_CODE, 0)


def test_a_failing_second_launch_stops_the_plan_there(fl, stub):
    the_plan = split_plan("h100")
    functions, grids = fake_handles(the_plan, DEVICES["h100"])
    scratch = {name: 0x5000 + 0x1000 * i for i, (name, _) in enumerate(the_plan.scratch)}
    launcher = _launch.compiled_launcher(stub, the_plan, functions, grids, scratch)
    fl._reset_recording(fail_from=1, code=700)
    second = rf"launch 2 of {len(the_plan.launches)} \({the_plan.launches[1].kernel}\)"
    with pytest.raises(fl.LaunchError, match=second + " failed: error 700$"):
        launcher.launch(0x1000, 0x2000, 0)
    assert [c["function"] for c in fl._recorded()] == functions[:2]  # the first launched, the second was tried


def test_a_describe_that_fails_still_leaves_the_code(fl):
    def describe(code):
        raise ValueError("no name for it")

    launcher = fl.Launcher(fl._error_stub_address(), [("ps_k", 1, 1, 1, 0, [])], describe=describe)
    with pytest.raises(fl.LaunchError, match=rf"\(ps_k\) failed: error {fl.ERROR_STUB_CODE}$"):
        launcher(0, 0, 0)


@pytest.mark.parametrize("steps, error, message", [
    ([("k", 1, 1, 1, 0, [("f32", 1)])], ValueError, "unknown kind"),
    ([("k", 1, 1, 1, 0, [(I32, 1 << 31)])], OverflowError, "does not fit 32 bits"),
    ([("k", 1, 1, 1, 0, [(I64, 1 << 63)])], OverflowError, "does not fit 64 bits"),
    ([("k", 1, 1, 1, 0, [(PTR, "partials")])], KeyError, "partials"),
    ([("k", 1, 1, 1, 0, [(PTR, -1)])], ValueError, "address"),
    ([("k", 1, 1, 1, 0, [(I64, 1.5)])], TypeError, "must be an int"),
    ([("k", 1, 1, 1, 0, [(PTR, "x")] * 65)], ValueError, "at most"),
    ([("k", 1, 0, 1, 0, [])], ValueError, "grid"),
    ([("k", 1, 1, (1, 2, 3, 4), 0, [])], TypeError, "block"),
    ([("k", 1, 1, 1, 1 << 32, [])], ValueError, "shared_bytes"),
    ([("k", 1, 1, 1, 0)], TypeError, "a step is"),
    ([("k", 1, 1, 1, 0, [], False, None)], TypeError, "a step is"),
    ([], ValueError, "non-empty"),
])
def test_bad_steps_are_refused_when_built(fl, stub, steps, error, message):
    with pytest.raises(error, match=message):
        fl.Launcher(stub, steps)


def test_a_launcher_in_a_cycle_with_its_describes_owner_is_collected(fl):
    import gc
    import weakref

    class Owner:
        def describe(self, code):
            return f"code {code}"

    owner = Owner()
    owner.launcher = fl.Launcher(fl._error_stub_address(), [("k", 1, 1, 1, 0, [])], describe=owner.describe)
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is None


def test_a_null_entry_point_is_refused(fl):
    with pytest.raises(ValueError, match="null"):
        fl.Launcher(0, [("k", 1, 1, 1, 0, [])])


@pytest.mark.parametrize("args, error", [((1, 2), TypeError), ((1, 2, 3, 4), TypeError), ((-1, 2, 3), ValueError),
                                         ((1, "y", 3), TypeError), ((1, 2, 1 << 64), ValueError)])
def test_bad_call_arguments_raise_and_launch_nothing(fl, stub, args, error):
    launcher = fl.Launcher(stub, [("k", 1, 1, 1, 0, [(PTR, "x"), (PTR, "y")])])
    for call in (launcher, launcher.launch):
        with pytest.raises(error):
            call(*args)
    assert fl._recorded() == []


# ---- threads -----------------------------------------------------------------------------------------
def test_threads_calling_one_launcher_never_mix_their_pointers(fl, stub, rng):
    """The launches run with the GIL released and the parameters live on each call's stack:
    every recorded launch must carry the x, y and stream of one call, in that call's order."""
    the_plan = split_plan("mi300x")
    functions, grids = fake_handles(the_plan, DEVICES["mi300x"])
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    launcher = _launch.compiled_launcher(stub, the_plan, functions, grids, scratch)
    threads, calls = 8, 200
    assert threads * calls * len(the_plan.launches) <= fl.RECORD_CAPACITY
    base = random_address(rng, 1 << 20) & ~((1 << 40) - 1)
    start = threading.Barrier(threads)
    errors = []

    def work(t: int) -> None:
        try:
            start.wait()
            launch = launcher.launch
            for i in range(calls):
                x = base + (t << 32) + (i << 8)
                launch(x, x + 64, t)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert not errors, errors
    recorded = fl._recorded()
    assert len(recorded) == threads * calls * len(the_plan.launches)
    per_thread: dict[int, list] = {t: [] for t in range(threads)}
    for call in recorded:
        per_thread[call["stream"]].append(call)
    for t, seq in per_thread.items():
        assert len(seq) == calls * len(the_plan.launches), t
        for n, call in enumerate(seq):
            i, s = divmod(n, len(the_plan.launches))
            step = the_plan.launches[s]
            x = base + (t << 32) + (i << 8)
            assert call["function"] == functions[s]
            got = decode(call["params"], [k for k, _ in step.args])
            assert got == expected_values(step.args, {"x": x, "y": x + 64, **scratch}), (t, i, s)


# ---- pointer slots: the gradient's dy, y and dx ------------------------------------------------------
GRADIENT = ("dy", "y", "dx")


def _gradient_plans():
    """Gradient plans of every regime on both devices (a split with scratch among them)."""
    problems = [GradRowProblem("float32", op, rows, cols, (cols, cols, cols), (0, 0, 0), safe=True)
                for op in ("softmax", "log_softmax") for rows, cols in ((4096, 7), (64, 1000), (8, 50257),
                                                                       (1, 4_000_000))]
    problems.append(GradStridedProblem("float32", "softmax", 4, 300, 64, (300 * 64, 64, 1), (300 * 64, 64, 1),
                                       (300 * 64, 64, 1), safe=True))
    return [(dev_name, plan_backward(p, dev)) for dev_name, dev in DEVICES.items() for p in problems]


def test_the_gradient_plans_take_three_pointers_and_scratch():
    plans = [p for _, p in _gradient_plans()]
    names = {v for p in plans for s in p.launches for k, v in s.args if k == PTR}
    assert set(GRADIENT) <= names and any(p.scratch for p in plans)


@pytest.mark.parametrize("index", range(len(_gradient_plans())))
def test_a_gradient_launcher_fills_its_three_pointer_slots(slots, stub, rng, index):
    dev_name, the_plan = _gradient_plans()[index]
    functions, grids = fake_handles(the_plan, DEVICES[dev_name])
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    launcher = _launch.compiled_launcher(stub, the_plan, functions, grids, scratch, pointers=GRADIENT)
    assert launcher is not None
    for call in range(2):
        dy, y, dx = (random_address(rng, 16) + 4 * call for _ in range(3))
        stream = int(rng.integers(0, 1 << 62))
        (launcher.launch if call else launcher)(dy, y, dx, stream)
        calls = slots._recorded()[-len(the_plan.launches):]
        check_calls(calls, the_plan, functions, grids, {"dy": dy, "y": y, "dx": dx, **scratch}, stream, False)


@pytest.mark.parametrize("pointers, error, message", [
    (("x", "x"), ValueError, "twice"), ((), ValueError, "1 to 8"), (tuple("abcdefghi"), ValueError, "1 to 8"),
    ((1, 2), TypeError, "names"), ("xy", TypeError, "names"),
])
def test_bad_pointer_slots_are_refused(slots, stub, pointers, error, message):
    with pytest.raises(error, match=message):
        slots.Launcher(stub, [("k", 1, 1, 1, 0, [])], pointers=pointers)


def test_a_launcher_takes_one_address_a_slot_and_the_stream(slots, stub):
    launcher = slots.Launcher(stub, [("k", 1, 1, 1, 0, [(PTR, "dy"), (PTR, "dx"), (PTR, "y"), (I32, 5)])],
                              pointers=GRADIENT)
    launcher(0x10, 0x20, 0x30, 9)
    (call,) = slots._recorded()
    assert decode(call["params"], [PTR, PTR, PTR, I32]) == [0x10, 0x30, 0x20, 5] and call["stream"] == 9
    for args in ((1, 2, 3), (1, 2, 3, 4, 5)):
        for f in (launcher, launcher.launch):
            with pytest.raises(TypeError, match=r"launch\(dy_ptr, y_ptr, dx_ptr, stream\) takes 4 arguments"):
                f(*args)
    with pytest.raises(TypeError, match="dx_ptr must be an int"):
        launcher(1, 2, "dx", 4)
    with pytest.raises(KeyError, match="'x'"):  # a name outside the slots needs an address
        slots.Launcher(stub, [("k", 1, 1, 1, 0, [(PTR, "x")])], pointers=GRADIENT)
    assert len(slots._recorded()) == 1


def test_an_extension_of_x_and_y_only_leaves_gradients_to_python(fl, stub, monkeypatch):
    """ABI 2 (built before pointer slots) still drives x / y launchers; a gradient's gets None, so
    the runtime builds the Python launcher."""
    the_plan = plan_backward(GradRowProblem("float32", "softmax", 4, 8, (8, 8, 8), (0, 0, 0), safe=True),
                             DEVICES["h100"])
    functions, grids = fake_handles(the_plan, DEVICES["h100"])
    monkeypatch.setattr(_launch, "_FASTLAUNCH", SimpleNamespace(ABI=_launch.FASTLAUNCH_ABI_XY,
                                                                Launcher=fl.Launcher))
    assert _launch.compiled_launcher(stub, the_plan, functions, grids, pointers=GRADIENT) is None
    forward = plan(RowProblem("float32", "softmax", rows=4, cols=8), DEVICES["h100"])
    assert _launch.compiled_launcher(stub, forward, *fake_handles(forward, DEVICES["h100"])) is not None


# ---- the runtime adapters' prepare() ----------------------------------------------------------------
class StubDriver:
    """cupy.cuda.driver's launchKernel and launchCooperativeKernel, recording what the Python
    launcher passes."""

    def __init__(self):
        self.calls = []
        self.context = 0x1  # the calling thread's current context; 0: none bound

    def ctxGetCurrent(self):  # noqa: N802
        return self.context

    def launchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802
        self.calls.append(dict(function=fn, grid=(gx, gy, gz), block=(bx, by, bz), shared_bytes=smem,
                               stream=stream, params=params, extra=extra, cooperative=False))

    def launchCooperativeKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params):  # noqa: N802
        self.calls.append(dict(function=fn, grid=(gx, gy, gz), block=(bx, by, bz), shared_bytes=smem,
                               stream=stream, params=params, extra=0, cooperative=True))

    @staticmethod
    def CUDADriverError(code):  # noqa: N802
        return RuntimeError(f"CUDA_ERROR_FAKE_{code}: fake")


class StubCuda(_cuda.CudaRuntime):
    """CudaRuntime with the GPU parts replaced: fixed handles and grids, a device counter."""

    def __init__(self, entry_point, device_now=0, device_count=2, cooperative_entry_point=0):
        self.driver = StubDriver()
        self.device_count = device_count
        self.entered = []
        self.device_now = device_now
        self._entry_point = entry_point
        self._cooperative_entry_point = cooperative_entry_point  # 0: none (looked up already)
        self._launch_cooperative = self.driver.launchCooperativeKernel
        stub = self

        class Device:
            def __init__(self, device):
                self.device = device

            def __enter__(self):
                stub.entered.append(self.device)

            def __exit__(self, *exc):
                return False

        self.bound = []
        self.cupy = SimpleNamespace(cuda=SimpleNamespace(
            Device=Device, runtime=SimpleNamespace(setDevice=self.bound.append)))

    def function(self, device, dtype, name, shared_mem):
        return 0xF000 + len(name)

    def resident_grid(self, fn, step, device):
        return one_wave(step, 2, DEVICES["h100"].multiprocessors)

    def current_device(self):
        return self.device_now


def _python_launcher_params(call, kinds) -> list[int]:
    """What the Python launcher's packed void** array points at, read as the kinds say."""
    array = ctypes.cast(call["params"], ctypes.POINTER(ctypes.c_void_p))
    raw = [ctypes.string_at(array[i], struct.calcsize(_FORMATS[k])) for i, k in enumerate(kinds)]
    return [struct.unpack("@" + _FORMATS[k], r)[0] for r, k in zip(raw, kinds)]


def test_cuda_prepare_launches_through_the_compiled_launcher(fl, stub, rng):
    rt = StubCuda(stub)
    the_plan = plan(RowProblem("bfloat16", "softmax", rows=64, cols=4000, safe=True), DEVICES["h100"])
    launcher = rt.prepare(the_plan, "bfloat16", 0)
    x, y, stream = random_address(rng, 16), random_address(rng, 16), 0xABC
    assert launcher(x, y, stream) is None
    functions = [rt.function(0, "", s.kernel, 0) for s in the_plan.launches]
    grids = [rt.resident_grid(None, s, 0) for s in the_plan.launches]
    check_calls(fl._recorded(), the_plan, functions, grids, {"x": x, "y": y}, stream)
    assert rt.driver.calls == [] and rt.entered == []
    assert rt.launcher_kind().startswith("compiled (")

    rt.device_now = 1  # another device is current: the launcher switches to its own first
    launcher(y, x, 7)
    assert rt.entered == [0]
    check_calls(fl._recorded()[-len(the_plan.launches):], the_plan, functions, grids, {"x": y, "y": x}, 7)

    single = StubCuda(stub, device_count=1)  # one device is always the current one: the C launch itself
    launch = single.prepare(the_plan, "bfloat16", 0)
    assert isinstance(launch.__self__, fl.Launcher)
    launch(x, y, 5)
    check_calls(fl._recorded()[-len(the_plan.launches):], the_plan, functions, grids, {"x": x, "y": y}, 5)


@pytest.mark.parametrize("problem, asked", [(RowProblem("float32", "log_softmax", rows=3, cols=5000), True),
                                            (RowProblem("float32", "softmax", rows=20, cols=200_000), True),
                                            (RowProblem("float32", "softmax", rows=20, cols=200_000), False)],
                         ids=["plain", "cooperative", "cooperative-not-asked-for"])
def test_cuda_prepare_falls_back_to_python_with_the_same_values(fl, stub, cooperative_stub, rng, monkeypatch,
                                                                problem, asked):
    """The compiled and the Python launcher pass the same values to the same entry points: the
    cooperative one for steps whose blocks wait on each other where cooperative launches are
    asked for (PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1), the plain one for every other step."""
    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", asked)
    the_plan = plan(problem, DEVICES["h100"])
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    x, y, stream = random_address(rng, 16), random_address(rng, 16), 0x5EED
    compiled = StubCuda(stub, cooperative_entry_point=cooperative_stub)
    compiled.prepare(the_plan, "float32", 0, scratch)(x, y, stream)
    monkeypatch.setenv(_launch.LAUNCHER_ENV, "python")
    python = StubCuda(stub, cooperative_entry_point=cooperative_stub)
    launcher = python.prepare(the_plan, "float32", 0, scratch)
    launcher(x, y, stream)  # reads the packed values while they are alive (inside the call)
    assert len(python.driver.calls) == len(the_plan.launches) == len(fl._recorded())
    for via_python, via_c, step in zip(python.driver.calls, fl._recorded(), the_plan.launches):
        kinds = [k for k, _ in step.args]
        for key in ("function", "grid", "block", "shared_bytes", "stream", "cooperative"):
            assert via_python[key] == via_c[key], key
        assert via_c["cooperative"] == (asked and step.cooperative)
        assert _python_launcher_params(via_python, kinds) == decode(via_c["params"], kinds)
    assert python.launcher_kind() == f"python ({_launch.LAUNCHER_ENV}=python)"
    assert any(s.cooperative for s in the_plan.launches) == (the_plan.tier != "block")


@pytest.mark.parametrize("device_count", [1, 2])
def test_a_gradients_prepared_launcher_passes_the_same_values_from_c_and_python(slots, stub, rng, monkeypatch,
                                                                                 device_count):
    """prepare(..., pointers=(dy, y, dx)): launcher(dy, y, dx, stream), compiled where the extension
    has pointer slots, else from Python, with the same values; made current on its device first."""
    the_plan = plan_backward(GradRowProblem("float32", "softmax", 1, 4_000_000, (4_000_000,) * 3, (0, 0, 0),
                                            safe=True), DEVICES["h100"])
    assert the_plan.scratch
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    dy, y, dx = (random_address(rng, 16) for _ in range(3))
    stream = 0x5EED
    compiled = StubCuda(stub, device_now=1, device_count=device_count)
    launcher = compiled.prepare(the_plan, "float32", 0, scratch, pointers=GRADIENT)
    launcher(dy, y, dx, stream)
    assert compiled.entered == ([0, 0] if device_count == 2 else [])  # the steps looked up, then the call
    monkeypatch.setenv(_launch.LAUNCHER_ENV, "python")
    python = StubCuda(stub, device_now=1, device_count=device_count)
    from_python = python.prepare(the_plan, "float32", 0, scratch, pointers=GRADIENT)
    from_python(dy, y, dx, stream)  # its packed values stay alive with it, for the reads below
    with pytest.raises(TypeError, match="dy, y, dx, stream"):
        from_python(dy, y, stream)
    assert len(python.driver.calls) == len(the_plan.launches) == len(slots._recorded())
    for via_python, via_c, step in zip(python.driver.calls, slots._recorded(), the_plan.launches):
        kinds = [k for k, _ in step.args]
        values = {"dy": dy, "y": y, "dx": dx, **scratch}
        assert _python_launcher_params(via_python, kinds) == decode(via_c["params"], kinds)
        assert decode(via_c["params"], kinds) == expected_values(step.args, values)


class StubHip(_hip.HipRuntime):
    """HipRuntime with hip-python replaced: integer handles, a current device per thread."""

    def __init__(self, entry_point, device_count=1, cooperative_entry_point=0):
        self.device_count = device_count
        self.current = 0
        self.switches = []
        self._entry_point = entry_point
        self._cooperative_entry_point = cooperative_entry_point  # 0: none (looked up already)
        self._launch_cooperative = None
        self._occupancy = {}
        rt = self

        class Hip:
            @staticmethod
            def hipGetDevice():  # noqa: N802
                return (0, rt.current)

            @staticmethod
            def hipSetDevice(device):  # noqa: N802
                rt.switches.append(device)
                rt.current = device
                return (0,)

            @staticmethod
            def hipError_t(code):  # noqa: N802
                return SimpleNamespace(name=f"hipErrorFake{code}", value=code)

            @staticmethod
            def hipGetErrorString(err):  # noqa: N802
                return (0, b"fake text")

        self.hip = Hip

    def function(self, device, dtype, name):
        return Handle(0xA000 + len(name))

    def resident_grid(self, fn, step, device):
        return one_wave(step, 1, DEVICES["mi300x"].multiprocessors)


class Handle:
    """Like hip-python's hipFunction_t: not an int, but int() gives its address."""

    def __init__(self, address: int):
        self.address = address

    def __int__(self) -> int:
        return self.address


def test_hip_prepare_launches_through_the_compiled_launcher(fl, stub, rng):
    the_plan = plan(RowProblem("float16", "softmax", rows=4096, cols=1000), DEVICES["mi300x"])
    for device_count in (1, 2):
        fl._reset_recording()
        rt = StubHip(stub, device_count)
        launcher = rt.prepare(the_plan, "float16", 1 if device_count == 2 else 0)
        x, y = random_address(rng, 16), random_address(rng, 16)
        assert launcher(x, y, 0x77) is None
        functions = [0xA000 + len(s.kernel) for s in the_plan.launches]
        grids = [rt.resident_grid(None, s, 0) for s in the_plan.launches]
        check_calls(fl._recorded(), the_plan, functions, grids, {"x": x, "y": y}, 0x77)
        if device_count == 2:  # device 1 made current for the call, device 0 restored after
            assert rt.switches[-2:] == [1, 0] and rt.current == 0


def test_hip_prepare_takes_the_cooperative_entry_point_where_the_runtime_has_one(fl, stub, cooperative_stub, rng,
                                                                                 monkeypatch):
    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", True)
    the_plan = plan(RowProblem("float32", "softmax", rows=20, cols=400_000), DEVICES["mi300x"])
    assert any(s.cooperative for s in the_plan.launches), the_plan.tier
    scratch = {name: random_address(rng, 256) for name, _ in the_plan.scratch}
    functions = [0xA000 + len(s.kernel) for s in the_plan.launches]
    grids = [one_wave(s, 1, DEVICES["mi300x"].multiprocessors) for s in the_plan.launches]
    for entry, cooperative in ((cooperative_stub, True), (0, False)):  # 0: ROCm 5.2, which lacks it
        rt = StubHip(stub, cooperative_entry_point=entry)
        rt.prepare(the_plan, "float32", 0, scratch)(0x1000, 0x2000, 3)
        calls = fl._recorded()[-len(the_plan.launches):]
        check_calls(calls, the_plan, functions, grids, {"x": 0x1000, "y": 0x2000, **scratch}, 3, cooperative)
    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", False)  # the default: plain launches
    StubHip(stub, cooperative_entry_point=cooperative_stub).prepare(the_plan, "float32", 0, scratch)(0x1000, 0x2000, 3)
    calls = fl._recorded()[-len(the_plan.launches):]
    check_calls(calls, the_plan, functions, grids, {"x": 0x1000, "y": 0x2000, **scratch}, 3, cooperative=False)


def test_hip_launch_errors_carry_hips_name_for_the_code(fl):
    rt = StubHip(fl._error_stub_address())
    the_plan = plan(RowProblem("float32", "softmax", rows=2, cols=300), DEVICES["mi300x"])
    with pytest.raises(fl.LaunchError, match=rf"error {fl.ERROR_STUB_CODE} \(hipErrorFake{fl.ERROR_STUB_CODE}"):
        rt.prepare(the_plan, "float32", 0)(1, 2, 3)


def test_a_stand_in_for_hip_python_keeps_the_python_launcher(fl):
    rt = StubHip(None)
    rt.hip = SimpleNamespace()  # not hip-python's module: no library to take the entry point from
    assert rt.launch_entry_point() is None
    assert rt.launcher_kind().startswith("python (")


def test_no_hip_library_loaded_means_no_entry_point():
    assert _hip.hip_launch_entry_point(["libportable-softmax-no-such-library.so"]) is None


def test_the_python_switch_turns_the_compiled_launcher_off(fl, stub, monkeypatch):
    the_plan = plan(RowProblem("float32", "softmax", rows=2, cols=300), DEVICES["h100"])
    functions, grids = fake_handles(the_plan, DEVICES["h100"])
    assert _launch.compiled_launcher(stub, the_plan, functions, grids) is not None
    assert _launch.compiled_launcher(None, the_plan, functions, grids) is None  # no entry point found
    monkeypatch.setenv(_launch.LAUNCHER_ENV, "python")
    assert _launch.compiled_launcher(stub, the_plan, functions, grids) is None
    assert _launch.launcher_status() == f"python ({_launch.LAUNCHER_ENV}=python)"


@pytest.mark.parametrize("context, device_now, bound", [(0, 0, [0]), (0x1, 0, []), (0, 1, [])])
def test_a_launch_binds_the_context_a_thread_lacks_on_its_current_device(context, device_now, bound):
    """A thread that reports the device but holds no context (torch's autograd thread) gets the
    primary context bound (cudaSetDevice) before the launch; one that holds a context, or reports
    another device (whose switch binds it), is left as it is."""
    rt = StubCuda(entry_point=0, device_now=device_now)
    rt.driver.context = context
    the_plan = plan(RowProblem("float32", "softmax", 4096, 1000), DEVICES["h100"])
    rt.launch(the_plan, "float32", {"x": 0x1000, "y": 0x2000}, 0, 0)
    assert rt.bound == bound and len(rt.driver.calls) == len(the_plan.launches)

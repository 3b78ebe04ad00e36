"""The runtime protocols: the CUDA and HIP adapters implement ``Runtime``, the emulated runtimes
``HostRuntime``, each member with the protocol's parameters; the launch path both GPU adapters
share is written once (``DriverRuntime``)."""

from __future__ import annotations

import doctest
import inspect
import types
from types import SimpleNamespace

import pytest
from emulation.runtime import EmulatedRuntime

from portable_softmax import _cuda, _hip, _runtime
from portable_softmax._runtime import DriverRuntime, HostRuntime, Runtime

#: what DriverRuntime writes once for both GPU adapters
SHARED = ("launch", "prepare", "launch_entry_point", "cooperative_entry_point", "cooperative_launch",
          "launcher_kind", "_python_launcher", "_on")


def _members(protocol) -> tuple[list[str], list[str]]:
    """(methods, data members) the protocol declares in its own body."""
    methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
    return methods, list(vars(protocol).get("__annotations__", {}))


def _parameters(function) -> list[tuple[str, bool]]:
    """(name, has a default) of each parameter after self."""
    return [(p.name, p.default is not p.empty) for p in list(inspect.signature(function).parameters.values())[1:]]


def _check_implements(cls, protocol, instance) -> None:
    methods, data = _members(protocol)
    assert methods, protocol
    for name in methods:
        implementation = getattr(cls, name, None)
        assert callable(implementation), f"{cls.__name__} lacks {name}"
        wanted, given = _parameters(getattr(protocol, name)), _parameters(implementation)
        assert [n for n, _ in given[:len(wanted)]] == [n for n, _ in wanted], (cls.__name__, name, given)
        # a parameter the protocol lets callers leave out must have a default here too; extra ones too
        assert all(d for (_, d), (_, w) in zip(given, wanted) if w), (cls.__name__, name, given)
        assert all(d for _, d in given[len(wanted):]), (cls.__name__, name, given)
    for name in data:
        assert hasattr(instance, name), f"{cls.__name__} instances lack {name}"
    assert isinstance(instance, protocol)


def _uninitialised(cls, **attributes):
    """An instance of a runtime class without its __init__ (which needs the vendor's library and a
    device), given the data members __init__ would set."""
    instance = object.__new__(cls)
    for name, value in attributes.items():
        setattr(instance, name, value)
    return instance


@pytest.mark.parametrize("cls", [_cuda.CudaRuntime, _hip.HipRuntime], ids=["cuda", "hip"])
def test_the_gpu_runtimes_implement_the_runtime_protocol(cls):
    _check_implements(cls, Runtime, _uninitialised(cls, device_count=1))
    assert issubclass(cls, DriverRuntime)


def test_the_hip_runtime_made_with_a_stand_in_for_hip_python_is_a_runtime(monkeypatch):
    """An initialised adapter too: __init__ sets what the protocol's data members name."""
    fake = SimpleNamespace(hipGetDeviceCount=lambda: (0, 2))
    monkeypatch.setitem(__import__("sys").modules, "hip", SimpleNamespace(hip=fake))
    rt = _hip.HipRuntime()
    assert isinstance(rt, Runtime) and rt.device_count == 2 and rt.vendor == "hip"
    assert rt.launch_entry_point() is None  # a stand-in has no library to take it from


def test_the_emulated_runtimes_implement_the_host_runtime_protocol():
    _check_implements(EmulatedRuntime, HostRuntime, _uninitialised(EmulatedRuntime))


def test_something_that_lacks_a_member_is_no_runtime():
    class Partial:
        vendor, device_count = "cuda", 1

        def profile(self, device):
            return None

    assert not isinstance(Partial(), Runtime) and not isinstance(Partial(), HostRuntime)


@pytest.mark.parametrize("name", SHARED)
def test_the_shared_launch_path_is_written_once(name):
    assert name in vars(DriverRuntime)
    for cls in (_cuda.CudaRuntime, _hip.HipRuntime):
        assert name not in vars(cls), f"{cls.__name__} carries its own {name}"


@pytest.mark.parametrize("cls", [_cuda.CudaRuntime, _hip.HipRuntime], ids=["cuda", "hip"])
def test_each_gpu_runtime_provides_what_the_shared_path_needs(cls):
    """Every hook DriverRuntime leaves to the adapter (a method raising NotImplementedError there) is
    given, and so are the entry points' names."""
    hooks = [n for n, v in vars(DriverRuntime).items()
             if inspect.isfunction(v) and "raise NotImplementedError" in inspect.getsource(v)]
    assert set(hooks) >= {"_steps", "_launch_one", "_switch_to", "_find_entry_point", "_describe_error"}
    for name in hooks:
        assert getattr(cls, name) is not getattr(DriverRuntime, name), f"{cls.__name__} lacks {name}"
    for name in ("LAUNCH_SYMBOL", "COOPERATIVE_SYMBOL", "MISSING_LAUNCH"):
        assert isinstance(getattr(cls, name), str) and getattr(cls, name), name


def test_the_call_path_probes_no_runtime_with_hasattr():
    """What a runtime offers is its protocol: the call path asks for it, never whether it is there."""
    from portable_softmax import _backward, _probe, api

    for module in (api, _backward, _probe, _runtime):
        source = inspect.getsource(module)
        assert "hasattr(rt" not in source and "getattr(rt" not in source, module.__name__


def test_the_runtime_module_docstring_runs():
    result = doctest.testmod(_runtime)
    assert result.attempted > 0 and result.failed == 0


def test_unknown_attribute_is_not_part_of_the_protocol():
    """The protocol is the members the call path uses: a module stand-in with all of them passes."""
    methods, data = _members(Runtime)
    stand_in = types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in methods}, vendor="cuda", device_count=1)
    assert isinstance(stand_in, Runtime)
    del stand_in.prepare
    assert not isinstance(stand_in, Runtime)

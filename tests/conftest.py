"""The shared suite's backends: cpu always; cuda / hip where a device is present; the
emulated warp-32 / warp-64 runs of the kernel source where the host compiler builds them."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest
from checks import SMALL_INPUT_OFF, tune_defaults

import portable_softmax as ps
from portable_softmax import _probe, api
from portable_softmax.planner import DeviceProfile, plan


def _gpu_status(vendor: str) -> str | None:
    try:
        _probe.runtime(vendor)
        return None
    except _probe.BackendUnavailableError as e:
        return f"no {vendor} device here ({e})"


def _emulation_status() -> tuple[dict, str | None]:
    from emulation import CompilerUnavailable, emulated_runtimes

    try:
        return emulated_runtimes(), None
    except CompilerUnavailable as e:  # only a missing compiler skips; a kernel that fails to build fails
        return {}, f"no host C++ compiler for the emulation: {e}"


_EMULATED, _EMULATION_SKIP = _emulation_status()
for _name, _runtime in _EMULATED.items():
    api.host_runtimes[_name] = _runtime


def _backend_params():
    params = [pytest.param("cpu", id="cpu")]
    for vendor in ("cuda", "hip"):
        reason = _gpu_status(vendor)
        marks = [pytest.mark.gpu] + ([pytest.mark.skip(reason=reason)] if reason else [])
        params.append(pytest.param(vendor, marks=marks, id=vendor))
    for name in ("emu32", "emu64"):
        marks = [] if name in _EMULATED else [pytest.mark.skip(reason=_EMULATION_SKIP or f"{name} not built")]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


BACKEND_PARAMS = _backend_params()


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request):
    """Run the test's host (numpy) inputs on one backend."""
    with ps.use_backend(request.param):
        yield request.param


def profile_of(backend: str) -> DeviceProfile:
    """The device whose tier boundaries a backend's shapes should straddle."""
    if backend in ("cuda", "hip"):
        rt = _probe.runtime(backend)
        return rt.profile(rt.current_device())
    if backend in _EMULATED:
        return _EMULATED[backend].profile(0)
    return DeviceProfile.h100()


@pytest.fixture
def rng(request):
    """A fresh generator per test; the seed is printed (shown on failure) and can be pinned
    with PORTABLE_SOFTMAX_TEST_SEED to replay a failure."""
    seed = int(os.environ.get("PORTABLE_SOFTMAX_TEST_SEED") or secrets.randbits(32))
    print(f"seed={seed} ({request.node.nodeid})")
    return np.random.default_rng(seed)


@pytest.fixture
def large_input_rules(monkeypatch):
    """The planner without its small-input rules wherever no Tuning is passed (the API's calls too),
    for tests that run a few rows through the tiers that larger inputs take."""
    tune_defaults(monkeypatch, **SMALL_INPUT_OFF)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Plans cached under a test's Tuning changes (checks.tune_defaults) do not outlive it."""
    yield
    plan.cache_clear()


def pytest_configure(config):
    """Capture log records of INFO and above unless --log-level (or the log_level ini option) says
    otherwise: torch's structured-trace logger (torch.__trace) logs at DEBUG always and does not
    propagate, and pytest attaches its capture handlers to such loggers too, so a failing test that
    compiled something would report hundreds of "DEBUG torch.__trace" lines."""
    if config.getoption("log_level") is None and not config.getini("log_level"):
        config.option.log_level = "INFO"


@pytest.fixture
def torch_repeat_path(monkeypatch):
    """api's repeat-call paths with torch seen, an empty launcher cache, and the current stream 7 on
    every device (torch's reader needs a GPU); CPU tensors stand in for CUDA ones."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    api.launchers.clear()
    monkeypatch.setattr(api, "_TORCH", torch)
    monkeypatch.setattr(api, "_TORCH_TENSOR", torch.Tensor)
    monkeypatch.setattr(api, "_torch_is_compiling", torch.compiler.is_compiling)
    monkeypatch.setattr(api, "_TORCH_FORWARD_AD", torch.autograd.forward_ad)
    monkeypatch.setattr(api, "_current_stream", lambda device: 7)
    yield torch
    api.launchers.clear()  # the recording launchers go with the test

"""Which backend runs host (numpy) arrays, and why: the probe behind backend_info().

Order: ``PORTABLE_SOFTMAX_BACKEND`` if set (cuda | hip | cpu), else the first of
cuda, hip that has a device, else cpu. Device arrays always run on the device
they live on, through that vendor's runtime.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:  # the runtimes' module loads the compiled launcher: only when a runtime opens
    from ._runtime import Runtime

BACKENDS = ("cuda", "hip", "cpu")
ENV_VAR = "PORTABLE_SOFTMAX_BACKEND"


class BackendUnavailableError(RuntimeError):
    pass


def _try_cuda() -> Runtime:
    from ._cuda import CudaRuntime

    rt = CudaRuntime()
    if rt.device_count < 1:
        raise BackendUnavailableError("cupy found no CUDA device")
    return rt


def _try_hip() -> Runtime:
    try:
        from ._hip import HipRuntime
    except ImportError as e:
        raise BackendUnavailableError(f"HIP runtime adapter unavailable: {e}") from None
    rt = HipRuntime()
    if rt.device_count < 1:
        raise BackendUnavailableError("hip-python found no HIP device")
    return rt


_OPENERS = {"cuda": _try_cuda, "hip": _try_hip}


@cache
def runtime(vendor: str) -> Runtime:
    """The runtime adapter of a vendor (cached), or BackendUnavailableError saying why not."""
    try:
        return _OPENERS[vendor]()
    except BackendUnavailableError:
        raise
    except Exception as e:  # ImportError, driver errors: all mean "cannot run here"
        raise BackendUnavailableError(f"{type(e).__name__}: {e}") from None


@cache
def _choice(forced: str | None) -> tuple[str, tuple[tuple[str, str], ...]]:
    reasons = []
    if forced:
        if forced not in BACKENDS:
            raise BackendUnavailableError(f"{ENV_VAR}={forced!r} is not one of {', '.join(BACKENDS)}")
        if forced == "cpu":
            return "cpu", ((forced, f"forced by {ENV_VAR}"),)
        try:
            runtime(forced)
        except BackendUnavailableError as e:
            raise BackendUnavailableError(f"{ENV_VAR}={forced} but that backend cannot run here: {e}") from None
        return forced, ((forced, f"forced by {ENV_VAR}"),)
    for vendor in ("cuda", "hip"):
        try:
            runtime(vendor)
            reasons.append((vendor, "chosen: a device is present"))
            return vendor, tuple(reasons)
        except BackendUnavailableError as e:
            reasons.append((vendor, f"not chosen: {e}"))
    reasons.append(("cpu", "chosen: no GPU backend can run"))
    return "cpu", tuple(reasons)


def host_backend() -> str:
    """The backend that computes numpy inputs: 'cuda', 'hip' or 'cpu'."""
    return _choice(os.environ.get(ENV_VAR) or None)[0]


def backend_info() -> dict:
    """The probe's report: backend, why, runtime versions, device and where kernels come from."""
    name, reasons = _choice(os.environ.get(ENV_VAR) or None)
    info: dict = {"backend": name, "why": dict(reasons), "package_version": __version__}
    if name == "cpu":
        import numpy

        from ._launch import launcher_status

        # what repeat calls of GPU arrays would launch through: a property of the installation
        info.update(runtime_package=f"numpy {numpy.__version__}", device="host CPU",
                    repeat_call_launcher=launcher_status())
        return info
    rt = runtime(name)
    dev = rt.current_device()
    prof = rt.profile(dev)
    info.update(rt.versions())
    info.update(
        device_index=dev,
        device=prof.name,
        arch=prof.arch,
        warp_size=prof.warp_size,
        multiprocessors=prof.multiprocessors,
        shared_mem_per_block=prof.shared_mem_per_block,
        shared_mem_per_block_optin=prof.shared_mem_per_block_optin,
        kernel_source=rt.kernel_source(dev, "float32"),
        jit_cache_dir=rt.cache_dir(),
        repeat_call_launcher=rt.launcher_kind(),
        cooperative_launch=rt.cooperative_launch(),
    )
    return info

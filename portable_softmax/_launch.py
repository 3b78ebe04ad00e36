"""Vendor-neutral pieces of a launch: kernel-parameter packing, the compiled launcher and the
kernel files.

``PackedArgs`` builds the ``void**`` array that cuLaunchKernel and hipModuleLaunchKernel both
take, from a plan's (kind, value) arguments. ``compiled_launcher`` wraps a plan's launches in
``_fastlaunch.Launcher`` (C), which replays them per call with new array pointers (x and y; dy, y
and dx for a gradient) and stream through either entry point, given by address: the two share one
C signature (and so do their cooperative forms, which launches whose blocks wait on each other take).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

from .planner import I32, I64, PTR, Plan

_CTYPES = {PTR: ctypes.c_void_p, I64: ctypes.c_int64, I32: ctypes.c_int32}

PACKAGE_DIR = Path(__file__).resolve().parent


def _kernel_dir() -> Path:
    """Where CMake installed code objects and kernel source: beside this file, or, for an
    editable install or a source checkout imported after `pip install`, in site-packages."""
    here = PACKAGE_DIR / "kernels"
    if here.is_dir():
        return here
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("portable_softmax").locate_file("portable_softmax/kernels")))
        if installed.is_dir():
            return installed
    except (PackageNotFoundError, ImportError, OSError):
        pass
    return here


#: installed by CMake: code objects and the kernel source for run-time compilation
KERNEL_DIR = _kernel_dir()


class PackedArgs:
    """Holds the C values and the pointer array for one launch."""

    def __init__(self, args, buffers: dict[str, int]):
        values = []
        for kind, value in args:
            if kind not in _CTYPES:
                raise ValueError(f"unknown kernel argument kind {kind!r}")
            if kind == PTR:
                if value not in buffers:
                    raise KeyError(f"the launch needs buffer {value!r}, which was not provided")
                value = buffers[value]
            values.append(_CTYPES[kind](value))
        self.values = values
        self.pointers = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
        )

    @property
    def address(self) -> int:
        return ctypes.addressof(self.pointers)


# ---- the compiled launcher ------------------------------------------------------------------------
#: the _fastlaunch.ABI this Python side is written against (portable_softmax/_fastlaunch.c)
FASTLAUNCH_ABI = 3
#: the previous ABI, still driven for x / y launchers: an extension built before pointer slots
#: (``Launcher(..., pointers=...)``), whose gradient launchers then launch from Python
FASTLAUNCH_ABI_XY = 2
#: the per-call pointers of a forward launcher
XY = ("x", "y")
#: "python" makes prepared launchers launch from Python even where the compiled one is available
LAUNCHER_ENV = "PORTABLE_SOFTMAX_LAUNCHER"
#: "1" launches the tiers whose blocks wait on each other cooperatively (cuLaunchCooperativeKernel,
#: hipModuleLaunchCooperativeKernel), which keeps each such grid resident whole beside other
#: kernels. Off by default: cooperative launches of the on-chip tiers are slower on long rows
#: (docs/design.md).
COOPERATIVE_ENV = "PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH"
#: read by the runtime adapters at each launch (Python path) and when they prepare a launcher
COOPERATIVE_LAUNCHES = os.environ.get(COOPERATIVE_ENV, "") == "1"


def _installed_fastlaunch() -> ModuleType | None:
    """The extension as `pip install` put it beside the installed package, for a source checkout
    that is imported ahead of it (``python -m pytest`` in the repository): the checkout holds only
    the C source."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("portable_softmax").locate_file("portable_softmax"))).resolve()
    except (PackageNotFoundError, ImportError, OSError):
        return None
    if installed == PACKAGE_DIR or not installed.is_dir():
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = installed / f"_fastlaunch{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"{__package__}._fastlaunch", path)
            if spec is None or spec.loader is None:
                continue
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[spec.name] = module  # later imports of the name get this one
            return module
    return None


def _load_fastlaunch() -> tuple[ModuleType | None, str]:
    try:
        from . import _fastlaunch as module
    except ImportError as e:
        try:
            module = _installed_fastlaunch()
        except Exception as e2:  # found but not loadable (another platform's build, say)
            return None, f"the installed _fastlaunch does not load: {e2}"
        if module is None:
            built = _build_info().get("fastlaunch")
            if built is False:
                return None, "the package was built without _fastlaunch"
            return None, f"_fastlaunch is not importable: {e}"
    if getattr(module, "ABI", None) not in (FASTLAUNCH_ABI, FASTLAUNCH_ABI_XY):
        return None, f"{module.__file__} has ABI {getattr(module, 'ABI', None)}, this package needs {FASTLAUNCH_ABI}"
    return module, str(module.__file__)


def _build_info() -> dict:
    import json

    try:
        return json.loads((KERNEL_DIR / "build_info.json").read_text())
    except (OSError, ValueError):
        return {}


_FASTLAUNCH, _FASTLAUNCH_WHERE = _load_fastlaunch()


def fastlaunch_module() -> ModuleType | None:
    """The compiled launcher module (``_fastlaunch``), or None where it is not available here."""
    return _FASTLAUNCH


def launcher_status() -> str:
    """Which launcher prepared repeat calls use: 'compiled (PATH)', or 'python (WHY)'."""
    if os.environ.get(LAUNCHER_ENV, "").lower() == "python":
        return f"python ({LAUNCHER_ENV}=python)"
    if _FASTLAUNCH is None:
        return f"python ({_FASTLAUNCH_WHERE})"
    return f"compiled ({_FASTLAUNCH_WHERE})"


def launcher_kind(entry_point: int | None, missing: str) -> str:
    """launcher_status() for a runtime whose launch entry point is ``entry_point``: 'python
    (``missing``)' where the compiled launcher is there but the entry point was not found."""
    status = launcher_status()
    if status.startswith("compiled") and not entry_point:
        return f"python ({missing})"
    return status


def cooperative_launch_status(available: bool, missing: str, entry: str) -> str:
    """How a runtime launches the steps whose blocks wait on each other: 'plain (why)', or
    'cooperative (``entry``)' where they are asked for and ``available`` (else ``missing`` says why)."""
    if not COOPERATIVE_LAUNCHES:
        return f"plain (the default; {COOPERATIVE_ENV}=1 makes them cooperative)"
    if not available:
        return f"plain ({missing}: such launches rely on no other such launch running beside them)"
    return f"cooperative ({entry}: all blocks resident at once)"


def compiled_steps(plan: Plan, functions: Sequence[int], grids: Sequence[int],
                   buffers: Mapping[str, int] | None = None, cooperative: bool = False,
                   pointers: tuple[str, ...] = XY) -> list[tuple]:
    """A plan's launches as ``_fastlaunch.Launcher`` steps.

    ``functions`` and ``grids`` hold each launch's function handle and the grid the runtime
    launches it with (after ``one_wave``). Buffer arguments not named in ``pointers`` (scratch)
    take their address from ``buffers``; those in ``pointers`` stay names, filled on every call.
    ``cooperative``: launches whose blocks wait on each other (Launch.cooperative) take the
    cooperative entry point; False: every launch takes the plain one.
    """
    if not (len(plan.launches) == len(functions) == len(grids)):
        raise ValueError(f"{len(plan.launches)} launches, {len(functions)} functions, {len(grids)} grids")
    buffers = buffers or {}
    steps = []
    for step, fn, grid in zip(plan.launches, functions, grids):
        args = []
        for kind, value in step.args:
            if kind == PTR and value not in pointers:
                if value not in buffers:
                    raise KeyError(f"the launch needs buffer {value!r}, which was not provided")
                value = buffers[value]
            args.append((kind, value))
        steps.append((step.kernel, int(fn), int(grid), step.block, step.shared_mem, tuple(args),
                      bool(cooperative and step.cooperative)))
    return steps


def compiled_launcher(entry_point: int | None, plan: Plan, functions: Sequence[int], grids: Sequence[int],
                      buffers: Mapping[str, int] | None = None,
                      describe: Callable[[int], str] | None = None,
                      cooperative_entry_point: int | None = None,
                      pointers: tuple[str, ...] = XY):
    """A ``_fastlaunch.Launcher`` for the plan over the launch entry point at ``entry_point``
    (cuLaunchKernel or hipModuleLaunchKernel), called as ``launcher(*pointer_values, stream)`` with
    the buffers named in ``pointers``; or None where the compiled launcher is not available (or
    takes x and y only, and ``pointers`` names others), the entry point is unknown, or
    PORTABLE_SOFTMAX_LAUNCHER=python asks for Python.

    Cooperative launches take ``cooperative_entry_point`` (cuLaunchCooperativeKernel or
    hipModuleLaunchCooperativeKernel) where one is given, else the plain entry point.
    ``describe(code)`` names a failed launch's status in the LaunchError it raises.
    """
    if _FASTLAUNCH is None or not entry_point or os.environ.get(LAUNCHER_ENV, "").lower() == "python":
        return None
    slots = pointers != XY
    if slots and _FASTLAUNCH.ABI == FASTLAUNCH_ABI_XY:
        return None
    steps = compiled_steps(plan, functions, grids, buffers, cooperative=bool(cooperative_entry_point),
                           pointers=pointers)
    if slots:
        return _FASTLAUNCH.Launcher(entry_point, steps, describe, cooperative_entry_point or None, pointers=pointers)
    return _FASTLAUNCH.Launcher(entry_point, steps, describe, cooperative_entry_point or None)


def source_dir(vendor: str) -> Path:
    """Kernel source for JIT: installed copy first, else the source tree's."""
    installed = KERNEL_DIR / ("src_hip" if vendor == "hip" else "src_cuda")
    if installed.is_dir():
        return installed
    return PACKAGE_DIR.parent / ("src_hip" if vendor == "hip" else "src_cuda")


def inline_source(path: Path) -> str:
    """The source with its local #include "..." lines replaced by the files, once each.

    A self-contained text makes the run-time compiler's disk cache key cover the
    headers too, so an upgraded header can never reuse a stale binary.
    """
    seen: set[Path] = set()

    def expand(p: Path) -> list[str]:
        if p in seen:
            return []
        seen.add(p)
        out = []
        for line in p.read_text().splitlines():
            stripped = line.strip()
            target = p.parent / stripped.split('"')[1] if stripped.startswith('#include "') else None
            if target is not None and target.is_file():
                out += expand(target)
            elif stripped == "#pragma once":
                continue
            else:
                out.append(line)
        return out

    return "\n".join(expand(path)) + "\n"

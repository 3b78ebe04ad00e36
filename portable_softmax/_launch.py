"""Vendor-neutral pieces of a launch: kernel-parameter packing and the kernel files.

``pack_args`` builds the ``void**`` array that cuLaunchKernel and
hipModuleLaunchKernel both take, from a plan's (kind, value) arguments.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from .planner import I32, I64, PTR

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

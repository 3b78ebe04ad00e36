"""SIMT emulation of the kernel source on the CPU at warp 32 and warp 64 (see README.md)."""

from .build import BuildError, CompilerUnavailable, build_library
from .runtime import EmulatedRuntime, EmulationError, EmulationLibrary, emulated_runtimes, load_library

__all__ = [
    "BuildError",
    "CompilerUnavailable",
    "EmulatedRuntime",
    "EmulationError",
    "EmulationLibrary",
    "build_library",
    "emulated_runtimes",
    "load_library",
]

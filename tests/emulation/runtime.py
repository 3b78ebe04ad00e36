"""Emulated GPU runtimes: the kernel source run on the CPU at warp 32 and warp 64.

``emulated_runtimes()`` gives runtimes that duck-type what
``portable_softmax.api.run_host_array`` needs (``current_device``, ``profile``,
``run_host``), so the shared test suite can select them as backends "emu32" and
"emu64" next to "cpu", "cuda" and "hip".
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from functools import cache
from pathlib import Path

import numpy as np

from portable_softmax import _variants as V
from portable_softmax._launch import PackedArgs
from portable_softmax.planner import I32, I64, PTR, DeviceProfile, Plan, PlanError, one_wave, resident_launch

from .build import SRC_CUDA, BuildError, build_library

#: the letters the library's registry uses for the planner's argument kinds
_KIND_LETTERS = {PTR: "p", I64: "q", I32: "i"}
#: staging buffers start 256-byte aligned, like device allocations
_ALIGN = 256
#: bytes of NaN on either side of every buffer: reads there poison the result, writes there are caught
_GUARD = 256
_POISON = 0xFF  # all-ones bytes are NaN in float16, bfloat16, float32 and float64


class EmulationError(RuntimeError):
    """A kernel broke a SIMT rule (divergent shuffle, missed barrier) or the launch was malformed."""


class EmulationLibrary:
    """The compiled kernels and SIMT runtime (``emulation_runtime.cpp``), through ctypes."""

    def __init__(self, path: Path, threads: int | None = None):
        self.path = Path(path)
        lib = ctypes.CDLL(str(self.path))
        lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                   ctypes.c_size_t, ctypes.c_void_p]
        lib.emu_launch.restype = ctypes.c_int
        lib.emu_last_error.restype = ctypes.c_char_p
        lib.emu_kernel_count.restype = ctypes.c_int
        lib.emu_kernel_name.argtypes = [ctypes.c_int]
        lib.emu_kernel_name.restype = ctypes.c_char_p
        lib.emu_set_threads.argtypes = [ctypes.c_int]
        lib.emu_set_spin_timeout_ms.argtypes = [ctypes.c_long]
        for name in ("emu_half_to_float", "emu_float_to_half", "emu_bfloat16_to_float", "emu_float_to_bfloat16"):
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self._lib = lib
        if threads is None:
            threads = int(os.environ.get("PORTABLE_SOFTMAX_EMU_THREADS", os.cpu_count() or 1))
        lib.emu_set_threads(max(1, threads))

    def set_spin_timeout(self, seconds: float) -> None:
        """How long blocks may spin-wait on each other, all started, before the launch fails (default 20 s)."""
        self._lib.emu_set_spin_timeout_ms(int(seconds * 1000))

    def kernel_names(self) -> list[str]:
        return [self._lib.emu_kernel_name(i).decode() for i in range(self._lib.emu_kernel_count())]

    def launch(self, kernel: str, warp: int, grid: int, block: int, shared_mem: int, args, buffers: dict[str, int]):
        """Run ``kernel`` with the planner's (kind, value) ``args``, pointers taken from ``buffers``."""
        packed = PackedArgs(args, buffers)
        kinds = "".join(_KIND_LETTERS[kind] for kind, _ in args)
        if self._lib.emu_launch(kernel.encode(), kinds.encode(), warp, grid, block, shared_mem, packed.address):
            raise EmulationError(self._lib.emu_last_error().decode())

    def convert(self, function: str, values: np.ndarray, out_dtype) -> np.ndarray:
        """Apply one of the header's 16-bit conversions (``emu_float_to_half`` ...) elementwise."""
        values = np.ascontiguousarray(values)
        out = np.empty(values.shape, out_dtype)
        getattr(self._lib, function)(values.ctypes.data, out.ctypes.data, values.size)
        return out


class GuardedBuffer:
    """Aligned host memory between two NaN guard zones; the payload starts as ``fill`` bytes (NaN)."""

    def __init__(self, nbytes: int, offset: int = 0, fill: int = _POISON):
        self.nbytes, self.offset = nbytes, offset
        self._raw = np.full(nbytes + offset + 2 * _GUARD + _ALIGN, _POISON, np.uint8)
        start = -(self._raw.ctypes.data + _GUARD) % _ALIGN + _GUARD
        self._region = self._raw[start - _GUARD:start + offset + nbytes + _GUARD]
        self.address = self._raw.ctypes.data + start + offset
        self.payload[...] = fill

    @property
    def payload(self) -> np.ndarray:
        return self._region[_GUARD + self.offset:_GUARD + self.offset + self.nbytes]

    def check_guards(self, name: str) -> None:
        front, back = self._region[:_GUARD + self.offset], self._region[_GUARD + self.offset + self.nbytes:]
        for side, zone in (("before", front), ("after", back)):
            if np.any(zone != _POISON):
                raise EmulationError(f"a kernel wrote {side} buffer {name!r} ({self.nbytes} bytes)")


class EmulatedRuntime:
    """A host backend whose kernels run in the SIMT emulation with warps of ``warp_size`` lanes."""

    vendor = "emulated"

    def __init__(self, library: EmulationLibrary, warp_size: int, **limits):
        """``limits`` override the small default limits below (DeviceProfile fields)."""
        self.library = library
        # Small limits let small shapes reach every tier: rows of a few thousand elements leave
        # the register tier for the block tier, rows above ~24 KiB split over up to four
        # co-resident blocks, longer ones stream twice; 256 threads is the largest block the
        # fixed-size tiers launch.
        self._profile = DeviceProfile(
            name=f"emulated warp {warp_size}",
            vendor="emulated",
            arch="host",
            warp_size=warp_size,
            multiprocessors=4,
            max_threads_per_block=256,
            shared_mem_per_block=24 * 1024,
            shared_mem_per_block_optin=24 * 1024,
            max_threads_per_multiprocessor=1024,
            shared_mem_per_multiprocessor=48 * 1024,
        )
        if limits:
            self._profile = dataclasses.replace(self._profile, **limits)

    def current_device(self) -> int:
        return 0

    def profile(self, device: int) -> DeviceProfile:
        return self._profile

    def versions(self) -> dict[str, str]:
        return {"runtime_package": f"SIMT emulation ({self.library.path})"}

    def run_host(self, x: np.ndarray, plan: Plan, dtype: str, device: int) -> np.ndarray:
        """A C-contiguous host array through the plan's launches; the result has x's dtype and shape."""
        return self.run_plan(x, plan)

    def run_plan(self, x: np.ndarray, plan: Plan, x_offset: int = 0, y_offset: int = 0) -> np.ndarray:
        """Like ``run_host``, with the input and output starting ``x_offset`` / ``y_offset`` elements past
        an aligned address (plan with the matching ``x_misalign`` / ``y_misalign``)."""
        return self._run(plan, {"x": (x, x_offset)}, ("y", y_offset))

    def run_backward(self, dy: np.ndarray, y: np.ndarray, plan: Plan, offsets: tuple[int, int, int] = (0, 0, 0),
                     into: str | None = None) -> np.ndarray:
        """dx of a gradient plan (planner_backward) for C-contiguous dy and y, each array starting
        ``offsets`` (dy, y, dx) elements past an aligned address; the guard and scratch checks of run_plan.
        ``into`` ("dy" or "y"): dx written over that input, as a call with out= one of them runs."""
        inputs = {"dy": (dy, offsets[0]), "y": (y, offsets[1])}
        if into is None:
            return self._run(plan, inputs, ("dx", offsets[2]))
        return self._run(plan, inputs, (into, inputs[into][1]), aliases={"dx": into})

    def _run(self, plan: Plan, inputs: dict[str, tuple[np.ndarray, int]], output: tuple[str, int],
             aliases: dict[str, str] | None = None) -> np.ndarray:
        """The plan's launches over guarded copies of ``inputs`` (name -> (array, offset in elements)) and a
        poisoned output buffer of the first input's shape (or, where ``output`` names an input, that input's
        buffer, the launch arguments ``aliases`` names pointing at it); the guards, the scratch left zero
        where the plan says so, and the inputs left as they were (but one written over) are checked."""
        arrays = {name: np.ascontiguousarray(a) for name, (a, _) in inputs.items()}
        like = next(iter(arrays.values()))
        buffers = {}
        for name, (_, offset) in inputs.items():
            buffers[name] = GuardedBuffer(like.nbytes, offset * like.itemsize)
            buffers[name].payload[...] = arrays[name].reshape(-1).view(np.uint8)
        out_name, out_offset = output
        if out_name not in buffers:
            buffers[out_name] = GuardedBuffer(like.nbytes, out_offset * like.itemsize)
        for name, nbytes in plan.scratch:  # zero where the plan reads it as zero, else poison (NaN bytes)
            buffers[name] = GuardedBuffer(nbytes, fill=0 if plan.scratch_zeroed else _POISON)
        addresses = {name: buf.address for name, buf in buffers.items()}
        addresses.update({arg: addresses[name] for arg, name in (aliases or {}).items()})
        for step in plan.launches:
            step = resident_launch(step, lambda kernel, block, step=step: self._blocks_per_multiprocessor(step, block))
            self._check_fits(step)
            grid = self.resident_grid(step) if step.cooperative else step.grid
            self.library.launch(step.kernel, self._profile.warp_size, grid, step.block, step.shared_mem,
                                step.args, addresses)
        for name, buf in buffers.items():
            buf.check_guards(name)
        if plan.scratch_zeroed:  # the next call on the stream reuses it unfilled
            for name, _ in plan.scratch:
                if np.any(buffers[name].payload != 0):
                    raise EmulationError(f"the launches left scratch {name!r} not zero "
                                         f"({int(np.count_nonzero(buffers[name].payload))} bytes)")
        for name, array in arrays.items():
            if name != out_name and not np.array_equal(buffers[name].payload, array.reshape(-1).view(np.uint8)):
                raise EmulationError(f"a kernel wrote into its input {name}")
        return buffers[out_name].payload.view(like.dtype).reshape(like.shape).copy()

    def resident_grid(self, step) -> int:
        """The grid cut to the blocks this profile keeps resident, as the GPU runtimes cut it for
        launches whose blocks wait on each other (the emulation itself runs any number at once)."""
        try:
            return one_wave(step, self._blocks_per_multiprocessor(step, step.block), self._profile.multiprocessors)
        except PlanError as exc:
            raise EmulationError(str(exc)) from exc

    def _blocks_per_multiprocessor(self, step, block: int) -> int:
        """Blocks of ``block`` threads a multiprocessor of the profile holds, by threads and shared
        memory (the emulation knows no registers: it takes a block a row's fitted kernel and block
        wherever they hold more blocks by threads, so that the suites run those kernels)."""
        p = self._profile
        # what a block occupies beside its dynamic shared memory: reduction scratch and the runtime's 1 KiB
        static_bytes = 2 * (1024 // p.warp_size) * 8 + 1024
        return min(p.max_threads_per_multiprocessor // block,
                   p.shared_mem_per_multiprocessor // (step.shared_mem + static_bytes))

    def _check_fits(self, step) -> None:
        """A launch a real device of this profile would refuse is a planner bug."""
        p = self._profile
        if not (1 <= step.block <= p.max_threads_per_block and step.shared_mem <= p.shared_mem_per_block_optin
                and 1 <= step.grid <= p.max_grid_x):
            raise EmulationError(f"{step.kernel}: grid {step.grid} x block {step.block} with {step.shared_mem} "
                                 f"bytes of shared memory does not fit the profile {p}")


@cache
def load_library(src_dir: Path = SRC_CUDA, dtypes: tuple[str, ...] = tuple(V.DTYPES),
                 defines: tuple[str, ...] = ()) -> EmulationLibrary:
    """The emulation library of ``src_dir`` for ``dtypes`` (kernels compiled with ``defines``),
    built on first use (once per process)."""
    return EmulationLibrary(build_library(Path(src_dir), dtypes, defines=defines))


def emulated_runtimes() -> dict[str, EmulatedRuntime]:
    """{"emu32": ..., "emu64": ...}; RuntimeError (BuildError) with the reason if the library cannot be built."""
    try:
        library = load_library()
    except OSError as exc:
        raise BuildError(f"the emulation library does not load: {exc}") from exc
    return {f"emu{warp}": EmulatedRuntime(library, warp) for warp in V.WARP_SIZES}

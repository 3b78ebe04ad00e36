"""What the call path asks of a runtime, and the parts the CUDA and HIP runtimes share.

``Runtime`` is the protocol a GPU runtime adapter implements (``_cuda.CudaRuntime`` through cupy,
``_hip.HipRuntime`` through hip-python); ``HostRuntime`` the smaller one of a backend that takes
host arrays and stages them itself (the emulated warp-32/64 runtimes of the tests register as one
in ``api.host_runtimes``). ``DriverRuntime`` holds what both GPU adapters do alike: the launch of a
plan, the prepared launcher of repeat calls (compiled, or the Python fallback) and the lookup of
the launch entry points; each adapter adds its vendor's calls.

>>> from portable_softmax._runtime import Runtime, DriverRuntime
>>> from portable_softmax._hip import HipRuntime
>>> issubclass(HipRuntime, DriverRuntime) and all(hasattr(HipRuntime, m) for m in ("launch", "prepare"))
True
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import _launch
from ._launch import XY, PackedArgs, compiled_launcher, cooperative_launch_status, launcher_kind
from .planner import PTR, DeviceProfile, Launch, Plan, one_wave, resident_launch

#: a prepared launcher: launcher(x_ptr, y_ptr, stream) replays a plan's launches (a gradient's:
#: launcher(dy_ptr, y_ptr, dx_ptr, stream))
Launcher = Callable[..., None]



@runtime_checkable
class HostRuntime(Protocol):
    """A backend that computes host (numpy) arrays on its own kernels, staging them."""

    def current_device(self) -> int: ...

    def profile(self, device: int) -> DeviceProfile: ...

    def versions(self) -> dict[str, str]: ...

    def run_host(self, x: np.ndarray, plan: Plan, dtype: str, device: int) -> np.ndarray:
        """The plan's launches over a C-contiguous host array: the result of x's shape and dtype."""
        ...

    def run_backward(self, dy: np.ndarray, y: np.ndarray, plan: Plan) -> np.ndarray:
        """A gradient plan's launches over C-contiguous host arrays dy and y: dx."""
        ...


@runtime_checkable
class Runtime(Protocol):
    """A GPU runtime adapter: what the public calls, the gradients and the repeat-call launchers use."""

    vendor: str  # "cuda" | "hip"
    device_count: int

    def current_device(self) -> int: ...

    def profile(self, device: int) -> DeviceProfile: ...

    def versions(self) -> dict[str, str]: ...

    def function(self, device: int, dtype: str, name: str, shared_mem: int = 0) -> Any:
        """The handle of kernel ``name`` of a dtype's module on ``device``, able to take ``shared_mem``
        bytes of dynamic shared memory."""
        ...

    def resident_step(self, step: Launch, dtype: str, device: int) -> Launch:
        """``step`` with the kernel, block and grid it launches with on ``device``
        (planner.resident_launch with the kernels' occupancy there)."""
        ...

    def resident_grid(self, fn: Any, step: Launch, device: int) -> int:
        """The grid ``step`` launches with (cut to one wave where its blocks wait on each other)."""
        ...

    def launch(self, plan: Plan, dtype: str, buffers: dict[str, int], stream: int, device: int) -> None:
        """The plan's launches on ``stream`` of ``device`` with the named buffers' addresses."""
        ...

    def prepare(self, plan: Plan, dtype: str, device: int, buffers: Mapping[str, int] | None = None,
                pointers: tuple[str, ...] = XY) -> Launcher:
        """A launcher for repeat calls of the plan, ``launcher(*pointer_values, stream)`` with the
        buffers named in ``pointers``; ``buffers`` holds its scratch addresses."""
        ...

    def synchronize_stream(self, device: int, stream: int) -> None: ...

    def run_host(self, x: np.ndarray, plan: Plan, dtype: str, device: int) -> np.ndarray: ...

    def kernel_source(self, device: int, dtype: str) -> str: ...

    def cache_dir(self) -> str: ...

    def launcher_kind(self) -> str:
        """Which launcher prepare() returns: 'compiled (PATH)' or 'python (WHY)'."""
        ...

    def cooperative_launch(self) -> str:
        """How launches whose blocks wait on each other are made: 'cooperative (...)' or 'plain (why)'."""
        ...


class DriverRuntime:
    """The launch path both GPU adapters share. An adapter provides its vendor's calls:

    - ``_steps(plan, dtype, device)``: (function handle, grid, step) of each launch;
    - ``_launch_one(fn, grid, block, shared_mem, stream, params, cooperative)``: one launch;
    - ``_switch_to(device)``: a context in which ``device`` is current, the previous one after;
    - ``_find_entry_point(symbol)``: the address of a driver launch function, or None;
    - ``_has_cooperative_call()``: whether launches whose blocks wait on each other can be made
      (``_cooperative_available()``, what ``cooperative_launch`` reports, may refine it);
    - ``_missing_cooperative()``: why not, where they cannot;
    - ``_describe_error(code)``: the name and text of a failed launch's status;

    and the class attributes naming its two entry points and why the first may be missing. The
    entry points are looked up once: ``_entry_point`` and ``_cooperative_entry_point`` hold None
    until then, 0 where none was found.
    """

    vendor: str
    device_count: int
    LAUNCH_SYMBOL: str  # cuLaunchKernel, hipModuleLaunchKernel
    COOPERATIVE_SYMBOL: str  # cuLaunchCooperativeKernel, hipModuleLaunchCooperativeKernel
    MISSING_LAUNCH: str  # why LAUNCH_SYMBOL may not be found
    _entry_point: int | None
    _cooperative_entry_point: int | None

    # ---- what each adapter provides -------------------------------------------------------------
    def current_device(self) -> int:
        raise NotImplementedError

    def _steps(self, plan: Plan, dtype: str, device: int) -> list[tuple[Any, int, Launch]]:
        raise NotImplementedError

    def _launch_one(self, fn: Any, grid: int, block: int, shared_mem: int, stream: int, params: int,
                    cooperative: bool) -> None:
        raise NotImplementedError

    def _switch_to(self, device: int) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def _find_entry_point(self, symbol: str) -> int | None:
        raise NotImplementedError

    def _has_cooperative_call(self) -> bool:
        raise NotImplementedError

    def _missing_cooperative(self) -> str:
        raise NotImplementedError

    def _cooperative_available(self) -> bool:
        return self._has_cooperative_call()

    def _describe_error(self, code: int) -> str:
        raise NotImplementedError

    def _handle(self, device: int, dtype: str, kernel: str, shared_mem: int) -> Any:
        """The kernel's function handle, able to take ``shared_mem`` bytes of dynamic shared memory."""
        raise NotImplementedError

    def _blocks_per_multiprocessor(self, fn: Any, kernel: str, block: int, shared_mem: int, device: int) -> int:
        """The kernel's occupancy: its blocks of ``block`` threads (and ``shared_mem`` bytes) that a
        multiprocessor of ``device`` holds at once."""
        raise NotImplementedError

    # ---- shared ---------------------------------------------------------------------------------
    def resident_step(self, step: Launch, dtype: str, device: int) -> Launch:
        """``step`` with the kernel, block and grid it launches with (planner.resident_launch with the
        device's occupancy for its kernels)."""
        def blocks_at(kernel: str, block: int) -> int:
            fn = self._handle(device, dtype, kernel, step.shared_mem)
            return self._blocks_per_multiprocessor(fn, kernel, block, step.shared_mem, device)

        return resident_launch(step, blocks_at)

    def resident_grid(self, fn: Any, step: Launch, device: int) -> int:
        """planner.one_wave with the device's occupancy for this kernel, block and shared memory."""
        return one_wave(step, self._blocks_per_multiprocessor(fn, step.kernel, step.block, step.shared_mem, device),
                        self.profile(device).multiprocessors)

    def bind(self, device: int) -> None:
        """Make sure the calling thread holds the device's context where it already reports the device
        (a driver launch needs one): nothing where the vendor binds it itself."""

    def _on(self, device: int) -> contextlib.AbstractContextManager:
        """A context in which ``device`` is current: bound where it is already."""
        if self.device_count == 1 or self.current_device() == device:
            self.bind(device)
            return contextlib.nullcontext()
        return self._switch_to(device)

    def launch(self, plan: Plan, dtype: str, buffers: dict[str, int], stream: int, device: int) -> None:
        with self._on(device):
            for fn, grid, step in self._steps(plan, dtype, device):
                packed = PackedArgs(step.args, buffers)
                self._launch_one(fn, grid, step.block, step.shared_mem, stream, packed.address, step.cooperative)

    def launch_entry_point(self) -> int | None:
        """The plain launch entry point's address for the compiled launcher (looked up once)."""
        if self._entry_point is None:
            self._entry_point = self._find_entry_point(self.LAUNCH_SYMBOL) or 0
        return self._entry_point or None

    def cooperative_entry_point(self) -> int | None:
        """The cooperative launch entry point's address for the compiled launcher (looked up once);
        None where the Python path launches such steps plainly too (cooperative launches not asked
        for, or the runtime cannot make them), so that both paths launch alike."""
        if not _launch.COOPERATIVE_LAUNCHES:
            return None
        if self._cooperative_entry_point is None:
            found = self._find_entry_point(self.COOPERATIVE_SYMBOL) if self._has_cooperative_call() else None
            self._cooperative_entry_point = found or 0
        return self._cooperative_entry_point or None

    def cooperative_launch(self) -> str:
        """How launches whose blocks wait on each other are made: 'cooperative (...)' or 'plain (why)'."""
        return cooperative_launch_status(self._cooperative_available(), self._missing_cooperative(),
                                         self.COOPERATIVE_SYMBOL)

    def launcher_kind(self) -> str:
        """Which launcher prepare() returns: 'compiled (PATH)' or 'python (WHY)'."""
        return launcher_kind(self.launch_entry_point(), self.MISSING_LAUNCH)

    def prepare(self, plan: Plan, dtype: str, device: int, buffers: Mapping[str, int] | None = None,
                pointers: tuple[str, ...] = XY) -> Launcher:
        """A launcher for repeat calls of one plan: ``launcher(*pointer_values, stream)``, the values of
        the buffers named in ``pointers`` in that order (by default ``launcher(x_ptr, y_ptr, stream)``).
        ``buffers`` holds the addresses of the plan's scratch buffers, which every call uses.

        It launches from C (``_fastlaunch``) where that module is built, else from Python; either way
        on ``device``, made current for the call where it is not.
        """
        with self._on(device):
            steps = self._steps(plan, dtype, device)
        entry_point, fast = self.launch_entry_point(), None
        if entry_point:  # handles become integers only where a real runtime made them
            made = replace(plan, launches=tuple(step for _, _, step in steps))  # blocks as launched
            fast = compiled_launcher(entry_point, made, [int(fn) for fn, _, _ in steps], [g for _, g, _ in steps],
                                     buffers, describe=self._describe_error,
                                     cooperative_entry_point=self.cooperative_entry_point(), pointers=pointers)
        if fast is not None:
            launch = fast.launch  # the bound C method: no argument tuple per call
            if self.device_count == 1:
                return launch  # one device: it is the current one
            current_device, switch_to = self.current_device, self._switch_to

            def launcher(*args: int) -> None:
                if current_device() != device:
                    with switch_to(device):
                        return launch(*args)
                return launch(*args)

            return launcher
        return self._python_launcher(steps, device, buffers, pointers)

    def _python_launcher(self, steps: list[tuple[Any, int, Launch]], device: int,
                         buffers: Mapping[str, int] | None, pointers: tuple[str, ...] = XY) -> Launcher:
        """The prepared launcher without the compiled module: the packed arguments made once, the
        pointers named in ``pointers`` written into them per call."""
        prepared = []
        for fn, grid, step in steps:
            packed = PackedArgs(step.args, {**(buffers or {}), **dict.fromkeys(pointers, 0)})
            slots = tuple(tuple(i for i, (kind, name) in enumerate(step.args) if kind == PTR and name == pointer)
                          for pointer in pointers)
            prepared.append((fn, grid, step.block, step.shared_mem, packed, slots, step.cooperative))
        launch_one, on, lock, count = self._launch_one, self._on, threading.Lock(), len(pointers) + 1

        def launcher(*args: int) -> None:
            if len(args) != count:
                raise TypeError(f"the launcher takes {count} arguments ({', '.join(pointers)}, stream); "
                                f"got {len(args)}")
            stream = args[-1]
            with on(device), lock:  # the packed values are shared by the threads calling this launcher
                for fn, grid, block, smem, packed, slots, cooperative in prepared:
                    values = packed.values
                    for at, pointer in zip(slots, args):
                        for i in at:
                            values[i].value = pointer
                    launch_one(fn, grid, block, smem, stream, packed.address, cooperative)

        return launcher

"""Host time per call of the pieces of a repeat softmax call on a small torch CUDA tensor.

    python3 tools/host_cost.py [calls]

Each piece gets two figures: the wall time per call of many back-to-back calls with one
synchronisation at the end, and the host time per call of a few hundred calls queued behind a
long GPU sleep (so that no call waits for the GPU); the pieces show where a call's time goes.
Medians of five passes over all the pieces.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import portable_softmax as ps
from portable_softmax import _probe, api
from portable_softmax._arrays import torch_current_stream
from portable_softmax.bench import back_to_back_us


def host_us(fn, queued: int = 400) -> float:
    """Host time per call of `queued` calls (fewer than the launch queue holds) queued behind a GPU
    sleep, so that no call waits for the GPU."""
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the calls
    t = time.perf_counter()
    for _ in range(queued):
        fn()
    host = (time.perf_counter() - t) / queued * 1e6
    torch.cuda.synchronize()
    return host


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall time per call of back-to-back calls, host time per call with the GPU held busy)."""
    return back_to_back_us(torch, fn, calls, warmup=50), host_us(fn)


def softmax_as_at_bbe90ad(x, axis=-1, *, out=None, safe=False):
    """The repeat call's control flow as at bbe90ad, from api's pieces: softmax -> _apply, which
    checked out, requires_grad, compiling and torch's functorch-wrapper test, -> the prepared path."""
    if (type(x) is torch.Tensor and out is None and not x.requires_grad and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(x)):
        if type(axis) is int:
            ptr, device = x.data_ptr(), x.get_device()
            entry = api._prepared.get((x.dtype, x.shape, x.stride(), ptr & 15, axis, "softmax", bool(safe), device))
            if entry is not None:
                launcher, contiguous, bound_to, _ = entry
                stream = api._current_stream(device)
                y = torch.empty_like(x)
                launcher(ptr, y.data_ptr(), stream)
                return y
    raise RuntimeError("not the repeat path")


def main(calls: int) -> None:
    x = torch.randn(8, 1000, device="cuda")
    y = torch.empty_like(x)
    ps.softmax(x)  # plans and prepares the repeat path
    key = api._prepared_key(x, -1, "softmax", False)
    launcher = api._prepared[key][0]
    stream = torch_current_stream(torch, 0)
    rt = _probe.runtime("cuda")
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    shape, strides, dtype, device = x.shape, x.stride(), x.dtype, x.device
    pieces = {
        "torch.softmax(x)": lambda: torch.softmax(x, dim=-1),
        "ps.softmax(x)": lambda: ps.softmax(x),
        "ps.softmax(x) as at bbe90ad": lambda: softmax_as_at_bbe90ad(x),
        "api._run_prepared(x, ...)": lambda: api._run_prepared(x, -1, "softmax", None, False),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "is_functorch_wrapped_tensor(x)": lambda: wrapped(x),
        "x.requires_grad": lambda: x.requires_grad,
        "x.shape, x.stride()": lambda: (x.shape, x.stride()),
        "torch.empty(shape)": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "x.new_empty(shape)": lambda: x.new_empty(shape),
        "torch.empty_strided(...)": lambda: torch.empty_strided(shape, strides, dtype=dtype, device=device),
        "x.new_empty_strided(...)": lambda: x.new_empty_strided(shape, strides),
        "_is_torch_cuda(x)": lambda: api._is_torch_cuda(x),
        "_prepared_key(x)": lambda: api._prepared_key(x, -1, "softmax", False),
        "x.data_ptr()": lambda: x.data_ptr(),
        "torch_current_stream": lambda: torch_current_stream(torch, 0),
        "rt.current_device()": lambda: rt.current_device(),
        "empty_like(contiguous)": lambda: torch.empty_like(x, memory_format=torch.contiguous_format),
        "launcher(x, y, stream)": lambda: launcher(x.data_ptr(), y.data_ptr(), stream),
    }
    passes = 5  # every piece once a pass, so that the host's drift falls on all of them alike
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in pieces}
    for _ in range(passes):
        for name, fn in pieces.items():
            times[name].append(per_call_us(fn, calls))
    print(f"medians of {passes} passes:")
    for name, measured in times.items():
        wall, host = (statistics.median(m[i] for m in measured) for i in (0, 1))
        print(f"{name:34s} {wall:7.2f} us/call back to back, {host:7.2f} us/call of host time")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)

"""Host time per call of the pieces of a repeat softmax call on a small torch CUDA tensor.

    python3 tools/host_cost.py [calls]

Each piece gets two figures: the wall time per call of many back-to-back calls with one
synchronisation at the end, and the host time per call of a few hundred calls queued behind a
long GPU sleep (so that no call waits for the GPU); the pieces show where a call's time goes.
"""

from __future__ import annotations

import sys
import time

import torch

import portable_softmax as ps
from portable_softmax import _probe, api
from portable_softmax._arrays import torch_current_stream
from portable_softmax.bench import back_to_back_us


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall time per call of back-to-back calls, host time per call with the GPU held busy)."""
    wall = back_to_back_us(torch, fn, calls, warmup=50)
    queued = 400  # fewer than the launch queue holds, so that no call waits for the GPU
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time ahead of the calls
    t = time.perf_counter()
    for _ in range(queued):
        fn()
    host = (time.perf_counter() - t) / queued * 1e6
    torch.cuda.synchronize()
    return wall, host


def main(calls: int) -> None:
    x = torch.randn(8, 1000, device="cuda")
    y = torch.empty_like(x)
    ps.softmax(x)  # plans and prepares the repeat path
    key = api._prepared_key(x, -1, "softmax", False)
    launcher = api._prepared[key][0]
    stream = torch_current_stream(torch, 0)
    rt = _probe.runtime("cuda")
    pieces = {
        "torch.softmax(x)": lambda: torch.softmax(x, dim=-1),
        "ps.softmax(x)": lambda: ps.softmax(x),
        "torch.empty(shape)": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "_is_torch_cuda(x)": lambda: api._is_torch_cuda(x),
        "_prepared_key(x)": lambda: api._prepared_key(x, -1, "softmax", False),
        "x.data_ptr()": lambda: x.data_ptr(),
        "torch_current_stream": lambda: torch_current_stream(torch, 0),
        "rt.current_device()": lambda: rt.current_device(),
        "empty_like(contiguous)": lambda: torch.empty_like(x, memory_format=torch.contiguous_format),
        "launcher(x, y, stream)": lambda: launcher(x.data_ptr(), y.data_ptr(), stream),
    }
    for name, fn in pieces.items():
        wall, host = per_call_us(fn, calls)
        print(f"{name:28s} {wall:7.2f} us/call back to back, {host:7.2f} us/call of host time")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)

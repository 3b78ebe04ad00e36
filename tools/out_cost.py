"""Host time per call of softmax with and without out= on a small torch CUDA tensor (the GPU held
busy, so that no call waits for it), beside torch.softmax's.

    python3 tools/out_cost.py [calls]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import portable_softmax as ps


def host_us(fn, calls: int) -> float:
    """Host time per call of `calls` calls queued behind a GPU sleep."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # about 0.2 s of GPU time ahead of the calls
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main(calls: int) -> None:
    for shape in ((8, 1000), (4096, 64), (64, 65536)):
        x = torch.randn(*shape, device="cuda")
        y = torch.empty_like(x)
        pieces = {"torch.softmax(x)": lambda x=x: torch.softmax(x, dim=-1),
                  "ps.softmax(x)": lambda x=x: ps.softmax(x),
                  "ps.softmax(x, out=y)": lambda x=x, y=y: ps.softmax(x, out=y)}
        times = {name: statistics.median(host_us(fn, calls) for _ in range(5)) for name, fn in pieces.items()}
        print(shape, "  ".join(f"{name} {us:.1f} us" for name, us in times.items()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)

"""Host time per call of softmax with and without out= on a small torch CUDA tensor (the GPU held
busy, so that no call waits for it), beside torch.softmax's.

    python3 tools/out_cost.py [calls]
"""

from __future__ import annotations

import statistics
import sys

import torch
from host_cost import host_us

import portable_softmax as ps


def warm_host_us(fn, calls: int) -> float:
    """host_us of `calls` calls after 20 unqueued ones (plans made, launches prepared)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    return host_us(fn, calls)


def main(calls: int) -> None:
    for shape in ((8, 1000), (4096, 64), (64, 65536)):
        x = torch.randn(*shape, device="cuda")
        y = torch.empty_like(x)
        pieces = {"torch.softmax(x)": lambda x=x: torch.softmax(x, dim=-1),
                  "ps.softmax(x)": lambda x=x: ps.softmax(x),
                  "ps.softmax(x, out=y)": lambda x=x, y=y: ps.softmax(x, out=y)}
        times = {name: statistics.median(warm_host_us(fn, calls) for _ in range(5)) for name, fn in pieces.items()}
        print(shape, "  ".join(f"{name} {us:.1f} us" for name, us in times.items()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)

"""Time per call of softmax on small cupy arrays: the repeat path against the full path it skips,
with and without out=, beside cupy's own one-kernel exp, cupyx's softmax and torch.softmax of the
same memory.

    python3 tools/cupy_cost.py [calls]

Each piece gets two figures: the wall time per call of back-to-back calls with one synchronisation
at the end, and the host time per call of calls queued behind a long GPU sleep (so that no call
waits for the GPU). Medians of five passes over all the pieces, float32, the latency command's
shapes.
"""

from __future__ import annotations

import statistics
import sys

import cupy
import cupyx.scipy.special
import torch
from host_cost import host_us

import portable_softmax as ps
from portable_softmax import api
from portable_softmax.bench import back_to_back_us

SHAPES = ((1, 128), (8, 1000), (32, 4096), (64, 1024), (256, 1024), (4096, 64))


def pieces_for(x, y) -> dict:
    t = torch.from_dlpack(x)  # the same memory, as a torch tensor
    return {
        "cupy.exp(x)": lambda: cupy.exp(x),
        "cupyx softmax(x)": lambda: cupyx.scipy.special.softmax(x, axis=-1),
        "torch.softmax(t)": lambda: torch.softmax(t, dim=-1),
        "ps.softmax(x)": lambda: ps.softmax(x),
        "ps.softmax(x), full path": lambda: api._apply(x, -1, "softmax", None, False),
        "ps.softmax(x, out=y)": lambda: ps.softmax(x, out=y),
        "ps.softmax(x, out=y), full path": lambda: api._apply(x, -1, "softmax", y, False),
    }


def main(calls: int) -> None:
    print("us per call: wall time back to back / host time with the GPU held busy")
    for shape in SHAPES:
        x = cupy.random.standard_normal(shape, dtype=cupy.float32)
        y = cupy.empty_like(x)
        ps.softmax(x), ps.softmax(x, out=y)  # plans and prepares both calls
        assert api._run_prepared_cupy(x, -1, "softmax", None, False) is not None, "not prepared"
        assert api._run_prepared_cupy(x, -1, "softmax", y, False) is y, "out= not prepared"
        error = float(cupy.abs(ps.softmax(x) - cupyx.scipy.special.softmax(x, axis=-1)).max())
        pieces = pieces_for(x, y)
        wall: dict[str, list[float]] = {name: [] for name in pieces}
        host: dict[str, list[float]] = {name: [] for name in pieces}
        for _ in range(5):
            for name, fn in pieces.items():
                wall[name].append(back_to_back_us(torch, fn, calls, warmup=50))
                host[name].append(host_us(fn, min(calls, 400)))
        print(f"{shape} float32 (max |ps - cupyx| {error:.1e})")
        for name in pieces:
            print(f"  {name:34s} {statistics.median(wall[name]):6.2f} / {statistics.median(host[name]):6.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)

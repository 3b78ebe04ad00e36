"""Launch one softmax per shape (after a warm-up) so that `ncu` can profile the kernels.

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section MemoryWorkloadAnalysis python3 tools/profile_kernels.py float16:16384x8192 ...

Arguments of the form KNOB=VALUE set a planner knob (portable_softmax.planner.KNOB) for the
shapes after them, so that two planner choices can be profiled in one run. A shape may name the
axis to reduce after an @ (float32:8192x8192@0); the last axis otherwise. A shape prefixed with
torch: (torch:float32:4096x64) launches torch.softmax instead, for side-by-side counters.
"""

from __future__ import annotations

import ast
import sys

import torch

import portable_softmax as ps
from portable_softmax import planner


def main(specs: list[str]) -> None:
    for spec in specs:
        if "=" in spec:
            knob, _, value = spec.partition("=")
            if not hasattr(planner, knob):
                raise SystemExit(f"planner has no knob {knob!r}")
            setattr(planner, knob, ast.literal_eval(value))
            planner.plan.cache_clear()
            continue
        theirs = spec.startswith("torch:")
        dtype, shape = spec.removeprefix("torch:").split(":")
        shape, _, axis = shape.partition("@")
        dims = tuple(int(d) for d in shape.split("x"))
        x = (torch.randn(*dims, device="cuda") * 4).to(getattr(torch, dtype))
        y = torch.empty_like(x)
        dim = int(axis) if axis else -1

        def call(x=x, y=y, dim=dim, theirs=theirs):
            return torch.softmax(x, dim=dim, out=y) if theirs else ps.softmax(x, axis=dim, out=y)

        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(spec)
        call()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])

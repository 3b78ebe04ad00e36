"""Device time of every compiled register-tier variant that holds a row (those taking one row a
step too), on small inputs, beside the planner's choice and torch.softmax: how rows a warp (lane
groups x the variant's batch) and threads a block set a small call's time.

    python3 tools/warp_batch_probe.py float32:4096x64 float16:8192x64 ... [--reps 200] [--every-vec]

Each line: the variant, threads a block, rows a warp, the grid, the device time a call (median of
CUDA-event timings with the L2 flushed, the GPU held busy while the host issues the call) and the
largest error against torch in float64 (so a fast wrong launch shows).
"""

from __future__ import annotations

import argparse
from math import ceil

import torch

import portable_softmax as ps
from portable_softmax import _probe
from portable_softmax import _variants as V
from portable_softmax.bench import _Timer
from portable_softmax.planner import I32, I64, Launch, Plan, RowProblem, plan, register_vec


def probe(spec: str, op: str, rt, device: int, profile, timer: _Timer, every_vec: bool = False) -> None:
    dtype, shape = spec.split(":")
    rows, cols = (int(d) for d in shape.split("x"))
    x = (torch.randn(rows, cols, device="cuda") * 4).to(getattr(torch, dtype))
    y = torch.empty_like(x)
    ref = torch.softmax(x.double(), -1) if op == "softmax" else torch.log_softmax(x.double(), -1)
    problem = RowProblem(dtype=dtype, op=op, rows=rows, cols=cols)
    chosen = plan(problem, profile)
    theirs = torch.softmax if op == "softmax" else torch.log_softmax
    ours = ps.softmax if op == "softmax" else ps.log_softmax
    print(f"{spec} {op}: planner {chosen.tier} {[(s.kernel, s.grid, s.block) for s in chosen.launches]} "
          f"{timer.median_ms(lambda: ours(x, out=y)) * 1e3:.2f} us; "
          f"torch {timer.median_ms(lambda: theirs(x, dim=-1)) * 1e3:.2f} us")
    vecs = V.vector_widths(dtype) if every_vec else (register_vec(problem, profile.warp_size),)
    row_args = (("ptr", "x"), ("ptr", "y"), (I64, rows), (I64, cols), (I64, cols), (I64, cols), (I32, 0))
    stream = torch.cuda.current_stream().cuda_stream
    for variant in (v for vec in vecs for v in V.built_warp_variants(dtype, op, profile.warp_size, vec)):
        vec = variant.vec
        if variant.lanes * variant.slots * vec < cols or variant.lanes == 1:
            continue
        batch = variant.batch
        for threads in (32, 64, 128, 256):
            grid = ceil(rows / (threads // variant.lanes * batch))
            launch = Launch(variant.name, grid, threads, 0, row_args, cut_to_one_wave=False)
            launcher = rt.prepare(Plan("warp", (launch,)), dtype, device)

            def call(launcher=launcher):
                launcher(x.data_ptr(), y.data_ptr(), stream)

            y.fill_(float("nan"))  # poisoned: a launch that skips rows shows as an error
            call()
            err = float((y.double() - ref).abs().nan_to_num(float("inf")).max())
            us = timer.median_ms(call) * 1e3
            print(f"  {variant.name:36s} threads {threads:4d} rows/warp "
                  f"{profile.warp_size // variant.lanes * batch:3d} grid {grid:6d} {us:7.2f} us  err {err:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--op", default="softmax")
    ap.add_argument("--every-vec", action="store_true",
                    help="scalar and 16-byte slots both, not only the planner's width for the rows")
    args = ap.parse_args()
    rt = _probe.runtime("cuda")
    device = torch.cuda.current_device()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    timer = _Timer(torch, args.reps)
    for spec in args.specs:
        probe(spec, args.op, rt, device, rt.profile(device), timer, args.every_vec)


if __name__ == "__main__":
    main()

"""Launches whose blocks wait on each other, side by side on streams of different priority.

    python3 tools/concurrent_waits.py [--cooperative | --plain] [--iterations N] [--rows R] [--cols C]

The on-chip tiers' blocks wait for the other chunks of their row (or tile) and need every block
of the launch resident at once. Here each iteration queues a large elementwise kernel on one
stream (it holds part of the device), then softmax of long rows on a low-priority stream and
log_softmax of the same rows on a high-priority stream, so that the blocks freed by the first
kernel are contended by the two waiting launches. --cooperative launches them cooperatively
(resident whole; it sets PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1), --plain as ordinary kernels (the
default), which nothing but the order the device starts blocks in keeps from being partly resident
both and waiting for ever. Prints "ok" and the largest errors against float64 when every launch
finished; run it under a timeout (tests/test_gpu.py does, and checks that the default shape is
planned with such launches).
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cooperative", action="store_true", help="launch waiting steps cooperatively")
    mode.add_argument("--plain", action="store_true", help="launch waiting steps as ordinary kernels")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=131072)
    args = ap.parse_args()
    if args.cooperative or args.plain:  # read when the package is imported
        os.environ["PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH"] = "1" if args.cooperative else "0"
    import portable_softmax as ps

    print(f"cooperative launch: {ps.backend_info()['cooperative_launch']}", flush=True)
    # torch maps a priority past the device's range to the nearest it has: -100 is the highest
    low, high, busy = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-100), torch.cuda.Stream()
    x = torch.randn(args.rows, args.cols, device="cuda") * 4
    filler = torch.ones(1 << 27, device="cuda")
    expected_soft = torch.softmax(x.double(), dim=-1)
    expected_log = torch.log_softmax(x.double(), dim=-1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    soft = log = None
    for _ in range(args.iterations):
        with torch.cuda.stream(busy):
            filler.mul_(1.0)
        with torch.cuda.stream(low):
            soft = ps.softmax(x)
        with torch.cuda.stream(high):
            log = ps.log_softmax(x)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    soft_err = float((soft.double() - expected_soft).abs().max())
    log_err = float((log.double() - expected_log).abs().max())
    print(f"ok: {args.iterations} iterations in {seconds:.2f} s; max error softmax {soft_err:.1e}, "
          f"log_softmax {log_err:.1e}", flush=True)
    if not (soft_err < 1e-6 and log_err < 1e-4):
        raise SystemExit("outputs off the float64 reference")


if __name__ == "__main__":
    main()

"""Which multiprocessor each block of a launch starts on, launched plainly and cooperatively.

    python3 tools/block_placement.py [--threads 256] [--shared-kib 40] [--per-sm 5]

A probe kernel shaped like the on-chip split's launch (the block size, dynamic shared memory and
grid of per-sm blocks a multiprocessor) records %smid per block, once through cuLaunchKernel and
once through cuLaunchCooperativeKernel (cupy's enable_cooperative_groups). The on-chip tiers give a
row's chunks consecutive block indices, so where those blocks land decides whether the chunks
that wait for each other share a multiprocessor. Prints, for each way, the share of neighbouring
block indices on one multiprocessor and the multiprocessors of the first blocks.
"""

from __future__ import annotations

import argparse

import cupy
import numpy as np

SOURCE = r"""
extern "C" __global__ void where(int* out) {
  extern __shared__ int pad[];
  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    pad[0] = sm;
    out[blockIdx.x] = pad[0];
  }
  // hold the block a while, so that every block of the grid is resident before any leaves
  long long start = clock64();
  while (clock64() - start < 2000000) {}
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--shared-kib", type=int, default=40)
    ap.add_argument("--per-sm", type=int, default=5)
    args = ap.parse_args()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid = sms * args.per_sm
    shared = args.shared_kib << 10
    for cooperative in (False, True):
        kernel = cupy.RawKernel(SOURCE, "where", enable_cooperative_groups=cooperative)
        kernel.max_dynamic_shared_size_bytes = shared
        out = cupy.full(grid, -1, dtype=cupy.int32)
        kernel((grid,), (args.threads,), (out,), shared_mem=shared)
        cupy.cuda.Device().synchronize()
        where = cupy.asnumpy(out)
        assert (where >= 0).all(), "a block did not record its multiprocessor"
        same = float(np.mean(where[1:] == where[:-1]))
        per_sm = np.bincount(where, minlength=sms)
        print(f"{'cooperative' if cooperative else 'plain'}: grid {grid} x {args.threads} threads, "
              f"{args.shared_kib} KiB; neighbouring blocks on one multiprocessor {100 * same:.0f}%; "
              f"blocks a multiprocessor {per_sm.min()}-{per_sm.max()}; first 12: {where[:12].tolist()}", flush=True)


if __name__ == "__main__":
    main()

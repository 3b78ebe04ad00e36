"""Time softmax over an axis sharded across GPUs: portable_softmax.distributed beside DTensor's softmax
and the two-all-reduce method written with torch ops.

Run on a machine with 2 GPUs (NCCL; RCCL on ROCm):

    torchrun --nproc-per-node 2 tools/bench_distributed.py
    torchrun --nproc-per-node 2 tools/bench_distributed.py --rows 8192 --cols 128256 --dtype bfloat16

The tensor (rows x cols, sharded on its last axis, an even share per rank) is timed forward and
forward + backward for each method. Times are the median of the iterations, the slowest rank's.
"received B/row" counts the bytes a rank receives per row from the collectives (a ring all_reduce
of b bytes: 2 (world - 1) / world b; an all_gather of b bytes a rank: (world - 1) b; the 128-byte
header a rank adds to the gather once a call is left out). "local % of
copy" times the local computation of this package's path alone (no collective), with the local
math the call uses (KernelMath: the package's split kernels on a GPU) and with torch operations
(TorchMath), against a device-to-device copy of the bytes it must move (forward: x read twice,
once for the (m, d) pairs before the collective and once to normalise after it, y written;
backward: dy and y read, dx written). Before timing, the result is checked against the
single-GPU softmax of the gathered tensor within the package's tolerance.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=128256, help="the whole (sharded) axis")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32", "float64"))
    p.add_argument("--op", default="softmax", choices=("softmax", "log_softmax"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="CPU tensors on gloo (a quick run of the bench itself)")
    return p.parse_args(argv)


def _two_all_reduces(torch, dist, op: str):
    """softmax / log_softmax of a sharded axis with torch ops: all_reduce(MAX) of the row max, then
    all_reduce(SUM) of the sum of exp; its backward one all_reduce(SUM) of the row dot product."""

    class TwoAllReduces(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = torch.amax(x, dim=-1, keepdim=True).float()
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            d = torch.exp(x.float() - m).sum(dim=-1, keepdim=True)
            dist.all_reduce(d, op=dist.ReduceOp.SUM)
            if op == "softmax":
                y = (torch.exp(x.float() - m) / d).to(x.dtype)
            else:
                y = (x.float() - m - torch.log(d)).to(x.dtype)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            s = (dy.float() * y.float()).sum(-1, keepdim=True) if op == "softmax" else dy.float().sum(-1, keepdim=True)
            dist.all_reduce(s, op=dist.ReduceOp.SUM)
            dx = y.float() * (dy.float() - s) if op == "softmax" else dy.float() - torch.exp(y.float()) * s
            return dx.to(y.dtype)

    return TwoAllReduces.apply


def _timer(torch, dist, device):
    def elapsed_ms(fn) -> float:
        if device.type == "cpu":
            start = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - start)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    def time_ms(fn, iters: int, warmup: int) -> float:
        """Median milliseconds of fn() over iters (each started together on every rank), the slowest rank's."""
        for _ in range(warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            dist.barrier()
            times.append(elapsed_ms(fn))
        t = torch.tensor([statistics.median(times)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    return time_ms


def _check_against_single_gpu(torch, dist, x_local, y_local, op: str, rank: int, world: int) -> str:
    """The gathered result against the single-GPU softmax of the gathered tensor, on rank 0."""
    import numpy as np

    from portable_softmax import _tolerance
    from portable_softmax import log_softmax as single_log_softmax
    from portable_softmax import softmax as single_softmax

    def gather(t):  # slices padded to the widest (all_gather takes equal sizes), then cut back
        width = torch.tensor([t.shape[-1]], device=t.device)
        widths = [torch.empty_like(width) for _ in range(world)]
        dist.all_gather(widths, width)
        widths = [int(w) for w in widths]
        padded = torch.nn.functional.pad(t, (0, max(widths) - t.shape[-1]))
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        return torch.cat([p[..., :w] for p, w in zip(parts, widths)], -1)

    x, y = gather(x_local), gather(y_local)
    if rank != 0:
        return ""
    try:
        ref = (single_softmax if op == "softmax" else single_log_softmax)(x, -1)
        which = "portable_softmax"
    except Exception as e:  # the single-GPU call cannot run here: torch's is the reference then
        ref = (torch.softmax if op == "softmax" else torch.log_softmax)(x.float(), -1)
        which = f"torch ({type(e).__name__}: {e})"
    ref64 = ref.double().cpu().numpy()
    got = y.cpu()
    got_np = got.view(torch.int16).numpy().view(__import__("ml_dtypes").bfloat16) if got.dtype == torch.bfloat16 \
        else got.numpy()
    # the single-GPU result carries its own rounding: allow the tolerance on both sides
    bad = _tolerance.outside(got_np, ref64)
    worst = float(np.nanmax(np.abs(got_np.astype(np.float64) - ref64)))
    return (f"check vs single-GPU {which}: {int(bad.sum())} of {bad.size} elements outside "
            f"{_tolerance.describe(str(got.dtype).removeprefix('torch.'))} (max |diff| {worst:.3g})")


def main(argv=None) -> int:
    args = _parse(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("error: launch with torchrun, e.g. torchrun --nproc-per-node 2 tools/bench_distributed.py",
              file=sys.stderr)
        return 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"error: the bench needs torch with torch.distributed ({e})", file=sys.stderr)
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("error: the bench needs a GPU a rank (NCCL); --cpu runs it on gloo", file=sys.stderr)
        return 2
    try:
        return _bench(args, torch, dist)
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _bench(args, torch, dist) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from portable_softmax import _sharded, distributed

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.cpu:
        device, backend = torch.device("cpu"), "gloo"
        dist.init_process_group(backend)
    else:
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    chunk = -(-args.cols // world)  # DTensor's Shard: torch.chunk's split, the last ranks' shares smaller
    cols = max(0, min(chunk, args.cols - rank * chunk))
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    x = (4 * torch.randn(args.rows, cols, device=device, generator=gen)).to(dtype)
    dy = torch.randn(args.rows, cols, device=device, generator=gen).to(dtype)
    op = args.op
    ours = distributed.softmax if op == "softmax" else distributed.log_softmax
    torch_op = torch.softmax if op == "softmax" else torch.log_softmax
    two = _two_all_reduces(torch, dist, op)
    mesh = init_device_mesh(device.type, (world,))
    time_ms = _timer(torch, dist, device)
    say = print if rank == 0 else (lambda *a, **k: None)
    itemsize = x.element_size()
    compute = 8 if dtype == torch.float64 else 4

    name = "cpu" if args.cpu else torch.cuda.get_device_name(device)
    say(f"{op} of {args.rows} x {args.cols} {args.dtype} sharded on the last axis over {world} ranks "
        f"({name}, torch {torch.__version__}, backend {backend})")
    say(_check_against_single_gpu(torch, dist, x, ours(x), op, rank, world))

    def with_grad(fn):
        def step():
            xg = x.detach().requires_grad_(True)
            fn(xg).backward(dy)
        return step

    def dtensor_fn(xl):
        dt = DTensor.from_local(xl, mesh, [Shard(1)], shape=torch.Size((args.rows, args.cols)),
                                stride=(args.cols, 1))
        return torch_op(dt, -1).redistribute(mesh, [Shard(1)]).to_local()

    row_bytes = args.cols * itemsize
    recv = {
        "portable_softmax.distributed": ((world - 1) * 2 * compute, 2 * (world - 1) / world * compute),
        "portable_softmax.distributed, check=False": ((world - 1) * 2 * compute, 2 * (world - 1) / world * compute),
        "two all_reduces (torch ops)": (2 * 2 * (world - 1) / world * compute, 2 * (world - 1) / world * compute),
        # DTensor replicates the softmax axis: it gathers x forward and the incoming gradient backward
        "DTensor softmax, Shard(-1)": ((world - 1) / world * row_bytes, (world - 1) / world * row_bytes),
    }
    methods = {"portable_softmax.distributed": ours,
               "portable_softmax.distributed, check=False": lambda xl: ours(xl, check=False),
               "two all_reduces (torch ops)": two, "DTensor softmax, Shard(-1)": dtensor_fn}
    rows = []
    for name, fn in methods.items():
        try:
            fwd = time_ms(lambda fn=fn: fn(x), args.iters, args.warmup)
            both = time_ms(with_grad(fn), args.iters, args.warmup)
        except Exception as e:  # a method that cannot run (e.g. out of memory) is reported, not fatal
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append((name, f"failed: {type(e).__name__}: {str(e)[:80]}", "", "", ""))
            continue
        rf, rb = recv[name]
        rows.append((name, f"{fwd:.3f}", f"{both:.3f}", f"{rf:.0f}", f"{rb:.0f}"))

    # the local work of this package's path alone: partials + merge + finish, and grad_dot + grad_finish
    def local_times(math):
        def forward():
            m, d = math.partials(x, 1)
            big, total = math.merge(m.unsqueeze(0), d.unsqueeze(0))
            return math.finish(x, big, total, op, False, 1)

        y = forward()

        def backward():
            return math.grad_finish(dy, y, math.grad_dot(dy, y, op, 1), op, 1)

        return time_ms(forward, args.iters, args.warmup), time_ms(backward, args.iters, args.warmup)

    y = torch.empty_like(x)
    src = torch.empty(int(1.5 * x.numel()), dtype=dtype, device=device)
    dst = torch.empty_like(src)
    copy2 = time_ms(lambda: y.copy_(x), args.iters, args.warmup)  # reads x, writes y
    copy3 = time_ms(lambda: dst.copy_(src), args.iters, args.warmup)  # 1.5x: the bytes of 2 reads and a write
    local = {type(m).__name__: m for m in (_sharded.local_math(x), _sharded.TORCH)}
    local_rows = [(name, *local_times(math)) for name, math in local.items()]

    header = ("method", "forward ms", "fwd+bwd ms", "recv B/row fwd", "recv B/row bwd")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        say("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    ours_both = rows[0][2]
    for r in rows[2:]:
        try:
            say(f"fwd+bwd speed-up of portable_softmax.distributed over {r[0]}: {float(r[2]) / float(ours_both):.2f}x")
        except ValueError:
            pass
    say(f"device copy: {copy2:.3f} ms for read x + write y ({2 * x.numel() * itemsize / copy2 / 1e6:.0f} GB/s), "
        f"{copy3:.3f} ms for 1.5x that")
    for name, t_fwd, t_bwd in local_rows:
        say(f"local forward ({name}: partials + merge + finish): {t_fwd:.3f} ms, {100 * copy3 / t_fwd:.0f}% of a "
            f"copy of the bytes it must move (x read twice, y written), {100 * copy2 / t_fwd:.0f}% of read x + write y")
        say(f"local backward ({name}: grad_dot + grad_finish): {t_bwd:.3f} ms, {100 * copy3 / t_bwd:.0f}% of a copy "
            f"of read dy, y + write dx")
    return 0


if __name__ == "__main__":
    sys.exit(main())

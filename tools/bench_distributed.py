"""Time softmax over an axis sharded across GPUs: portable_softmax.distributed beside DTensor's softmax
and the two-all-reduce method written with torch ops.

Run on a machine with 2 GPUs (NCCL; RCCL on ROCm):

    torchrun --nproc-per-node 2 tools/bench_distributed.py
    torchrun --nproc-per-node 2 tools/bench_distributed.py --rows 8192 --cols 128256 --dtype bfloat16
    torchrun --nproc-per-node 2 tools/bench_distributed.py --rows 50304 --cols 2048 --axis 0

The tensor (rows x cols, softmax over --axis, sharded on it as DTensor's Shard splits it: the last
axis by default) is timed forward and forward + backward for each method. Times are the median of
the iterations, the slowest rank's. A "row" below is a line along the sharded axis.

"recv B/row" counts the bytes a rank receives per row from the collectives: a ring all_reduce of
b bytes, 2 (world - 1) / world b; an all_gather of b bytes a rank, (world - 1) b (the 128-byte
header a rank adds to the gather once a call is left out).

"local % of copy" times the local computation of this package's path alone (no collective), a call
from an idle device (as the methods are timed) and calls queued back to back, with
the local math the call uses (KernelMath: the package's kernels on a GPU) and with torch
operations (TorchMath), as the bandwidth of the bytes it must move over the bandwidth of a
device-to-device copy of x. The forward must read x twice (the (m, d) pairs before the collective,
the normalisation after it) and write y; the backward must read dy and y twice (the row sums
before the all_reduce, dx after it) and write dx.

Before timing, a sample of rows (--check-rows, spread evenly over the tensor) is gathered from the
ranks and checked on rank 0: the values against the single-GPU ``portable_softmax`` call on the
gathered rows within the package's tolerance (``_tolerance``), and the gradient of
``(y * w).sum()`` (w: the random incoming gradient the timed backward passes too) against torch's
float64 autograd of the gathered rows (float32 / float64: atol 1e-6 + rtol 1e-5; 16-bit: 8 units
of the dtype's rounding of the sample's largest gradient). A check that fails makes the exit
status 1.
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
    p.add_argument("--cols", type=int, default=128256)
    p.add_argument("--axis", type=int, default=1, choices=(0, 1), help="the axis the softmax takes and the ranks share")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32", "float64"))
    p.add_argument("--op", default="softmax", choices=("softmax", "log_softmax"))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--check-rows", type=int, default=64, help="rows of the sample the correctness check gathers")
    p.add_argument("--cpu", action="store_true", help="CPU tensors on gloo (a quick run of the bench itself)")
    args = p.parse_args(argv)
    for name in ("rows", "cols", "iters", "check_rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be at least 0, got {args.warmup}")
    return args


def _two_all_reduces(torch, dist, op: str, axis: int = -1):
    """softmax / log_softmax of a sharded axis with torch ops: all_reduce(MAX) of the row max, then
    all_reduce(SUM) of the sum of exp; its backward one all_reduce(SUM) of the row dot product."""

    class TwoAllReduces(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = torch.amax(x, dim=axis, keepdim=True).float()
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            d = torch.exp(x.float() - m).sum(dim=axis, keepdim=True)
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
            s = (dy.float() * y.float() if op == "softmax" else dy.float()).sum(axis, keepdim=True)
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
        return slowest(statistics.median(times))

    def back_to_back_ms(fn, iters: int) -> float:
        """Milliseconds a call of fn() over iters calls queued back to back (the host's work for a
        call overlapping the device's for the one before), the slowest rank's."""
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        return slowest(elapsed_ms(lambda: [fn() for _ in range(iters)]) / iters)

    def slowest(ms: float) -> float:
        t = torch.tensor([ms], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    return time_ms, back_to_back_ms


def sample_rows(rows: int, count: int) -> list[int]:
    """``count`` row indices spread evenly over ``rows`` (all of them when there are fewer), first and
    last included.

    >>> sample_rows(10, 4), sample_rows(3, 64)
    ([0, 3, 6, 9], [0, 1, 2])
    """
    if count >= rows:
        return list(range(rows))
    if count == 1:
        return [0]
    return sorted({round(i * (rows - 1) / (count - 1)) for i in range(count)})


def _gather_columns(torch, dist, t, world: int):
    """Every rank's ``t`` (same leading shape, any width) concatenated along the last axis, on every rank:
    slices padded to the widest (all_gather takes equal sizes), then cut back."""
    width = torch.tensor([t.shape[-1]], device=t.device)
    widths = [torch.empty_like(width) for _ in range(world)]
    dist.all_gather(widths, width)
    widths = [int(w) for w in widths]
    padded = torch.nn.functional.pad(t, (0, max(widths) - t.shape[-1]))
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[..., :w] for p, w in zip(parts, widths)], -1)


def _grad_outside(torch, got, ref):
    """Mask of the gradient elements of ``got`` outside the bound of the module's docstring around
    the float64 ``ref``: NaN must meet NaN."""
    g = got.double()
    if got.dtype in (torch.float32, torch.float64):
        bound = 1e-6 + 1e-5 * ref.abs()
    else:
        eps = 2.0 ** -8 if got.dtype == torch.bfloat16 else 2.0 ** -11
        finite = ref[ref.isfinite()]
        bound = 1e-6 + 8 * eps * (float(finite.abs().max()) if finite.numel() else 0.0)
    return ~(((g - ref).abs() <= bound) | (g.isnan() & ref.isnan()))


def _check(torch, dist, fn, x, dy, op: str, rows: list[int], rank: int, world: int,
           axis: int = 1) -> tuple[bool, list[str]]:
    """Run ``fn`` forward and backward once, gather the sampled rows (lines along ``axis``) and check
    them on rank 0 (module docstring). Returns (passed, lines to print); other ranks get (True, [])."""
    import numpy as np

    from portable_softmax import _tolerance
    from portable_softmax import log_softmax as single_log_softmax
    from portable_softmax import softmax as single_softmax

    xg = x.detach().requires_grad_(True)
    y = fn(xg)
    y.backward(dy)
    index = torch.tensor(rows, device=x.device)
    xs, ys, dys, dxs = (_gather_columns(torch, dist, (t if axis == 1 else t.t()).detach().index_select(0, index), world)
                        for t in (x, y, dy, xg.grad))
    if rank != 0:
        return True, []
    dtype = str(x.dtype).removeprefix("torch.")
    try:
        ref = (single_softmax if op == "softmax" else single_log_softmax)(xs, -1)
        which = "the single-GPU portable_softmax" if xs.is_cuda else "portable_softmax"
    except Exception as e:  # the single-GPU call cannot run here: torch's float64 is the reference then
        ref = (torch.softmax if op == "softmax" else torch.log_softmax)(xs.double(), -1)
        which = f"torch float64 ({type(e).__name__}: {e})"
    ref64 = ref.double().cpu().numpy()
    got = ys.cpu()
    if got.dtype == torch.bfloat16:
        import ml_dtypes

        got_np = got.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        got_np = got.numpy()
    bad = _tolerance.outside(got_np, ref64)
    worst = float(np.nanmax(np.abs(got_np.astype(np.float64) - ref64))) if got_np.size else 0.0
    lines = [f"check, values of {len(rows)} rows vs {which}: {int(bad.sum())} of {bad.size} elements outside "
             f"{_tolerance.describe(dtype)} (max |diff| {worst:.3g})"]
    x64 = xs.double().requires_grad_(True)
    y64 = (torch.softmax if op == "softmax" else torch.log_softmax)(x64, -1)
    (ref_dx,) = torch.autograd.grad(y64, x64, dys.double())
    grad_bad = _grad_outside(torch, dxs, ref_dx)
    diff = (dxs.double() - ref_dx).abs()
    worst_grad = float(diff[diff.isfinite()].max()) if diff.isfinite().any() else 0.0
    lines.append(f"check, gradient of (y * w).sum() on those rows vs torch float64 autograd: {int(grad_bad.sum())} "
                 f"of {grad_bad.numel()} elements outside the bound (max |diff| {worst_grad:.3g})")
    passed = not bad.any() and not bool(grad_bad.any())
    if not passed:
        lines.append("check FAILED")
    return passed, lines


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
        status = _bench(args, torch, dist)
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        status = 1
    if dist.is_initialized():
        if dist.get_backend() == "gloo" and status == 0:
            # torch's gloo can abort a rank in its teardown while a peer closes its pairs ("terminate
            # called without an active exception"): once every rank is past the last collective,
            # leave without tearing the group down.
            dist.barrier()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        dist.destroy_process_group()
    return status


def _bench(args, torch, dist) -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from portable_softmax import _sharded, distributed

    began = time.perf_counter()
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
    axis = args.axis
    sharded, lines = (args.cols, args.rows) if axis == 1 else (args.rows, args.cols)
    chunk = -(-sharded // world)  # DTensor's Shard: torch.chunk's split, the last ranks' shares smaller
    share = max(0, min(chunk, sharded - rank * chunk))
    shape = (args.rows, share) if axis == 1 else (share, args.cols)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    x = (4 * torch.randn(shape, device=device, generator=gen)).to(dtype)
    dy = torch.randn(shape, device=device, generator=gen).to(dtype)
    op = args.op
    ours = distributed.softmax if op == "softmax" else distributed.log_softmax
    torch_op = torch.softmax if op == "softmax" else torch.log_softmax
    two = _two_all_reduces(torch, dist, op, axis)
    mesh = init_device_mesh(device.type, (world,))
    time_ms, back_to_back_ms = _timer(torch, dist, device)
    say = print if rank == 0 else (lambda *a, **k: None)
    itemsize = x.element_size()
    compute = 8 if dtype == torch.float64 else 4

    name = "cpu" if args.cpu else torch.cuda.get_device_name(device)
    say(f"{op} of {args.rows} x {args.cols} {args.dtype} over axis {axis}, sharded on it over {world} ranks "
        f"({name}, torch {torch.__version__}, backend {backend})", flush=True)
    started = time.perf_counter()
    passed, report = _check(torch, dist, lambda xl, **kw: ours(xl, axis, **kw), x, dy, op,
                            sample_rows(lines, args.check_rows), rank, world, axis)
    for line in report:
        say(line)
    say(f"(check: {time.perf_counter() - started:.1f} s, the first call's kernel loading included)", flush=True)

    def with_grad(fn):
        def step():
            xg = x.detach().requires_grad_(True)
            fn(xg).backward(dy)
        return step

    def dtensor_fn(xl):
        dt = DTensor.from_local(xl, mesh, [Shard(axis)], shape=torch.Size((args.rows, args.cols)),
                                stride=(args.cols, 1))
        return torch_op(dt, axis).redistribute(mesh, [Shard(axis)]).to_local()

    dtensor = "DTensor softmax, Shard(-1)" if axis == 1 else "DTensor softmax, Shard(0)"
    row_bytes = sharded * itemsize
    ring = 2 * (world - 1) / world
    ours_recv = ((world - 1) * 2 * compute, ring * 8)  # the backward's row sums are float64
    recv = {
        "portable_softmax.distributed": ours_recv,
        "portable_softmax.distributed, check=False": ours_recv,
        "two all_reduces (torch ops)": (2 * ring * compute, ring * compute),
        # DTensor replicates the softmax axis: it gathers x forward and the incoming gradient backward
        dtensor: ((world - 1) / world * row_bytes, (world - 1) / world * row_bytes),
    }
    methods = {"portable_softmax.distributed": lambda xl: ours(xl, axis),
               "portable_softmax.distributed, check=False": lambda xl: ours(xl, axis, check=False),
               "two all_reduces (torch ops)": two, dtensor: dtensor_fn}
    started = time.perf_counter()
    rows, times = [], {}
    for name, fn in methods.items():
        try:
            fwd = time_ms(lambda fn=fn: fn(x), args.iters, args.warmup)
            both = time_ms(with_grad(fn), args.iters, args.warmup)
        except Exception as e:  # a method that cannot run (e.g. out of memory) is reported, not fatal
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rows.append((name, f"failed: {type(e).__name__}: {str(e)[:80]}", "", "", ""))
            continue
        times[name] = (fwd, both)
        rf, rb = recv[name]
        rows.append((name, f"{fwd:.3f}", f"{both:.3f}", f"{rf:.0f}", f"{rb:.0f}"))
    methods_s = time.perf_counter() - started

    # the local work of this package's path alone: partials + merge + finish, and grad_dot + grad_finish
    def local_times(math):
        def forward():
            m, d = math.partials(x, axis)
            big, total = math.merge(m.unsqueeze(0), d.unsqueeze(0))
            return math.finish(x, big, total, op, False, axis)

        y = forward()

        def backward():
            return math.grad_finish(dy, y, math.grad_dot(dy, y, op, axis), op, axis)

        return (time_ms(forward, args.iters, args.warmup), time_ms(backward, args.iters, args.warmup),
                back_to_back_ms(forward, args.iters), back_to_back_ms(backward, args.iters))

    started = time.perf_counter()
    y = torch.empty_like(x)
    copy = time_ms(lambda: y.copy_(x), args.iters, args.warmup)  # reads x, writes y
    nbytes = x.numel() * itemsize
    copy_bw = 2 * nbytes / copy if copy > 0 else float("inf")  # bytes a millisecond
    local = {type(m).__name__: m for m in (_sharded.local_math(x), _sharded.TORCH)}
    local_rows = [(name, *local_times(math)) for name, math in local.items()]
    local_s = time.perf_counter() - started

    header = ("method", "forward ms", "fwd+bwd ms", "recv B/row fwd", "recv B/row bwd")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        say("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if "portable_softmax.distributed" in times:
        ours_fwd, ours_both = times["portable_softmax.distributed"]
        for other in ("two all_reduces (torch ops)", dtensor):
            if other in times:
                fwd, both = times[other]
                say(f"speed-up of portable_softmax.distributed over {other}: forward {fwd / ours_fwd:.2f}x, "
                    f"fwd+bwd {both / ours_both:.2f}x")
    say(f"device copy of x: {copy:.3f} ms ({copy_bw / 1e6:.0f} GB/s counting read + write)")

    def share(passes: int, t: float) -> str:  # the bandwidth of `passes` tensor-sized reads/writes in t
        return f"{100 * passes * nbytes / t / copy_bw:.0f}%" if t > 0 else "n/a"

    for name, t_fwd, t_bwd, b_fwd, b_bwd in local_rows:
        say(f"local forward ({name}: partials + merge + finish): {t_fwd:.3f} ms, {share(3, t_fwd)} of copy "
            f"(x read twice, y written); {b_fwd:.3f} ms, {share(3, b_fwd)} back to back")
        say(f"local backward ({name}: grad_dot + grad_finish): {t_bwd:.3f} ms, {share(5, t_bwd)} of copy "
            f"(dy and y read twice, dx written); {b_bwd:.3f} ms, {share(5, b_bwd)} back to back")
    say(f"(methods {methods_s:.1f} s, local steps {local_s:.1f} s, whole run {time.perf_counter() - began:.1f} s)")
    # every rank waits for rank 0's report before any tears its group down: a peer that closed its
    # connections while rank 0 still printed could abort rank 0's exit (gloo)
    dist.barrier()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

"""Time jax.jit(ps.softmax / ps.log_softmax) and a jitted gradient through them against jax.nn's and a
device-to-device copy of the same bytes, on the first JAX GPU.

    python -m portable_softmax._jax_ffi_bench                 # the 64 MiB+ shapes, float32 / bfloat16 / float16
    python -m portable_softmax._jax_ffi_bench --shape 8192x8192 --dtype float32 --calls 50
    python -m portable_softmax._jax_ffi_bench --only "grad ps.softmax" --only "grad ps.log_softmax"

``--only`` times the named computations alone (the copy is always timed: it is the reference), for
A/B runs that need only a few of them. Each figure is the median of ``--repeats`` timings of
``--calls`` back-to-back calls (one wait at the end), per call; "% copy" is the copy's time over the
call's (a call reads and writes its bytes once, as the copy does). A gradient of
``(f(x) * w).sum()`` reads x and w and writes dx: its "% copy" is over one and a half copies (three
streams to the copy's two).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

DEFAULT_SHAPES = ((8192, 8192), (65536, 1024), (1024, 65536), (16, 1 << 22))
DTYPES = ("float32", "bfloat16", "float16")
#: The computations timed for each shape and dtype, beside the copy.
CALLS = ("ps.softmax", "jax.nn.softmax", "ps.log_softmax", "jax.nn.log_softmax", "grad ps.softmax",
         "grad jax.nn.softmax", "grad ps.log_softmax", "grad jax.nn.log_softmax")


def _time(fn, x, calls: int, repeats: int) -> float:
    """Median seconds per call of ``calls`` calls queued back to back."""
    fn(x).block_until_ready()  # compile and warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            y = fn(x)
        y.block_until_ready()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def run(shapes, dtypes, calls: int, repeats: int, report=None, only=CALLS) -> list[dict]:
    """One row per (shape, dtype, computation): milliseconds per call and the fraction of the copy;
    ``report(row)`` is called with each row as it is measured. ``only``: the computations of CALLS
    to time (the copy is timed always)."""
    import jax
    import jax.numpy as jnp

    import portable_softmax as ps

    from . import _jax_ffi

    device = next((d for p in ("cuda", "rocm") for d in _devices(jax, p)), None)
    if device is None:
        raise SystemExit("error: JAX sees no CUDA or ROCm device; this bench times the GPU path")
    vendor = _jax_ffi.vendor_of(device)
    why = _jax_ffi.register(vendor)
    if why is not None:
        raise SystemExit(f"error: {why}")
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            x = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype), device)
            w = jax.device_put(jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype), device)
            copy = _time(jax.jit(jnp.copy), x, calls, repeats)
            grad_copy = 1.5 * copy  # a gradient reads x and w and writes dx: three streams to the copy's two
            cases = {
                "copy": (jax.jit(jnp.copy), None),
                "ps.softmax": (jax.jit(ps.softmax), copy), "jax.nn.softmax": (jax.jit(jax.nn.softmax), copy),
                "ps.log_softmax": (jax.jit(ps.log_softmax), copy),
                "jax.nn.log_softmax": (jax.jit(jax.nn.log_softmax), copy),
                "grad ps.softmax": (jax.jit(jax.grad(lambda t, w=w: (ps.softmax(t) * w).sum())), grad_copy),
                "grad jax.nn.softmax": (jax.jit(jax.grad(lambda t, w=w: (jax.nn.softmax(t) * w).sum())), grad_copy),
                "grad ps.log_softmax": (jax.jit(jax.grad(lambda t, w=w: (ps.log_softmax(t) * w).sum())), grad_copy),
                "grad jax.nn.log_softmax": (jax.jit(jax.grad(lambda t, w=w: (jax.nn.log_softmax(t) * w).sum())),
                                            grad_copy),
            }
            for name, (fn, reference) in cases.items():
                if name != "copy" and name not in only:
                    continue
                seconds = copy if name == "copy" else _time(fn, x, calls, repeats)
                rows.append({"shape": "x".join(map(str, shape)), "dtype": dtype, "call": name,
                             "ms": seconds * 1e3, "of_copy": None if reference is None else reference / seconds})
                if report is not None:
                    report(rows[-1])
    return rows


def _devices(jax, platform: str) -> list:
    try:
        return jax.devices(platform)
    except RuntimeError:
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", help="ROWSxCOLS (repeatable); default: the 64 MiB+ shapes")
    ap.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default: all three")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", action="append", choices=CALLS, metavar="CALL",
                    help=f"time this computation alone (repeatable; default: all of {', '.join(CALLS)})")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(n) for n in s.lower().split("x")) for s in args.shape] if args.shape else DEFAULT_SHAPES
    except ValueError:
        print(f"error: --shape takes ROWSxCOLS such as 8192x8192; got {args.shape}", file=sys.stderr)
        return 2
    def report(r: dict) -> None:
        if not reported:
            print(f"{'shape':>14} {'dtype':>9} {'call':>24} {'ms/call':>9} {'% copy':>7}")
        reported.append(r)
        share = "" if r["of_copy"] is None else f"{100 * r['of_copy']:.0f}"
        print(f"{r['shape']:>14} {r['dtype']:>9} {r['call']:>24} {r['ms']:>9.3f} {share:>7}", flush=True)

    reported: list[dict] = []
    try:
        run(shapes, args.dtype or DTYPES, args.calls, args.repeats, report, tuple(args.only or CALLS))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

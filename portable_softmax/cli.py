"""The ``portable-softmax`` command: ``info`` (the probe's report) and ``run`` (the main job)."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import _probe, reference
from ._dtypes import SUPPORTED, host_dtype, storage_name
from .api import log_softmax, softmax

ATOL, RTOL = 1e-6, 1e-5
DEMO_SHAPE = (4096, 1000)


class InputError(Exception):
    """A file the user named cannot be read as numbers."""


def read_input(path: Path, dtype: str | None) -> np.ndarray:
    """A .npy file, or whitespace-separated numbers (one row per line)."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a file of numbers")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: the file is empty; expected a .npy array or whitespace-separated numbers")
    if path.suffix == ".npy":
        try:
            x = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise InputError(f"{path}: not a readable .npy file ({e})") from None
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "no data" is reported below
                x = np.loadtxt(path, dtype=np.float64, ndmin=1)
        except ValueError as e:
            raise InputError(f"{path}: cannot parse as whitespace-separated numbers ({e})") from None
        if x.size == 0:
            raise InputError(f"{path}: holds no numbers")
        x = x.astype(np.float32)
    if dtype is not None:
        x = x.astype(host_dtype(dtype))
    return x


def write_output(y: np.ndarray, path: Path | None) -> None:
    if path is not None and path.suffix == ".npy":
        np.save(path, y)
        return
    values = y.astype(np.float64) if y.ndim else y.reshape(1).astype(np.float64)
    fmt = "%.17g" if y.dtype == np.float64 else "%.9g"
    if path is None:
        np.savetxt(sys.stdout, values if values.ndim <= 2 else values.reshape(-1, values.shape[-1]), fmt=fmt)
    else:
        np.savetxt(path, values if values.ndim <= 2 else values.reshape(-1, values.shape[-1]), fmt=fmt)


def _run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, soft_wrap=True)
    times: dict[str, float] = {}
    t = time.perf_counter()
    if args.input is None:
        rng = np.random.default_rng(args.seed)
        x = (rng.standard_normal(DEMO_SHAPE) * 4).astype(host_dtype(args.dtype or "float32"))
        source = f"demo input {DEMO_SHAPE[0]}x{DEMO_SHAPE[1]} {x.dtype} (randn x 4, seed {args.seed})"
    else:
        x = read_input(Path(args.input), args.dtype)
        source = f"{args.input}: shape {x.shape} {x.dtype}"
    times["read"] = time.perf_counter() - t

    t = time.perf_counter()
    backend = _probe.host_backend()
    device_x = None
    if backend != "cpu":
        rt = _probe.runtime(backend)
        rt.kernel_source(rt.current_device(), storage_name(x.dtype))  # load or compile the module
    times["runtime init"] = time.perf_counter() - t
    # cupy arrays let the transfers be timed apart; cupy has no bfloat16, which goes
    # through the numpy path (pinned staging) with its transfers inside "compute".
    if backend == "cuda" and x.dtype.name != "bfloat16":
        import cupy

        t = time.perf_counter()
        device_x = cupy.asarray(x)
        cupy.cuda.get_current_stream().synchronize()
        times["host->device"] = time.perf_counter() - t

    op = log_softmax if args.log else softmax
    t = time.perf_counter()
    if device_x is not None:
        import cupy

        device_y = op(device_x, axis=args.axis)
        cupy.cuda.get_current_stream().synchronize()
        times["compute"] = time.perf_counter() - t
        t = time.perf_counter()
        y = cupy.asnumpy(device_y)
        times["device->host"] = time.perf_counter() - t
    else:
        y = op(x, axis=args.axis)
        times["compute" if backend == "cpu" else "compute (with transfers)"] = time.perf_counter() - t

    status = 0
    if args.input is None:
        ref = (reference.log_softmax if args.log else reference.softmax)(x, axis=args.axis)
        err = np.abs(y.astype(np.float64) - ref)
        ok = bool(np.all(err <= ATOL + RTOL * np.abs(ref)))
        console.print(f"check against the float64 reference: max |error| {err.max():.3g} -> "
                      f"{'within' if ok else 'OUTSIDE'} atol {ATOL:g}, rtol {RTOL:g}")
        status = 0 if ok else 1
    t = time.perf_counter()
    if args.input is not None or args.output is not None:
        write_output(y, Path(args.output) if args.output else None)
    times["write"] = time.perf_counter() - t

    console.print(f"{'log_softmax' if args.log else 'softmax'} on {backend}: {source}")
    table = Table(title="timing of the whole run")
    table.add_column("step")
    table.add_column("ms", justify="right")
    for step, seconds in times.items():
        table.add_row(step, f"{seconds * 1e3:.3f}")
    table.add_row("total", f"{sum(times.values()) * 1e3:.3f}", style="bold")
    console.print(table)
    return status


def _info(args) -> int:
    from rich.console import Console
    from rich.table import Table

    info = _probe.backend_info()
    table = Table(title="portable_softmax backend")
    table.add_column("key")
    table.add_column("value")
    for key, value in info.items():
        if isinstance(value, dict):
            value = "\n".join(f"{k}: {v}" for k, v in value.items())
        table.add_row(key, str(value))
    Console().print(table)
    return 0


def _bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portable-softmax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="report the backend, device, warp size and kernel source").set_defaults(func=_info)
    run = sub.add_parser("run", help="softmax of a .npy or text file (a checked demo without INPUT)")
    run.add_argument("input", nargs="?", help=".npy file or whitespace-separated numbers")
    run.add_argument("-o", "--output", help="output file: .npy, or text for any other suffix (default: stdout)")
    run.add_argument("--axis", type=int, default=-1)
    run.add_argument("--log", action="store_true", help="log_softmax instead of softmax")
    run.add_argument("--dtype", choices=SUPPORTED, help="cast the input to this dtype first")
    run.add_argument("--seed", type=int, default=0, help="seed of the demo input")
    run.set_defaults(func=_run)
    bench = sub.add_parser("bench", help="bandwidth against the device-to-device copy and torch.softmax (GPU)")
    bench.add_argument("--shapes", help="comma-separated shapes like 65536x1024,1x100000000 (default: a sweep)")
    bench.add_argument("--dtypes", help="comma-separated dtypes (default: float32,float16,bfloat16)")
    bench.add_argument("--ops", default="softmax,log_softmax")
    bench.add_argument("--axis", type=int, default=-1)
    bench.add_argument("--mib", type=float, default=256, help="input size of the default sweep's shapes")
    bench.add_argument("--reps", type=int, default=20)
    bench.add_argument("--latency", action="store_true",
                       help="wall time and device time per call of small inputs instead")
    bench.add_argument("--calls", type=int, default=2000, help="--latency: back-to-back calls a round")
    bench.add_argument("--rounds", type=int, default=7,
                       help="--latency: rounds, ours and torch.softmax alternating (medians reported)")
    bench.add_argument("--json", help="write the results as JSON")
    bench.add_argument("--markdown", help="write the table as Markdown")
    bench.add_argument("--plot", help="write a PNG of %% of copy against columns per dtype")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (InputError, _probe.BackendUnavailableError, TypeError, ValueError, IndexError) as e:
        print(f"portable-softmax: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The portable-softmax command: ``info`` (the probe's report), ``run`` (softmax of a file) and ``bench``.

Every error a user can cause is one line on stderr and exit status 2; ``run``'s demo exits 1 when
its result is outside the tolerance.

>>> from portable_softmax.cli import main
>>> main(["--version"])
portable-softmax 0.1.0
0
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import __version__, _probe, _tolerance, reference
from ._dtypes import SUPPORTED, host_dtype, storage_name
from .api import log_softmax, softmax
from .bench import ALL_OPS

DEMO_SHAPE = (4096, 1000)
#: ``run`` writes at most this many values to stdout unless asked with ``-o -``
STDOUT_LIMIT = 10_000
#: the first bytes of every file numpy.save writes
NPY_MAGIC = b"\x93NUMPY"

DESCRIPTION = """\
Softmax on NVIDIA and AMD GPUs, with a CPU fallback.

  info    which backend computes, why, and the device it found
  run     softmax of a .npy or text file (without a file: a demo checked against float64)
  bench   timing: % of the device-to-device copy beside torch.softmax on a GPU,
          the CPU backend beside numpy, scipy and torch without one
"""

EPILOG = """\
examples:
  portable-softmax run                           # the checked demo
  portable-softmax run logits.npy -o probs.npy   # .npy in, .npy out
  cat scores.txt | portable-softmax run - --log  # text from stdin, text to stdout
  portable-softmax bench --shapes 4096x4096      # one shape

'portable-softmax COMMAND --help' describes a command's options.
"""


class InputError(Exception):
    """Something the user named or asked for cannot be used: the message is the whole story (exit 2)."""


# --------------------------------------------------------------------------------------------- input


def read_input(source: str, dtype: str | None) -> np.ndarray:
    """The array in ``source``: a path or ``-`` (stdin), holding a .npy array or whitespace-separated numbers.

    Text is a table, one row per line: it reads as a 2-D float64 array ((1, n) for one line). With
    ``dtype`` the values are converted to it, and a value that overflows it is an error.
    """
    if source == "-":
        name = "<stdin>"
        data = sys.stdin.buffer.read()
        if not data.strip():
            raise InputError(f"{name}: no input; expected a .npy array or whitespace-separated numbers")
        if data.startswith(NPY_MAGIC):
            x = _read_npy(io.BytesIO(data), name)
        else:
            x = _read_text(_decode(data, name), name)
        return _convert(x, dtype, name)
    path = Path(source)
    name = str(path)
    if not path.exists():
        raise InputError(f"{name}: no such file")
    if path.is_dir():
        raise InputError(f"{name}: is a directory, not a file of numbers")
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
            if not head:
                raise InputError(f"{name}: the file is empty; expected a .npy array or whitespace-separated numbers")
            f.seek(0)
            if head == NPY_MAGIC:
                x = _read_npy(f, name)
            elif path.suffix.lower() == ".npy":
                raise InputError(f"{name}: not a valid .npy array (it does not begin with the .npy header that "
                                 "numpy.save writes); expected a .npy array or whitespace-separated numbers")
            else:
                x = _read_text(_decode(f.read(), name), name)
    except OSError as e:
        raise InputError(f"{name}: cannot read ({e.strerror or e})") from None
    return _convert(x, dtype, name)


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: neither a .npy array nor text; expected a .npy array or whitespace-separated "
                         "numbers") from None


def _read_npy(f, name: str) -> np.ndarray:
    try:
        x = np.load(f, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e):  # an object array: its items are pickled Python objects
            raise InputError(f"{name}: holds Python objects (dtype object), not numbers") from None
        raise InputError(f"{name}: not a valid .npy array ({e})") from None
    except (OSError, EOFError) as e:
        raise InputError(f"{name}: not a valid .npy array ({e})") from None
    return x


def _read_text(text: str, name: str) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "no data" is reported below
            x = np.loadtxt(io.StringIO(text), dtype=np.float64, ndmin=2)
    except ValueError as e:
        raise InputError(f"{name}: cannot parse as whitespace-separated numbers ({e})") from None
    if x.size == 0:
        raise InputError(f"{name}: holds no numbers")
    if np.isinf(x).any():  # 'inf' is a value; a finite literal past float64's range is not
        for token in text.split():
            try:
                value = float(token)
            except ValueError:
                continue
            if np.isinf(value) and token.lstrip("+-").lower() not in ("inf", "infinity"):
                raise InputError(f"{name}: the value {token} overflows float64 (largest finite "
                                 f"{np.finfo(np.float64).max:.6g})")
    return x


def _convert(x: np.ndarray, dtype: str | None, name: str) -> np.ndarray:
    """x in ``dtype`` (or its own floating dtype), or an InputError saying why not."""
    is_float = x.dtype.kind == "f" or x.dtype.name == "bfloat16"  # ml_dtypes' bfloat16 is of kind "V"
    kind = "f" if is_float else x.dtype.kind
    if kind == "V" and x.dtype.itemsize == 2 and x.dtype.names is None:  # how numpy.save stores bfloat16
        if dtype != "bfloat16":
            raise InputError(f"{name}: holds 2-byte raw values ({x.dtype.str}), as numpy.save writes bfloat16 "
                             "arrays; add --dtype bfloat16 to read them as bfloat16")
        return x.view(host_dtype("bfloat16"))
    if kind == "c":
        raise InputError(f"{name}: holds complex values ({x.dtype}); softmax needs real floating-point numbers")
    if kind in "biu":
        if dtype is None:
            raise InputError(f"{name}: holds {x.dtype} values; softmax needs floating point: add --dtype "
                             f"float64 (or {', '.join(d for d in SUPPORTED if d != 'float64')}) to convert them")
    elif kind != "f":
        raise InputError(f"{name}: holds {x.dtype} values, not numbers; softmax needs floating point "
                         f"({', '.join(SUPPORTED)})")
    if dtype is None:
        return x
    import ml_dtypes

    target = host_dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(target)
        overflowed = np.isinf(y) & ~np.isinf(x) if is_float else np.isinf(y)
    if overflowed.any():
        where = np.unravel_index(int(np.argmax(overflowed)), x.shape)
        raise InputError(f"{name}: the value {float(x[where]):g} at index {list(map(int, where))} overflows "
                         f"{dtype} (largest finite {float(ml_dtypes.finfo(target).max):.6g})"
                         + ("; leave out --dtype to keep the file's precision" if is_float else ""))
    return y


# -------------------------------------------------------------------------------------------- output


def output_path(value: str | None, flag: str = "-o") -> Path | None:
    """The file an output option names, checked before any work: None for stdout (``-``)."""
    if value is None or value == "-":
        return None
    path = Path(value)
    if path.is_dir():
        raise InputError(f"{flag} {value}: is a directory; name a file in it, such as {path / 'out.npy'}")
    parent = path.parent
    if not parent.exists():
        raise InputError(f"{flag} {value}: the directory {parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{flag} {value}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{flag} {value}: cannot write into {parent} (permission denied)")
    return path


#: significant digits that round-trip each dtype through text
_DIGITS = {"float64": 17, "float32": 9, "float16": 5, "bfloat16": 4}


def write_output(y: np.ndarray, path: Path | None) -> None:
    """A .npy file for a .npy path, else text: the last axis along each line, one line per row."""
    if path is not None and path.suffix == ".npy":
        try:
            np.save(path, y)
        except OSError as e:
            raise InputError(f"-o {path}: cannot write ({e.strerror or e})") from None
        return
    values = y.astype(np.float64).reshape(-1, y.shape[-1] if y.ndim else 1)
    if y.ndim == 1:
        values = values.reshape(1, -1)
    fmt = f"%.{_DIGITS[storage_name(y.dtype)]}g"
    if path is None:
        np.savetxt(sys.stdout, values, fmt=fmt)
        sys.stdout.flush()
        return
    try:
        np.savetxt(path, values, fmt=fmt)
    except OSError as e:
        raise InputError(f"-o {path}: cannot write ({e.strerror or e})") from None


# ---------------------------------------------------------------------------------------------- run


def _run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, soft_wrap=True)
    out_path = output_path(args.output)
    op_name = "log_softmax" if args.log else "softmax"
    times: dict[str, float] = {}
    if args.input is None:
        rng = np.random.default_rng(args.seed)
        x = (rng.standard_normal(DEMO_SHAPE) * 4).astype(host_dtype(args.dtype or "float32"))
        source = f"demo input {DEMO_SHAPE[0]}x{DEMO_SHAPE[1]} {x.dtype} (randn x 4, seed {args.seed})"
    else:
        t = time.perf_counter()
        x = read_input(args.input, args.dtype)
        times["read"] = time.perf_counter() - t
        source = f"{'<stdin>' if args.input == '-' else args.input}: shape {x.shape} {x.dtype}"
        if args.output is None and x.size > STDOUT_LIMIT:
            raise InputError(f"the result holds {x.size:,} values, more than the {STDOUT_LIMIT:,} run writes to "
                             "stdout by itself; name a file with -o (.npy, or text for another suffix), or write "
                             "them all to stdout with -o -")
    if x.ndim and not -x.ndim <= args.axis < x.ndim:
        raise InputError(f"--axis {args.axis} is out of range for an input of shape {x.shape} "
                         f"(accepted: {-x.ndim} to {x.ndim - 1})")

    t = time.perf_counter()
    backend = _probe.host_backend()
    device_x = None
    if backend != "cpu":
        rt = _probe.runtime(backend)
        rt.kernel_source(rt.current_device(), storage_name(x.dtype))  # load or compile the module
    times["runtime init"] = time.perf_counter() - t
    console.print(f"{op_name} on {backend}: {source}, axis {args.axis}")
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
        bad = _tolerance.outside(y, ref)
        err = np.abs(y.astype(np.float64) - ref)
        verdict = "within" if not bad.any() else f"{int(bad.sum())} of {bad.size} values OUTSIDE"
        console.print(f"check against the float64 reference: max |error| {np.nanmax(err):.3g} -> {verdict} "
                      f"{_tolerance.describe(storage_name(y.dtype))}")
        status = 1 if bad.any() else 0
    if args.input is not None or args.output is not None:
        t = time.perf_counter()
        write_output(y, out_path)
        times["write"] = time.perf_counter() - t

    table = Table(title="timing of the run" if args.input is not None else "timing of the run (demo input "
                  "not counted)")
    table.add_column("step")
    table.add_column("ms", justify="right")
    for step, seconds in times.items():
        table.add_row(step, f"{seconds * 1e3:.3f}")
    table.add_row("total", f"{sum(times.values()) * 1e3:.3f}", style="bold")
    console.print(table)
    return status


# --------------------------------------------------------------------------------------------- info


def _info(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    try:
        info = _probe.backend_info()
    except _probe.BackendUnavailableError as e:
        info = _unavailable_report(str(e))
    info["jax_ffi"] = _jax_ffi_status()
    table = Table(title="portable_softmax backend")
    table.add_column("key")
    table.add_column("value")
    for key, value in info.items():
        if isinstance(value, dict):
            value = "\n".join(f"{k}: {v}" for k, v in value.items())
        table.add_row(key, escape(str(value)))  # values hold brackets (".[jax]") that rich would read as markup
    Console(soft_wrap=True).print(table)
    return 0


def _jax_ffi_status() -> str:
    """Whether jax.jit calls run the kernels through XLA's FFI, and for which platform."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return "jax is not installed"
    from . import _jax_ffi

    return _jax_ffi.status()


def _unavailable_report(reason: str) -> dict:
    """What info reports when PORTABLE_SOFTMAX_BACKEND names a backend that cannot run: the reason, and the
    backend the probe would choose without the variable."""
    forced = os.environ.get(_probe.ENV_VAR, "")
    report: dict = {"backend": f"none: {_probe.ENV_VAR}={forced} cannot run here", "why": reason,
                    "package_version": __version__}
    os.environ.pop(_probe.ENV_VAR, None)
    try:
        fallback = _probe.backend_info()
        report[f"without {_probe.ENV_VAR}"] = {"backend": fallback["backend"], **fallback["why"]}
    except _probe.BackendUnavailableError as e:
        report[f"without {_probe.ENV_VAR}"] = str(e)
    finally:
        os.environ[_probe.ENV_VAR] = forced
    report["to fix"] = f"unset {_probe.ENV_VAR}, or set it to a backend that can run ({', '.join(_probe.BACKENDS)})"
    return report


# -------------------------------------------------------------------------------------------- bench


def _bench(args) -> int:
    from . import bench

    for flag in ("json", "markdown", "plot"):
        output_path(getattr(args, flag), f"--{flag}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("--plot needs matplotlib: pip install 'portable_softmax[bench]'") from None
    for flag, known in (("ops", ALL_OPS), ("dtypes", SUPPORTED)):
        value = getattr(args, flag)
        unknown = [v for v in (value.split(",") if value else []) if v not in known]
        if unknown:
            raise InputError(f"--{flag}: {', '.join(map(repr, unknown))} not known; accepted: {', '.join(known)}")
    for flag in ("reps", "calls", "rounds", "mib"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise InputError(f"--{flag} must be positive, not {value:g}")
    try:
        return bench.main(args)
    except bench.BenchError as e:
        raise InputError(str(e)) from None


# ------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portable-softmax", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"portable-softmax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser("info", help="which backend computes, why, and the device it found",
                          description="The probe's report: backend, why it was chosen, runtime versions, device, "
                          "warp size and where the kernels come from. Under a PORTABLE_SOFTMAX_BACKEND that "
                          "cannot run it reports why (exit status 0).")
    info.set_defaults(func=_info)

    run = sub.add_parser(
        "run", help="softmax of a .npy or text file (without a file: a demo checked against float64)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Softmax (or log_softmax) of a file, with a timing breakdown on stderr.\n\n"
        "Text input is a table: one row per line, numbers separated by whitespace, read as float64\n"
        "(a single line is shape (1, n)). Text output has the same layout, the last axis along each line.\n"
        f"Without -o up to {STDOUT_LIMIT:,} values are written to stdout; more need -o FILE or -o -.\n"
        "Without INPUT, a 4096x1000 demo is computed and checked against the float64 reference\n"
        "(exit status 1 if it is outside the tolerance).")
    run.add_argument("input", nargs="?", metavar="INPUT",
                     help=".npy file, or text of whitespace-separated numbers; - reads stdin")
    run.add_argument("-o", "--output", metavar="FILE",
                     help="output: .npy, text for any other suffix, - for stdout (default: stdout, up to "
                     f"{STDOUT_LIMIT:,} values)")
    run.add_argument("--axis", type=int, default=-1,
                     help="the axis softmax normalises along; negative counts from the last (default: -1, "
                     "along each line of a text file; 0 runs down its columns)")
    run.add_argument("--log", action="store_true", help="log_softmax instead of softmax")
    run.add_argument("--dtype", choices=SUPPORTED,
                     help="convert the input to this dtype first (text reads as float64; integer .npy files "
                     "need it)")
    run.add_argument("--seed", type=int, default=0, help="seed of the demo input (default: 0)")
    run.set_defaults(func=_run)

    bench = sub.add_parser(
        "bench", help="timing on a GPU (%% of copy, beside torch) or on the CPU (beside numpy, scipy, torch)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="On a GPU visible to torch: bandwidth of softmax as a % of the device-to-device copy,\n"
        "beside torch.softmax, with the L2 cache flushed before each repetition.\n"
        "Without one (or with --cpu): milliseconds of the CPU backend beside numpy's exp(x - max) / sum,\n"
        "scipy.special.softmax and torch.softmax on the CPU (each where importable), with peak memory.")
    bench.add_argument("--cpu", action="store_true", help="time the CPU backend even where a GPU is present")
    bench.add_argument("--shapes", help="comma-separated shapes like 65536x1024,1x100000000 "
                       "(default: a sweep of column counts at about --mib each)")
    bench.add_argument("--dtypes", help="comma-separated dtypes (default: float32,float16,bfloat16 on a GPU; "
                       "float32 on the CPU)")
    bench.add_argument("--ops", default="softmax,log_softmax",
                       help="comma-separated ops to time: softmax, log_softmax (default: both), and the "
                       "gradients softmax_backward, log_softmax_backward (3 streams each; GPU only)")
    bench.add_argument("--axis", type=int, default=-1,
                       help="the axis normalised along, for every shape (default: -1, the last)")
    bench.add_argument("--mib", type=float,
                       help="input size of the default sweep's shapes in MiB (default: 256 on a GPU, 64 on the CPU)")
    bench.add_argument("--reps", type=int,
                       help="timed repetitions per figure, the median reported (default: 20 on a GPU, 5 on the CPU)")
    bench.add_argument("--latency", action="store_true",
                       help="GPU only: wall time and device time per call of small inputs instead")
    bench.add_argument("--calls", type=int, default=2000, help="--latency: back-to-back calls a round")
    bench.add_argument("--rounds", type=int, default=7,
                       help="--latency: rounds, ours and torch.softmax alternating (medians reported)")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    bench.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    bench.add_argument("--plot", metavar="FILE", help="GPU only: write a PNG of %% of copy against columns per dtype")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: sys.argv[1:]) and return its exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors (status 2)
        return e.code if isinstance(e.code, int) else 2
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            # NaN and inf inputs are values with a defined result, not a reason for numpy's warnings
            warnings.simplefilter("ignore", RuntimeWarning)
            return args.func(args)
    except (InputError, _probe.BackendUnavailableError, TypeError, ValueError, IndexError) as e:
        print(f"portable-softmax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("portable-softmax: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head): nothing more to say
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as e:
        if sys.flags.dev_mode:  # python -X dev: the traceback, for a bug report
            raise
        print(f"portable-softmax: unexpected error: {type(e).__name__}: {e} (this is a bug; rerun with "
              "'python -X dev -m portable_softmax.cli ...' for the traceback and report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""``portable-softmax bench``: bandwidth of softmax against the device-to-device copy, beside torch.

Every GPU figure is (bytes read + bytes written) / median time, with the L2 cache flushed
before each timed repetition, and reported as a fraction of the faster of two device-to-device
copies (torch's copy_ and cudaMemcpyAsync) measured in the same run.

Without a GPU visible to torch (or with ``--cpu``) it times the CPU backend instead, beside numpy's
``exp(x - max) / sum``, ``scipy.special.softmax`` and torch's CPU softmax (each where importable),
with the peak memory of each call as a multiple of the input.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

#: the default sweep: tiny to long rows, non-powers of two, vocabulary sizes, one huge row
DEFAULT_COLS = (1, 7, 32, 100, 128, 1000, 1024, 3000, 4096, 8192, 32000, 50257, 131072, 128256, 262144)
DEFAULT_DTYPES = ("float32", "float16", "bfloat16")
#: the latency command's default small inputs (0.5 KiB to 1 MiB of float32)
LATENCY_SHAPES = ((1, 128), (8, 1000), (64, 1024), (256, 1024), (32, 4096), (4096, 64))
#: the GPU bench's defaults: input size of the sweep's shapes (MiB) and timed repetitions
GPU_MIB, GPU_REPS = 256, 20
#: the CPU bench's defaults: a shorter sweep of smaller inputs, fewer repetitions
CPU_COLS = (128, 1000, 4096, 50257)
CPU_DTYPES = ("float32",)
CPU_MIB, CPU_REPS = 64, 5


class BenchError(Exception):
    """The bench asked for cannot run here: the message says why (the command exits 2)."""


@dataclass
class Result:
    dtype: str
    op: str
    shape: tuple[int, ...]
    axis: int
    bytes_moved: int
    copy_gbs: float
    ours_gbs: float
    torch_gbs: float | None
    ours_pct_of_copy: float
    torch_pct_of_copy: float | None
    max_abs_error_vs_float64: float | None = None
    #: torch.compile of the op's formula (the backward ops), as % of the copy
    compiled_pct_of_copy: float | None = None


#: the ops the bench times: the forward ones move 2 streams (read x, write y), the gradients 3 (dy, y, dx)
FORWARD_OPS = ("softmax", "log_softmax")
BACKWARD_OPS = ("softmax_backward", "log_softmax_backward")
ALL_OPS = FORWARD_OPS + BACKWARD_OPS


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(float(d)) for d in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape {text!r} is not like 4096x1000") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"shape {text!r} needs positive dimensions")
    return dims


def default_shapes(dtype: str, target_bytes: int, cols: tuple[int, ...] = DEFAULT_COLS) -> list[tuple[int, ...]]:
    """2-D shapes of about ``target_bytes`` per input for each column count of ``cols``."""
    size = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[dtype]
    return [(max(1, target_bytes // (size * c)), c) for c in cols]


def gpu_unavailable() -> str | None:
    """Why the GPU bench cannot run here (it times against torch on a device torch sees), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when it finds no driver
        if not torch.cuda.is_available():
            return "torch sees no GPU"
    return None


def device_copies(torch) -> list:
    """The device-to-device copies every figure is measured against: copy(x, y) callables.

    torch's ``copy_`` and, where cupy is importable, cudaMemcpyAsync of the bytes. Either of them
    has measured 10-15% slower than the other on some tensors of an H100 (about 2.5 against
    2.9 TB/s), so the bench times both and divides by the faster: a conservative ceiling.
    """
    copies = [lambda x, y: y.copy_(x)]
    try:
        import cupy
    except ImportError:
        return copies
    memcpy, device_to_device = cupy.cuda.runtime.memcpyAsync, 3

    def memcpy_bytes(x, y):
        memcpy(y.data_ptr(), x.data_ptr(), x.numel() * x.element_size(), device_to_device,
               torch.cuda.current_stream().cuda_stream)

    return copies + [memcpy_bytes]


def fastest_copy_ms(timer, copies, x, y) -> float:
    """The median time of the faster of the device copies (device_copies) of x into y."""
    return min(timer.median_ms(lambda c=c: c(x, y)) for c in copies)


def back_to_back_us(torch, fn, calls: int, warmup: int = 20) -> float:
    """Wall time per call of `calls` back-to-back calls of fn, one synchronisation at the end."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def device_us(torch, fn, calls: int = 400) -> float:
    """Device time per call of `calls` calls queued behind a GPU sleep (so that the host is always
    ahead and the events time the GPU's work and launch gaps alone)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time: the calls queue behind it
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls


class _Timer:
    """Median event timing of a callable with the L2 flushed before each repetition.

    Before each repetition the GPU is held busy (a sleep kernel) while the host issues the call, so
    that the events time the device's work alone. A repetition whose call the host finished
    issuing only after the hold could have run out (a host stall: the events then time an idle GPU
    too) is timed again, with a hold twice as long from then on; ``redone`` counts them."""

    #: the longest hold, in GPU cycles (about 8 ms at 2 GHz): past it a slow host's repetitions stand
    MOST_SLEEP_CYCLES = 16_000_000

    def __init__(self, torch, reps: int, clock=time.perf_counter):
        self.torch, self.reps, self.clock = torch, reps, clock
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        self.flush = torch.empty(max(2 * l2, 1 << 26), dtype=torch.uint8, device="cuda")
        self.sleep_cycles = 1_000_000  # about 0.5 ms at 2 GHz, far longer than a host call here
        self.hold_ms = self._hold_ms()
        self.redone = 0

    def _hold_ms(self) -> float:
        """How long the GPU takes for the hold alone (its clock sets how long the cycles last)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(self.sleep_cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median_ms(self, fn) -> float:
        torch = self.torch
        fn()  # warm-up: module load, run-time compilation, allocator
        times, retries = [], 4 * self.reps
        while len(times) < self.reps:
            issued = self.clock()  # before the flush: the hold ends no earlier than this + hold_ms
            self.flush.zero_()
            torch.cuda._sleep(self.sleep_cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            host_ms = (self.clock() - issued) * 1e3
            end.synchronize()
            if host_ms >= self.hold_ms and retries > 0:
                retries -= 1
                self.redone += 1
                if self.sleep_cycles < self.MOST_SLEEP_CYCLES:
                    self.sleep_cycles *= 2
                    self.hold_ms = self._hold_ms()
                continue
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def run_bench(shapes_by_dtype: dict[str, list[tuple[int, ...]]], ops: list[str], axis: int, reps: int,
              check: bool = True, progress=None, timer: _Timer | None = None) -> list[Result]:
    import torch

    import portable_softmax as ps

    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a GPU visible to torch")
    timer = timer or _Timer(torch, reps)
    copies = device_copies(torch)
    results = []
    for dtype, shapes in shapes_by_dtype.items():
        tdtype = getattr(torch, dtype)
        for shape in shapes:
            x = (torch.randn(*shape, device="cuda") * 4).to(tdtype)
            y = torch.empty_like(x)
            nbytes = 2 * x.numel() * x.element_size()
            copy_ms = fastest_copy_ms(timer, copies, x, y)
            for op in ops:
                if op in BACKWARD_OPS:
                    r = _time_backward(torch, ps, timer, dtype, x, axis, op, copy_ms, nbytes, check)
                    results.append(r)
                    if progress is not None:
                        progress(r)
                    continue
                ours = ps.softmax if op == "softmax" else ps.log_softmax
                theirs = torch.softmax if op == "softmax" else torch.log_softmax
                ours_ms = timer.median_ms(lambda x=x, y=y, ours=ours: ours(x, axis=axis, out=y))
                err = None
                if check and x.numel() <= 1 << 27:
                    ref = theirs(x.double(), dim=axis)
                    ours(x, axis=axis, out=y)
                    err = float((y.double() - ref).abs().nan_to_num(0).max())
                    del ref
                torch_ms = timer.median_ms(lambda x=x, theirs=theirs: theirs(x, dim=axis))
                copy_gbs = nbytes / copy_ms / 1e6
                r = Result(dtype, op, tuple(shape), axis, nbytes, copy_gbs, nbytes / ours_ms / 1e6,
                           nbytes / torch_ms / 1e6, 100 * copy_ms / ours_ms, 100 * copy_ms / torch_ms, err)
                results.append(r)
                if progress is not None:
                    progress(r)
            del x, y
            torch.cuda.empty_cache()
    return results


_compiled_formulas: dict = {}


def _compiled_backward(torch, op: str):
    """torch.compile of the gradient's formula (what inductor makes of a training step's backward)."""
    if op not in _compiled_formulas:
        if op == "softmax_backward":
            def formula(dy, y, axis: int):
                w = y.float()
                return (w * (dy.float() - (dy.float() * w).sum(axis, keepdim=True))).to(y.dtype)
        else:
            def formula(dy, y, axis: int):
                return (dy.float() - y.float().exp() * dy.float().sum(axis, keepdim=True)).to(y.dtype)
        _compiled_formulas[op] = torch.compile(formula)
    return _compiled_formulas[op]


def _time_backward(torch, ps, timer, dtype, x, axis: int, op: str, copy_ms: float, forward_bytes: int,
                   check: bool) -> Result:
    """One gradient op: 3 streams (dy, y read, dx written), against the copy's bandwidth; torch's own
    backward (aten._softmax_backward_data) and torch.compile of the formula beside it."""
    forward = torch.softmax if op == "softmax_backward" else torch.log_softmax
    y = forward(x.float(), dim=axis).to(x.dtype)
    dy = torch.randn_like(x, dtype=torch.float32).to(x.dtype)
    dx = torch.empty_like(x)
    ours = ps.softmax_backward if op == "softmax_backward" else ps.log_softmax_backward
    aten = (torch.ops.aten._softmax_backward_data if op == "softmax_backward"
            else torch.ops.aten._log_softmax_backward_data)
    nbytes = forward_bytes * 3 // 2
    copy_3_ms = copy_ms * 3 / 2  # the copy's bandwidth over 3 streams
    ours_ms = timer.median_ms(lambda: ours(dy, y, axis, out=dx))
    err = None
    if check and x.numel() <= 1 << 27:
        d, w = dy.double(), y.double()
        if op == "softmax_backward":
            ref = w * (d - (d * w).sum(axis, keepdim=True))
        else:
            ref = d - w.exp() * d.sum(axis, keepdim=True)
        ours(dy, y, axis, out=dx)
        err = float((dx.double() - ref).abs().nan_to_num(0).max())
        del ref, d, w
    torch_ms = timer.median_ms(lambda: aten(dy, y, axis, x.dtype))
    compiled = _compiled_backward(torch, op)
    try:
        compiled_ms = timer.median_ms(lambda: compiled(dy, y, axis))
    except Exception:  # no working compiler toolchain here: the column stays empty
        compiled_ms = None
    return Result(dtype, op, tuple(x.shape), axis, nbytes, nbytes / copy_3_ms / 1e6, nbytes / ours_ms / 1e6,
                  nbytes / torch_ms / 1e6, 100 * copy_3_ms / ours_ms, 100 * copy_3_ms / torch_ms, err,
                  100 * copy_3_ms / compiled_ms if compiled_ms else None)


def paired_rounds(ours: list[float], theirs: list[float]) -> dict:
    """Summary of rounds timed in pairs (ours and torch's in each round): the medians, and the
    median and range of the per-round difference, which the host's drift between rounds (several
    microseconds a call on some hosts) moves far less than either median."""
    if not ours or len(ours) != len(theirs):
        raise ValueError(f"paired rounds need equal, non-empty lists ({len(ours)} and {len(theirs)} given)")
    differences = [a - b for a, b in zip(ours, theirs)]
    return {"ours_us": statistics.median(ours), "torch_us": statistics.median(theirs),
            "difference_us": statistics.median(differences),
            "difference_range_us": (min(differences), max(differences)),
            "rounds_ours_ahead": sum(d <= 0 for d in differences), "rounds": len(differences)}


def latency(shapes: list[tuple[int, ...]], dtypes: list[str], calls: int, rounds: int = 7,
            progress=None) -> list[dict]:
    """Wall time per call of back-to-back calls with one sync at the end (small inputs), ours and
    torch's in alternating rounds, which of the two goes first alternating too (paired_rounds); and
    the device time per call of calls queued behind a GPU sleep (what the wall time would be on a
    host that kept ahead of the GPU)."""
    import torch

    import portable_softmax as ps

    out = []
    for dtype in dtypes:
        for shape in shapes:
            x = torch.randn(*shape, device="cuda").to(getattr(torch, dtype))
            ours_fn, torch_fn = (lambda x=x: ps.softmax(x)), (lambda x=x: torch.softmax(x, dim=-1))
            ours, theirs = [], []
            for r in range(rounds):
                pair = [(ours, ours_fn), (theirs, torch_fn)]
                for into, fn in (pair if r % 2 == 0 else pair[::-1]):
                    into.append(back_to_back_us(torch, fn, calls))
            row = {"shape": shape, "dtype": dtype, "bytes": x.numel() * x.element_size(), "calls": calls,
                   **paired_rounds(ours, theirs), "ours_rounds_us": ours, "torch_rounds_us": theirs,
                   "ours_device_us": device_us(torch, ours_fn), "torch_device_us": device_us(torch, torch_fn)}
            out.append(row)
            if progress:
                progress(row)
    return out


def render_latency(rows: list[dict], title: str):
    from rich.table import Table

    table = Table(title=title)
    for name in ("dtype", "shape", "bytes", "ours us", "torch us", "ours - torch us (median, range)",
                 "rounds ours ahead", "device us ours", "device us torch"):
        table.add_column(name, justify="left" if name in ("dtype", "shape") else "right")
    for r in rows:
        low, high = r["difference_range_us"]
        table.add_row(r["dtype"], "x".join(map(str, r["shape"])), str(r["bytes"]), f"{r['ours_us']:.2f}",
                      f"{r['torch_us']:.2f}", f"{r['difference_us']:+.2f} ({low:+.2f}..{high:+.2f})",
                      f"{r['rounds_ours_ahead']}/{r['rounds']}", f"{r['ours_device_us']:.2f}",
                      f"{r['torch_device_us']:.2f}")
    return table


def render_table(results: list[Result], title: str):
    from rich.table import Table

    table = Table(title=title)
    compiled = any(r.compiled_pct_of_copy is not None for r in results)
    cols = ("dtype", "op", "shape", "copy GB/s", "ours GB/s", "ours % copy", "torch % copy",
            *(("compile % copy",) if compiled else ()), "max |err|")
    for col in cols:
        table.add_column(col, justify="right" if col not in ("dtype", "op") else "left")
    for r in results:
        extra = ((f"{r.compiled_pct_of_copy:.0f}" if r.compiled_pct_of_copy else "-"),) if compiled else ()
        table.add_row(r.dtype, r.op, "x".join(map(str, r.shape)), f"{r.copy_gbs:.0f}", f"{r.ours_gbs:.0f}",
                      f"{r.ours_pct_of_copy:.0f}", f"{r.torch_pct_of_copy:.0f}" if r.torch_pct_of_copy else "-",
                      *extra,
                      f"{r.max_abs_error_vs_float64:.1e}" if r.max_abs_error_vs_float64 is not None else "-")
    return table


def markdown_table(results: list[Result]) -> str:
    """One row per (dtype, shape): each op as % of the copy, beside torch's."""
    ops = sorted({r.op for r in results}, key=list(ALL_OPS).index)
    compiled = [op for op in ops if any(r.op == op and r.compiled_pct_of_copy is not None for r in results)]
    head = "| dtype | shape | " + " | ".join(
        f"{op} % of copy | torch.{op} %" + (f" | torch.compile {op} %" if op in compiled else "") for op in ops
    ) + " | copy GB/s |"
    lines = [head, "|---" * (3 + 2 * len(ops) + len(compiled)) + "|"]
    by_shape: dict = {}
    for r in results:
        by_shape.setdefault((r.dtype, r.shape, r.axis), {})[r.op] = r
    for (dtype, shape, _), rs in by_shape.items():
        cells = []
        for op in ops:
            r = rs.get(op)
            cells += [f"{r.ours_pct_of_copy:.0f}", f"{r.torch_pct_of_copy:.0f}"] if r else ["-", "-"]
            if op in compiled:
                cells.append(f"{r.compiled_pct_of_copy:.0f}" if r and r.compiled_pct_of_copy else "-")
        copy = next(iter(rs.values())).copy_gbs
        lines.append(f"| {dtype} | {'x'.join(map(str, shape))} | " + " | ".join(cells) + f" | {copy:.0f} |")
    return "\n".join(lines)


def plot(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r.dtype for r in results})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        for op, style in (("softmax", "-o"), ("log_softmax", "--s")):
            rs = sorted((r for r in results if r.dtype == dtype and r.op == op), key=lambda r: r.shape[-1])
            if not rs:
                continue
            cols = [r.shape[r.axis] for r in rs]
            ax.plot(cols, [r.ours_pct_of_copy for r in rs], style, label=f"portable_softmax {op}")
            ax.plot(cols, [r.torch_pct_of_copy for r in rs], style, alpha=0.5, label=f"torch {op}")
        ax.axhline(90, color="gray", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("columns (reduced axis length)")
        ax.set_ylabel("% of device-to-device copy bandwidth")
        ax.set_title(dtype)
        ax.set_ylim(0, 110)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --------------------------------------------------------------------------------------------- CPU


def numpy_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """numpy's softmax as users write it: exp(x - max) / sum."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def numpy_log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """numpy's log_softmax as users write it: x - max - log(sum(exp(x - max)))."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


#: bind(x, axis) -> a call of one implementation on x, ready to time
Binder = Callable[[np.ndarray, int], Callable[[], object]]


def cpu_implementations(op: str) -> dict[str, Binder]:
    """The implementations the CPU bench times, by name: portable_softmax's CPU backend, numpy, and
    scipy.special and torch's CPU op where they are importable."""
    import portable_softmax as ps

    ours = ps.softmax if op == "softmax" else ps.log_softmax
    mine = numpy_softmax if op == "softmax" else numpy_log_softmax

    def bind_ours(x, axis):
        def call():
            with ps.use_backend("cpu"):
                return ours(x, axis=axis)
        return call

    impls: dict[str, Binder] = {"portable_softmax": bind_ours, "numpy": lambda x, axis: lambda: mine(x, axis)}
    try:
        import scipy.special
    except ImportError:
        pass
    else:
        theirs = scipy.special.softmax if op == "softmax" else scipy.special.log_softmax
        impls["scipy"] = lambda x, axis: lambda: theirs(x, axis=axis)
    try:
        import torch
    except ImportError:
        pass
    else:
        fn = torch.softmax if op == "softmax" else torch.log_softmax

        def bind_torch(x, axis):
            t = (torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16) if x.dtype.name == "bfloat16"
                 else torch.from_numpy(x))
            return lambda: fn(t, dim=axis)

        impls["torch"] = bind_torch
    return impls


def median_ms(fn: Callable[[], object], reps: int, clock=time.perf_counter) -> float:
    """The median wall time of ``reps`` calls of fn, in ms, after one untimed call."""
    fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append((clock() - t) * 1e3)
    return statistics.median(times)


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most memory numpy (or any allocator tracemalloc sees) held at once during one call of fn,
    its result included."""
    tracing = tracemalloc.is_tracing()  # a caller's tracing (python -X tracemalloc) is left running
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


@dataclass
class CpuResult:
    dtype: str
    op: str
    shape: tuple[int, ...]
    axis: int
    input_bytes: int
    #: median ms a call, by implementation (portable_softmax, numpy, scipy, torch); None where it failed
    ms: dict[str, float | None] = field(default_factory=dict)
    #: peak memory of a call as a multiple of the input, by implementation (torch's is not traced)
    peak_x_input: dict[str, float | None] = field(default_factory=dict)
    max_abs_error_vs_float64: float | None = None
    within_tolerance: bool | None = None


def run_cpu_bench(shapes_by_dtype: dict[str, list[tuple[int, ...]]], ops: list[str], axis: int, reps: int,
                  progress=None, seed: int = 0) -> list[CpuResult]:
    """Times every implementation of cpu_implementations on random inputs (randn x 4) of each shape."""
    from . import _tolerance, reference
    from ._dtypes import host_dtype

    rng = np.random.default_rng(seed)
    results = []
    for dtype, shapes in shapes_by_dtype.items():
        for shape in shapes:
            x = (rng.standard_normal(shape, dtype=np.float32) * 4).astype(host_dtype(dtype))
            for op in ops:
                r = CpuResult(dtype, op, tuple(shape), axis, x.nbytes)
                for name, bind in cpu_implementations(op).items():
                    call = bind(x, axis)
                    try:
                        r.ms[name] = median_ms(call, reps)
                    except (TypeError, ValueError, RuntimeError):  # another library without this dtype: "-"
                        if name == "portable_softmax":
                            raise
                        r.ms[name] = r.peak_x_input[name] = None
                        continue
                    r.peak_x_input[name] = None if name == "torch" else peak_bytes(call) / max(1, x.nbytes)
                    if name == "portable_softmax" and x.size <= 1 << 27:
                        y = call()
                        ref = (reference.softmax if op == "softmax" else reference.log_softmax)(x, axis)
                        r.max_abs_error_vs_float64 = float(np.nanmax(np.abs(y.astype(np.float64) - ref)))
                        r.within_tolerance = not _tolerance.outside(y, ref).any()
                        del y, ref
                results.append(r)
                if progress is not None:
                    progress(r)
    return results


def cpu_name() -> str:
    """The processor's model name where the OS says it, and the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


#: short column names of the implementations in the CPU tables
_SHORT = {"portable_softmax": "ours"}


def render_cpu_table(results: list[CpuResult], title: str):
    """ms a call of each implementation, and our peak memory and error (the other peaks are in the JSON)."""
    from rich import box
    from rich.table import Table

    names = list(dict.fromkeys(n for r in results for n in r.ms))
    # blank rules between columns, one space of padding: ten columns fit 80 characters
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("dtype", "op", "shape", *(_SHORT.get(n, n) for n in names), "peak", "|err|"):
        table.add_column(col, justify="left" if col in ("dtype", "op") else "right")
    for r in results:
        peak = r.peak_x_input.get("portable_softmax")
        table.add_row(r.dtype, r.op, "x".join(map(str, r.shape)), *(_fmt(r.ms.get(n), ".1f") for n in names),
                      "-" if peak is None else f"{peak:.1f}x",
                      _fmt(r.max_abs_error_vs_float64, ".0e") + ("" if r.within_tolerance in (None, True) else "!"))
    return table


def cpu_markdown_table(results: list[CpuResult]) -> str:
    """One row per (dtype, op, shape): ms a call of each implementation, and the peak memory of ours."""
    names = list(dict.fromkeys(n for r in results for n in r.ms))
    lines = ["| dtype | op | shape | axis | " + " | ".join(f"{n} ms" for n in names) + " | peak ours x input |",
             "|---" * (5 + len(names)) + "|"]
    for r in results:
        cells = [_fmt(r.ms.get(n), ".1f") for n in names]
        lines.append(f"| {r.dtype} | {r.op} | {'x'.join(map(str, r.shape))} | {r.axis} | " + " | ".join(cells)
                     + f" | {_fmt(r.peak_x_input.get('portable_softmax'), '.1f')} |")
    return "\n".join(lines)


def _cpu_main(args, stderr) -> int:
    from rich.progress import Progress

    reps = args.reps or CPU_REPS
    dtypes = args.dtypes.split(",") if args.dtypes else list(CPU_DTYPES)
    if args.shapes:
        by_dtype = {d: [parse_shape(s) for s in args.shapes.split(",")] for d in dtypes}
    else:
        target = int((args.mib or CPU_MIB) * (1 << 20))
        by_dtype = {d: default_shapes(d, target, CPU_COLS) for d in dtypes}
    ops = args.ops.split(",")
    if set(ops) & set(BACKWARD_OPS):
        raise BenchError("the CPU bench times softmax and log_softmax; --ops softmax_backward and "
                         "log_softmax_backward need a GPU visible to torch")
    with Progress(console=stderr) as progress:
        task = progress.add_task("timing the CPU backend", total=sum(len(s) for s in by_dtype.values()) * len(ops))
        results = run_cpu_bench(by_dtype, ops, args.axis, reps, progress=lambda r: progress.advance(task))
    title = (f"{cpu_name()}, {time.strftime('%Y-%m-%d')}: median ms a call of {reps} along axis {args.axis}; "
             "ours: portable_softmax's CPU backend, its peak memory (x input) and max |error| against float64"
             + (" (! outside the tolerance)" if any(r.within_tolerance is False for r in results) else ""))
    _stdout().print(render_cpu_table(results, title))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": cpu_name(), "date": time.strftime("%Y-%m-%d"), "backend": "cpu",
                       "results": [asdict(r) for r in results]}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(cpu_markdown_table(results) + "\n")
    return 0


def _stdout():
    """The console the tables go to: a terminal's width, or wide enough for every column in a file or pipe."""
    import sys

    from rich.console import Console

    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def main(args) -> int:
    """The bench command (arguments as ``portable-softmax bench`` parses them): the GPU bench where torch
    sees a GPU, else the CPU bench with a line on stderr saying why; BenchError for what cannot run here."""
    from rich.console import Console

    stderr = Console(stderr=True, soft_wrap=True)
    given = {f" {s}": parse_shape(s) for s in args.shapes.split(",")} if args.shapes else {}
    for text, shape in (given or {"s of the default sweep (2-D)": (1, 1)}).items():
        if not -len(shape) <= args.axis < len(shape):
            raise BenchError(f"--axis {args.axis} is out of range for the shape{text} "
                             f"(accepted: {-len(shape)} to {len(shape) - 1})")
    gpu_only = [(flag, what) for flag, what in (("latency", "times GPU launches against torch.softmax"),
                                                ("plot", "draws the GPU bench's % of copy")) if getattr(args, flag)]
    if args.cpu and gpu_only:
        raise BenchError(f"bench --{gpu_only[0][0]} {gpu_only[0][1]}; it has no --cpu form")
    why_not_gpu = None if args.cpu else gpu_unavailable()
    if args.cpu or why_not_gpu:
        if gpu_only:
            flag, what = gpu_only[0]
            raise BenchError(f"bench --{flag} {what} and needs a GPU visible to torch: {why_not_gpu}")
        if why_not_gpu:
            stderr.print(f"no GPU bench here ({why_not_gpu}): timing the CPU backend instead (--cpu asks for it "
                         "directly)")
        return _cpu_main(args, stderr)
    return _gpu_main(args, stderr)


def _gpu_main(args, stderr) -> int:
    import torch
    from rich.progress import Progress

    console = _stdout()
    dtypes = args.dtypes.split(",") if args.dtypes else list(DEFAULT_DTYPES)
    if args.latency:
        shapes = [parse_shape(s) for s in args.shapes.split(",")] if args.shapes else list(LATENCY_SHAPES)
        latency_dtypes = dtypes if args.dtypes else ["float32"]
        with Progress(console=stderr) as progress:
            task = progress.add_task("timing calls", total=len(shapes) * len(latency_dtypes))
            rows = latency(shapes, latency_dtypes, args.calls, args.rounds, progress=lambda r: progress.advance(task))
        title = (f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}: wall time a call, medians of "
                 f"{args.rounds} rounds of {args.calls} calls, ours and torch.softmax alternating")
        console.print(render_latency(rows, title))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                           "torch": torch.__version__, "results": rows}, f, indent=1)
        return 0
    reps = args.reps or GPU_REPS
    if args.shapes:
        shapes = [parse_shape(s) for s in args.shapes.split(",")]
        by_dtype = {d: shapes for d in dtypes}
    else:
        by_dtype = {d: default_shapes(d, int((args.mib or GPU_MIB) * (1 << 20))) for d in dtypes}
    ops = args.ops.split(",")
    total = sum(len(s) for s in by_dtype.values()) * len(ops)
    with Progress(console=stderr) as progress:
        task = progress.add_task("benchmarking", total=total)
        timer = _Timer(torch, reps)
        results = run_bench(by_dtype, ops, args.axis, reps, progress=lambda r: progress.advance(task), timer=timer)
    device = torch.cuda.get_device_name()
    title = f"{device}, {time.strftime('%Y-%m-%d')}, median of {reps} with L2 flushed"
    console.print(render_table(results, title))
    if timer.redone:
        console.print(f"{timer.redone} repetitions timed again: the host issued the call after the GPU's "
                      f"hold could have run out (the hold is now {timer.hold_ms:.1f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                       "repetitions_redone": timer.redone, "results": [asdict(r) for r in results]}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(results) + "\n")
    if args.plot:
        plot(results, args.plot)
    return 0

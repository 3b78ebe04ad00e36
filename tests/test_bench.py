"""``portable-softmax bench``: its host-side pieces everywhere, the command itself on a GPU."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from portable_softmax import _tolerance, bench, cli, reference
from portable_softmax.bench import CpuResult, Result


@pytest.mark.parametrize("text, shape", [("4096x1000", (4096, 1000)), ("1x1e8", (1, 100_000_000)),
                                         ("262144X8x32", (262144, 8, 32)), ("7", (7,))])
def test_parse_shape(text, shape):
    assert bench.parse_shape(text) == shape


@pytest.mark.parametrize("text, message", [("4096 by 1000", "is not like"), ("0x5", "positive"),
                                           ("4096x-1", "positive"), ("", "is not like")])
def test_parse_shape_names_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_shape(text)


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("float16", 2), ("bfloat16", 2), ("float64", 8)])
def test_default_shapes_reach_the_size_asked_for(dtype, itemsize):
    target = 64 << 20
    shapes = bench.default_shapes(dtype, target)
    assert [cols for _, cols in shapes] == list(bench.DEFAULT_COLS)
    for rows, cols in shapes:
        nbytes = rows * cols * itemsize
        assert target - cols * itemsize < nbytes <= target, (rows, cols)


def test_paired_rounds_take_medians_and_the_per_round_difference():
    summary = bench.paired_rounds([8.0, 9.0, 7.0, 12.0], [7.5, 9.5, 7.2, 11.0])
    assert summary["ours_us"] == pytest.approx(8.5)
    assert summary["torch_us"] == pytest.approx(8.5)
    # differences 0.5, -0.5, -0.2, 1.0: a host that drifted between rounds moves both sides alike
    assert summary["difference_us"] == pytest.approx(0.15)
    assert summary["difference_range_us"] == pytest.approx((-0.5, 1.0))
    assert (summary["rounds_ours_ahead"], summary["rounds"]) == (2, 4)


@pytest.mark.parametrize("ours, theirs", [([], []), ([1.0], [1.0, 2.0])])
def test_paired_rounds_need_pairs(ours, theirs):
    with pytest.raises(ValueError, match="equal, non-empty"):
        bench.paired_rounds(ours, theirs)


def _results() -> list[Result]:
    """Two shapes, both ops, figures as run_bench computes them from times (copy 1.0 ms)."""
    out = []
    for shape, ours_ms, torch_ms in [((4096, 1000), 1.25, 2.0), ((1, 100_000_000), 1.6, 100.0)]:
        nbytes = 2 * shape[0] * shape[1] * 4
        for op in ("softmax", "log_softmax"):
            out.append(Result("float32", op, shape, -1, nbytes, nbytes / 1.0 / 1e6, nbytes / ours_ms / 1e6,
                              nbytes / torch_ms / 1e6, 100 * 1.0 / ours_ms, 100 * 1.0 / torch_ms, 1e-7))
    return out


def test_markdown_table_has_a_row_per_shape_and_a_column_pair_per_op():
    lines = bench.markdown_table(_results()).splitlines()
    assert lines[0] == ("| dtype | shape | softmax % of copy | torch.softmax % | log_softmax % of copy "
                        "| torch.log_softmax % | copy GB/s |")
    assert lines[2] == "| float32 | 4096x1000 | 80 | 50 | 80 | 50 | 33 |"
    assert lines[3] == "| float32 | 1x100000000 | 62 | 1 | 62 | 1 | 800 |"
    assert len(lines) == 4


def test_rich_tables_hold_every_row():
    assert bench.render_table(_results(), "title").row_count == 4
    row = {"dtype": "float32", "shape": (8, 1000), "bytes": 32000, **bench.paired_rounds([7.0, 8.0], [7.5, 7.9]),
           "ours_device_us": 3.1, "torch_device_us": 4.6}
    table = bench.render_latency([row, row], "title")
    assert table.row_count == 2 and len(table.columns) == 9


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the bench extra) is not installed")
    path = tmp_path / "bench.png"
    bench.plot(_results(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bench_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["bench", *argv])


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.mark.gpu
def test_bench_command_on_a_gpu(tmp_path):
    _torch_cuda()
    out = tmp_path / "bench.json"
    args = _bench_args("--shapes", "300x1000,2x70000", "--dtypes", "float32,bfloat16", "--reps", "3",
                       "--json", str(out), "--markdown", str(tmp_path / "bench.md"))
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    assert len(report["results"]) == 2 * 2 * 2
    for r in report["results"]:
        assert r["ours_pct_of_copy"] == pytest.approx(100 * r["ours_gbs"] / r["copy_gbs"])
        assert r["torch_pct_of_copy"] == pytest.approx(100 * r["torch_gbs"] / r["copy_gbs"])
        limit = 1e-5 if r["dtype"] == "float32" else 1e-2  # outputs within [0, 1]; log_softmax near -11
        assert r["max_abs_error_vs_float64"] < (limit if r["op"] == "softmax" else 50 * limit), r
    assert (tmp_path / "bench.md").read_text().count("\n| ") == 4  # a row per (dtype, shape)


@pytest.mark.gpu
def test_bench_latency_command_on_a_gpu(tmp_path):
    _torch_cuda()
    out = tmp_path / "latency.json"
    args = _bench_args("--latency", "--shapes", "1x128,64x1024", "--dtypes", "float32,float16",
                       "--calls", "50", "--rounds", "3", "--json", str(out))
    assert bench.main(args) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["dtype"], r["shape"]) for r in rows] == [
        ("float32", [1, 128]), ("float32", [64, 1024]), ("float16", [1, 128]), ("float16", [64, 1024])]
    for r in rows:
        assert len(r["ours_rounds_us"]) == len(r["torch_rounds_us"]) == r["rounds"] == 3
        assert all(t > 0 for t in r["ours_rounds_us"] + r["torch_rounds_us"])
        assert r["ours_device_us"] > 0 and r["torch_device_us"] > 0


class _Timeline:
    """A host clock and a GPU that runs what the host issues in order, in ms: the fake torch of
    _Timer (events stamped when the GPU reaches them, a sleep of cycles at 2 GHz, a flush of 0.03 ms)."""

    def __init__(self):
        self.host = self.gpu = 0.0

    def issue(self, work_ms: float) -> None:
        self.gpu = max(self.gpu, self.host) + work_ms

    def clock(self) -> float:
        return self.host / 1e3

    def torch(self):
        line = self

        class Event:
            def __init__(self, enable_timing):
                self.at = None

            def record(self):
                line.issue(0.0)
                self.at = line.gpu

            def synchronize(self):
                line.host = max(line.host, line.gpu)

            def elapsed_time(self, end):
                return end.at - self.at

        class Flush:
            def zero_(self):
                line.issue(0.03)

        cuda = argparse.Namespace(Event=Event, _sleep=lambda cycles: line.issue(cycles / 2e6),
                                  current_device=lambda: 0,
                                  get_device_properties=lambda d: argparse.Namespace(L2_cache_size=50 << 20))
        return argparse.Namespace(cuda=cuda, uint8="uint8", empty=lambda *a, **k: Flush())


def test_timer_times_again_a_repetition_the_host_issued_after_the_hold():
    line = _Timeline()
    # the warm-up call, then repetitions: three host stalls (0.9, 2.5 and 5 ms) among quick issues
    host_ms = iter([0.01, 0.9, 0.01, 2.5, 0.01, 5.0, 0.01, 0.01, 0.01])

    def kernel():  # 0.2 ms of GPU work, issued host_ms after the call starts
        line.host += next(host_ms)
        line.issue(0.2)

    timer = bench._Timer(line.torch(), reps=5, clock=line.clock)
    assert timer.hold_ms == pytest.approx(0.5)
    # timed as they ran, the stalled repetitions would read the work plus the GPU's wait for the
    # call (0.57, 2.2, 4.7 ms) and hold the median
    assert timer.median_ms(kernel) == pytest.approx(0.2)
    # each stall outlasted the hold of its time, which doubled after each
    assert (timer.redone, timer.hold_ms) == (3, pytest.approx(4.0))


def test_timer_without_stalls_keeps_its_hold():
    line = _Timeline()

    def kernel():
        line.host += 0.05
        line.issue(0.3)

    timer = bench._Timer(line.torch(), reps=7, clock=line.clock)
    assert timer.median_ms(kernel) == pytest.approx(0.3)
    assert (timer.redone, timer.hold_ms) == (0, pytest.approx(0.5))


# ------------------------------------------------------------------------------- the CPU bench, errors


def _no_gpu_bench():
    reason = bench.gpu_unavailable()
    if reason is None:
        pytest.skip("torch sees a GPU here: the GPU bench runs")
    return reason


def _bench_cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portable_softmax.cli", "bench", *argv], capture_output=True,
                          timeout=300, text=True, env={**os.environ, **(env or {})})


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr  # no progress bar, no traceback
    assert lines[0].startswith("portable-softmax: error: "), stderr
    return lines[0]


def test_bench_without_a_gpu_times_the_cpu(capsys):
    reason = _no_gpu_bench()
    assert cli.main(["bench", "--shapes", "64x100", "--reps", "2"]) == 0
    out, err = capsys.readouterr()
    assert f"no GPU bench here ({reason}): timing the CPU backend instead" in err
    header = out.splitlines()
    assert any(line.split()[:4] == ["dtype", "op", "shape", "ours"] for line in header), out
    assert "float32  softmax " in out and "float32  log_softmax " in out


def test_bench_cpu_results(tmp_path):
    out, md = tmp_path / "cpu.json", tmp_path / "cpu.md"
    args = _bench_args("--cpu", "--shapes", "64x300,3x50x7", "--axis", "1", "--reps", "2", "--json", str(out),
                       "--markdown", str(md))
    assert bench.main(args) == 0
    report = json.loads(out.read_text())
    assert report["backend"] == "cpu"
    rows = report["results"]
    assert [(r["shape"], r["op"]) for r in rows] == [([64, 300], "softmax"), ([64, 300], "log_softmax"),
                                                     ([3, 50, 7], "softmax"), ([3, 50, 7], "log_softmax")]
    for r in rows:
        assert r["axis"] == 1 and r["input_bytes"] == 4 * np.prod(r["shape"])
        assert r["ms"]["portable_softmax"] > 0 and r["ms"]["numpy"] > 0
        assert r["within_tolerance"] is True and r["max_abs_error_vs_float64"] < 1e-5
        # the result alone is one input's worth; numpy's exp(x - max) / sum holds one temporary more
        assert r["peak_x_input"]["portable_softmax"] >= 1.0
        assert 1.0 <= r["peak_x_input"]["numpy"] < 3.5
    assert md.read_text().count("\n| float32 |") == 4


def test_bench_cpu_row_of_16_bit_inputs(tmp_path):
    out = tmp_path / "cpu.json"
    assert bench.main(_bench_args("--cpu", "--shapes", "16x64", "--dtypes", "float16,bfloat16", "--ops",
                                  "softmax", "--reps", "1", "--json", str(out))) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["dtype"] for r in rows] == ["float16", "bfloat16"]
    assert all(r["within_tolerance"] and r["ms"]["portable_softmax"] > 0 for r in rows)


def test_bench_without_torch_times_the_cpu_without_a_torch_column(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert bench.gpu_unavailable() == "torch is not installed"
    assert cli.main(["bench", "--shapes", "32x10", "--reps", "1", "--ops", "softmax"]) == 0
    out, err = capsys.readouterr()
    assert "no GPU bench here (torch is not installed)" in err
    assert "ours" in out and "numpy" in out and "torch" not in out.split("\n", 1)[1]
    assert cli.main(["bench", "--latency"]) == 2
    assert "needs a GPU visible to torch: torch is not installed" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["--latency"], "bench --latency times GPU launches against torch.softmax and needs a GPU visible to torch"),
    (["--plot", "PNG"], "bench --plot draws the GPU bench's % of copy and needs a GPU visible to torch"),
])
def test_gpu_only_modes_without_a_gpu_fail_before_any_progress(tmp_path, argv, message):
    reason = _no_gpu_bench()
    done = _bench_cli(*[str(tmp_path / "b.png") if a == "PNG" else a for a in argv])
    assert done.returncode == 2
    assert f"{message}: {reason}" in _one_error_line(done.stderr)
    assert done.stdout == "" and not (tmp_path / "b.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--cpu", "--latency"], "bench --latency times GPU launches against torch.softmax; it has no --cpu form"),
    (["--cpu", "--plot", "b.png"], "bench --plot draws the GPU bench's % of copy; it has no --cpu form"),
    (["--json", "/nonexistent/dir/b.json"], "--json /nonexistent/dir/b.json: the directory /nonexistent/dir does"),
    (["--markdown", "."], "--markdown .: is a directory"),
    (["--ops", "softmax,logsoftmax"], "--ops: 'logsoftmax' not known; accepted: softmax, log_softmax"),
    (["--dtypes", "float32,int8"], "--dtypes: 'int8' not known; accepted: float32, float16, bfloat16, float64"),
    (["--reps", "0"], "--reps must be positive, not 0"),
    (["--mib", "-1"], "--mib must be positive, not -1"),
    (["--shapes", "4096 by 1000"], "shape '4096 by 1000' is not like 4096x1000"),
    (["--shapes", "8x8,2x3x4", "--axis", "2"], "--axis 2 is out of range for the shape 8x8 (accepted: -2 to 1)"),
    (["--axis", "-3"], "--axis -3 is out of range for the shapes of the default sweep (2-D)"),
])
def test_bench_mistakes_are_one_line_and_exit_2(capsys, argv, message):
    assert cli.main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert message in _one_error_line(err) and out == ""


def test_bench_mistakes_from_a_shell():
    done = _bench_cli("--json", "/nonexistent/dir/b.json")
    assert done.returncode == 2 and "does not exist" in _one_error_line(done.stderr)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_every_cpu_implementation_computes_the_op(rng, op):
    x = (rng.standard_normal((17, 33)) * 4).astype(np.float32)
    impls = bench.cpu_implementations(op)
    assert list(impls)[:2] == ["portable_softmax", "numpy"]
    ref = (reference.softmax if op == "softmax" else reference.log_softmax)(x, 0)
    for name, bind in impls.items():
        y = np.asarray(bind(x, 0)())
        assert y.shape == x.shape and y.dtype == np.float32, name
        assert not _tolerance.outside(y, ref).any(), name


def test_median_ms_times_each_call_after_a_warm_up():
    ticks = iter([0.0, 0.004, 1.0, 1.001, 2.0, 2.010])  # start, end of three timed calls
    calls = []
    assert bench.median_ms(lambda: calls.append(1), 3, clock=lambda: next(ticks)) == pytest.approx(4.0)
    assert len(calls) == 4


def test_peak_bytes_counts_what_a_call_holds_at_once():
    n = 1 << 22

    def two_buffers():
        a = np.ones(n, np.uint8)
        b = np.ones(n, np.uint8)
        return a, b

    assert 2 * n <= bench.peak_bytes(two_buffers) < 2 * n + (1 << 16)
    assert bench.peak_bytes(lambda: [np.ones(n, np.uint8) for _ in range(3)][0]) >= 3 * n


def _cpu_results() -> list[CpuResult]:
    ms = {"portable_softmax": 118.0, "numpy": 77.0, "scipy": 73.0, "torch": 60.0}
    peaks = {"portable_softmax": 4.0, "numpy": 2.0, "scipy": 2.0, "torch": None}
    return [CpuResult("float32", op, (4096, 4096), -1, 4096 * 4096 * 4, dict(ms), dict(peaks), 3e-7, True)
            for op in ("softmax", "log_softmax")] + [
        CpuResult("float16", "softmax", (262144, 50257), 0, 2, {"portable_softmax": 1234.5, "numpy": None,
                                                                 "scipy": 99.0, "torch": 8.0},
                  {"portable_softmax": 4.0}, 2e-3, False)]


def test_cpu_table_fits_80_columns_and_marks_results_outside_the_tolerance():
    console = Console(width=80, record=True)
    console.print(bench.render_cpu_table(_cpu_results(), "title"))
    text = console.export_text()
    assert "…" not in text  # nothing cut short
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("float")]
    assert rows[0] == ["float32", "softmax", "4096x4096", "118.0", "77.0", "73.0", "60.0", "4.0x", "3e-07"]
    assert rows[2] == ["float16", "softmax", "262144x50257", "1234.5", "-", "99.0", "8.0", "4.0x", "2e-03!"]


def test_cpu_markdown_table():
    lines = bench.cpu_markdown_table(_cpu_results()).splitlines()
    assert lines[0] == ("| dtype | op | shape | axis | portable_softmax ms | numpy ms | scipy ms | torch ms "
                        "| peak ours x input |")
    assert lines[2] == "| float32 | softmax | 4096x4096 | -1 | 118.0 | 77.0 | 73.0 | 60.0 | 4.0 |"
    assert lines[4] == "| float16 | softmax | 262144x50257 | 0 | 1234.5 | - | 99.0 | 8.0 | 4.0 |"


def test_default_cpu_sweep():
    shapes = bench.default_shapes("float32", bench.CPU_MIB << 20, bench.CPU_COLS)
    assert (4096, 4096) in shapes and [c for _, c in shapes] == list(bench.CPU_COLS)

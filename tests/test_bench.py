"""``portable-softmax bench``: its host-side pieces everywhere, the command itself on a GPU."""

from __future__ import annotations

import argparse
import json

import pytest

from portable_softmax import bench, cli
from portable_softmax.bench import Result


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

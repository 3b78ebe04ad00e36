"""The gradient kernels on a real GPU: every regime and dtype, views, out=, streams, CUDA graphs, threads
and torch's autograd. Run on a machine with a GPU: ``pytest -m gpu``. Skipped elsewhere with the reason.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from checks import gradient_reference
from test_backward import assert_gradient, forward_output, long_rows_with_a_cancelling_element
from test_gpu import _to_numpy, _torch_cuda, device_arrays, needs_cuda

import portable_softmax as ps
from portable_softmax import _probe
from portable_softmax._dtypes import host_dtype

pytestmark = pytest.mark.gpu


def _to_torch(a: np.ndarray):
    import torch

    if a.dtype == host_dtype("bfloat16"):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def _plan(dy, y, axis, op):
    from portable_softmax import _backward
    from portable_softmax.layout import describe

    src = _backward.classify(dy)
    layout = describe(tuple(dy.shape), src.strides, axis % dy.ndim)
    problem = _backward._problem(src.dtype, op, layout, layout, layout, (0, 0, 0))
    return _backward.plan_backward(problem, _probe.runtime("cuda").profile(0))


def _tier(dy, y, axis, op) -> str:
    return _plan(dy, y, axis, op).tier


#: shapes that take each regime on an H100/H200 class device
SHAPES = [(4096, 1), (1000, 7), (2048, 32), (512, 1000), (256, 8192), (64, 50257), (8, 131072),
          (1, 2_000_000), (2, 20_000_000)]
FNS = {"softmax": ps.softmax_backward, "log_softmax": ps.log_softmax_backward}


@needs_cuda
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_cupy_every_regime(rng, dtype, op):
    cupy = pytest.importorskip("cupy")
    tiers = set()
    for shape in SHAPES:
        if dtype == "float64" and shape[0] * shape[1] > 4_000_000:
            continue
        y = forward_output(rng, shape, 1, op, dtype)
        dy = rng.standard_normal(shape).astype(y.dtype)
        dy_d, y_d = cupy.asarray(dy), cupy.asarray(y)
        out = cupy.full(shape, np.nan, dtype=y.dtype)  # poisoned
        assert FNS[op](dy_d, y_d, 1, out=out) is out
        tiers.add(_tier(dy_d, y_d, 1, op))
        assert_gradient(cupy.asnumpy(out), dy, y, 1, op, f"cupy {dtype} {shape}")
        got = FNS[op](dy_d, y_d)
        assert isinstance(got, cupy.ndarray)
        assert_gradient(cupy.asnumpy(got), dy, y, 1, op, f"cupy {dtype} {shape} (fresh output)")
    assert {"warp", "block", "cached", "split"} <= tiers


#: rows a little past a block shape, each of whose fitted kernels holds more blocks a multiprocessor
#: than the shape's on an NVIDIA multiprocessor of 65536 registers and 2048 threads (sm_80, sm_90):
#: the kernels of _variants.GRAD_FITTED_CAPPED only under their register cap (float32 log_softmax's
#: and float64 softmax's at 8200 and 4200 columns, 16-bit ones at 16400); enough rows that they take
#: no split (planner_backward.GradTuning.few_rows_fraction)
FITTED_ROWS = {"float32": [(256, 1100), (256, 8200)], "float64": [(256, 2100), (256, 4200)],
               "bfloat16": [(256, 2056), (256, 16400)], "float16": [(256, 8200), (256, 16400)]}


@needs_cuda
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("dtype", list(FITTED_ROWS))
def test_rows_past_a_block_shape_launch_at_their_fitted_block(rng, dtype, op):
    """The runtime launches the fitted kernel at the fewest warps that hold the row, its output right."""
    cupy = pytest.importorskip("cupy")
    runtime = _probe.runtime("cuda")
    arch = runtime.profile(0).arch
    if arch not in ("sm_80", "sm_90"):
        pytest.skip(f"which block holds more a multiprocessor is counted for sm_80 and sm_90, not {arch}")
    for shape in FITTED_ROWS[dtype]:
        y = forward_output(rng, shape, 1, op, dtype)
        dy = rng.standard_normal(shape).astype(y.dtype)
        dy_d, y_d = cupy.asarray(dy), cupy.asarray(y)
        step = _plan(dy_d, y_d, 1, op).launches[0]
        made = runtime.resident_step(step, dtype, 0)
        assert (made.kernel, made.block) == (step.fitted_kernel, step.fitted_block), (shape, step, made)
        out = cupy.full(shape, np.nan, dtype=y.dtype)  # poisoned
        assert FNS[op](dy_d, y_d, 1, out=out) is out
        assert_gradient(cupy.asnumpy(out), dy, y, 1, op, f"cupy {dtype} {shape} at {made.block} threads")


@needs_cuda
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("dtype, shape", [("float32", (4, 600_000)), ("bfloat16", (8, 2_097_152))])
def test_cupy_rows_past_one_chunk_a_multiprocessor_stay_on_chip(rng, dtype, shape, op):
    """Rows that take several chunks of the gradient's on-chip split a multiprocessor (two or more
    rows a round of resident blocks), a NaN element in one, contiguous and as views a column off a
    vector (out a view alike), into a poisoned output."""
    cupy = pytest.importorskip("cupy")
    from portable_softmax import planner

    device = _probe.runtime("cuda").profile(0)
    if not planner.has_async_copy(device):
        pytest.skip(f"{device.arch} has no asynchronous copies: such rows take the two passes")
    rows, cols = shape
    y = forward_output(rng, (rows, cols + 1), 1, op, dtype)
    dy = rng.standard_normal((rows, cols + 1)).astype(y.dtype)
    dy[1, 7] = np.nan
    for name, cut in (("contiguous", slice(0, cols)), ("column offset 1", slice(1, cols + 1))):
        dy_h, y_h = np.ascontiguousarray(dy[:, cut]), np.ascontiguousarray(y[:, cut])
        dy_d, y_d = (cupy.asarray(dy), cupy.asarray(y)) if cut.start else (cupy.asarray(dy_h), cupy.asarray(y_h))
        if cut.start:
            dy_d, y_d = dy_d[:, cut], y_d[:, cut]
        out = cupy.full(dy.shape, np.nan, dtype=y.dtype)[:, cut] if cut.start else cupy.full(shape, np.nan, y.dtype)
        the_plan = _plan(dy_d, y_d, 1, op)
        assert the_plan.tier == "cached" and the_plan.notes["chunks"] > device.multiprocessors, (name, the_plan)
        assert FNS[op](dy_d, y_d, 1, out=out) is out
        assert_gradient(cupy.asnumpy(out), dy_h, y_h, 1, op, f"{dtype} {shape} {name}")


@needs_cuda
@pytest.mark.parametrize("into", ["dy", "y"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cupy_gradients_written_over_dy_or_y(rng, dtype, into):
    """out=dy or out=y, as memory-saving training code passes them: every regime."""
    cupy = pytest.importorskip("cupy")
    tiers = set()
    for shape in [(1000, 7), (2048, 32), (256, 8192), (64, 50257), (1, 2_000_000)]:
        for op, fn in FNS.items():
            y = forward_output(rng, shape, 1, op, dtype)
            dy = rng.standard_normal(shape).astype(y.dtype)
            arrays = {"dy": cupy.asarray(dy), "y": cupy.asarray(y)}
            tiers.add(_tier(arrays["dy"], arrays["y"], 1, op))
            assert fn(arrays["dy"], arrays["y"], 1, out=arrays[into]) is arrays[into]
            assert_gradient(cupy.asnumpy(arrays[into]), dy, y, 1, op, f"cupy {dtype} {shape} over {into}")
    assert {"warp", "block", "cached", "split"} <= tiers


@needs_cuda
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_a_gradients_out_overlapping_dy_or_y_partly_is_computed_apart(rng, library):
    """dy, y and out rows of one buffer, out a row off dy or y: the gradient of the inputs as they
    were, on the first call and on a repeat call of the same layouts."""
    make, host = device_arrays(library)
    for cols in (40, 3000, 131072):
        for op, fn in FNS.items():
            for _ in range(2):
                y = forward_output(rng, (8, cols), 1, op, "float32")
                dy = rng.standard_normal((8, cols)).astype(np.float32)
                both = make(np.concatenate([dy, y, np.zeros((1, cols), np.float32)]))
                d, w = both[:8], both[8:16]
                got = fn(d, w, 1, out=both[1:9])  # one row past dy: dy's rows 1-7 and y's row 0
                assert_gradient(host(got), dy, y, 1, op, f"{library} {op} {cols} a row past dy")
                both = make(np.concatenate([dy, y, np.zeros((1, cols), np.float32)]))
                got = fn(both[:8], both[8:16], 1, out=both[9:17])  # one row past y
                assert_gradient(host(got), dy, y, 1, op, f"{library} {op} {cols} a row past y")


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_every_strided_regime_and_vector_width(rng, dtype):
    """Non-last axes: short ones a thread per line of positions at every vector width (inner
    positions 3 * vec, rows of 2, 4 and 50), longer ones in column groups, and long ones over
    positions that fill a block's shared memory cached on chip where the dtype takes that regime
    (positions of a vector and not);
    also over a view one element past an aligned address (vectors of one)."""
    torch = _torch_cuda()
    from portable_softmax import _variants as V

    tiers = set()
    shapes = [(3, cols, 3 * vec) for vec in V.strided_thread_widths(dtype) for cols in (2, 4, 50)]
    for shape in shapes + [(2, 300, 64), (2, 1000, 40), (5, 70, 33), (2, 4096, 128), (1, 8192, 129)]:
        for op, fn in FNS.items():
            y = forward_output(rng, shape, 1, op, dtype)
            dy = rng.standard_normal(shape).astype(y.dtype)
            dy_t, y_t = _to_torch(dy), _to_torch(y)
            tiers.add(_tier(dy_t, y_t, 1, op))
            assert_gradient(_to_numpy(fn(dy_t, y_t, 1)), dy, y, 1, op, f"torch {dtype} {shape}")
            flat = torch.empty(dy.size + 1, dtype=dy_t.dtype, device="cuda")
            view = flat[1:].view(shape)
            view.copy_(dy_t)
            assert_gradient(_to_numpy(fn(view, y_t, 1)), dy, y, 1, op, f"torch {dtype} {shape} offset 1")
    on_chip = {"strided_cached"} if V.DTYPES[dtype][2] in V.GRAD_STRIDED_CACHED_ITEMSIZES else set()
    assert tiers == {"strided", "strided_thread"} | on_chip


@needs_cuda
def test_log_softmax_gradients_take_a_long_rows_sum_exactly(rng):
    """Where exp(y) * sum(dy) cancels dy, the sum's float32 rounding would be all of dx (see the
    emulated test of the same name): every row regime, on the device."""
    cupy = pytest.importorskip("cupy")
    tiers = set()
    for shape in [(512, 1000), (256, 8192), (64, 50257), (8, 131072), (2, 2_000_000)]:
        y, dy = long_rows_with_a_cancelling_element(rng, *shape)
        dy_d, y_d = cupy.asarray(dy), cupy.asarray(y)
        out = cupy.full(shape, np.nan, dtype=np.float32)  # poisoned
        ps.log_softmax_backward(dy_d, y_d, out=out)
        tiers.add(_tier(dy_d, y_d, 1, "log_softmax"))
        assert_gradient(cupy.asnumpy(out), dy, y, 1, "log_softmax", f"{shape}")
    assert {"warp", "block", "cached", "split"} <= tiers


@needs_cuda
@pytest.mark.parametrize("op", FNS)
def test_torch_views_axes_and_misalignment(rng, op):
    torch = _torch_cuda()
    for shape, axis in [((300, 257), 0), ((6, 500, 9), 1), ((4, 3, 1000), 2), ((33, 4000), 1)]:
        y = forward_output(rng, shape, axis, op, "float32")
        dy = rng.standard_normal(shape).astype(np.float32)
        got = FNS[op](_to_torch(dy), _to_torch(y), axis)
        assert got.is_cuda and got.dtype == torch.float32
        assert_gradient(_to_numpy(got), dy, y, axis, op, f"torch {shape} axis {axis}")
    # views that start 1..3 elements past an aligned address, each array at its own offset
    base_dy = torch.randn(70_003, device="cuda")
    y_np = forward_output(rng, (7, 10_000), 1, op, "float32")
    base_y = torch.empty(70_005, device="cuda")
    for a, b, c in [(1, 1, 1), (1, 2, 3), (0, 3, 0)]:
        dy_v = base_dy[a:a + 70_000].view(7, 10_000)
        y_v = base_y[b:b + 70_000].view(7, 10_000)
        y_v.copy_(_to_torch(y_np))
        out_base = torch.full((70_004,), float("nan"), device="cuda")
        out = out_base[c:c + 70_000].view(7, 10_000)
        FNS[op](dy_v, y_v, 1, out=out)
        assert_gradient(_to_numpy(out), _to_numpy(dy_v), y_np, 1, op, f"offsets {(a, b, c)}")
    # a transposed (non-contiguous) gradient, as autograd can pass one
    y = forward_output(rng, (64, 3000), 1, op, "float32")
    dy_t = torch.randn(3000, 64, device="cuda").t()
    got = FNS[op](dy_t, _to_torch(y), 1)
    assert_gradient(_to_numpy(got), _to_numpy(dy_t), y, 1, op, "transposed dy")


@needs_cuda
def test_torch_streams_graphs_and_threads(rng):
    torch = _torch_cuda()
    shapes = [(512, 1000), (8, 131072), (2, 3_000_000)]
    data = []
    for shape in shapes:
        y = forward_output(rng, shape, 1, "softmax", "float32")
        dy = rng.standard_normal(shape).astype(np.float32)
        data.append((dy, y, _to_torch(dy), _to_torch(y)))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the caller's stream
        outs = [ps.softmax_backward(dy_d, y_d) for _, _, dy_d, y_d in data]
    side.synchronize()
    for (dy, y, _, _), got in zip(data, outs):
        assert_gradient(_to_numpy(got), dy, y, 1, "softmax", f"side stream {dy.shape}")
    for dy, y, dy_d, y_d in data:  # captured in a CUDA graph, replayed with new values in the same memory
        dy_d = dy_d.clone()  # the threads below read the original
        out = torch.empty_like(dy_d)
        ps.softmax_backward(dy_d, y_d, out=out)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ps.softmax_backward(dy_d, y_d, out=out)
        new_dy = rng.standard_normal(dy.shape).astype(np.float32)
        dy_d.copy_(_to_torch(new_dy))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_gradient(_to_numpy(out), new_dy, y, 1, "softmax", f"graph replay {dy.shape}")
    errors = []

    def worker(i):
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(5):
                    dy, y, dy_d, y_d = data[i % len(data)]
                    got = ps.softmax_backward(dy_d, y_d)
                    torch.cuda.current_stream().synchronize()
                    assert_gradient(_to_numpy(got), dy, y, 1, "softmax", f"thread {i}")
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@needs_cuda
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_autograd_runs_the_gradient_kernels(monkeypatch, rng, op, dtype):
    torch = _torch_cuda()
    from portable_softmax import _torch_op

    calls = []
    real = _torch_op._gradient
    monkeypatch.setattr(_torch_op, "_gradient", lambda *a: calls.append(a[3]) or real(*a))
    f = ps.softmax if op == "softmax" else ps.log_softmax
    ref = torch.softmax if op == "softmax" else torch.log_softmax
    generator = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))
    for shape in [(4096, 100), (64, 50257), (2, 2_000_000)]:
        x = torch.randn(shape, device="cuda", generator=generator).to(getattr(torch, dtype)) * 3
        w = torch.randn(shape, device="cuda", generator=generator).to(x.dtype)
        xa = x.clone().requires_grad_()
        (f(xa, 1) * w).sum().backward()
        y = f(x, 1)
        want = FNS[op](w, y, 1)  # the same kernels, called directly
        torch.testing.assert_close(xa.grad, want, atol=0, rtol=0)
        assert_gradient(_to_numpy(xa.grad), _to_numpy(w), _to_numpy(y), 1, op, f"autograd {shape}")
        if dtype == "float32":
            # Beside torch's own backward: no further from the float64 dx than torch's is. (Elementwise
            # agreement with torch would compare two float32 roundings of a row's sum, which on rows of
            # 2e6 columns differ by more than any fixed tolerance now and then; 16-bit: the float64
            # check above decides.)
            xr = x.clone().requires_grad_()
            (ref(xr, 1) * w).sum().backward()
            exact = torch.from_numpy(gradient_reference(_to_numpy(w), _to_numpy(y), 1, op)).cuda()
            ours_off = float((xa.grad.double() - exact).abs().max())
            torch_off = float((xr.grad.double() - exact).abs().max())
            assert ours_off <= torch_off + 1e-6, f"{shape}: ours {ours_off:.3g} from float64, torch's {torch_off:.3g}"
    assert calls == [op] * 3


AUTOGRAD_THREAD = """
import torch, portable_softmax as ps
x = torch.randn(256, 1000, device="cuda") * 3
w = torch.randn_like(x)
y = ps.softmax(x, 1)
{first}
xa = x.clone().requires_grad_()
(ps.softmax(xa, 1) * w).sum().backward()  # dx on torch's autograd thread for the device
torch.testing.assert_close(xa.grad, ps.softmax_backward(w, y, 1), atol=0, rtol=0)
xr = x.clone().requires_grad_()
(torch.softmax(xr, 1) * w).sum().backward()
torch.testing.assert_close(xa.grad, xr.grad, atol=1e-5, rtol=1e-4)
print("autograd thread ok")
"""


@needs_cuda
@pytest.mark.parametrize("first", ["", "ps.softmax_backward(w, y, 1); torch.cuda.synchronize()"],
                         ids=["first-gradient-on-the-autograd-thread", "launcher-kept-from-the-main-thread"])
def test_gradients_on_torchs_fresh_autograd_thread(first):
    """A fresh process: torch's autograd thread for device 0 starts without the device's context bound
    (it reports device 0 already, so torch skips cudaSetDevice); its first gradient, planned there or
    replaying a launcher the main thread kept, still launches."""
    import subprocess
    import sys

    _torch_cuda()
    done = subprocess.run([sys.executable, "-c", AUTOGRAD_THREAD.format(first=first)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "autograd thread ok" in done.stdout, done.stdout + done.stderr


@needs_cuda
@pytest.mark.parametrize("library", ["torch", "cupy"])
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("shape", [(512, 1000), (8, 131072), (1, 2_000_000)])
def test_repeat_gradient_calls_replay_the_launcher_of_the_first(monkeypatch, rng, library, op, shape):
    """The first gradient call of a layout builds its launcher (dy, y, dx pointers); later calls with
    fresh data, with and without out=, replay it without classifying or planning, and match float64.
    On another stream, a launcher with scratch (bound to its first stream) is not replayed: the full
    path launches once there, and is right too."""
    from portable_softmax import _backward, api

    xp = _torch_cuda() if library == "torch" else pytest.importorskip("cupy")
    to_device = _to_torch if library == "torch" else xp.asarray
    to_host = _to_numpy if library == "torch" else xp.asnumpy
    api.launchers.clear()
    y = forward_output(rng, shape, 1, op, "float32")
    y_d = to_device(y)
    FNS[op](to_device(rng.standard_normal(shape).astype(np.float32)), y_d, 1)  # builds
    FNS[op](to_device(rng.standard_normal(shape).astype(np.float32)), y_d, 1, out=xp.empty_like(y_d))  # builds
    key = _backward._repeat_key(y_d, y_d, 1, op)
    assert key in api.launchers, "the first call kept its launcher"
    has_scratch = api.launchers.get(key)[2] is not None
    classify, full_path = _backward.classify, []
    monkeypatch.setattr(_backward, "classify", lambda a, **kw: full_path.append(a) or classify(a, **kw))
    for call in range(2):
        dy = rng.standard_normal(shape).astype(np.float32)
        got = FNS[op](to_device(dy), y_d, 1)
        out = xp.full_like(y_d, float("nan"))
        assert FNS[op](to_device(dy), y_d, 1, out=out) is out
        assert type(got) is type(y_d)
        assert_gradient(to_host(got), dy, y, 1, op, f"{library} repeat {call} {shape}")
        assert_gradient(to_host(out), dy, y, 1, op, f"{library} out= repeat {call} {shape}")
    assert not full_path, "a repeat gradient call took the full path"
    other = xp.cuda.Stream() if library == "torch" else xp.cuda.Stream(non_blocking=True)
    dy = rng.standard_normal(shape).astype(np.float32)
    dy_d = to_device(dy)
    if library == "torch":  # dy is there before `other` reads it
        xp.cuda.synchronize()
    else:
        xp.cuda.Device().synchronize()
    with (xp.cuda.stream(other) if library == "torch" else other):
        got = FNS[op](dy_d, y_d, 1)
        other.synchronize()
    assert bool(full_path) == has_scratch, "launchers with scratch replay only on their stream"
    assert_gradient(to_host(got), dy, y, 1, op, f"{library} another stream {shape}")
    api.launchers.clear()

"""Device arrays on a real GPU: zero-copy views, the caller's type and stream, long rows, > 2**31 elements.

Run on a machine with a GPU: ``pytest -m gpu``. Skipped elsewhere with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from checks import DTYPES, assert_matches, mismatches, random_input, tune_defaults

import portable_softmax as ps
from portable_softmax import _probe

pytestmark = pytest.mark.gpu


def _cuda_reason() -> str | None:
    try:
        _probe.runtime("cuda")
        return None
    except _probe.BackendUnavailableError as e:
        return f"no CUDA device here ({e})"


needs_cuda = pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def _to_numpy(t) -> np.ndarray:
    """A torch tensor as numpy, bfloat16 through ml_dtypes."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        from portable_softmax._dtypes import host_dtype

        return t.view(torch.int16).numpy().view(host_dtype("bfloat16"))
    return t.numpy()


def device_arrays(library: str):
    """(make, host) for "torch" or "cupy": a numpy array to a device array of that library, and back."""
    if library == "torch":
        torch = _torch_cuda()
        return (lambda a: torch.from_numpy(a).cuda()), _to_numpy
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    return cupy.asarray, cupy.asnumpy


def _plan_of(v, axis: int = -1):
    """The plan the API makes for softmax of device tensor `v` along `axis`, in place."""
    from portable_softmax import api

    src = api.classify(v)
    layout = api.describe(tuple(v.shape), src.strides, axis % len(v.shape))
    return api.plan(api.problem_for(src.dtype, "softmax", False, layout, layout, src.ptr, src.ptr),
                    _probe.runtime("cuda").profile(0))


def _check_each_op(v, what: str) -> None:
    """softmax (plain and safe) and log_softmax of `v` along its last axis into NaN-filled outputs,
    each against the float64 reference."""
    import torch

    for op, safe in (("softmax", False), ("softmax", True), ("log_softmax", False)):
        out = torch.full_like(v, float("nan"))
        if op == "softmax":
            ps.softmax(v, out=out, safe=safe)
        else:
            ps.log_softmax(v, out=out)
        assert_matches(_to_numpy(out), _to_numpy(v.contiguous()), op=op, safe=safe, what=f"{what} safe={safe}")


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_cuda_tensor_in_torch_out_same_device(rng, dtype):
    torch = _torch_cuda()
    for shape in [(4096, 1000), (7, 3), (3, 70000), (2, 1 << 20)]:
        t = torch.from_numpy(random_input(rng, shape, "float32")).to("cuda", getattr(torch, dtype))
        y = ps.softmax(t)
        assert isinstance(y, torch.Tensor) and y.device == t.device and y.dtype == t.dtype
        assert_matches(_to_numpy(y), _to_numpy(t), what=f"torch {shape}")
        assert_matches(_to_numpy(ps.log_softmax(t)), _to_numpy(t), op="log_softmax", what=f"torch {shape}")


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_cupy_array_in_cupy_out(rng, dtype):
    import cupy

    x = random_input(rng, (513, 2049), dtype)
    d = cupy.asarray(x)
    y = ps.softmax(d, axis=1)
    assert isinstance(y, cupy.ndarray) and y.device == d.device and y.dtype == d.dtype
    assert_matches(cupy.asnumpy(y), x)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_misaligned_and_strided_device_views_are_computed_in_place(rng, dtype):
    torch = _torch_cuda()
    base = torch.from_numpy(random_input(rng, (300, 4100), "float32")).to("cuda", getattr(torch, dtype))
    views = {
        "column offset 1": base[:, 1:],
        "column offset 3, odd width": base[:, 3:4098],
        "flat offset 1": base.reshape(-1)[1 : 1 + 299 * 4099].view(299, 4099),
        "every other column": base[:, ::2],
        "transposed": base.t(),
        "3-D permuted": base[:, :4096].reshape(300, 64, 64).permute(2, 0, 1),
    }
    for name, v in views.items():
        for axis in range(-v.dim(), 0):
            y = ps.softmax(v, axis=axis)
            assert y.shape == v.shape
            assert_matches(_to_numpy(y), _to_numpy(v.contiguous()), axis=axis, what=name)


@needs_cuda
def test_out_on_device_including_in_place(rng):
    torch = _torch_cuda()
    x = torch.from_numpy(random_input(rng, (64, 3000), "float32")).cuda()
    expected = _to_numpy(x)
    out = torch.full_like(x, float("nan"))
    assert ps.softmax(x, out=out) is out
    assert_matches(_to_numpy(out), expected)
    strided_out = torch.full((64, 6000), float("nan"), device="cuda")[:, ::2]
    assert ps.log_softmax(x, out=strided_out) is strided_out
    assert_matches(_to_numpy(strided_out), expected, op="log_softmax")
    assert ps.softmax(x, out=x) is x  # in place
    assert_matches(_to_numpy(x), expected)
    with pytest.raises(ValueError, match="out must live where the input does"):
        ps.softmax(x, out=np.zeros((64, 3000), np.float32))


@needs_cuda
@pytest.mark.parametrize("cols", [40, 3000, 131072])
@pytest.mark.parametrize("library", ["torch", "cupy"])
def test_an_out_that_overlaps_the_input_partly_gets_the_inputs_softmax(rng, library, cols):
    """ps.softmax(x[1:], out=x[:-1]) reads rows that its output overwrites: computed apart and
    copied in, on the first call and on a repeat call of the same layouts."""
    make, host = device_arrays(library)
    for _ in range(2):
        data = random_input(rng, (9, cols), "float32")
        x = make(data)
        for op in ("softmax", "log_softmax"):
            got = getattr(ps, op)(x[1:], out=x[:-1])
            assert_matches(host(got), data[1:], op=op, what=f"{library} {op} one row back")
            x = make(data)
            got = getattr(ps, op)(x[:-1], out=x[1:])
            assert_matches(host(got), data[:-1], op=op, what=f"{library} {op} one row on")
            x = make(data)


@needs_cuda
def test_runs_on_the_callers_stream_without_device_sync(rng):
    torch = _torch_cuda()
    x = torch.from_numpy(random_input(rng, (4096, 4096), "float32")).cuda()
    expected = _to_numpy(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(8192, 8192, device="cuda")
        for _ in range(20):  # keep the side stream busy so that ordering matters
            big = big @ big.T / 8192
        y = ps.softmax(x)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()
    assert_matches(_to_numpy(y), expected)


@needs_cuda
def test_per_thread_default_streams_of_threads_that_end_and_come_again(rng):
    """Threads on cupy's per-thread default stream, in waves: each thread's launches count in
    scratch of their own (a shared one would mix their rows' arrivals and hang or mis-normalise),
    and an ended thread's scratch is reused only once drained: the next wave's one-off launches
    take the drained buffers, whatever thread ids the system hands out."""
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    import threading

    from portable_softmax import api

    pool = api.scratch_pool
    x_host = random_input(rng, (96, 131072), "float32")
    x = cupy.asarray(x_host)
    cupy.cuda.Stream.null.synchronize()  # x is there before any thread's stream reads it
    assert _plan_of(x).scratch_zeroed, "the plan keeps its scratch zeroed across calls"
    cupy.cuda.Device(0).synchronize()
    api.launchers.clear()
    pool.clear()  # another test's idle buffers would serve the first wave
    results, keys, kept_launches, pooled = [], [], [], []
    together = threading.Barrier(4, timeout=120)

    def work():
        key = api.stream_key(api.PER_THREAD_DEFAULT_STREAM)
        keys.append(key)
        with cupy.cuda.Stream.ptds:
            assert api.classify(x).stream() == api.PER_THREAD_DEFAULT_STREAM
            for _ in range(3):
                y = ps.softmax(x)  # the first call builds this thread's launcher, the next replay it
            out = cupy.empty_like(x)
            ps.log_softmax(x, out=out, safe=True)  # never kept: a one-off launch on the pool's scratch
            kept_launches.append(bool(api.launchers.bound_to(key)))
            pooled.append(pool.held("cuda", 0)[key][0])
            together.wait()  # the wave's threads hold their buffers at once
            results.append((cupy.asnumpy(y), cupy.asnumpy(out)))  # copies on this thread's stream, then waits

    waves = []
    for _ in range(3):
        wave = [threading.Thread(target=work) for _ in range(4)]
        for t in wave:
            t.start()
        for t in wave:
            t.join()
        waves.append(list(pooled))
        pooled.clear()
    assert len(results) == 12 and len(set(keys)) == 12, "a token a thread, never given twice"
    for y, out in results:
        assert_matches(y, x_host)
        assert_matches(out, x_host, op="log_softmax")
    # the threads of a wave ran at once: a buffer each; later waves take the drained ones, no new fill
    assert len(set(waves[0])) == 4, waves
    assert set(waves[1]) <= set(waves[0]) and set(waves[2]) <= set(waves[0]), waves
    idle = pool.idle("cuda", 0)
    assert len(idle) == 4 and {p for p, _, _ in idle} == set(waves[0]), "the ended threads' scratch is kept"
    for _, _, keep in idle:
        assert int(cupy.count_nonzero(keep)) == 0, "an idle buffer is left zero for its next stream"
    assert not [k for k in pool.held_streams() if k in keys], "no ended thread keeps a buffer"
    # a thread's repeat calls replay a launcher with scratch of its own, bound to its stream:
    # dropped once the thread has ended, as it could never run again
    # (a wave's threads share the layout's key: the first to build keeps it, the others launch once)
    assert any(kept_launches), "no thread kept a launcher for its stream: the drop went untested"
    assert not [k for k in keys if api.launchers.bound_to(k)], "no ended thread keeps launchers"


@needs_cuda
@pytest.mark.parametrize("shape", [(1024, 1000), (64, 131072)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_cuda_tensors_that_require_grad_get_torchs_gradients(rng, monkeypatch, op, shape):
    """The forward on this package's kernels, the backward through torch's: gradients as
    torch.softmax's for the same input; a tensor that does not require grad still takes the
    prepared launcher afterwards."""
    torch = _torch_cuda()
    x = torch.from_numpy(random_input(rng, shape, "float32")).cuda().requires_grad_()
    g = torch.randn(shape, device="cuda")
    y = getattr(ps, op)(x)
    assert y.grad_fn is not None
    assert_matches(_to_numpy(y), _to_numpy(x.detach()), op=op)
    (ours,) = torch.autograd.grad(y, x, g)
    (theirs,) = torch.autograd.grad(getattr(torch, op)(x, -1), x, g)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    plain = x.detach()
    getattr(ps, op)(plain)  # the full path, which prepares
    from portable_softmax import api

    monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("a repeat call went through the full path"))
    assert_matches(_to_numpy(getattr(ps, op)(plain)), _to_numpy(plain), op=op)


@needs_cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_tensors_under_torch_compile_and_vmap(rng, monkeypatch, mode):
    """torch.compile (inductor, fullgraph; "reduce-overhead" replays CUDA graphs) keeps the call as
    the operator portable_softmax::softmax, forward and backward; vmap computes the batch at once;
    plain tensors take the prepared launcher afterwards."""
    torch = _torch_cuda()
    torch._dynamo.reset()
    x = torch.from_numpy(random_input(rng, (8, 96, 3000), "float32")).cuda()
    y = torch.vmap(lambda t: ps.log_softmax(t, axis=0), in_dims=1)(x)
    torch.testing.assert_close(y, torch.log_softmax(x, 0).movedim(1, 0), atol=1e-5, rtol=1e-5)
    compiled = torch.compile(lambda t: ps.softmax(t) * 3, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        y = torch.full_like(x, float("nan"))
        y.copy_(compiled(x))
        assert_matches(_to_numpy(y / 3), _to_numpy(x))
    leaf = x[:2, :4].clone().requires_grad_()
    loss = torch.compile(lambda t: (ps.log_softmax(t) ** 2).sum(), fullgraph=True, mode=mode)
    (ours,) = torch.autograd.grad(loss(leaf), leaf)
    (theirs,) = torch.autograd.grad((torch.log_softmax(leaf, -1) ** 2).sum(), leaf)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    ps.softmax(x)  # the full path, which prepares
    from portable_softmax import api

    monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("a repeat call went through the full path"))
    assert_matches(_to_numpy(ps.softmax(x)), _to_numpy(x))


@needs_cuda
def test_functorch_wrappers_never_take_the_prepared_launches(rng):
    """The repeat path tells vmap's, grad's and jvp's wrappers (no storage: their data_ptr raises)
    and functionalize's (data_ptr 0) from plain tensors without torch's wrapper test: with launches
    kept for the per-example key, each transform still gets the transform's result."""
    torch = _torch_cuda()
    x = torch.from_numpy(random_input(rng, (6, 64, 200), "float32")).cuda()
    example = x[0].clone()
    for op, theirs in ((ps.softmax, torch.softmax), (ps.log_softmax, torch.log_softmax)):
        op(example), op(example)  # the full path prepares the (64, 200) key; the second call takes it
        torch.testing.assert_close(torch.vmap(op)(x), theirs(x, -1), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(torch.func.functionalize(op)(example), theirs(example, -1), atol=1e-6, rtol=1e-5)
        weights = torch.randn_like(example)
        ours_grad = torch.func.grad(lambda t, op=op, w=weights: (op(t) * w).sum())(example)
        their_grad = torch.func.grad(lambda t, theirs=theirs, w=weights: (theirs(t, -1) * w).sum())(example)
        torch.testing.assert_close(ours_grad, their_grad, atol=1e-5, rtol=1e-4)
        tangent = torch.randn_like(example)
        _, ours_jvp = torch.func.jvp(op, (example,), (tangent,))
        _, their_jvp = torch.func.jvp(lambda t, theirs=theirs: theirs(t, -1), (example,), (tangent,))
        torch.testing.assert_close(ours_jvp, their_jvp, atol=1e-5, rtol=1e-4)


@needs_cuda
def test_nvrtc_jit_path_matches(rng, tmp_path):
    """A process that skips the AOT fatbin compiles the packaged source with NVRTC."""
    code = (
        "import numpy as np, portable_softmax as ps\n"
        "from portable_softmax import _probe\n"
        "x = (np.random.default_rng(1).standard_normal((300, 3000)) * 4).astype(np.float32)\n"
        "y = ps.softmax(x)\n"
        "rt = _probe.runtime('cuda')\n"
        "print(rt.kernel_source(0, 'float32'))\n"
        "np.save(r'%s', y)\n" % (tmp_path / "y.npy")
    )
    env = dict(os.environ, PORTABLE_SOFTMAX_FORCE_JIT="1", CUPY_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "jit:nvrtc" in proc.stdout
    x = (np.random.default_rng(1).standard_normal((300, 3000)) * 4).astype(np.float32)
    assert_matches(np.load(tmp_path / "y.npy"), x)
    assert any((tmp_path / "cache").rglob("*")), "the compiled module is cached on disk"


@needs_cuda
def test_one_row_of_1e8_floats(rng):
    torch = _torch_cuda()
    x = torch.from_numpy(random_input(rng, (1, 10**8), "float32")).cuda()
    host = _to_numpy(x)
    y = ps.softmax(x)
    ours = int(mismatches(_to_numpy(y), host).sum())
    theirs = int(mismatches(_to_numpy(torch.softmax(x, dim=-1)), host).sum())
    print(f"1 x 1e8 float32: portable_softmax {ours} outputs outside tolerance, torch.softmax {theirs}")
    assert ours == 0


@needs_cuda
def test_numpy_inputs_go_through_the_gpu(rng):
    assert ps.backend_info()["backend"] == "cuda"
    x = random_input(rng, (1000, 777), "float32")
    assert_matches(ps.softmax(x), x)
    xb = random_input(rng, (100, 5000), "bfloat16")
    assert_matches(ps.softmax(xb), xb)


@needs_cuda
def test_probe_reports_the_device():
    info = ps.backend_info()
    assert info["backend"] == "cuda" and info["warp_size"] == 32
    assert info["arch"].startswith("sm_") and info["multiprocessors"] > 0
    assert info["kernel_source"].startswith(("aot:", "jit:"))


@needs_cuda
def test_more_than_2_pow_31_elements(rng):
    torch = _torch_cuda()
    rows, cols = (1 << 16) + 3, 1 << 15  # 2**31 + 98304 float16 elements: 4 GiB in, 4 GiB out
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    y = ps.softmax(x)
    sample = torch.tensor([0, 1, rows // 2, rows - 2, rows - 1], device="cuda")
    assert_matches(_to_numpy(y[sample]), _to_numpy(x[sample]), what="rows sampled past 2**31")
    sums = y.float().sum(dim=1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-2), "every row sums to 1"
    del x, y

    # One float32 row of n > 2**31: zeros but one element of log(n) at an index past 2**31,
    # so every output is known exactly: e**big / (n - 1 + e**big) there, 1 / (n - 1 + e**big) elsewhere.
    n = (1 << 31) + 5
    row = torch.zeros(1, n, device="cuda")
    peak = n - 3
    row[0, peak] = float(np.float32(np.log(n)))
    out = ps.softmax(row)
    big = float(np.exp(np.float64(np.float32(np.log(n)))))
    denom = (n - 1) + big
    got_peak = out[0, peak].item()
    assert abs(got_peak - big / denom) <= 1e-6 + 1e-5 * big / denom, got_peak
    others = out[0, torch.tensor([0, 1 << 30, (1 << 31) - 1, 1 << 31, n - 1], device="cuda")].double()
    expected = torch.full_like(others, 1 / denom)
    assert torch.allclose(others, expected, rtol=1e-5, atol=0), others
    del row, out
    torch.cuda.empty_cache()


@needs_cuda
def test_repeat_calls_reuse_the_plan_and_stay_correct(rng):
    torch = _torch_cuda()
    from portable_softmax import api

    base = torch.from_numpy(random_input(rng, (64, 1001), "float32")).cuda()
    for view in (base[:, :1000], base[:, 1:], base[:, :1000].contiguous()):
        for _ in range(3):  # the first call plans, the next ones take the prepared launcher
            fresh = view * float(rng.uniform(0.5, 2.0))  # new data, same layout as view when contiguous
            for t in (view, fresh):
                assert_matches(_to_numpy(ps.softmax(t)), _to_numpy(t.contiguous()), what="repeat")
                assert_matches(_to_numpy(ps.log_softmax(t, axis=0)), _to_numpy(t.contiguous()), axis=0,
                               op="log_softmax", what="repeat")
    assert len(api.launchers), "repeat calls of torch CUDA tensors are prepared"


@needs_cuda
def test_repeat_call_takes_the_prepared_launcher(rng, monkeypatch):
    torch = _torch_cuda()
    from portable_softmax import api

    x = torch.from_numpy(random_input(rng, (8, 1000), "float32")).cuda()
    ps.softmax(x)  # plans and prepares
    monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("a repeat call went through the full path"))
    assert_matches(_to_numpy(ps.softmax(x)), _to_numpy(x))


@needs_cuda
def test_repeat_call_with_out_takes_the_prepared_launcher_where_out_is_laid_out_alike(rng, monkeypatch):
    """out= calls keep their launches too: a repeat call with a new out of the same dtype, shape,
    strides, alignment and device (or the input itself) skips the full path and writes into out;
    an out laid out otherwise takes the full path again, and every result matches float64."""
    torch = _torch_cuda()
    from portable_softmax import api

    x = torch.from_numpy(random_input(rng, (8, 1000), "float32")).cuda()
    ps.log_softmax(x, out=torch.empty_like(x))  # plans and prepares, out= given
    monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("an out= repeat call took the full path"))
    for _ in range(2):
        out = torch.full_like(x, float("nan"))
        assert ps.log_softmax(x, out=out) is out
        assert_matches(_to_numpy(out), _to_numpy(x), op="log_softmax", what="out= repeat")
    monkeypatch.undo()
    strided = torch.full((8, 1024), float("nan"), device="cuda")[:, :1000]
    assert ps.log_softmax(x, out=strided) is strided  # rows 1024 apart: the full path, then kept apart
    assert_matches(_to_numpy(strided), _to_numpy(x), op="log_softmax", what="strided out")
    assert any(len(key) > 8 and key[10] == (1024, 1) for key in api.launchers.entries), "strided out= kept apart"
    same = x.clone()
    ps.softmax(same, out=same)  # in place: prepared on the first call, replayed on the second
    monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("an in-place repeat call took the full path"))
    again = x.clone()
    assert ps.softmax(again, out=again) is again
    assert_matches(_to_numpy(again), _to_numpy(x), what="in place, repeat")


@needs_cuda
@pytest.mark.parametrize("shape, axis", [((8, 1000), -1), ((8192, 512), 0), ((8, 131072), -1)])
def test_cupy_repeat_calls_take_the_prepared_launches_and_stay_correct(rng, monkeypatch, shape, axis):
    """A cupy array's repeat calls (fresh data, the same layout), with and without out=, replay the
    launches its first calls kept: cupy arrays come back and every result matches float64. On
    another stream, launches with scratch (a column or a long row cached across blocks) are not
    replayed (the full path runs); launches without it are."""
    import cupy

    from portable_softmax import api

    x = cupy.asarray(random_input(rng, shape, "float32"))
    has_scratch = bool(_plan_of(x, axis).scratch)
    assert has_scratch == (shape != (8, 1000))
    ps.softmax(x, axis=axis)  # plans and prepares
    ps.log_softmax(x, axis=axis, out=cupy.empty_like(x))  # the same, out= given
    classify, full_path = api.classify, []
    monkeypatch.setattr(api, "classify", lambda a, **kw: full_path.append(a) or classify(a, **kw))
    for _ in range(2):
        fresh = x * float(rng.uniform(0.5, 2.0))  # new data, the same layout
        y = ps.softmax(fresh, axis=axis)
        assert type(y) is cupy.ndarray and y.shape == shape and y.dtype == fresh.dtype
        assert_matches(cupy.asnumpy(y), cupy.asnumpy(fresh), axis=axis, what="cupy repeat")
        out = cupy.full_like(fresh, cupy.nan)
        assert ps.log_softmax(fresh, axis=axis, out=out) is out
        assert_matches(cupy.asnumpy(out), cupy.asnumpy(fresh), axis=axis, op="log_softmax", what="cupy out= repeat")
    assert not full_path, "a cupy repeat call took the full path"
    with cupy.cuda.Stream(non_blocking=True):
        fresh = x * 0.5
        y = ps.softmax(fresh, axis=axis)
        out = cupy.full_like(fresh, cupy.nan)
        ps.log_softmax(fresh, axis=axis, out=out)
        cupy.cuda.get_current_stream().synchronize()
    assert bool(full_path) == has_scratch, "launches with scratch replay only on their stream"
    assert_matches(cupy.asnumpy(y), cupy.asnumpy(fresh), axis=axis, what="cupy, another stream")
    assert_matches(cupy.asnumpy(out), cupy.asnumpy(fresh), axis=axis, op="log_softmax",
                   what="cupy out=, another stream")


@needs_cuda
@pytest.mark.parametrize("dtype, shape, axis, tier", [("float32", (8, 131072), -1, "cached"),
                                                      ("float64", (8, 65536), -1, "cached"),
                                                      ("float32", (8192, 512), 0, "strided_cached"),
                                                      ("float16", (4096, 301), 0, "strided_cached"),
                                                      ("float32", (1, 1 << 22), -1, "split")])
def test_scratch_is_zeroed_once_and_left_zero(rng, monkeypatch, dtype, shape, axis, tier):
    """Launches that count arrivals and publish (m, d) pairs in scratch find it zero and leave it
    zero, so that a call launches no fill ahead of its kernel: the first calls build launchers with
    a scratch of their own (torch tensors, with and without out=) that repeat calls with fresh data
    replay; on a second stream the same calls launch once each on the pool's scratch of that stream
    (the launchers' scratch belongs to the first). Every result matches the float64 reference, the
    launchers are taken, and every such scratch is all zero after them. The two-pass split writes
    its scratch before reading it: it needs no fill and takes none."""
    from portable_softmax import api

    torch = _torch_cuda()
    torch.cuda.synchronize()
    api.launchers.clear()
    api.scratch_pool.clear()  # an ended thread's buffers (another test's) would serve a call here
    base = torch.from_numpy(random_input(rng, shape, "float32")).to("cuda", getattr(torch, dtype))
    the_plan = _plan_of(base, axis)
    assert the_plan.tier == tier and the_plan.scratch and the_plan.scratch_zeroed == (tier != "split"), the_plan
    other = torch.cuda.Stream()
    torch.cuda.synchronize()  # base is ready for the other stream
    try:
        for stream in (torch.cuda.current_stream(), other, torch.cuda.current_stream()):
            with torch.cuda.stream(stream):
                for call in range(3):
                    x = base * float(rng.uniform(0.5, 2.0))
                    out = torch.full_like(x, float("nan"))
                    ps.log_softmax(x, axis=axis, out=out)
                    got = ps.softmax(x, axis=axis)  # the launcher built by the first call
                    stream.synchronize()
                    what = f"{tier} call {call} on stream {stream.cuda_stream}"
                    assert_matches(_to_numpy(out), _to_numpy(x), axis=axis, op="log_softmax", what=what)
                    assert_matches(_to_numpy(got), _to_numpy(x), axis=axis, what=what)
        # kept for the first stream: softmax without out=, log_softmax with it (its key goes on)
        prepared = sorted(((len(key), entry) for key, entry in api.launchers.entries.items() if key[1] == x.shape),
                          key=lambda item: item[0])
        here = torch.cuda.current_stream().cuda_stream
        assert [n for n, _ in prepared] == [8, 13] and all(e[2] == here for _, e in prepared), prepared
        # pooled: one for the other stream, whose calls the launchers do not replay
        pooled = api.scratch_pool.held("cuda", base.get_device())
        assert set(pooled) == ({other.cuda_stream} if the_plan.scratch_zeroed else set()), pooled  # split: none
        scratches = [keep for _, _, keep in pooled.values()] + [e[3] for _, e in prepared]
        assert len(scratches) == (3 if the_plan.scratch_zeroed else 2), scratches
        if the_plan.scratch_zeroed:
            for keep in scratches:
                assert int(torch.count_nonzero(keep)) == 0, f"{tier}: scratch left not zero"
        x = base.clone()
        monkeypatch.setattr(api, "classify", lambda *_, **__: pytest.fail("a repeat call went through the full path"))
        assert_matches(_to_numpy(ps.softmax(x, axis=axis)), _to_numpy(x), axis=axis, what=f"{tier} prepared")
        out = torch.full_like(x, float("nan"))
        ps.log_softmax(x, axis=axis, out=out)
        assert_matches(_to_numpy(out), _to_numpy(x), axis=axis, op="log_softmax", what=f"{tier} prepared out=")
    finally:
        torch.cuda.synchronize()
        api.launchers.clear()
        api.scratch_pool.clear()


@needs_cuda
@pytest.mark.parametrize("dtype, cols, tier", [("float32", 50257, "cached"), ("bfloat16", 120011, "cached"),
                                               ("float32", 50257, "cached_registers"),
                                               ("bfloat16", 120011, "cached_registers"),
                                               ("float32", 50257, "block"),
                                               ("float32", 65537, "block_registers"),
                                               ("bfloat16", 131071, "block_registers"),
                                               ("float32", 40001, "block_registers"),
                                               ("bfloat16", 80001, "block_registers")])
def test_many_long_rows_take_several_rounds_of_the_on_chip_split(rng, monkeypatch, dtype, cols, tier):
    """Rows too long for half a multiprocessor's shared memory, contiguous and as views whose rows
    start at varying misalignments (partial head and tail slots), with NaN, +inf and -inf rows:
    blocks that merge through global memory, each taking several rows in turn (cached; where copies
    are asynchronous also cached_registers, each chunk's first slots in registers), and a block
    alone on its multiprocessor per row (block, where
    copies are asynchronous; block_registers, with the row's first slots in registers, and the
    shorter of those rows two blocks of half the threads a multiprocessor)."""
    from portable_softmax import api, planner

    torch = _torch_cuda()
    rt = _probe.runtime("cuda")
    if tier in ("block", "block_registers") and not planner.has_async_copy(rt.profile(0)):
        pytest.skip(f"{rt.profile(0).arch} has no asynchronous copies: such rows are split")
    if tier == "cached_registers" and not planner.has_async_copy(rt.profile(0)):
        pytest.skip(f"{rt.profile(0).arch} has no asynchronous copies: the split holds no slots in registers")
    held = tier == "cached_registers"
    tier = "cached" if held else tier
    if not held:
        tune_defaults(monkeypatch, split_registers={})
    tune_defaults(monkeypatch, block_tier_whole_sm=tier == "block")
    tune_defaults(monkeypatch, row_registers=tier == "block_registers")
    tune_defaults(monkeypatch, block_alone_min_waves=0)  # blocks alone at any number of rows
    planner.plan.cache_clear()
    api.launchers.clear()
    rows = 600 if held else 400  # three rounds of the grid: the held chunks are larger, so more blocks a round
    host = random_input(rng, (rows, cols + 4), "float32")
    host[0, cols // 2] = np.nan  # the row is NaN
    host[1, cols // 3] = np.inf  # NaN, like torch
    host[2, :] = -np.inf  # NaN, or 0 when safe
    host[3, : cols - 7] = -np.inf  # whole chunks of nothing but -inf
    base = torch.from_numpy(host).to("cuda", getattr(torch, dtype))
    views = {"contiguous": base[:, :cols].contiguous(), "column offset 1": base[:, 1 : cols + 1],
             "flat offset 3, odd stride": base.reshape(-1)[3 : 3 + (rows - 1) * (cols + 2)].view(rows - 1, cols + 2)}
    try:
        for name, v in views.items():
            the_plan = _plan_of(v)
            step = the_plan.launches[0]
            assert the_plan.tier == tier, (name, the_plan)
            if tier == "block_registers":  # 40001 and 80001 columns: two blocks a multiprocessor
                paired = cols in (40001, 80001)
                threads = planner.DEFAULT_TUNING.row_registers_threads
                assert step.block == threads // (2 if paired else 1), (name, the_plan)
            if tier == "cached":
                assert ("held_slots" in the_plan.notes) == held, (name, the_plan)
                grid = rt.resident_grid(rt.function(0, dtype, step.kernel, step.shared_mem), step, 0)
                rows_per_block = v.shape[0] / (grid // the_plan.notes["chunks"])
                assert rows_per_block >= 3, (name, the_plan, grid)
            _check_each_op(v, name)
    finally:
        planner.plan.cache_clear()
        api.launchers.clear()


@needs_cuda
@pytest.mark.parametrize("held", [True, False])
def test_on_chip_split_rounds_of_as_many_rows(rng, monkeypatch, held):
    """float32 rows that take one and a half rounds of the on-chip split's grid, cut into more
    chunks so that both rounds take as many rows (split_even_rounds_most), with NaN, +inf and -inf
    rows and whole chunks of -inf; held: each chunk's first slots in registers."""
    from portable_softmax import api, planner

    torch = _torch_cuda()
    device = _probe.runtime("cuda").profile(0)
    if held and not planner.has_async_copy(device):
        pytest.skip(f"{device.arch} has no asynchronous copies: the split holds no slots in registers")
    if not held:
        tune_defaults(monkeypatch, split_registers={})
    planner.plan.cache_clear()
    api.launchers.clear()
    cols, committed = 50257, planner.DEFAULT_TUNING.split_even_rounds_most
    try:
        # the rows a round of the grid takes without the rule
        tune_defaults(monkeypatch, split_even_rounds_most=0.0)
        planner.plan.cache_clear()
        probe = planner.plan(planner.RowProblem("float32", "softmax", 2 * device.multiprocessors, cols), device)
        rows = probe.launches[0].grid // probe.notes["chunks"] * 3 // 2  # a round and a half of rows
        tune_defaults(monkeypatch, split_even_rounds_most=committed)
        planner.plan.cache_clear()
        host = random_input(rng, (rows, cols), "float32")
        host[0, cols // 2] = np.nan
        host[1, cols // 3] = np.inf
        host[2, :] = -np.inf
        host[rows - 1, : cols - 7] = -np.inf  # the second round: whole chunks of nothing but -inf
        v = torch.from_numpy(host).to("cuda")
        the_plan = _plan_of(v)
        assert the_plan.tier == "cached" and ("held_slots" in the_plan.notes) == held, the_plan
        assert the_plan.notes["chunks"] > probe.notes["chunks"], (the_plan, probe)
        per_round = the_plan.launches[0].grid // the_plan.notes["chunks"]
        assert per_round == -(-rows // 2), the_plan
        _check_each_op(v, f"{rows}x{cols}")
    finally:
        planner.plan.cache_clear()
        api.launchers.clear()


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("many", [True, False], ids=["three-rounds", "four-rows"])
def test_rows_past_one_chunk_a_multiprocessor_stay_on_chip(rng, dtype, many, cooperative):
    """Rows longer than the held form's chunks on every multiprocessor take several chunks a
    multiprocessor, the grid filled with as many rows a round (rows enough for three rounds, or four
    rows, fewer than multiprocessors), with NaN, +inf and -inf rows and whole chunks of -inf;
    launched plain and cooperatively."""
    from portable_softmax import planner

    torch = _torch_cuda()
    device = _probe.runtime("cuda").profile(0)
    if not planner.has_async_copy(device):
        pytest.skip(f"{device.arch} has no asynchronous copies: the split holds no slots in registers")
    # a row just past the held chunks of one block on every multiprocessor
    probe = planner.plan(planner.RowProblem(dtype, "softmax", 64, 1 << 20), device)
    chunk_bytes = probe.notes["chunk_slots"] * 16
    cols = int(1.2 * device.multiprocessors * chunk_bytes) // planner.V.DTYPES[dtype][2] + 3
    first = planner.plan(planner.RowProblem(dtype, "softmax", 1_000, cols), device)
    per_round = first.launches[0].grid // first.notes["chunks"]
    rows = 2 * per_round + 1 if many else 4
    host = random_input(rng, (rows, cols), "float32")
    host[0, cols // 2] = np.nan
    host[1, cols // 3] = np.inf
    host[2, :] = -np.inf
    host[rows - 1, : cols - 7] = -np.inf  # the last round: whole chunks of nothing but -inf
    v = torch.from_numpy(host).to("cuda", getattr(torch, dtype))
    the_plan = _plan_of(v)
    assert the_plan.tier == "cached" and "held_slots" in the_plan.notes, the_plan
    assert the_plan.notes["chunks"] > device.multiprocessors, the_plan
    assert the_plan.launches[0].grid == min(rows, per_round) * the_plan.notes["chunks"], the_plan
    _check_each_op(v, f"{dtype} {rows}x{cols}")


@needs_cuda
@pytest.mark.parametrize("dtype, cols, tier, padded", [("float32", 100, "staged_group", False),
                                                       ("float16", 120, "staged_group", False),
                                                       ("float16", 256, "staged_group", True),
                                                       ("bfloat16", 1001, "staged_group", False),
                                                       ("bfloat16", 98, "staged", False),
                                                       ("float32", 61, "staged", False)])
def test_staged_tiers_as_large_inputs_plan_them(rng, monkeypatch, dtype, cols, tier, padded):
    """Contiguous short rows staged through shared memory as inputs past the small-input rules plan
    them (rules off, and rows a group of the register tier fills as past exact_group_max_bytes, so
    that a few thousand rows do): a group of lanes a row, in tiles padded by a slot a row where rows
    are a power-of-two number of 16-byte slots, or a thread a row; a partial last tile, with NaN,
    +inf and -inf rows."""
    from checks import SMALL_INPUT_OFF

    from portable_softmax import api, planner

    torch = _torch_cuda()
    rt = _probe.runtime("cuda")
    if tier == "staged_group" and not planner.has_async_copy(rt.profile(0)):
        pytest.skip(f"{rt.profile(0).arch} has no asynchronous copies: no staged groups")
    tune_defaults(monkeypatch, **SMALL_INPUT_OFF)
    tune_defaults(monkeypatch, exact_group_min_lanes=1 << 30)
    api.launchers.clear()
    host = random_input(rng, (3001, cols), "float32")
    host[0, cols // 2] = np.nan
    host[1, cols // 3] = np.inf
    host[2, :] = -np.inf
    x = torch.from_numpy(host).to("cuda", getattr(torch, dtype))
    try:
        the_plan = _plan_of(x)
        assert the_plan.tier == tier and (the_plan.notes.get("row_shift", -1) >= 0) == padded, the_plan
        assert x.shape[0] % the_plan.notes["tile_rows"], the_plan  # a partial last tile
        _check_each_op(x, f"{dtype} x{cols} {tier}")
    finally:
        planner.plan.cache_clear()
        api.launchers.clear()


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_long_non_last_axes_are_cached_on_chip(rng, dtype):
    """Reductions over a long non-last axis, cached across co-resident blocks: axis 0 of a
    matrix, the middle axis of a 3-D tensor, and a column-strided view."""
    torch = _torch_cuda()
    tdtype = getattr(torch, dtype)
    base = torch.from_numpy(random_input(rng, (3000, 4100), "float32")).to("cuda", tdtype)
    cases = {"axis 0": (base, 0), "3-D middle axis": (base[:, :4096].reshape(3000, 64, 64).permute(1, 0, 2), 1),
             "every other column, axis 0": (base[:, ::2], 0)}
    for name, (v, axis) in cases.items():
        the_plan = _plan_of(v, axis)
        assert the_plan.tier == "strided_cached", (name, the_plan.tier)
        for op, fn in (("softmax", ps.softmax), ("log_softmax", ps.log_softmax)):
            out = torch.full(v.shape, float("nan"), device="cuda", dtype=tdtype)
            fn(v, axis=axis, out=out)
            assert_matches(_to_numpy(out), _to_numpy(v.contiguous()), axis=axis, op=op, what=name)


@pytest.fixture(params=[False, True], ids=["plain", "cooperative"])
def cooperative(request, monkeypatch):
    """Both ways of launching the tiers whose blocks wait on each other: plain (the default) and
    cooperative (PORTABLE_SOFTMAX_COOPERATIVE_LAUNCH=1); launchers prepared the other way are
    dropped before and after."""
    from portable_softmax import _launch, api

    monkeypatch.setattr(_launch, "COOPERATIVE_LAUNCHES", request.param)
    api.launchers.clear()
    yield request.param
    api.launchers.clear()


@needs_cuda
def test_launches_whose_blocks_wait_on_each_other_take_the_entry_point_asked_for(rng, cooperative):
    """The on-chip tiers' launches go through cuLaunchKernel by default and through
    cuLaunchCooperativeKernel when asked for, from Python and from the compiled launcher alike,
    and are right either way (a safe log_softmax launches once from Python, the first softmax
    builds the prepared launcher and every softmax replays it)."""
    torch = _torch_cuda()
    info = ps.backend_info()
    assert info["cooperative_launch"].startswith("cooperative (" if cooperative else "plain ("), info
    rt = _probe.runtime("cuda")
    if cooperative and rt.launch_entry_point():
        assert rt.cooperative_entry_point(), "cuLaunchCooperativeKernel not found for the compiled launcher"
    x = torch.from_numpy(random_input(rng, (64, 131072), "float32")).cuda()
    assert any(s.cooperative for s in _plan_of(x).launches)
    out = torch.full_like(x, float("nan"))
    ps.log_softmax(x, out=out, safe=True)  # never kept: its rows of all -inf are filled afterwards
    assert_matches(_to_numpy(out), _to_numpy(x), op="log_softmax", what="Python launch")
    for call in range(2):  # the second call replays the prepared launcher
        assert_matches(_to_numpy(ps.softmax(x)), _to_numpy(x), what=f"call {call}")


@needs_cuda
@pytest.mark.parametrize("mode", ["--plain", "--cooperative"])
def test_waiting_launches_on_streams_of_different_priority_all_finish(mode):
    """Two on-chip split launches on a low- and a high-priority stream, queued behind a kernel
    that holds part of the device, 200 times: every launch finishes and matches float64. In a
    subprocess with a time limit, so that launches waiting for ever fail the test instead of
    holding the suite."""
    torch = _torch_cuda()
    waiting = _plan_of(torch.empty(64, 131072, device="cuda")).launches  # the tool's default rows
    assert any(s.cooperative for s in waiting), "the tool's rows are not planned with launches that wait"
    tool = os.path.join(os.path.dirname(__file__), "..", "tools", "concurrent_waits.py")
    try:
        proc = subprocess.run([sys.executable, tool, mode, "--iterations", "200"], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the waiting launches did not finish in 120 s: {e.stdout}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"cooperative launch: {mode[2:]} (" in proc.stdout, proc.stdout
    assert "ok:" in proc.stdout, proc.stdout


@needs_cuda
@pytest.mark.parametrize("dtype, shape, axis, tier", [("float32", (16, 131072), -1, "cached"),
                                                      ("bfloat16", (8192, 512), 0, "strided_cached"),
                                                      ("float32", (1, 1 << 22), -1, "split")])
def test_a_captured_graph_replays_launches_with_scratch(rng, cooperative, dtype, shape, axis, tier):
    """A CUDA graph captured around softmax (plain or cooperative launches, scratch zeroed inside
    the capture) gives the right outputs on every replay with fresh inputs."""
    torch = _torch_cuda()
    tdtype = getattr(torch, dtype)
    static = torch.from_numpy(random_input(rng, shape, "float32")).to("cuda", tdtype)
    assert _plan_of(static, axis).tier == tier
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: modules loaded, launchers prepared
        ps.softmax(static, axis=axis)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ps.softmax(static, axis=axis)
    for replay in range(3):
        fresh = torch.from_numpy(random_input(rng, shape, "float32")).to("cuda", tdtype)
        static.copy_(fresh)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(_to_numpy(out), _to_numpy(fresh), axis=axis, what=f"{tier} replay {replay}")

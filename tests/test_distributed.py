"""portable_softmax.distributed: groups of 2 and 3 processes on gloo (CPU), one of 3 on gloo whose
local steps are the package's kernels in the SIMT emulation at warp 64 (as a GPU's are), and one of
2 on NCCL where 2 GPUs are present (marked gpu), spawned by the test itself.

Each group starts its processes once (``python tests/test_distributed.py RANK WORLD STORE OUT SEED
BACKEND``); every rank runs every case of ``CASES`` and writes each case's outcome to OUT. A case
builds the whole tensor from the seed (the same on every rank), passes its rank's slice, and
checks the slice of the result and of the gradient against the float64 reference of the whole
tensor. The processes run under a timeout (and gloo's own), so a collective that never completes
fails the tests instead of blocking the suite.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="distributed.softmax runs on torch tensors")
dist = pytest.importorskip("torch.distributed", reason="torch without torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch built without gloo", allow_module_level=True)

from checks import gradient_reference  # noqa: E402

from portable_softmax import _tolerance, distributed, reference  # noqa: E402

WORLD_TIMEOUT_S = 120  # a whole group's run; gloo's own timeout (below) ends a stuck collective sooner
COLLECTIVE_TIMEOUT_S = 30
OPS = ("softmax", "log_softmax")
NEG_INF = float("-inf")


# ---- helpers run inside the ranks ---------------------------------------------------------------
def _widths(gen: torch.Generator, total: int, world: int, zero: bool) -> list[int]:
    """Uneven widths of the ranks' slices summing to ``total``; with ``zero``, rank 1's is empty."""
    cuts = sorted(torch.randint(0, total + 1, (world - 1,), generator=gen).tolist())
    widths = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
    if zero:
        widths[0] += widths[1]
        widths[1] = 0
    return widths


def _slice(full: torch.Tensor, axis: int, widths: list[int], rank: int) -> torch.Tensor:
    start = sum(widths[:rank])
    return full.narrow(axis, start, widths[rank]).clone()


def _reference(full64: torch.Tensor, axis: int, op: str, safe: bool) -> np.ndarray:
    fn = reference.softmax if op == "softmax" else reference.log_softmax
    return fn(full64.numpy(), axis, safe=safe)


def _reference_grad(full64: torch.Tensor, dy64: torch.Tensor, axis: int, op: str, safe: bool) -> torch.Tensor:
    """torch's float64 gradient of the whole tensor; zero on rows of all -inf under safe."""
    x = full64.clone().requires_grad_(True)
    y = torch.softmax(x, axis) if op == "softmax" else torch.log_softmax(x, axis)
    (dx,) = torch.autograd.grad(y, x, dy64)
    if safe:
        dx = dx.masked_fill((full64 == NEG_INF).all(dim=axis, keepdim=True), 0.0)
    return dx


def _gather_slices(t: torch.Tensor, axis: int, group, world: int) -> torch.Tensor:
    """The ranks' slices of a tensor joined along ``axis``, on every rank (in group rank order)."""
    parts: list = [None] * world
    dist.all_gather_object(parts, t.cpu(), group=group)
    return torch.cat(parts, dim=axis)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch tensor as numpy in its own dtype (bfloat16 through ml_dtypes)."""
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().numpy()


def expect(ctx, ok: bool, message: str) -> None:
    """Record a failed check and go on: every rank must still make the case's later collectives (a
    rank that stopped early would pair its next collective with another rank's different one)."""
    if not ok:
        ctx["failures"].append(message)


def _check_values(ctx, got: torch.Tensor, ref: np.ndarray, what: str) -> None:
    bad = _tolerance.outside(_as_numpy(got.detach()), ref)
    expect(ctx, not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} elements outside "
                               f"{_tolerance.describe(str(got.dtype).removeprefix('torch.'))}; "
                               f"first got {_as_numpy(got.detach())[bad][:3]}, want {ref[bad][:3]}")


def _check_grad(ctx, got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """float64: 1e-12 + 1e-9 relative; float32: 1e-6 + 1e-5 relative; 16-bit: a few units of the
    dtype's rounding of the largest gradient (a wrong formula is off by the gradient's size)."""
    g, r = got.double(), ref
    if got.dtype == torch.float64:
        bound = 1e-12 + 1e-9 * r.abs()
    elif got.dtype == torch.float32:
        bound = 1e-6 + 1e-5 * r.abs()
    else:
        eps = 2.0 ** -8 if got.dtype == torch.bfloat16 else 2.0 ** -11
        bound = torch.full_like(r, 1e-6 + 8 * eps * float(r.abs().max()) if r.numel() else 0.0)
    bad = ~((g - r).abs() <= bound)
    expect(ctx, not bad.any(), f"{what}: gradient off at {int(bad.sum())} of {bad.numel()} elements; "
                               f"first got {g[bad][:3].tolist()}, want {r[bad][:3].tolist()}")


def _run(ctx, full: torch.Tensor, axis: int, op: str, *, safe: bool = False, zero: bool = False,
         grads: bool = True, widths: list[int] | None = None, group=None, world: int | None = None,
         rank: int | None = None) -> None:
    """Slice ``full`` over the ranks, run the distributed op and check its slice (and gradient)."""
    world = ctx["world"] if world is None else world
    rank = ctx["rank"] if rank is None else rank
    widths = widths or _widths(ctx["gen"], full.shape[axis], world, zero)
    local = _slice(full, axis, widths, rank).to(ctx["device"]).requires_grad_(grads)
    kept = local.detach().clone()
    fn = distributed.softmax if op == "softmax" else distributed.log_softmax
    y = fn(local, axis - full.dim() if axis % 2 else axis, group=group, safe=safe)  # negative and positive axes
    expect(ctx, y.device == local.device, f"the result is on {y.device}, the input on {local.device}")
    y = y.cpu()
    what = f"{op} axis={axis} {full.dtype} shape={tuple(full.shape)} widths={widths} safe={safe}"
    expect(ctx, y.shape == local.shape and y.dtype == local.dtype, f"{what}: got {y.shape} {y.dtype}")
    full64 = full.double()
    ref = _reference(full64, axis, op, safe)
    _check_values(ctx, y, _slice(torch.from_numpy(ref), axis, widths, rank).numpy(), what)
    if grads:
        dy_full = torch.randn(full.shape, generator=ctx["gen"], dtype=torch.float64)
        dy = _slice(dy_full, axis, widths, rank).to(full.dtype)
        dy_kept = dy.clone()
        y.backward(dy)
        expect(ctx, _same(dy, dy_kept), f"{what}: the backward changed its incoming gradient")
        # the gradient from the y the ranks computed (a y near 1 leaves dx ill-conditioned in y, so a
        # reference from x would hold dx to the forward's rounding as well)
        y_full = _gather_slices(y.detach(), axis, group, world)
        ref_dx = torch.from_numpy(gradient_reference(dy_full.to(full.dtype).double().numpy(),
                                                     y_full.double().numpy(), axis, op))
        _check_grad(ctx, local.grad.cpu(), _slice(ref_dx, axis, widths, rank), what)
    expect(ctx, _same(local.detach(), kept), f"{what}: the input was changed")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN equal to NaN."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _randn(ctx, *shape, dtype=torch.float64) -> torch.Tensor:
    return (3 * torch.randn(shape, generator=ctx["gen"], dtype=torch.float64)).to(dtype)


# ---- the cases: each runs on every rank; a recorded failure (or any error) fails it -----------------
def case_values_and_grads(ctx):
    for op in OPS:
        for dtype in (torch.float64, torch.float32):
            _run(ctx, _randn(ctx, 5, 37, dtype=dtype), 1, op)


def case_every_axis(ctx):
    full = _randn(ctx, 4, 9, 6, dtype=torch.float32)
    for axis in range(full.dim()):
        for op in OPS:
            _run(ctx, full, axis, op)


def case_zero_width_shard(ctx):
    for axis in (0, 1):
        for op in OPS:
            _run(ctx, _randn(ctx, 6, 11), axis, op, zero=True)


def case_all_on_one_rank(ctx):
    full = _randn(ctx, 3, 8)
    widths = [0] * ctx["world"]
    widths[-1] = 8
    for op in OPS:
        _run(ctx, full, 1, op, widths=widths)


def case_half_precision(ctx):
    for dtype in (torch.float16, torch.bfloat16):
        for op in OPS:
            _run(ctx, _randn(ctx, 6, 300, dtype=dtype), 1, op)
            _run(ctx, _randn(ctx, 40, 5, dtype=dtype), 0, op)


def case_nan_on_one_rank(ctx):
    full = _randn(ctx, 4, 12)
    widths = [3] * (ctx["world"] - 1) + [12 - 3 * (ctx["world"] - 1)]
    full[1, 0] = float("nan")  # in rank 0's slice: row 1 must be NaN on every rank
    full[2, -1] = float("inf")  # in the last rank's slice: +inf gives NaN, as torch.softmax
    dy_full = torch.randn(full.shape, generator=ctx["gen"], dtype=torch.float64)
    for op in OPS:
        _run(ctx, full, 1, op, widths=widths, grads=False)
        local = _slice(full, 1, widths, ctx["rank"]).to(ctx["device"]).requires_grad_(True)
        y = (distributed.softmax if op == "softmax" else distributed.log_softmax)(local, 1)
        y.backward(_slice(dy_full, 1, widths, ctx["rank"]).to(ctx["device"]))
        y, dx = y.detach().cpu(), local.grad.cpu()
        expect(ctx, bool(y[1].isnan().all() and y[2].isnan().all()), f"{op}: the NaN / +inf rows are not all NaN")
        expect(ctx, not y[[0, 3]].isnan().any(), f"{op}: NaN leaked into other rows")
        # the gradient: NaN rows NaN on every rank, the others as the float64 reference's
        expect(ctx, bool(dx[1].isnan().all() and dx[2].isnan().all()), f"{op}: the NaN rows' gradient is not NaN")
        ref_dx = _slice(_reference_grad(full, dy_full, 1, op, False), 1, widths, ctx["rank"])
        _check_grad(ctx, dx[[0, 3]], ref_dx[[0, 3]], f"{op} gradient of the rows without NaN")


def case_neg_inf_slices(ctx):
    full = _randn(ctx, 5, 10)
    widths = [2] * (ctx["world"] - 1) + [10 - 2 * (ctx["world"] - 1)]
    full[0, :2] = NEG_INF  # rank 0's slice of row 0: all -inf, other ranks finite
    full[1, :] = NEG_INF  # all -inf everywhere
    full[2, 3] = NEG_INF  # a single -inf
    for op in OPS:
        for safe in (False, True):
            grads = safe  # without safe the all -inf row is NaN, and so is its gradient
            _run(ctx, full, 1, op, widths=widths, safe=safe, grads=grads)


def case_bench_layout(ctx):
    """bfloat16 rows along the last axis of contiguous slices, as the bench's (the local kernels on a
    GPU), at widths that are not multiples of the vectors."""
    for op in OPS:
        for safe in (False, True):
            full = _randn(ctx, 9, 4099, dtype=torch.bfloat16)
            full[3] = NEG_INF
            _run(ctx, full, 1, op, safe=safe, grads=safe)


def case_empty_rows(ctx):
    for op in OPS:
        _run(ctx, _randn(ctx, 0, 7), 1, op)
        _run(ctx, _randn(ctx, 3, 0, 7), 2, op)


def case_subgroup(ctx):
    """A group of the first and last ranks; the others take no part."""
    members = [0, ctx["world"] - 1]
    group = dist.new_group(members)  # every rank of the world makes the group
    full = _randn(ctx, 4, 13)
    if ctx["rank"] in members:
        for op in OPS:
            _run(ctx, full, 1, op, group=group, world=2, rank=members.index(ctx["rank"]))
    dist.destroy_process_group(group)


def case_mismatched_shapes(ctx):
    """Slices with the same row count but other shapes, ops or safe: every rank gets the same error."""
    rank = ctx["rank"]
    shape = (4, 5, 6) if rank == 0 else (6, 5, 4)
    try:
        distributed.softmax(torch.zeros(shape, device=ctx["device"]), axis=1)
        expect(ctx, False, "mismatched shapes were not reported")
    except ValueError as e:
        expect(ctx, "rank 0: (4, [5], 6) float32 softmax" in str(e) and "rank 1: (6, [5], 4)" in str(e), str(e))
    fn = distributed.softmax if rank == 0 else distributed.log_softmax
    try:
        fn(torch.zeros(3, 4, device=ctx["device"]), axis=1)
        expect(ctx, False, "mismatched ops were not reported")
    except ValueError as e:
        expect(ctx, "log_softmax" in str(e), str(e))
    _run(ctx, _randn(ctx, 2, 9), 1, "softmax")  # the group still works


def case_dtensor(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(ctx["device"].type, (ctx["world"],))
    full = _randn(ctx, 5, 14)
    dy = _randn(ctx, 5, 14)
    for op in OPS:
        fn = distributed.softmax if op == "softmax" else distributed.log_softmax
        for placement in (Shard(1), Shard(0), Replicate()):
            dt = distribute_tensor(full.to(ctx["device"]), mesh, [placement]).requires_grad_(True)
            y = fn(dt, axis=1)
            expect(ctx, tuple(y.placements) == (placement,), f"{op} {placement}: result placed {y.placements}")
            got = y.full_tensor().cpu()
            want = _reference(full, 1, op, False)
            expect(ctx, np.allclose(got.detach().numpy(), want, atol=1e-12, rtol=1e-10), f"{op} {placement}")
            y.backward(distribute_tensor(dy.to(ctx["device"]), mesh, [placement]))
            ref_dx = _reference_grad(full, dy, 1, op, False)
            got_dx = dt.grad.full_tensor().cpu()
            expect(ctx, torch.allclose(got_dx, ref_dx, atol=1e-12, rtol=1e-9), f"{op} {placement} grad")


CASES = {name.removeprefix("case_"): fn for name, fn in globals().items() if name.startswith("case_")}


EMU_LIBRARY_ENV = "PORTABLE_SOFTMAX_TEST_EMU_LIBRARY"  # the parent's emulation library, for the ranks


def _use_emulated_kernels(warp: str) -> None:
    """This process's CPU tensors take KernelMath with the kernels in the SIMT emulation, as GPU tensors
    take it with the device's kernels: the collectives between them are gloo's. The library is the
    one the parent built (no rebuild in the ranks, whatever the sources became since)."""
    from emulation.runtime import EmulatedRuntime, EmulationLibrary

    from portable_softmax import _sharded

    runtime = EmulatedRuntime(EmulationLibrary(os.environ[EMU_LIBRARY_ENV]), int(warp.removeprefix("emu")))
    math = _emulated_math(runtime)
    _sharded.local_math = lambda x: math


def _worker(rank: int, world: int, store: str, out: str, seed: int, backend: str) -> None:
    device = torch.device("cpu")
    if backend == "nccl":  # a GPU a rank
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    if backend.startswith("gloo-"):  # gloo-emu32 / gloo-emu64
        _use_emulated_kernels(backend.removeprefix("gloo-"))
        backend = "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            **({"device_id": device} if backend == "nccl" else {}))
    results = {}
    for name, fn in CASES.items():
        ctx = {"rank": rank, "world": world, "gen": torch.Generator().manual_seed(seed + zlib_crc(name)),
               "failures": [], "device": device}
        try:
            fn(ctx)
            results[name] = "\n".join(ctx["failures"]) or "ok"
        except Exception:  # the case's failure, reported to the test in the parent
            results[name] = "\n".join([*ctx["failures"], traceback.format_exc()])
        try:
            dist.barrier()  # an error on some ranks only leaves the group out of step: then stop
        except Exception:
            skipped = f"not run: the group broke after case {name!r}"
            results.update((later, skipped) for later in CASES if later not in results)
            break
    with open(out + ".tmp", "w") as f:  # renamed whole: the parent reads all of it or none
        json.dump(results, f)
    os.replace(out + ".tmp", out)
    # Torch's gloo can abort a rank in the group's teardown while a peer closes its pairs
    # ("terminate called without an active exception"): once every rank's results are written (no
    # rank is in a collective), a gloo rank leaves without tearing the group down.
    outs = [_results_file(os.path.dirname(out), r) for r in range(world)]
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S
    while not all(os.path.exists(o) for o in outs) and time.monotonic() < deadline:
        time.sleep(0.01)
    if backend == "gloo":
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def _results_file(folder, rank: int) -> str:
    """Where a rank of a spawned group writes its cases' outcomes (the parent and the ranks read them)."""
    return os.path.join(folder, f"rank{rank}.json")


def zlib_crc(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode())


# ---- the tests in the parent ------------------------------------------------------------------
@pytest.fixture(scope="module")
def group_results(tmp_path_factory):
    """(world size, backend) -> one dict of case -> outcome per rank (spawned once per pair)."""
    cache: dict[tuple[int, str], list[dict] | str] = {}

    def run(world: int, backend: str) -> list[dict]:
        if (world, backend) not in cache:
            cache[world, backend] = spawn(world, backend)
        if isinstance(cache[world, backend], str):  # the group itself failed: every case reports it
            pytest.fail(cache[world, backend])
        return cache[world, backend]

    def spawn(world: int, backend: str) -> list[dict] | str:
        seed = int(os.environ.get("PORTABLE_SOFTMAX_TEST_SEED") or secrets.randbits(31))
        tmp = tmp_path_factory.mktemp(f"{backend}{world}")
        store, outs = tmp / "store", [Path(_results_file(tmp, r)) for r in range(world)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(distributed.__file__))),
             os.environ.get("PYTHONPATH", "")]))
        if "-emu" in backend:  # the ranks load this process's emulation library; a host thread each
            from emulation import emulated_runtimes

            env.update({EMU_LIBRARY_ENV: str(emulated_runtimes()["emu32"].library.path),
                        "PORTABLE_SOFTMAX_EMU_THREADS": "1"})
        procs = [subprocess.Popen([sys.executable, __file__, str(r), str(world), str(store), str(outs[r]),
                                   str(seed), backend],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=WORLD_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return f"the group of {world} ranks did not finish within {WORLD_TIMEOUT_S} s (seed={seed})"
        for r, (p, log) in enumerate(zip(procs, logs)):
            if not outs[r].exists():
                return f"rank {r} of {world} exited with {p.returncode} (seed={seed}):\n{log[-4000:]}"
            if p.returncode != 0:  # after all its results: in torch's teardown of the group, not in a case
                warnings.warn(f"rank {r} of {world} ({backend}) exited with {p.returncode} after writing every "
                              f"result, in the process group's teardown (seed={seed}): {log[-400:]}", stacklevel=1)
        return [dict(json.loads(o.read_text()), seed=seed) for o in outs]

    return run


def _two_gpus() -> str | None:
    if not dist.is_nccl_available():
        return "torch built without NCCL"
    if torch.cuda.device_count() < 2:
        return f"needs 2 GPUs, found {torch.cuda.device_count()}"
    return None


_NCCL_SKIP = _two_gpus()


def _emulation_skip() -> str | None:
    from emulation import CompilerUnavailable, emulated_runtimes

    try:
        emulated_runtimes()
    except CompilerUnavailable as e:
        return f"no host C++ compiler for the emulation: {e}"
    return None


_EMU_SKIP = _emulation_skip()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("world, backend", [
    (2, "gloo"), (3, "gloo"),
    # the local steps by the kernels (emulated, warp 64): their row sums, pairs, NaN and -inf across ranks
    pytest.param(3, "gloo-emu64", marks=pytest.mark.skipif(_EMU_SKIP is not None, reason=f"{_EMU_SKIP}")),
    pytest.param(2, "nccl", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(_NCCL_SKIP is not None, reason=f"{_NCCL_SKIP}")]),
])
def test_ranks(group_results, world, backend, case):
    results = group_results(world, backend)
    failures = [f"rank {r}: {res[case]}" for r, res in enumerate(results) if res[case] != "ok"]
    assert not failures, f"seed={results[0]['seed']}\n" + "\n".join(failures)


def test_docstring_examples():
    import doctest

    from portable_softmax import _sharded

    for module in (distributed, _sharded):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ---- the local kernels (KernelMath) in the SIMT emulation, against torch operations ----------------
@pytest.fixture(scope="module")
def emulated():
    from emulation import CompilerUnavailable, emulated_runtimes

    try:
        return emulated_runtimes()
    except CompilerUnavailable as e:
        pytest.skip(f"no host C++ compiler for the emulation: {e}")


def _emulated_math(rt):
    from portable_softmax import _sharded

    def launch(plan, dtype, buffers):
        for step in plan.launches:
            rt.library.launch(step.kernel, rt.profile(0).warp_size, step.grid, step.block, step.shared_mem,
                              step.args, buffers)

    return _sharded.KernelMath(rt.profile(0), launch)


def _offset_rows(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t (on its device) starting ``offset`` elements past an aligned address."""
    flat = torch.empty(t.numel() + 16, dtype=t.dtype, device=t.device)
    view = flat[offset:offset + t.numel()].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("warp", ["emu32", "emu64"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_kernel_math_matches_torch_math(emulated, warp, dtype, rng):
    """partials and finish given one merged (M, D) a row: rows a warp holds by the rows regime's
    passes (a warp a row), longer ones by the split's, one chunk a row and (two long rows) several
    chunks a row whose pairs merge on the host side; a finish whose output starts at another offset
    in its vectors than its input by the split's too."""
    from portable_softmax import _sharded
    from portable_softmax.planner import RowProblem, plan_split_passes

    math, names = _counting(_emulated_math(emulated[warp]))
    torch_dtype = getattr(torch, dtype)
    assert plan_split_passes(RowProblem(dtype, "softmax", 2, 40000), math.profile).notes["chunks"] > 1
    for rows, cols, offset in ((5, 1000, 0), (3, 37, 1), (4, 3000, 3), (1, 5, 0), (2, 40000, 1)):
        x64 = torch.from_numpy(rng.standard_normal((rows, cols)) * 4)
        x64[0, : cols // 2] = NEG_INF  # part of a row -inf
        if rows > 2:
            x64[1] = NEG_INF  # a whole row
            x64[2, cols // 3] = float("nan")
        x = _offset_rows(x64.to(torch_dtype), offset)
        m, d = math.partials(x, 1)
        want_m, want_d = _sharded.TORCH.partials(x, 1)
        assert _same(m, want_m), f"{dtype} {rows}x{cols}: m {m} want {want_m}"
        close = (d - want_d).abs() <= 1e-6 + 1e-5 * want_d.abs()
        assert bool((close | (d.isnan() & want_d.isnan())).all()), f"{dtype} {rows}x{cols}: d {d} want {want_d}"
        # a merged (M, D) from another rank's slice: the row's max and sum grow
        other_m, other_d = m + 1.5, d * 2 + 1
        for op in OPS:
            for safe in (False, True):
                y = math.finish(x, other_m, other_d, op, safe, 1)
                want = _sharded.TORCH.finish(x.double(), other_m.double(), other_d.double(), op, safe, 1)
                assert y.dtype == x.dtype and y.shape == x.shape
                bad = _tolerance.outside(_as_numpy(y), want.numpy())
                assert not bad.any(), f"{dtype} {op} safe={safe} {rows}x{cols}+{offset}: {_as_numpy(y)[bad][:4]}"
        # rows of all -inf everywhere (here too): NaN, or 0 / -inf with safe
        empty = _offset_rows(torch.full_like(x, NEG_INF), offset)
        empty_m, empty_d = math.partials(empty, 1)
        assert (empty_m == NEG_INF).all() and (empty_d == 0).all(), f"{empty_m} {empty_d}"
        for op, filled in (("softmax", 0.0), ("log_softmax", NEG_INF)):
            assert math.finish(empty, empty_m, empty_d, op, False, 1).isnan().all()
            assert (math.finish(empty, empty_m, empty_d, op, True, 1) == filled).all()
    assert names.saw("ps_rows_partials_", "ps_rows_finish_", "ps_split_partials_", "ps_split_normalize_"), names.seen


# ---- the gradient's local steps by the kernels (KernelMath), against torch operations --------------
GRAD_DTYPES = ("float32", "float64", "float16", "bfloat16")


class _Names(list):
    """The kernel names launched since the list was last cleared, and (``seen``) every one launched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def saw(self, *prefixes: str) -> bool:
        return all(any(name.startswith(prefix) for name in self.seen) for prefix in prefixes)


def _counting(math):
    """A KernelMath like ``math`` whose launches are recorded (kernel names), to tell the kernels ran."""
    from portable_softmax import _sharded

    names = _Names()

    def launch(plan, dtype, buffers):
        names.extend(step.kernel for step in plan.launches)
        names.seen.update(step.kernel for step in plan.launches)
        math.launch(plan, dtype, buffers)

    return _sharded.KernelMath(math.profile, launch), names


def _grad_case(rng, op: str, dtype, rows: int, cols: int, device) -> tuple:
    """(dy, y, empty) of one rank's slice: y the op's output of random logits, and among the rows
    (when there are 5 or more) row 1 NaN (as the forward makes a row with NaN), row 2 a single NaN
    in y, row 3 of all -inf on every rank (safe: y 0 or -inf, ``empty``), row 4 all -inf in this
    slice alone (the same y, not ``empty``)."""
    x = torch.from_numpy(rng.standard_normal((rows, cols)) * 3)
    y = torch.softmax(x, 1) if op == "softmax" else torch.log_softmax(x, 1)
    empty = torch.zeros(rows, dtype=torch.bool)
    if rows >= 5:
        y[1] = float("nan")
        y[2, cols // 2] = float("nan")
        y[3] = y[4] = 0.0 if op == "softmax" else NEG_INF
        empty[3] = True
    dy = torch.from_numpy(rng.standard_normal((rows, cols)))
    return dy.to(dtype).to(device), y.to(dtype).to(device), empty.to(device)


def _grad_bound(dtype, *magnitudes) -> float:
    """Rounding room of the compute dtype for sums of terms of these magnitudes."""
    eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    return 16 * eps * sum(magnitudes)


def _rows_of(t: torch.Tensor, axis: int) -> torch.Tensor:
    """t's rows along ``axis`` (the positions of the reduced shape in C order), as a 2-D tensor."""
    return t.movedim(axis, -1).reshape(-1, t.shape[axis])


#: the kernels each step must launch: the row split's or the rows regime's (a warp a row), or the
#: strided passes'
ROW_STEPS = (("ps_bwd_partials_", "ps_bwd_rows_sums_"), ("ps_bwd_finish_", "ps_bwd_rows_finish_"))
STRIDED_STEPS = (("ps_bwd_strided_sums_",), ("ps_bwd_strided_finish_",))


def _check_grad_steps(math, names: list[str], dy, y, empty, op: str, what: str, axis: int = 1,
                      kernels=ROW_STEPS) -> None:
    """KernelMath's grad_dot and grad_finish against TorchMath's (and both against float64 operations on
    the same inputs) along ``axis``; each step must have launched its kernel (``kernels``: the name
    prefixes of each step's). ``empty`` has the reduced shape; the special rows of _grad_case are
    the rows of _rows_of."""
    from portable_softmax import _sharded

    dtype = y.dtype
    reduced = y.shape[:axis] + y.shape[axis + 1:]
    dy_kept, y_kept = dy.clone(), y.clone()
    names.clear()
    s = math.grad_dot(dy, y, op, axis)
    want = _sharded.TORCH.grad_dot(dy, y, op, axis)
    assert names and names[0].startswith(kernels[0]), f"{what}: grad_dot launched {names}"
    assert s.dtype == torch.float64 and s.shape == reduced, f"{what}: row sums {s.dtype} {tuple(s.shape)}"
    terms = (dy.double() * y.double()) if op == "softmax" else dy.double()
    room = _grad_bound(dtype, terms.abs().nan_to_num(0.0).sum(axis))
    assert _same(s.isnan(), want.isnan()), f"{what}: NaN sums at rows {s.isnan().nonzero().tolist()}, " \
                                           f"want {want.isnan().nonzero().tolist()}"
    ok = ((s - want).abs() <= room) | want.isnan()
    assert bool(ok.all()), f"{what}: row sums {s[~ok].tolist()}, want {want[~ok].tolist()}"
    # the finish with a row total as the all_reduce would leave it (other ranks' parts added)
    total = want * 1.5 + 0.25
    for mask in (empty, None):
        names.clear()
        dx = math.grad_finish(dy, y, total, op, axis, mask)
        assert names and names[0].startswith(kernels[1]), f"{what}: grad_finish launched {names}"
        assert dx.dtype == dtype and dx.shape == y.shape, f"{what}: dx {dx.dtype} {tuple(dx.shape)}"
        torch_dx = _sharded.TORCH.grad_finish(dy, y, total, op, axis, mask)
        exact = _sharded.TORCH.grad_finish(dy.double(), y.double(), total, op, axis, mask)
        y64, dy64, s64 = y.double(), dy.double(), total.unsqueeze(axis).abs()
        scale = y64.abs() * (dy64.abs() + s64) if op == "softmax" else dy64.abs() + y64.exp() * s64
        info = torch.finfo(dtype)  # an ulp of the output dtype, the subnormals' spacing included
        bound = info.eps * (exact.abs() + info.tiny) + _grad_bound(dtype, scale.nan_to_num(0.0))
        for name, got in (("kernels", dx), ("torch", torch_dx)):
            g = got.double()
            ok = ((g - exact).abs() <= bound) | (g.isnan() & exact.isnan()) | ((g == exact) & exact.isinf())
            assert bool(ok.all()), f"{what} empty={mask is not None} ({name}): {int((~ok).sum())} elements off, " \
                                   f"got {g[~ok][:4].tolist()} want {exact[~ok][:4].tolist()}"
        rows_dx, rows_dy = _rows_of(dx, axis), _rows_of(dy, axis)
        if rows_dx.shape[0] >= 5:
            assert bool(rows_dx[1:3].isnan().all()), f"{what}: a NaN in y leaves dx of its row not all NaN"
            assert not rows_dx[[0, 4]].isnan().any(), f"{what}: NaN leaked into other rows"
            if op == "log_softmax":  # a slice of all -inf: exp(y) = 0, dx = dy; constant rows (empty): 0
                assert torch.equal(rows_dx[4], rows_dy[4]), f"{what}: a slice of all -inf has dx {rows_dx[4]}"
                want_3 = torch.zeros_like(rows_dy[3]) if mask is not None else rows_dy[3]
                assert torch.equal(rows_dx[3], want_3), f"{what} empty={mask is not None}: dx {rows_dx[3]}"
            else:
                assert bool((rows_dx[3:5] == 0).all()), f"{what}: softmax rows of y = 0 have dx {rows_dx[3:5]}"
    assert _same(dy, dy_kept) and _same(y, y_kept), f"{what}: the inputs were changed"


def _grad_shapes():
    """(rows, cols, offset of dy, offset of y): the widths of the brief, aligned and not (dy and y at
    different offsets take scalar slots), and rows a warp holds in every dtype (256)."""
    return [(5, 1000, 0, 0), (6, 7, 1, 1), (3, 1, 0, 0), (5, 50257, 3, 3), (2, 1000, 1, 2), (7, 7, 0, 0),
            (5, 256, 0, 0)]


@pytest.mark.parametrize("warp", ["emu32", "emu64"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES)
def test_kernel_math_gradient_matches_torch_math(emulated, warp, dtype, rng):
    """grad_dot and grad_finish (the row total given) by the rows regime's passes where a warp holds
    the rows, else by the split's (the total as the first chunk's pair), in the SIMT emulation at warp
    32 and 64; rows of 50257 take several chunks."""
    from portable_softmax.planner_backward import GradRowProblem, plan_split_passes

    math, names = _counting(_emulated_math(emulated[warp]))
    wide = GradRowProblem(dtype, "softmax", 5, 50257, None, (3, 3, 3), False)
    assert plan_split_passes(wide, math.profile).notes["chunks"] > 1
    for op in OPS:
        for rows, cols, dy_at, y_at in _grad_shapes():
            dy, y, empty = _grad_case(rng, op, getattr(torch, dtype), rows, cols, "cpu")
            dy, y = _offset_rows(dy, dy_at), _offset_rows(y, y_at)
            _check_grad_steps(math, names, dy, y, empty, op, f"{warp} {dtype} {op} {rows}x{cols}+{dy_at},{y_at}")
    assert names.saw("ps_bwd_rows_sums_", "ps_bwd_rows_finish_", "ps_bwd_partials_", "ps_bwd_finish_"), names.seen


def _across(t: torch.Tensor, outer: int, inner: int) -> torch.Tensor:
    """A contiguous (outer, cols, inner) tensor whose rows along axis 1, in the order of its reduced
    (outer, inner) shape, are the rows of the 2-D ``t`` (outer * inner rows): _rows_of gives t back."""
    return t.reshape(outer, inner, t.shape[-1]).permute(0, 2, 1).contiguous()


#: (outer, cols, inner, offset of dy, offset of y) of the strided passes: vectors of positions (wide
#: and scalar), axes of one step and of several, axes of one chunk and of several (1000 rows: 15
#: chunks, the last one shorter)
STRIDED_GRAD_SHAPES = ((1, 9, 8, 0, 0), (2, 5, 8, 0, 0), (2, 40, 3, 1, 1), (1, 300, 8, 0, 0), (3, 130, 2, 1, 2),
                       (2, 70, 5, 0, 0), (1, 1000, 4, 0, 0))


def _strided_chunks(profile, dtype: str, outer: int, cols: int, inner: int) -> tuple[int, int]:
    """(chunks, rows of a chunk) of the strided passes over a contiguous (outer, cols, inner) view."""
    from portable_softmax.planner import StridedProblem, plan_strided_passes

    strides = (cols * inner, inner, 1)
    notes = plan_strided_passes(StridedProblem(dtype, "softmax", outer, cols, inner, strides, strides), profile).notes
    return notes["chunks"], notes["chunk_cols"]


@pytest.mark.parametrize("warp", ["emu32", "emu64"])
@pytest.mark.parametrize("dtype", GRAD_DTYPES)
def test_kernel_math_gradient_of_a_strided_axis(emulated, warp, dtype, rng):
    """grad_dot and grad_finish along a non-last axis, by the strided passes apart (a thread per line
    of positions down a chunk of the axis), in the SIMT emulation at warp 32 and 64."""
    math, names = _counting(_emulated_math(emulated[warp]))
    chunks, chunk_cols = _strided_chunks(math.profile, dtype, 1, 1000, 4)
    assert chunks > 1 and chunks * chunk_cols > 1000, (chunks, chunk_cols)  # several chunks, the last shorter
    for op in OPS:
        for outer, cols, inner, dy_at, y_at in STRIDED_GRAD_SHAPES:
            dy, y, empty = _grad_case(rng, op, getattr(torch, dtype), outer * inner, cols, "cpu")
            dy = _offset_rows(_across(dy, outer, inner), dy_at)
            y = _offset_rows(_across(y, outer, inner), y_at)
            _check_grad_steps(math, names, dy, y, empty.reshape(outer, inner), op,
                              f"{warp} {dtype} {op} {outer}x{cols}x{inner}+{dy_at},{y_at}", 1, STRIDED_STEPS)


def test_kernel_math_takes_any_view(emulated):
    """An incoming gradient of stride 0 (an expanded one, as sum() gives) beside a contiguous y takes the
    strided passes; views whose dimensions collapse to no (outer, cols, inner) layout are copied
    contiguous and take the kernels too. Each gives what torch operations give."""
    from portable_softmax import _sharded

    math, names = _counting(_emulated_math(emulated["emu32"]))
    y = torch.softmax(torch.randn(4, 9, dtype=torch.float64), 1).float()
    dy = torch.ones(()).expand(4, 9)
    s = math.grad_dot(dy, y, "softmax", 1)
    assert names[0].startswith(STRIDED_STEPS[0]) and torch.allclose(s, y.double().sum(1))
    dx = math.grad_finish(dy, y, s, "softmax", 1)
    assert torch.allclose(dx, _sharded.TORCH.grad_finish(dy, y, s, "softmax", 1))
    names.clear()
    tangled = torch.randn(4, 3, 9).permute(1, 0, 2)  # (3, 4, 9) whose outer dimensions do not collapse
    before = tangled.clone()
    m, d = math.partials(tangled, 2)
    want_m, want_d = _sharded.TORCH.partials(tangled, 2)
    assert names and torch.equal(m, want_m) and torch.allclose(d, want_d), names
    names.clear()
    y = math.finish(tangled, m, d, "log_softmax", False, 2)
    assert names and torch.allclose(y, torch.log_softmax(tangled, 2), atol=1e-6), names
    assert y.shape == tangled.shape and torch.equal(tangled, before)
    names.clear()
    yt = torch.log_softmax(torch.randn(9, 4, 3, dtype=torch.float64), 0).permute(0, 2, 1)
    s0 = math.grad_dot(torch.ones(9, 3, 4, dtype=torch.float64), yt, "log_softmax", 0)
    assert names and torch.allclose(s0, torch.full((3, 4), 9.0, dtype=torch.float64)), names
    names.clear()
    dyt = torch.randn(9, 4, 3, dtype=torch.float64).permute(0, 2, 1)
    dx0 = math.grad_finish(dyt, yt, s0, "log_softmax", 0)
    assert names and torch.allclose(dx0, _sharded.TORCH.grad_finish(dyt, yt, s0, "log_softmax", 0)), names


#: (outer, cols, inner, offset) of the forward's strided passes, as STRIDED_GRAD_SHAPES
STRIDED_SHAPES = ((1, 9, 8, 0), (2, 5, 8, 0), (2, 40, 3, 1), (1, 300, 8, 0), (3, 130, 2, 3), (2, 70, 5, 0),
                  (1, 1000, 4, 0))


@pytest.mark.parametrize("warp", ["emu32", "emu64"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_kernel_math_of_a_strided_axis(emulated, warp, dtype, rng):
    """partials and finish along a non-last axis by the strided passes apart, against torch
    operations: positions of NaN, of some -inf and of all -inf, safe or not, every op."""
    from portable_softmax import _sharded

    math, names = _counting(_emulated_math(emulated[warp]))
    chunks, chunk_cols = _strided_chunks(math.profile, dtype, 1, 1000, 4)
    assert chunks > 1 and chunks * chunk_cols > 1000, (chunks, chunk_cols)  # several chunks, the last shorter
    torch_dtype = getattr(torch, dtype)
    for outer, cols, inner, offset in STRIDED_SHAPES:
        x64 = torch.from_numpy(rng.standard_normal((outer * inner, cols)) * 4)
        x64[0, : cols // 2] = NEG_INF
        if outer * inner > 2:
            x64[1] = NEG_INF
            x64[2, cols // 3] = float("nan")
        x = _offset_rows(_across(x64.to(torch_dtype), outer, inner), offset)
        what = f"{warp} {dtype} {outer}x{cols}x{inner}+{offset}"
        names.clear()
        m, d = math.partials(x, 1)
        assert names and names[0].startswith("ps_strided_partials_"), names
        want_m, want_d = _sharded.TORCH.partials(x, 1)
        assert m.shape == (outer, inner) and _same(m, want_m), f"{what}: m {m} want {want_m}"
        close = (d - want_d).abs() <= 1e-6 + 1e-5 * want_d.abs()
        assert bool((close | (d.isnan() & want_d.isnan())).all()), f"{what}: d {d} want {want_d}"
        other_m, other_d = m + 1.5, d * 2 + 1  # a merged (M, D) from another rank's slice
        for op in OPS:
            for safe in (False, True):
                names.clear()
                y = math.finish(x, other_m, other_d, op, safe, 1)
                assert names and names[0].startswith("ps_strided_finish_"), names
                want = _sharded.TORCH.finish(x.double(), other_m.double(), other_d.double(), op, safe, 1)
                assert y.dtype == x.dtype and y.shape == x.shape
                bad = _tolerance.outside(_as_numpy(y), want.numpy())
                assert not bad.any(), f"{what} {op} safe={safe}: {_as_numpy(y)[bad][:4]}"
        empty = _offset_rows(torch.full_like(x, NEG_INF), offset)  # all -inf everywhere
        empty_m, empty_d = math.partials(empty, 1)
        assert (empty_m == NEG_INF).all() and (empty_d == 0).all(), f"{empty_m} {empty_d}"
        for op, filled in (("softmax", 0.0), ("log_softmax", NEG_INF)):
            assert math.finish(empty, empty_m, empty_d, op, False, 1).isnan().all()
            assert (math.finish(empty, empty_m, empty_d, op, True, 1) == filled).all()


def _gpu_math_or_skip():
    from portable_softmax import _probe, _sharded

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    vendor = "hip" if getattr(torch.version, "hip", None) else "cuda"
    try:
        _probe.runtime(vendor)
    except _probe.BackendUnavailableError as e:
        pytest.skip(f"the package's {vendor} runtime does not open: {e}")
    math = _sharded.local_math(torch.empty(1, device="cuda"))
    assert isinstance(math, _sharded.KernelMath)
    return math


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GRAD_DTYPES)
def test_gpu_kernel_math_gradient_matches_torch_math(dtype, rng):
    """The gradient's local steps on one GPU, no process group: the kernels against torch operations."""
    math, names = _counting(_gpu_math_or_skip())
    for op in OPS:
        for rows, cols, dy_at, y_at in [*_grad_shapes(), (64, 64128, 0, 0)]:
            dy, y, empty = _grad_case(rng, op, getattr(torch, dtype), rows, cols, "cuda")
            dy, y = _offset_rows(dy, dy_at), _offset_rows(y, y_at)
            _check_grad_steps(math, names, dy, y, empty, op, f"{dtype} {op} {rows}x{cols}+{dy_at},{y_at}")
        torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
def test_gpu_tensors_take_the_kernels():
    """On a GPU whose runtime the package opens, the local passes are the package's kernels, and they
    agree with torch operations on a bfloat16 row of the bench's width."""
    from portable_softmax import _probe, _sharded

    vendor = "hip" if getattr(torch.version, "hip", None) else "cuda"
    try:
        _probe.runtime(vendor)
    except _probe.BackendUnavailableError as e:
        pytest.skip(f"the package's {vendor} runtime does not open: {e}")
    x = (4 * torch.randn(64, 64128, device="cuda")).to(torch.bfloat16)
    math = _sharded.local_math(x)
    assert isinstance(math, _sharded.KernelMath)
    m, d = math.partials(x, 1)
    want_m, want_d = _sharded.TORCH.partials(x, 1)
    assert torch.equal(m, want_m) and torch.allclose(d, want_d, rtol=1e-5)
    for op in OPS:
        y = math.finish(x, m + 0.5, d * 3, op, False, 1)
        want = _sharded.TORCH.finish(x.double(), (m + 0.5).double(), (d * 3).double(), op, False, 1)
        bad = _tolerance.outside(_as_numpy(y.cpu()), want.cpu().numpy())
        assert not bad.any(), f"{op}: {int(bad.sum())} elements outside {_tolerance.describe('bfloat16')}"


# ---- tools/bench_distributed.py, end to end on gloo with a tiny shape -------------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "tools", "bench_distributed.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bench_env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
                **extra)


@pytest.mark.parametrize(("axis", "shape"), [(1, (9, 301)), (0, (301, 9))])
def test_bench_runs_on_gloo(axis, shape, op="log_softmax", dtype="bfloat16"):
    """Two ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment):
    the check passes, every method is timed, and the local steps' figures are printed; the last axis
    sharded, and the first."""
    port = str(_free_port())
    args = ["--cpu", "--rows", str(shape[0]), "--cols", str(shape[1]), "--axis", str(axis), "--iters", "2",
            "--warmup", "1", "--check-rows", "4", "--op", op, "--dtype", dtype]
    procs = [subprocess.Popen([sys.executable, BENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_bench_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    try:
        logs = [p.communicate(timeout=WORLD_TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], logs
    out = logs[0]
    assert "Traceback" not in out and not logs[1].strip(), logs
    assert f"{op} of {shape[0]} x {shape[1]} {dtype} over axis {axis}, sharded on it over 2 ranks" in out, out
    assert "check, values of 4 rows vs portable_softmax: 0 of 1204 elements outside" in out, out
    assert "check, gradient of (y * w).sum() on those rows vs torch float64 autograd: 0 of 1204" in out, out
    dtensor = "DTensor softmax, Shard(-1)" if axis == 1 else "DTensor softmax, Shard(0)"
    for method in ("portable_softmax.distributed ", "two all_reduces (torch ops) ", dtensor + " "):
        row = next((line for line in out.splitlines() if line.startswith(method)), "")
        assert len(row.split()) >= 4 and "failed" not in row, f"{method!r}: {row!r}\n{out}"
    assert f"speed-up of portable_softmax.distributed over {dtensor}: forward" in out, out
    assert "local backward (TorchMath: grad_dot + grad_finish)" in out, out


@pytest.mark.parametrize("argv, env, words", [
    ([], {}, "launch with torchrun"),
    (["--rows", "0"], {"RANK": "0", "WORLD_SIZE": "1"}, "--rows must be at least 1, got 0"),
    (["--check-rows", "-2"], {"RANK": "0", "WORLD_SIZE": "1"}, "--check-rows must be at least 1, got -2"),
])
def test_bench_refuses_bad_launches(argv, env, words):
    base = {k: v for k, v in _bench_env().items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, BENCH, *argv], capture_output=True, text=True, env=dict(base, **env),
                          timeout=WORLD_TIMEOUT_S)
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_bench_samples_rows_evenly():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_distributed", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.sample_rows(8192, 64)[:3] == [0, 130, 260] and bench.sample_rows(8192, 64)[-1] == 8191
    assert len(bench.sample_rows(8192, 64)) == 64 and bench.sample_rows(5, 64) == [0, 1, 2, 3, 4]
    assert bench.sample_rows(7, 1) == [0]


@pytest.mark.parametrize("bad, error, words", [
    (np.zeros((2, 3)), TypeError, "takes a torch tensor"),
    (torch.zeros((2, 3), dtype=torch.int32), TypeError, "supports float16, bfloat16, float32, float64; got int32"),
    (torch.zeros(()), ValueError, "0-d"),
])
def test_bad_input(bad, error, words):
    with pytest.raises(error, match=words):
        distributed.softmax(bad)


def test_bad_axis_and_flags():
    with pytest.raises(IndexError, match="axis 2 is out of bounds"):
        distributed.softmax(torch.zeros(2, 3), 2)
    with pytest.raises(TypeError, match="safe and check must be True or False"):
        distributed.log_softmax(torch.zeros(2, 3), safe=1)


def test_needs_an_initialised_group():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        distributed.softmax(torch.zeros(2, 3))


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])

"""The SIMT emulation: its primitives at warp 32 and 64, the kernels through it, and a mutant it must catch.

The shared suite (test_softmax.py) runs the public API on the "emu32" / "emu64" backends; this file
checks the layer underneath: that shuffles and barriers behave like the hardware's, that rule
breaking is reported instead of hanging, that every tier of every dtype matches the reference at
both warp sizes, and that a 32-lane assumption in the source fails at warp 64 only.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from checks import tune_defaults, without_small_input_rules
from emulation import CompilerUnavailable, EmulatedRuntime, EmulationError, EmulationLibrary, load_library
from emulation.build import SRC_CUDA

from portable_softmax import _variants as V
from portable_softmax import planner, reference
from portable_softmax._dtypes import host_dtype
from portable_softmax.api import problem_for, run_host_array
from portable_softmax.layout import describe, normalize_axis
from portable_softmax.planner import DEFAULT_TUNING, RowProblem, default_tuning, plan

WARPS = V.WARP_SIZES
ATOL, RTOL = 1e-6, 1e-5
#: float16 / bfloat16: distance to the reference rounded to the dtype, in units in the last place
ULP_BOUND = 2
SIXTEEN_BIT = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
#: the tests here run a few rows through the tiers that larger inputs take (the shared suite,
#: test_softmax.py, runs the emulation with the small-input rules on)
pytestmark = pytest.mark.usefixtures("large_input_rules")


def _library_or_skip(*args) -> EmulationLibrary:
    """Skip where no C++ compiler exists; a source that does not compile is a failure, not a skip."""
    try:
        return load_library(*args)
    except CompilerUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def library() -> EmulationLibrary:
    return _library_or_skip()


@pytest.fixture(params=WARPS, ids=lambda w: f"warp{w}")
def runtime(request, library) -> EmulatedRuntime:
    return EmulatedRuntime(library, request.param)


def _pointers(**arrays: np.ndarray) -> dict[str, int]:
    return {name: a.ctypes.data for name, a in arrays.items()}


# ---- primitives -------------------------------------------------------------------------------
def _expected_shuffle(values: np.ndarray, warp: int, lane_mask: int, width: int) -> np.ndarray:
    """CUDA's / HIP's __shfl_xor: lane ^ mask, or the lane's own value when that lies past its segment."""
    out = np.empty_like(values)
    for t in range(values.size):
        lane = t % warp
        source = lane ^ lane_mask
        if source >= (lane & ~(width - 1)) + width:
            source = lane
        out[t] = values[t - lane + source]
    return out


@pytest.mark.parametrize("kernel, dtype", [("emu_probe_shuffle_f32", np.float32),
                                           ("emu_probe_shuffle_f64", np.float64),
                                           ("emu_probe_shuffle_i32", np.int32)])
def test_shuffle_xor_every_width_and_mask(library, rng, kernel, dtype):
    for warp in WARPS:
        threads = 3 * warp  # three warps: lanes must never reach across a warp
        values = (rng.standard_normal(threads) * 1000).astype(dtype)
        for width in V.pow2_upto(warp):
            table = np.full((warp, threads), -7, dtype)
            args = (("ptr", "in"), ("ptr", "out"), ("i32", warp), ("i32", width))
            library.launch(kernel, warp, 1, threads, 0, args, _pointers(**{"in": values, "out": table}))
            for mask in range(warp):
                np.testing.assert_array_equal(table[mask], _expected_shuffle(values, warp, mask, width),
                                              err_msg=f"warp {warp} width {width} xor {mask}")
                if mask < width:  # the butterfly partner inside the segment, stated plainly
                    np.testing.assert_array_equal(table[mask], values[np.arange(threads) ^ mask])


def test_thread_and_block_ids(library):
    grid, block = 5, 96
    out = np.full((grid * block, 4), -1, np.int32)
    library.launch("emu_probe_ids", 32, grid, block, 0, (("ptr", "out"),), _pointers(out=out))
    t = np.arange(grid * block)
    np.testing.assert_array_equal(out, np.stack([t % block, t // block, np.full_like(t, block),
                                                 np.full_like(t, grid)], axis=1))


@pytest.mark.parametrize("block", [32, 64, 96, 256, 1024])
def test_barriers_keep_rounds_in_lock_step(library, rng, block):
    grid, rounds = 3, 7
    values = rng.integers(0, 1 << 20, grid * block).astype(np.int32)
    out = np.zeros_like(values)
    args = (("ptr", "in"), ("ptr", "out"), ("i32", rounds))
    library.launch("emu_probe_barrier_rotate", 64, grid, block, 0, args, _pointers(**{"in": values, "out": out}))
    t = np.arange(block)
    for b in range(grid):
        own = values[b * block:(b + 1) * block]
        np.testing.assert_array_equal(out[b * block:(b + 1) * block], own[(t + rounds) % block] + sum(range(rounds)))


def test_dynamic_shared_memory_starts_poisoned_and_is_per_block(library):
    grid, block = 4, 128
    out, before = np.zeros(grid * block, np.int32), np.zeros(grid * block, np.int32)
    library.launch("emu_probe_dynamic_shared", 32, grid, block, 4 * block, (("ptr", "out"), ("ptr", "before")),
                   _pointers(out=out, before=before))
    assert (before == -1).all(), "shared memory must start as NaN bytes, not as the previous block left it"
    t = np.arange(grid * block)
    np.testing.assert_array_equal(out, (t // block) * 1000 + (block - 1 - t % block))


def test_async_copies_land_at_the_wait_and_break_loudly(library):
    block = 64
    values = np.arange(1, block + 2, dtype=np.int32) * 7
    before, after = np.zeros(block, np.int32), np.zeros(block, np.int32)
    args = (("ptr", "in"), ("ptr", "before"), ("ptr", "after"), ("i32", 0), ("i32", 1))
    ptrs = _pointers(**{"in": values, "before": before, "after": after})
    library.launch("emu_probe_async_copy", 32, 1, block, 4 * block, args, ptrs)
    assert (before == -1).all(), "a copy's destination must read as poison until the wait"
    np.testing.assert_array_equal(after, values[:block])
    with pytest.raises(EmulationError, match="never waited for"):
        library.launch("emu_probe_async_copy", 32, 1, block, 4 * block, args[:3] + (("i32", 0), ("i32", 0)), ptrs)
    with pytest.raises(EmulationError, match="not aligned"):
        library.launch("emu_probe_async_copy", 32, 1, block, 4 * block, args[:3] + (("i32", 2), ("i32", 1)), ptrs)
    with pytest.raises(EmulationError, match="outside the block's dynamic shared memory"):
        library.launch("emu_probe_async_copy", 32, 1, block, 4 * (block - 1), args, ptrs)


def test_async_copy_groups_land_oldest_first(library):
    block = 32
    values = np.arange(1, 3 * block + 1, dtype=np.int32)
    seen = np.zeros(9 * block, np.int32)
    library.launch("emu_probe_async_groups", 32, 1, block, 12 * block, (("ptr", "in"), ("ptr", "seen")),
                   _pointers(**{"in": values, "seen": seen}))
    seen = seen.reshape(3, 3, block)  # [wait][copy][thread]
    copies = values.reshape(3, block)
    landed = [(True, False, False), (True, True, False), (True, True, True)]  # wait_group 1, 0, wait_all
    for wait, row in enumerate(landed):
        for copy, has_landed in enumerate(row):
            if has_landed:
                np.testing.assert_array_equal(seen[wait, copy], copies[copy])
            else:
                assert (seen[wait, copy] == -1).all(), (wait, copy)


@pytest.mark.parametrize("step", [1, -1])
def test_a_missing_barrier_reads_poison_in_one_thread_order_or_the_other(library, step):
    grid, block = 2, 64
    out = np.zeros(grid * block, np.int32)
    library.launch("emu_probe_missing_barrier", 32, grid, block, 4 * block, (("ptr", "out"), ("i32", step)),
                   _pointers(out=out))
    for b in range(grid):  # even blocks run threads forwards, odd ones backwards
        assert (out[b * block:(b + 1) * block] == -1).any(), f"block {b} never saw an unwritten slot"


def test_blocks_waiting_on_each_other_are_all_resident(library):
    """A grid-wide spin barrier over more blocks than host threads: blocks not yet started must get
    a thread while the started ones spin, as on a GPU that holds the whole grid."""
    grid, block = 12, 64
    arrivals, out = np.zeros(1, np.uint32), np.zeros(grid * block, np.int32)
    args = (("ptr", "arrivals"), ("ptr", "out"), ("i32", grid))
    library.launch("emu_probe_grid_barrier", 32, grid, block, 0, args, _pointers(arrivals=arrivals, out=out))
    assert (out == grid).all()


def test_a_wait_that_cannot_end_is_reported(library):
    arrivals, out = np.zeros(1, np.uint32), np.zeros(4 * 32, np.int32)
    args = (("ptr", "arrivals"), ("ptr", "out"), ("i32", 5))  # 5 arrivals expected from 4 blocks
    library.set_spin_timeout(0.3)
    try:
        with pytest.raises(EmulationError, match="wait on each other forever"):
            library.launch("emu_probe_grid_barrier", 32, 4, 32, 0, args, _pointers(arrivals=arrivals, out=out))
    finally:
        library.set_spin_timeout(20)


def test_shared_memory_overflow_is_reported(library):
    with pytest.raises(EmulationError, match="wrote past its 64 bytes of dynamic shared memory"):
        library.launch("emu_probe_shared_write", 32, 1, 32, 64, (("i64", 65),), {})
    library.launch("emu_probe_shared_write", 32, 1, 32, 64, (("i64", 64),), {})


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("kernel, extra_args, message", [
    ("emu_probe_uneven_shuffles", lambda warp: (), "diverge at a shuffle"),
    ("emu_probe_shuffle_after_exit", lambda warp: (("i32", warp),), "diverge at a shuffle"),
    ("emu_probe_exit_before_barrier", lambda warp: (), "barrier is not reached by every thread"),
    ("emu_probe_wide_shuffle", lambda warp: (("i32", 2 * warp),), "no larger than the warp"),
])
def test_broken_simt_rules_fail_loudly_and_the_runtime_recovers(library, warp, kernel, extra_args, message):
    out = np.zeros(2 * warp, np.float32)
    with pytest.raises(EmulationError, match=message) as info:
        library.launch(kernel, warp, 2, 2 * warp, 0, (("ptr", "out"), *extra_args(warp)), _pointers(out=out))
    print(info.value)
    values = np.arange(warp, dtype=np.float32)
    table = np.zeros((1, warp), np.float32)
    library.launch("emu_probe_shuffle_f32", warp, 1, warp, 0,
                   (("ptr", "in"), ("ptr", "out"), ("i32", 1), ("i32", warp)),
                   _pointers(**{"in": values, "out": table}))  # fibers abandoned above are rebuilt
    np.testing.assert_array_equal(table[0], values)


def test_launches_that_cannot_match_the_kernel_are_refused(library):
    x = np.zeros(4, np.float32)
    name = V.strided_name("float32", "softmax")
    with pytest.raises(EmulationError, match="takes arguments"):
        library.launch(name, 32, 1, 32, 0, (("ptr", "x"), ("ptr", "x"), ("i32", 1)), _pointers(x=x))
    with pytest.raises(EmulationError, match="no kernel named"):
        library.launch("ps_no_such_kernel", 32, 1, 32, 0, (), {})
    with pytest.raises(EmulationError, match="launch shape"):
        library.launch("emu_probe_ids", 32, 1, 2048, 0, (("ptr", "x"),), _pointers(x=x))


def test_every_catalogued_entry_point_is_registered(library):
    registered = set(library.kernel_names())
    for dtype in V.DTYPES:
        expected = set(V.warp_free_names(dtype))
        for warp in WARPS:
            expected |= set(V.entry_names(dtype, warp))
        assert expected <= registered, sorted(expected - registered)[:5]


# ---- 16-bit conversions against ml_dtypes --------------------------------------------------------
def _float32_probes(rng) -> np.ndarray:
    """Random bit patterns (every exponent, NaN included) plus the halfway and boundary cases."""
    random_bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    # midpoints between neighbouring float16 / bfloat16 values: the ties of round-to-nearest-even
    ties = [(a.astype(np.float64)[:-1] + a.astype(np.float64)[1:]) / 2
            for a in (np.sort(halves[np.isfinite(halves)]),
                      np.arange(0, 0x7f80, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32))]
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 6.1e-5, 5.96e-8, 2.98e-8,
                      3.4e38, 1e-45], np.float32)
    return np.concatenate([random_bits, halves, *(t.astype(np.float32) for t in ties), edges, -edges])


@pytest.mark.parametrize("dtype, to_float, from_float", [
    ("float16", "emu_half_to_float", "emu_float_to_half"),
    ("bfloat16", "emu_bfloat16_to_float", "emu_float_to_bfloat16"),
])
def test_sixteen_bit_conversions_round_to_nearest_even(library, rng, dtype, to_float, from_float):
    storage = SIXTEEN_BIT[dtype]
    every_pattern = np.arange(1 << 16, dtype=np.uint16).view(storage)
    widened = library.convert(to_float, every_pattern, np.float32)
    expected = every_pattern.astype(np.float32)
    np.testing.assert_array_equal(widened.view(np.uint32)[~np.isnan(expected)],
                                  expected.view(np.uint32)[~np.isnan(expected)])
    assert np.isnan(widened[np.isnan(expected)]).all()

    probes = _float32_probes(rng)
    narrowed = library.convert(from_float, probes, storage)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf and NaN are cases under test
        expected = probes.astype(storage)
    nan = np.isnan(probes)
    np.testing.assert_array_equal(narrowed.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])
    assert np.isnan(narrowed[nan].astype(np.float32)).all()


# ---- the kernels through the emulation -----------------------------------------------------------
#: (shape, axis): the input is drawn with `shape`, then its last axis is moved to `axis`. Contiguous
#: rows from one lane per row up to rows split across blocks (grid-stride loops at the larger row
#: counts), then reductions over a non-last axis: short ones a thread per 16 bytes of inner positions
#: in vectors (9 rows: more than a thread holds) or narrower, several a thread (7, 33; 1001 and 1026
#: positions: more than a block's first vectors), 16-byte vectors two or four a thread (3 and 2 rows),
#: and a longer one over column groups (100).
SHAPES = [((300, 1), 1), ((64, 3), 1), ((67, 5), 1), ((64, 6), 1), ((40, 127), 1), ((33, 37), 1), ((9, 130), 1),
          ((600, 100), 1), ((5, 1000), 1), ((11, 2500), 1), ((7, 5000), 1), ((3, 5000), 1), ((3, 12000), 1),
          ((3, 20000), 1), ((1, 20000), 1), ((2, 60001), 1), ((4, 5, 33), 1), ((3, 2, 5, 7), 0), ((2, 16, 9), 1),
          ((2, 1001, 9), 1), ((1, 1026, 3), 1), ((1, 4096, 2), 1), ((1, 5000, 3), 1), ((3, 4, 100), 1)]
#: every tier the planner has (tier "empty" launches nothing)
TIERS = {"packed", "staged", "warp", "block", "cached", "split", "strided", "strided_thread", "strided_cached"}
OP_CASES = [("softmax", False), ("softmax", True), ("log_softmax", False)]


def _inputs(rng, shape, dtype: str) -> np.ndarray:
    """Random values with the special rows the kernels must get right (last axis reduced)."""
    x = rng.standard_normal(shape) * 4.0
    rows = x.reshape(-1, shape[-1])
    cols = shape[-1]
    if rows.shape[0] >= 5:
        rows[0, cols // 2] = np.nan  # NaN -> the row is NaN
        rows[1, -1] = np.inf  # +inf -> NaN, like torch
        rows[2, :] = -np.inf  # all -inf -> NaN, or 0 when safe
        rows[3, :-1] = -np.inf  # one finite element -> exactly 1
    if rows.shape[0] >= 7:  # the lowest finite value, where the kernels' running max starts
        lowest = float(ml_dtypes.finfo(host_dtype(dtype)).min)
        rows[4, :] = lowest  # every term exp(0): 1 / cols each
        rows[5, :] = np.where(np.arange(cols) % 2 == 0, lowest, -np.inf)  # -inf terms add 0
    if cols > 1:  # a leading run of -inf: whole chunks of a split row have nothing to add
        rows[-1, : (cols * 3) // 5] = -np.inf
    return x.astype(host_dtype(dtype))


def _tier(runtime: EmulatedRuntime, x: np.ndarray, axis: int, op: str, safe: bool) -> str:
    layout = describe(x.shape, tuple(s // x.itemsize for s in x.strides), axis)
    problem = problem_for(x.dtype.name, op, safe, layout, layout, 0, 0)
    return plan(problem, runtime.profile(0)).tier


def _ordered(values: np.ndarray) -> np.ndarray:
    """16-bit floats as integers ordered like their values (+0 and -0 both 0)."""
    bits = values.view(np.uint16).astype(np.int64)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


def assert_close(got: np.ndarray, x: np.ndarray, axis: int, op: str, safe: bool, what: str) -> None:
    ref = reference.softmax(x, axis, safe=safe) if op == "softmax" else reference.log_softmax(x, axis)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), np.isnan(ref), err_msg=f"{what}: NaN places")
    if x.dtype.name in SIXTEEN_BIT:
        # Within ULP_BOUND of the reference rounded to the dtype, or within the float32 computation's
        # own ATOL (log_softmax outputs near 0 are tiny numbers from a difference of O(1) values).
        with np.errstate(over="ignore", invalid="ignore"):  # inf - inf where both are -inf
            rounded = ref.astype(x.dtype)
            near = np.abs(got.astype(np.float64) - ref) <= ATOL
        ulps = np.abs(_ordered(got) - _ordered(rounded))
        bad = ~np.isnan(ref) & (ulps > ULP_BOUND) & ~near
        assert not bad.any(), (f"{what}: {bad.sum()} outputs beyond {ULP_BOUND} ulp, worst {ulps[bad].max()} ulp "
                               f"at {np.argwhere(bad)[0]}")
    else:
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=what)


def _shapes_reaching_every_tier(runtime: EmulatedRuntime, dtype: str) -> list[tuple[tuple[int, ...], int]]:
    """SHAPES, plus the first row shape the planner sends to each row tier SHAPES misses, and the
    first (2, cols, 41) reduced over its middle axis that is cached on chip (so that moving tier
    boundaries cannot silently drop a tier from the test)."""
    def reduced(shape: tuple[int, ...], axis: int) -> np.ndarray:  # the last axis moved to `axis`, as run
        axis = normalize_axis(axis, len(shape))
        return np.empty(shape[:axis] + shape[-1:] + shape[axis:-1], host_dtype(dtype))

    reached = {_tier(runtime, reduced(shape, axis), normalize_axis(axis, len(shape)), "softmax", False)
               for shape, axis in SHAPES}
    extra, cols = [], 1
    while cols <= 1 << 17 and not TIERS - {"strided", "strided_thread", "strided_cached"} <= reached:
        for rows in (7, 3, 1):
            tier = _tier(runtime, np.empty((rows, cols), host_dtype(dtype)), 1, "softmax", False)
            if tier not in reached:
                reached.add(tier)
                extra.append(((rows, cols), 1))
        cols = cols * 5 // 4 + 1
    cols = 8
    while cols <= 1 << 12 and "strided_cached" not in reached:  # 41 inner positions: one a thread
        if _tier(runtime, np.empty((2, cols, 41), host_dtype(dtype)), 1, "softmax", False) == "strided_cached":
            reached.add("strided_cached")
            extra.append(((2, 41, cols), 1))  # drawn with the reduced axis last, then moved to axis 1
        cols += max(1, cols // 16)
    return SHAPES + extra


@pytest.mark.parametrize("dtype", V.DTYPES)
def test_every_tier_matches_the_reference(runtime, rng, dtype):
    _every_tier_matches_the_reference(runtime, rng, dtype)


@pytest.fixture(scope="module")
def async_library() -> EmulationLibrary:
    return _library_or_skip(SRC_CUDA, tuple(V.DTYPES), ("PS_EMULATE_ASYNC_COPY",))


@pytest.mark.parametrize("dtype", V.DTYPES)
def test_every_tier_with_copies_that_land_only_at_the_wait(async_library, rng, dtype):
    """The kernels as NVIDIA sm_80 and newer build them (PS_ASYNC_COPY: row caches filled by copies
    that bypass registers), at warp 32, where those run: every tier, and rows with partial heads."""
    runtime = EmulatedRuntime(async_library, 32)
    _every_tier_matches_the_reference(runtime, rng, dtype)
    _misaligned_rows_match_the_reference(runtime, rng, dtype, 1, 1)


#: warp sizes of devices with asynchronous copies (NVIDIA: 32 lanes); the tiers built on them exist at no other
ASYNC_COPY_WARPS = (32,)


@pytest.fixture
def async_planner(monkeypatch):
    """The planner as it runs on NVIDIA sm_80 and newer (asynchronous copies), for this test only."""
    monkeypatch.setattr(planner, "has_async_copy", lambda device: True)
    plan.cache_clear()  # plans made for the emulated device without asynchronous copies
    yield
    plan.cache_clear()


@pytest.mark.parametrize("dtype", [d for d in V.DTYPES if V.packed_cols(d)])
@pytest.mark.parametrize("copies", ["sync", "async"])
def test_every_packed_row_length(request, monkeypatch, rng, dtype, copies):
    """Every row length of the packed tier, its span starting on a vector and one row into it (so
    that the first group is partial), 1000 rows (the last group partial too), with and without
    asynchronous copies. The planner's floor on the grid of long groups is lifted: 1000 rows are
    a few blocks."""
    tune_defaults(monkeypatch, packed_large_groups_min_blocks_per_sm=0)
    tune_defaults(monkeypatch, packed_wide_min_groups_per_sm=0)
    plan.cache_clear()
    request.addfinalizer(plan.cache_clear)
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    # a block's shared memory as an H100's default, 64 KiB opted in as on an MI300X (16-bit tiles of
    # 256 threads: 7 columns 28 KiB, 13 columns 52 KiB)
    runtime = EmulatedRuntime(library, 32, shared_mem_per_block=48 * 1024, shared_mem_per_block_optin=64 * 1024,
                              shared_mem_per_multiprocessor=128 * 1024)
    vec = V.vector_widths(dtype)[1]
    for cols in V.packed_cols(dtype):
        x = _inputs(rng, (1000, cols), dtype)
        if cols % vec % cols:  # one row in is not a whole number of rows from a vector: not packed
            problem = RowProblem(dtype, "softmax", 1000, cols, x_misalign=cols % vec, y_misalign=cols % vec)
            assert plan(problem, runtime.profile(0)).tier != "packed", cols
        for offset in (0, cols) if cols % vec % cols == 0 else (0,):
            problem = RowProblem(dtype, "softmax", 1000, cols, x_misalign=offset % vec, y_misalign=offset % vec)
            for op, safe in OP_CASES:
                the_plan = plan(replace(problem, op=op, safe=safe), runtime.profile(0))
                assert the_plan.tier == "packed", (cols, offset)
                got = runtime.run_plan(x, the_plan, x_offset=offset, y_offset=offset)
                assert_close(got, x, 1, op, safe, f"{dtype} {op} safe={safe} {cols} columns offset {offset} packed")


@pytest.mark.parametrize("dtype", [d for d in V.DTYPES if V.packed_cols(d)])
def test_packed_blocks_of_two_tiles_over_several_rounds(async_library, async_planner, monkeypatch, rng, dtype):
    """The packed tier's rows of more than 32 values a thread (two tiles where copies are
    asynchronous: the next round's copies land in the other tile while a round computes) over
    several rounds a block: blocks of 32 threads taking 3 rounds each, the last block's last round
    partial, the span starting on a vector and one row into it. The same kernels with one tile
    (stages = 1, the next round copied after a round's stores) on a grid of one block, too."""
    tune_defaults(monkeypatch, packed_threads=32)
    tune_defaults(monkeypatch, packed_wide_group_threads=32)
    tune_defaults(monkeypatch, packed_rounds=3)
    tune_defaults(monkeypatch, packed_large_groups_min_blocks_per_sm=0)
    tune_defaults(monkeypatch, packed_wide_min_groups_per_sm=0)
    runtime = EmulatedRuntime(async_library, 32, shared_mem_per_block=48 * 1024,
                              shared_mem_per_block_optin=96 * 1024, shared_mem_per_multiprocessor=128 * 1024)
    long_groups = [c for c in V.packed_cols(dtype) if np.lcm(c, V.vector_widths(dtype)[1]) > 32]
    assert long_groups, V.packed_cols(dtype)
    vec = V.vector_widths(dtype)[1]
    for cols in long_groups:
        rows = 3 * 32 * np.lcm(cols, vec) * 3 // 2 // cols + 3  # a block's 3 rounds and a half, and 3 rows
        x = _inputs(rng, (rows, cols), dtype)
        for offset in (0, cols) if cols % vec % cols == 0 else (0,):  # one row in, where that is packed
            problem = RowProblem(dtype, "softmax", rows, cols, x_misalign=offset % vec, y_misalign=offset % vec)
            for op, safe in OP_CASES:
                the_plan = plan(replace(problem, op=op, safe=safe), runtime.profile(0))
                launch = the_plan.launches[0]
                assert the_plan.tier == "packed" and the_plan.notes["stages"] == 2 and launch.grid > 1, the_plan
                per_block = 3 * 32 * the_plan.notes["values_per_thread"]
                assert (offset + rows * cols) % per_block and (offset + rows * cols) > per_block * (launch.grid - 1)
                got = runtime.run_plan(x, the_plan, x_offset=offset, y_offset=offset)
                assert_close(got, x, 1, op, safe, f"{dtype} {op} safe={safe} {cols} columns offset {offset} two tiles")
                one_tile = replace(launch, grid=1, shared_mem=launch.shared_mem // 2,
                                   args=launch.args[:-1] + (("i32", 1),))
                got = runtime.run_plan(x, replace(the_plan, launches=(one_tile,)), x_offset=offset, y_offset=offset)
                assert_close(got, x, 1, op, safe, f"{dtype} {op} safe={safe} {cols} columns offset {offset} one tile")


@pytest.mark.parametrize("copies", ["sync", "async"])
def test_on_chip_split_with_float32_blocks_of_384_threads(request, rng, copies):
    """The on-chip split at the block size the planner gives float32 rows (cached_threads_by_itemsize:
    12 warps of 32, or 6 of 64), on a device that allows it, with and without asynchronous copies:
    enough rows for three rounds of the grid and a partial fourth, so that blocks refill their caches;
    rows a multiple of 128 bytes long, and one vector longer, so that rows start at different
    places in a line (a thread keeps its slots from row to row however its rows lie); and the
    longer rows starting one element into a vector, so that the first chunk begins with a partial
    slot, which is read, refilled and stored apart from the whole ones."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(library, warp, multiprocessors=16, max_threads_per_block=1024,
                                  max_threads_per_multiprocessor=2048)
        device = runtime.profile(0)
        cols = 64
        while cols < 1 << 17 and plan(RowProblem("float32", "softmax", 64, cols), device).tier != "cached":
            cols = cols * 5 // 4 + 1
        cols = cols // 32 * 32  # 128 bytes
        for row_cols, offset in ((cols, 0), (cols + 4, 0), (cols + 4, 1)):
            probe = plan(RowProblem("float32", "softmax", 64, row_cols, x_misalign=offset, y_misalign=offset), device)
            assert probe.tier == "cached" and probe.launches[0].block == 384, (warp, row_cols, probe)
            assert probe.notes["vec"] == 4, probe.notes
            rows = 3 * (probe.launches[0].grid // probe.notes["chunks"]) + 2
            x = _inputs(rng, (rows, row_cols), "float32")
            for op, safe in OP_CASES:
                problem = RowProblem("float32", op, rows, row_cols, safe=safe, x_misalign=offset, y_misalign=offset)
                the_plan = plan(problem, device)
                got = runtime.run_plan(x, the_plan, x_offset=offset, y_offset=offset)
                assert_close(got, x, 1, op, safe,
                             f"warp {warp} float32 {op} safe={safe} {x.shape} offset {offset} cached {the_plan.notes}")


@pytest.mark.parametrize("copies", ["sync", "async"])
def test_on_chip_split_merging_more_chunks_than_a_warp_has_lanes(request, rng, copies):
    """The merge's warp reads a row's published pairs a lane each, in turns of WARP: rows in more
    chunks than a 64-lane warp has lanes (a device of 96 multiprocessors) take a second turn at
    either warp size, as few long rows do on a 132-multiprocessor GPU (float32 4x262144: 66 chunks)."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(library, warp, multiprocessors=96)
        device = runtime.profile(0)
        probe = plan(RowProblem("float32", "softmax", 1, 66000), device)
        assert probe.tier == "cached" and probe.notes["chunks"] > max(V.WARP_SIZES), (warp, probe)
        x = _inputs(rng, (2, 66000), "float32")
        for op, safe in OP_CASES:
            the_plan = plan(RowProblem("float32", op, 2, 66000, safe=safe), device)
            assert the_plan.notes["chunks"] > max(V.WARP_SIZES), the_plan.notes
            got = runtime.run_plan(x, the_plan)
            assert_close(got, x, 1, op, safe, f"warp {warp} float32 {op} safe={safe} {x.shape} {the_plan.notes}")


@pytest.mark.parametrize("copies", ["sync", "async"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_block_tier_rows_past_the_grid_starting_anywhere_in_a_line(request, rng, dtype, copies):
    """Block-tier rows on a device whose grid holds 3 blocks, so that each block caches row after
    row, of lengths that put consecutive rows' starts at different places in a 128-byte line (each
    row starts its threads' turn on a line, and the cache's places change owners between rows)."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(library, warp, max_grid_x=3)
        device = runtime.profile(0)
        itemsize = V.DTYPES[dtype][2]
        cols = 64
        while cols < 1 << 16 and plan(RowProblem(dtype, "softmax", 64, cols), device).tier != "block":
            cols = cols * 5 // 4 + 1
        for row_cols in (cols // 64 * 64 + 16 // itemsize, cols // 64 * 64 + 1):  # one vector, one element past
            x = _inputs(rng, (11, row_cols), dtype)
            for op, safe in OP_CASES:
                the_plan = plan(RowProblem(dtype, op, 11, row_cols, safe=safe), device)
                assert the_plan.tier == "block" and the_plan.launches[0].grid == 3, (warp, row_cols, the_plan)
                got = runtime.run_plan(x, the_plan)
                assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {x.shape} block")


def _block_rows_with_one_owner_of_both_ends(device, dtype: str) -> int | None:
    """Columns of contiguous block-tier rows (several rows, so that rows start at every element
    offset of a slot) where some row's first and last slots are both partial and belong to one
    thread: slots = k * blockDim + 1."""
    vec = 16 // V.DTYPES[dtype][2]
    for cols in range(1001, 40000, 2):
        the_plan = plan(RowProblem(dtype, "softmax", 8, cols), device)
        if the_plan.tier != "block" or the_plan.notes["vec"] != vec:
            continue
        threads = the_plan.launches[0].block
        for pad in range(1, vec):
            slots = -(-(pad + cols) // vec)
            if (slots - 1) % threads == 0 and (pad + cols) % vec:
                return cols
    return None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_block_tier_row_whose_first_and_last_partial_slots_share_a_thread(async_library, rng, dtype):
    """Where copies are asynchronous, a thread reads its partial slot before its copies and places
    it after them, one slot a thread; a thread owning both ends of a row reads the second after."""
    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(async_library, warp)
        cols = _block_rows_with_one_owner_of_both_ends(runtime.profile(0), dtype)
        assert cols is not None, f"no such row length at warp {warp}"
        x = _inputs(rng, (8, cols), dtype)
        for op, safe in OP_CASES:
            the_plan = plan(RowProblem(dtype, op, 8, cols, safe=safe), runtime.profile(0))
            assert the_plan.tier == "block"
            got = runtime.run_plan(x, the_plan)
            assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} (8, {cols}) block")


@pytest.mark.parametrize("copies", ["sync", "async"])
@pytest.mark.parametrize("dtype", V.BLOCK_REGISTERS_DTYPES)
def test_rows_held_partly_in_registers(request, async_planner, monkeypatch, rng, dtype, copies):
    """Rows past a block's shared memory, the first slots of each held in registers
    (block_registers), built with and without asynchronous copies, at warp 32, on a device
    whose grid holds 3 blocks (blocks take row after row): the shortest such rows (most slots in
    registers past the row, read as -inf), and rows one slot past the registers and longer (the
    last slot always in shared memory), starting on a vector and one element into it (the first
    held slot partial). Blocks of 256 threads, and 128 where two such blocks share a
    multiprocessor (row_registers_paired), not the planner's 1024 and 512: the kernel holds
    kRowRegisterSlots a thread at any block size, and every emulated thread keeps a fiber stack
    mapped per host thread."""
    tune_defaults(monkeypatch, row_registers_threads=256)
    tune_defaults(monkeypatch, block_alone_min_waves=1)  # 7 rows on the emulated 4 multiprocessors
    block_sizes = set()
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    capacity = DEFAULT_TUNING.row_register_slots * 256  # slots a block of the threads set above holds in registers
    vec = 16 // V.DTYPES[dtype][2]
    for warp in ASYNC_COPY_WARPS:
        runtime = EmulatedRuntime(library, warp, max_grid_x=3)
        device = runtime.profile(0)
        shortest = 64
        while plan(RowProblem(dtype, "softmax", 7, shortest), device).tier != "block_registers":
            shortest = shortest * 9 // 8 + 1
        for cols in (shortest, capacity * vec + 1, capacity * vec + 700 * vec + 3):
            x = _inputs(rng, (7, cols), dtype)
            for offset in (0, 1):
                for op, safe in OP_CASES:
                    problem = RowProblem(dtype, op, 7, cols, safe=safe, x_misalign=offset, y_misalign=offset)
                    the_plan = plan(problem, device)
                    assert the_plan.tier == "block_registers" and the_plan.launches[0].grid == 3, (cols, the_plan)
                    block_sizes.add(the_plan.launches[0].block)
                    got = runtime.run_plan(x, the_plan, x_offset=offset, y_offset=offset)
                    assert_close(got, x, 1, op, safe,
                                 f"warp {warp} {dtype} {op} safe={safe} (7, {cols}) offset {offset} block_registers")
    assert block_sizes == {128, 256}, "both the paired blocks and the blocks alone ran"


@pytest.mark.parametrize("copies", ["sync", "async"])
@pytest.mark.parametrize("dtype", V.BLOCK_REGISTERS_DTYPES)
def test_on_chip_split_with_chunks_partly_in_registers(request, async_planner, monkeypatch, rng, dtype, copies):
    """The on-chip split whose chunks begin with `held` slots a thread in registers
    (split_cached_registers), every built (held, blocks) pair, at warp 32, with and without
    asynchronous copies, rows starting on a vector and one element into it (the first held slot
    partial), and input and output a different element off a vector (scalar slots), enough rows
    for three rounds of the grid and part of a fourth, so that the next row's held slots and cache
    are loaded while a row is stored. Last, with chunk boundaries on
    multiples of 1024 slots (chunk_align_bytes raised), rows whose last chunk ends inside the held
    slots: the row's partial tail slot in registers, and no cache part."""
    tune_defaults(monkeypatch, row_registers=False)
    tune_defaults(monkeypatch, block_tier_whole_sm=False)
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    itemsize = V.DTYPES[dtype][2]
    vec = 16 // itemsize
    configs = V.split_registers_configs(dtype)
    assert configs, dtype

    def check(runtime, cols: int, what: str, offsets=((0, 0), (1, 1))) -> None:
        """(x_offset, y_offset) pairs that differ take scalar slots (vec 1)."""
        device = runtime.profile(0)
        x_offset, y_offset = offsets[0]
        the_plan = plan(RowProblem(dtype, "softmax", 64, cols, x_misalign=x_offset, y_misalign=y_offset), device)
        rows = 3 * (the_plan.launches[0].grid // the_plan.notes["chunks"]) + 2
        x = _inputs(rng, (rows, cols), dtype)
        for x_offset, y_offset in offsets:
            for op, safe in OP_CASES:
                problem = RowProblem(dtype, op, rows, cols, safe=safe, x_misalign=x_offset, y_misalign=y_offset)
                the_plan = plan(problem, device)
                assert the_plan.tier == "cached" and "held_slots" in the_plan.notes, the_plan
                assert (the_plan.notes["vec"] == 1) == (x_offset != y_offset), the_plan.notes
                got = runtime.run_plan(x, the_plan, x_offset=x_offset, y_offset=y_offset)
                assert_close(got, x, 1, op, safe, f"warp {runtime.profile(0).warp_size} {dtype} {op} safe={safe} "
                             f"{x.shape} offsets {x_offset}, {y_offset} {what} {the_plan.notes}")

    for held, blocks in configs:
        tune_defaults(monkeypatch, split_registers={itemsize: (held, blocks)})
        tune_defaults(monkeypatch, chunk_align_bytes=256)
        plan.cache_clear()
        held_slots = held * DEFAULT_TUNING.split_registers_threads
        for warp in ASYNC_COPY_WARPS:
            runtime = EmulatedRuntime(library, warp)
            probe = plan(RowProblem(dtype, "softmax", 64, 4 * held_slots * vec), runtime.profile(0))
            assert probe.launches[0].kernel.endswith(f"_h{held}_b{blocks}"), probe
            assert probe.notes["chunk_slots"] > held_slots, probe.notes  # a cache part beside the held slots
            for cols in (2 * probe.notes["chunk_slots"] * vec + 3, 4 * held_slots * vec):
                check(runtime, cols, f"held {held} blocks {blocks}")
            device = runtime.profile(0)
            shortest = 4 * held_slots  # scalar slots: the shortest rows the held split takes, and longer
            while "held_slots" not in plan(RowProblem(dtype, "softmax", 64, shortest, x_misalign=1), device).notes:
                shortest = shortest * 5 // 4 + 1
            chunk_slots = plan(RowProblem(dtype, "softmax", 64, shortest, x_misalign=1), device).notes["chunk_slots"]
            longer = shortest + chunk_slots // 2  # its last chunk ends in a different place
            for cols in (shortest, longer):
                check(runtime, cols, f"held {held} blocks {blocks}", ((1, 0), (0, 1)))
        tune_defaults(monkeypatch, chunk_align_bytes=1024 * 16)
        plan.cache_clear()
        for warp in ASYNC_COPY_WARPS:
            runtime = EmulatedRuntime(library, warp)
            for cols in range(held_slots * vec + 5, 8 * held_slots * vec, 37 * vec):
                notes = plan(RowProblem(dtype, "softmax", 64, cols), runtime.profile(0)).notes
                if "held_slots" not in notes:  # not the on-chip split
                    continue
                last_chunk = -(-cols // vec) - (notes["chunks"] - 1) * notes["chunk_slots"]
                if notes["chunks"] > 1 and last_chunk < held_slots:
                    break
            else:
                pytest.fail(f"no row whose last chunk ends inside the {held_slots} held slots")
            check(runtime, cols, f"held {held} blocks {blocks}, last chunk {last_chunk} slots")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_on_chip_split_of_values_far_from_zero(async_library, async_planner, monkeypatch, rng, dtype):
    """16-bit chunks of the on-chip split take their exps as 2^(x log2(e) - h) (add_cached_two_pass),
    h = m log2(e) rounded: rows of values far from 0, a few of the dtype's spacings apart, where that
    rounding is 0.001-0.02 (outputs 1-3 ulps off unless the sum takes it out again); rows past 2^20,
    which take exp(x - m) instead; and rows of ordinary values beside them. Both forms of the split
    (chunks partly in registers, and wholly in shared memory), at warp 32."""
    tune_defaults(monkeypatch, row_registers=False)
    tune_defaults(monkeypatch, block_tier_whole_sm=False)
    # the largest value's log2(e) multiple rounds by 0.0039 (float16) and -0.020 (bfloat16) in float32
    large, spacing = {"float16": (49888.0, 32.0), "bfloat16": (598016.0, 4096.0)}[dtype]
    for held in (True, False):
        tune_defaults(monkeypatch, split_registers=DEFAULT_TUNING.split_registers if held else {})
        plan.cache_clear()
        for warp in ASYNC_COPY_WARPS:
            runtime = EmulatedRuntime(async_library, warp)
            device = runtime.profile(0)
            cols = 2048
            while True:
                the_plan = plan(RowProblem(dtype, "softmax", 64, cols), device)
                notes = the_plan.notes
                if the_plan.tier == "cached" and ("held_slots" in notes) == held and (
                        not held or notes["chunk_slots"] > notes["held_slots"] + 64):  # a cache part too
                    break
                assert cols < 1 << 18, (warp, held, the_plan)
                cols = cols * 5 // 4 + 8
            assert the_plan.notes["chunks"] > 1, the_plan.notes
            rows = 2 * (the_plan.launches[0].grid // the_plan.notes["chunks"]) + 3
            x = (rng.standard_normal((rows, cols)) * 4.0).astype(np.float64)
            x[0::3] = large + spacing * rng.integers(0, 4, (len(x[0::3]), cols))
            x[1::3, : cols // 2] = large + spacing * rng.integers(0, 4, (len(x[1::3]), cols // 2))  # half the row
            if dtype == "bfloat16":  # past 2^20 (float16 ends at 65504): exp(x - m)
                x[2] = 3.0 * 2.0**21 + 2.0**15 * rng.integers(0, 4, cols)
            x = x.astype(host_dtype(dtype))
            assert float(x[0].astype(np.float64).max()) == large + 3 * spacing
            for op, safe in OP_CASES:
                problem = RowProblem(dtype, op, rows, cols, safe=safe)
                got = runtime.run_plan(x, plan(problem, device), x_offset=0, y_offset=0)
                assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {x.shape} held={held}")


#: inputs that the small-input rules plan differently: short rows in smaller staged tiles or
#: blocks of fewer threads, packed and register-tier blocks of fewer warps, and rows of 16 or more
#: columns sent from the staged tiers to the register and block tiers
SMALL_INPUTS = {"float32": ((500, 5), (1000, 13), (4000, 1), (999, 4), (64, 64), (37, 100), (120, 40), (5, 128)),
                "float16": ((500, 7), (4000, 1), (999, 4), (200, 32), (64, 64), (37, 100), (40, 200)),
                "bfloat16": ((300, 5), (1000, 13), (999, 4), (5, 128), (9, 600))}


@pytest.mark.parametrize("copies", ["sync", "async"])
@pytest.mark.parametrize("dtype", SMALL_INPUTS)
def test_small_inputs_under_the_small_input_rules(request, monkeypatch, rng, dtype, copies):
    """The plans of the small-input rules (Tuning.small_input_*) at warps 32 and 64, with and
    without asynchronous copies: each input's plan differs from the one without the rules, and
    every output matches the reference."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    monkeypatch.setattr(planner, "has_async_copy", lambda device: copies == "async")

    def plan_with(rules: bool, problem: RowProblem, device):
        committed = default_tuning(device)  # the family's, as has_async_copy says above
        return plan(problem, device, committed if rules else without_small_input_rules(committed))

    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(library, warp)
        for shape in SMALL_INPUTS[dtype]:
            x = _inputs(rng, shape, dtype)
            for op, safe in OP_CASES:
                problem = RowProblem(dtype, op, *shape, safe=safe)
                device = runtime.profile(0)
                before, after = plan_with(False, problem, device), plan_with(True, problem, device)
                assert after != before, (warp, shape, before)
                got = runtime.run_plan(x, after)
                assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {shape} {after.tier} "
                             f"({after.launches[0].grid}x{after.launches[0].block}, {after.notes})")


#: rows the staged tier takes only where copies are asynchronous: whole 16-byte vectors (an even
#: number of 32-bit words, so threads start them at different words), rows ahead of scalar slots,
#: and rows of 514-576 bytes; odd lengths beside them, and short 16-bit rows (9-31 columns, rows of
#: 9-12 and 13-16 held in registers of two counts; 70 rows are too few for the packed tier's wide
#: groups of 9, 11 and 13 columns, and the other packed lengths are left out)
STAGED_WHERE_ASYNC = {"float32": (20, 36, 65, 80), "float16": (9, 13, 31, 60, 64, 72, 127, 200, 270),
                      "bfloat16": (11, 15, 17, 40, 48, 255, 257)}


@pytest.mark.parametrize("dtype", STAGED_WHERE_ASYNC)
def test_staged_rows_of_the_asynchronous_planner(async_library, async_planner, monkeypatch, rng, dtype):
    """The planner as it runs on NVIDIA sm_80 and newer sends these rows to the staged tier (where
    groups of lanes do not take them); 70 rows a tile, so that threads of both warps start rows at
    every word offset."""
    tune_defaults(monkeypatch, staged_groups=False)
    # a block's shared memory at least as large as an H100's default
    runtime = EmulatedRuntime(async_library, 32, shared_mem_per_block=64 * 1024,
                              shared_mem_per_block_optin=64 * 1024, shared_mem_per_multiprocessor=128 * 1024)
    for cols in STAGED_WHERE_ASYNC[dtype]:
        x = _inputs(rng, (70, cols), dtype)
        for op, safe in OP_CASES:
            assert _tier(runtime, x, 1, op, safe) == "staged", (dtype, cols)
            got = run_host_array(runtime, x, 1, op, safe)
            assert_close(got, x, 1, op, safe, f"{dtype} {op} safe={safe} {x.shape} staged")


#: rows the planner for NVIDIA sm_80 and newer stages a warp a row: odd lengths (rows starting
#: mid-word: a head and a tail value), whole words, and up to 8000 bytes (16-bit types only)
STAGED_WARP_WHERE_ASYNC = {"float16": (288, 300, 777, 1001, 4000), "bfloat16": (383, 512, 601)}


@pytest.mark.parametrize("dtype", STAGED_WARP_WHERE_ASYNC)
def test_staged_warp_rows_of_the_asynchronous_planner(async_library, async_planner, monkeypatch, rng, dtype):
    """The staged tier with a warp a row, at warp 32, as the sm_80+ planner sends rows to it
    (where groups of lanes, staged or the register tier's, do not take them); 37 rows, so that the
    last tile is partial and the special rows fall in the first one."""
    tune_defaults(monkeypatch, staged_groups=False)
    tune_defaults(monkeypatch, exact_group_min_lanes=1 << 30)  # bfloat16 512 columns at warp 64
    for warp in ASYNC_COPY_WARPS:
        runtime = EmulatedRuntime(async_library, warp, shared_mem_per_block=48 * 1024,
                                  shared_mem_per_block_optin=48 * 1024, shared_mem_per_multiprocessor=128 * 1024)
        for cols in STAGED_WARP_WHERE_ASYNC[dtype]:
            x = _inputs(rng, (37, cols), dtype)
            for op, safe in OP_CASES:
                assert _tier(runtime, x, 1, op, safe) == "staged_warp", (warp, dtype, cols)
                got = run_host_array(runtime, x, 1, op, safe)
                assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {x.shape} staged_warp")


#: rows of odd and whole-word lengths whose tile of a row a group fits 48 KiB, and rows of a power-of-two
#: number of 16-byte slots (a padded tile: 16-bit 256, 512 and 1024 columns, float32 64 and 128), and
#: rows of 193-256 bytes that are an even number of words (16-bit 120 columns, float32 52 and 64)
STAGED_GROUP_ROWS = {"float16": (120, 256, 288, 300, 512, 777, 1001), "bfloat16": (383, 512, 601, 1024),
                     "float32": (52, 64, 67, 100, 128, 150)}


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize(("dtype", "lanes"), [(d, n) for d in STAGED_GROUP_ROWS for n in V.staged_group_lanes(d)])
def test_staged_group_rows_of_the_asynchronous_planner(async_library, async_planner, monkeypatch, rng, dtype, lanes,
                                                       interleave):
    """The staged tier with a group of fewer lanes than a warp a row, at warp 32, the groups
    on a tile's rows in order and interleaved: a warp's groups take different rows (an empty one
    beside full ones among the special rows), and groups past the last row of a partial tile take
    none while the others shuffle."""
    # this group size and order wherever a row a group fits, whatever its banks
    monkeypatch.setattr(V, "STAGED_GROUP_LANES", (lanes,))
    tune_defaults(monkeypatch, staged_group_orders=(interleave,))
    tune_defaults(monkeypatch, staged_group_min_words=0)
    tune_defaults(monkeypatch, staged_group_max_ways=32)
    tune_defaults(monkeypatch, staged_group_tile_bytes=1 << 20)
    tune_defaults(monkeypatch, exact_group_min_lanes=1 << 30)  # rows the register tier's groups fill too
    for warp in ASYNC_COPY_WARPS:
        runtime = EmulatedRuntime(async_library, warp, shared_mem_per_block=48 * 1024,
                                  shared_mem_per_block_optin=48 * 1024, shared_mem_per_multiprocessor=128 * 1024)
        for cols in STAGED_GROUP_ROWS[dtype]:
            if DEFAULT_TUNING.staged_threads // lanes * (cols * V.DTYPES[dtype][2] + 16) > 48 * 1024 - 32:
                continue  # a row a group does not fit a tile: other tiers take these rows
            x = _inputs(rng, (37, cols), dtype)
            vec = V.vector_widths(dtype)[1]
            row_slots = cols * V.DTYPES[dtype][2] // 16
            power_of_two = cols % vec == 0 and row_slots & (row_slots - 1) == 0
            for op, safe in OP_CASES:
                the_plan = plan(RowProblem(dtype, op, 37, cols, safe=safe), runtime.profile(0))
                assert (the_plan.tier, the_plan.notes["interleave"]) == ("staged_group", interleave), (warp, cols)
                got = run_host_array(runtime, x, 1, op, safe)
                assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {x.shape} {lanes} lanes")
                if power_of_two:  # the same rows in a tile padded by a slot a row
                    problem = RowProblem(dtype, op, 37, cols, safe=safe)
                    device = runtime.profile(0)
                    padded = planner._plan_groups_at(planner.default_tuning(device), problem, device, vec,
                                                     row_slots.bit_length() - 1).resolve()
                    assert padded.notes["row_shift"] >= 0 and (padded.notes["lanes"], padded.notes["interleave"]) == (
                        lanes, interleave)
                    got = runtime.run_plan(x, padded)
                    assert_close(got, x, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {x.shape} padded")


def _every_tier_matches_the_reference(runtime, rng, dtype):
    warp = runtime.profile(0).warp_size
    tiers = set()
    for shape, axis in _shapes_reaching_every_tier(runtime, dtype):
        x = _inputs(rng, shape, dtype)
        axis = normalize_axis(axis, x.ndim)
        reduced = np.ascontiguousarray(np.moveaxis(x, -1, axis))  # the special rows run along `axis`
        for op, safe in OP_CASES:
            tier = _tier(runtime, reduced, axis, op, safe)
            tiers.add(tier)
            got = run_host_array(runtime, reduced, axis, op, safe)
            assert_close(got, reduced, axis, op, safe, f"warp {warp} {dtype} {op} safe={safe} {shape} {tier}")
    expected = TIERS if V.packed_cols(dtype) else TIERS - {"packed"}  # packed rows: a few lengths of some dtypes
    assert tiers == expected, f"warp {warp} {dtype} reached only {sorted(tiers)}"


@pytest.mark.parametrize("dtype", V.DTYPES)
@pytest.mark.parametrize("copies", ["sync", "async"])
def test_non_last_axis_cached_on_chip_with_vectors_and_without(request, rng, dtype, copies):
    """The on-chip strided tier with a thread per inner position and, for the element sizes that
    take vectors, with a vector of them (rows that all start vector-aligned), on a device with room
    for the vector form's scratch; built with and without asynchronous copies (which refill the
    cache and poll each pair where a slot is 4 bytes or more)."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    for warp in V.WARP_SIZES:
        runtime = EmulatedRuntime(library, warp, shared_mem_per_block=48 * 1024, shared_mem_per_block_optin=48 * 1024,
                                  shared_mem_per_multiprocessor=192 * 1024, multiprocessors=32)
        widths = set()
        many_chunks = False
        for inner in (128, 129):
            cols = 8
            while cols <= 1 << 12:
                reduced = np.empty((2, cols, inner), host_dtype(dtype))
                if _tier(runtime, reduced, 1, "softmax", False) == "strided_cached":
                    break
                cols += max(1, cols // 16)
            # The fewest columns that take the tier (two chunks), and sixteen times as many over
            # a quarter of the inner positions (a grid the emulation's threads hold): more chunks
            # than the block's threads a tile position, whose pairs merge in slices.
            for outer, positions, n in ((2, inner, cols), (1, inner // 4 + inner % 2, 16 * cols)):
                x = _inputs(rng, (outer, positions, n), dtype)
                reduced = np.ascontiguousarray(np.moveaxis(x, -1, 1))
                layout = describe(reduced.shape, tuple(s // reduced.itemsize for s in reduced.strides), 1)
                for op, safe in OP_CASES:
                    the_plan = plan(problem_for(dtype, op, safe, layout, layout, 0, 0), runtime.profile(0))
                    assert the_plan.tier == "strided_cached", (warp, positions, n, the_plan.tier)
                    widths.add(the_plan.notes["vec"])
                    many_chunks |= the_plan.notes["chunks"] > DEFAULT_TUNING.strided_cached_threads // (
                        the_plan.notes["inner_tile"] * the_plan.notes["vec"])
                    got = runtime.run_plan(reduced, the_plan)
                    assert_close(got, reduced, 1, op, safe, f"warp {warp} {dtype} {op} safe={safe} {reduced.shape}")
        vectors = V.DTYPES[dtype][2] in DEFAULT_TUNING.strided_vector_itemsizes
        assert widths == ({1, V.strided_vector_widths(dtype)[1]} if vectors else {1})
        assert many_chunks


@pytest.mark.parametrize("dtype", V.DTYPES)
def test_log_softmax_of_a_dominant_max_keeps_its_small_output(runtime, rng, dtype):
    """A row whose max (100) stands far above the rest has log d near 2e-4, and the max's output
    -log d is small: computed as x - (m + log d), m + log d would round to float32 at an absolute
    error of up to 4e-6 (many ulps of the output). Rows of every row tier's lengths."""
    for rows, cols in [(64, 3), (64, 31), (64, 100), (40, 127), (9, 1000), (3, 5000)]:
        x = (100.0 - 13.0 + 0.5 * rng.standard_normal((rows, cols)))
        x[np.arange(rows), rng.integers(0, cols, rows)] = 100.0
        x = x.astype(host_dtype(dtype))
        tier = _tier(runtime, x, 1, "log_softmax", False)
        got = run_host_array(runtime, x, 1, "log_softmax", False)
        assert_close(got, x, 1, "log_softmax", False, f"{dtype} {rows}x{cols} {tier}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_softmax_rows_in_registers_on_both_sides_of_the_shifted_exp_bound(runtime, rng, dtype):
    """Softmax rows held in registers take their exps relative to m log2(e) rounded while |m| <= 2^20
    (ExpShifted, float16 always) and relative to m beyond: rows whose max lies just inside and
    outside that bound, and near the dtype's largest values, in the packed, staged and register tiers."""
    largest = {"float32": 3e38, "bfloat16": 3e38, "float16": 6e4}[dtype]
    centres = [c for c in (1.0e6, -1.0e6, 1.2e6, -3.0e6, 1e30, largest) if abs(c) <= largest]
    tiers = set()
    for rows, cols in [(64, 3), (64, 6), (33, 37), (40, 127), (600, 100), (9, 1000)]:
        for centre in centres:
            x = (centre + 4.0 * rng.standard_normal((rows, cols))).astype(host_dtype(dtype))
            for safe in (False, True):
                tiers.add(_tier(runtime, x, 1, "softmax", safe))
                got = run_host_array(runtime, x, 1, "softmax", safe)
                assert_close(got, x, 1, "softmax", safe, f"{dtype} {rows}x{cols} around {centre:g}")
    assert {"staged", "warp"} <= tiers, tiers


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("x_misalign, y_misalign", [(1, 1), (1, 2)])
def test_misaligned_rows_use_scalar_heads_and_tails(runtime, rng, dtype, x_misalign, y_misalign):
    """Rows whose start is not vector-aligned: the same offset takes a partial head slot, different
    offsets force the scalar (VEC = 1) kernels."""
    _misaligned_rows_match_the_reference(runtime, rng, dtype, x_misalign, y_misalign)


def _misaligned_rows_match_the_reference(runtime, rng, dtype, x_misalign, y_misalign):
    for rows, cols in [(40, 3), (9, 130), (5, 1000), (7, 5000), (3, 12000), (1, 20000)]:
        x = _inputs(rng, (rows, cols), dtype)
        problem = RowProblem(dtype, "softmax", rows, cols, x_misalign=x_misalign, y_misalign=y_misalign)
        the_plan = plan(problem, runtime.profile(0))
        got = runtime.run_plan(x, the_plan, x_offset=x_misalign, y_offset=y_misalign)
        assert_close(got, x, 1, "softmax", False, f"{dtype} {rows}x{cols} {the_plan.launches[0].kernel}")


# ---- a 32-lane assumption must fail at warp 64 -------------------------------------------------------
#: name -> (source text, its replacement); every occurrence in softmax.cuh is replaced
MUTATIONS = {
    # the butterflies never exchange across 32 lanes: a 64-lane warp ends with two half totals
    "butterfly stops at xor 16": ("for (int offset = width / 2; offset > 0; offset /= 2)",
                                  "for (int offset = (width > 32 ? 32 : width) / 2; offset > 0; offset /= 2)"),
    # lane numbers from a 5-bit mask: lanes 32-63 also load per-warp partials, counting them twice
    "lane = thread & 31": ("const int lane = PS_THREAD_X % WARP;", "const int lane = PS_THREAD_X & 31;"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_32_lane_assumption_fails_at_warp_64_only(tmp_path, rng, mutation):
    anchor, replacement = MUTATIONS[mutation]
    src = tmp_path / "src_cuda"
    shutil.copytree(SRC_CUDA, src)
    header = src / "softmax.cuh"
    text = header.read_text()
    assert anchor in text, f"mutation anchor no longer in softmax.cuh: {anchor!r}"
    header.write_text(text.replace(anchor, replacement))
    mutant = _library_or_skip(src, ("float32",))

    # a row per 64-lane warp, 32-lane groups, then the tiers with block-wide reductions
    shapes = [(9, 130), (600, 100), (7, 5000), (3, 12000), (1, 20000)]
    wrong = {}
    for warp in WARPS:
        runtime = EmulatedRuntime(mutant, warp)
        wrong[warp] = []
        for shape in shapes:
            x = (rng.standard_normal(shape) * 4.0).astype(np.float32)
            got = run_host_array(runtime, x, 1, "softmax", False)
            ref = reference.softmax(x, 1)
            if not np.allclose(got, ref, rtol=RTOL, atol=ATOL):
                wrong[warp].append(f"{shape} {_tier(runtime, x, 1, 'softmax', False)}")
    assert not wrong[32], f"mutation {mutation!r} should be harmless at warp 32, yet broke {wrong[32]}"
    assert wrong[64], f"mutation {mutation!r} went unnoticed at warp 64"
    print(f"mutation {mutation!r} caught at warp 64 on: {wrong[64]}")


@pytest.mark.parametrize("copies", ["sync", "async"])
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_two_pass_split_through_a_buffer_in_shared_memory(request, async_planner, monkeypatch, rng,
                                                                      dtype, copies):
    """The two-pass split through a buffer in shared memory smaller than its chunks (the
    split_partials_buffered and split_normalize_buffered kernels), at warp 32, with and without
    asynchronous copies: chunks of several pieces of the buffer and a short last one, rows of one
    chunk and of several, starting on a vector and one element into it (a partial head slot), input
    and output a different element off (scalar slots: 16-bit ones, too narrow to copy
    asynchronously, take the streaming passes)."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    runtime = EmulatedRuntime(library, 32)
    device = runtime.profile(0)
    itemsize = V.DTYPES[dtype][2]
    vec = 16 // itemsize
    cache_slots = 3 * 64  # three slots a thread of two warps
    tune_defaults(monkeypatch, split_buffer_bytes=cache_slots * 16)
    tune_defaults(monkeypatch, split_buffer_threads=64)
    # full blocks over these rows of a few hundred slots, as longer rows take them (shorter rows
    # otherwise take a warp a row, or blocks sized to them that stream: tests/test_planner.py)
    tune_defaults(monkeypatch, split_stream_slots_per_thread=0, passes_rows_in_registers=False)
    plan.cache_clear()
    pieces_seen, chunks_seen = set(), set()
    for rows, cols in ((7, 2 * cache_slots * vec + 3), (2, 5000 * vec + 1), (3, 200)):
        x = _inputs(rng, (rows, cols), dtype)
        for x_offset, y_offset in ((0, 0), (1, 1), (1, 0)):
            for op, safe in OP_CASES:
                problem = RowProblem(dtype, op, rows, cols, safe=safe, x_misalign=x_offset, y_misalign=y_offset)
                the_plan = planner.plan_split_passes(problem, device)
                notes = the_plan.notes
                slot_bytes = notes["vec"] * itemsize
                for launch, buffers in zip(the_plan.launches, (True, itemsize in V.SPLIT_BUFFERED_NORMALIZE_ITEMSIZES)):
                    assert ("_buffered_" in launch.kernel) == (buffers and slot_bytes >= 4), (launch, slot_bytes)
                    if "_buffered_" in launch.kernel:
                        assert launch.block == 64 and launch.shared_mem == launch.args[-1][1] * slot_bytes, launch
                        pieces_seen.add(-(-notes["chunk_slots"] // launch.args[-1][1]))
                chunks_seen.add(notes["chunks"])
                got = runtime.run_plan(x, the_plan, x_offset=x_offset, y_offset=y_offset)
                assert_close(got, x, 1, op, safe, f"{dtype} {op} safe={safe} {x.shape} offsets {x_offset}, "
                             f"{y_offset} {the_plan.launches} {notes}")
    assert max(pieces_seen) > 2 and 1 in pieces_seen and max(chunks_seen) > 1, (pieces_seen, chunks_seen)

"""The gradient kernels and API: softmax_backward / log_softmax_backward against the float64 reference.

The kernels run in the SIMT emulation at warp 32 and 64 through every regime of planner_backward
(small emulated limits take small shapes to the split regimes); the public API runs on the CPU
backend, on the emulated backends, and under torch's autograd (eager, torch.func, torch.compile).
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import replace
from math import ceil

import ml_dtypes
import numpy as np
import pytest
from checks import gradient_reference
from emulation import EmulatedRuntime, EmulationLibrary
from emulation.build import SRC_CUDA
from test_emulation import _library_or_skip

import portable_softmax as ps
from portable_softmax import _tolerance, planner
from portable_softmax import _variants as V
from portable_softmax.planner import DeviceProfile
from portable_softmax.planner_backward import (
    DEFAULT_GRAD_TUNING,
    ROW_RULES,
    STRIDED_RULES,
    GradRowProblem,
    GradStridedProblem,
    GradTuning,
    _cached_blocks_per_multiprocessor,
    grad_slots,
    grad_vector_width,
    plan_backward,
    plan_backward_from_input,
    plan_split_passes,
    plan_strided_passes,
    whole_rows,
)

WARPS = V.WARP_SIZES
NUMPY_DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
                "bfloat16": ml_dtypes.bfloat16}


def forward_output(rng, shape, axis: int, op: str, dtype: str, scale: float = 3.0) -> np.ndarray:
    """y = softmax / log_softmax of random values (float64, rounded to dtype)."""
    x = rng.standard_normal(shape) * scale
    y = ps.reference.softmax(x, axis) if op == "softmax" else ps.reference.log_softmax(x, axis)
    return y.astype(NUMPY_DTYPES[dtype])


def assert_gradient(got, dy, y, axis, op, what=""):
    ref = gradient_reference(np.asarray(dy), np.asarray(y), axis, op)
    bad = _tolerance.outside(np.asarray(got), ref)
    bound = _tolerance.describe(np.asarray(got).dtype.name)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} outside {bound}, "
                           f"e.g. got {np.asarray(got)[bad][:3]} want {ref[bad][:3]}")


# ---- the emulated kernels ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def library() -> EmulationLibrary:
    return _library_or_skip()


@pytest.fixture(params=WARPS, ids=lambda w: f"warp{w}")
def runtime(request, library) -> EmulatedRuntime:
    return EmulatedRuntime(library, request.param)


#: shapes that take every row regime on the emulated profile (4 multiprocessors, 256 threads a
#: block): groups of lanes, a warp a row, a block a row, the on-chip split (a few long rows too), two passes
ROW_SHAPES = [(40, 1), (40, 3), (33, 32), (9, 130), (5, 1000), (7, 3000), (3, 6000), (3, 12000), (1, 20000),
              (2, 100000)]


def row_regimes(dtype: str) -> set[str]:
    """The tiers ROW_SHAPES take: rows of 130 columns go staged, and 16-bit rows of 3 packed, where
    their kernels are built."""
    staged = {"staged"} if V.DTYPES[dtype][2] in V.GRAD_STAGED_ITEMSIZES else set()
    packed = {"packed"} if 3 in V.grad_packed_cols(dtype) else set()  # rows of 3 columns
    return {"warp", "block", "cached", "split"} | staged | packed


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_every_row_regime_matches_the_reference(runtime, rng, dtype, op):
    tiers = set()
    for rows, cols in ROW_SHAPES:
        y = forward_output(rng, (rows, cols), 1, op, dtype)
        dy = rng.standard_normal((rows, cols)).astype(y.dtype)
        the_plan = plan_backward(GradRowProblem(dtype, op, rows, cols), runtime.profile(0))
        tiers.add(the_plan.tier)
        got = runtime.run_backward(dy, y, the_plan)
        assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} {the_plan.launches[0].kernel}")
    assert tiers == row_regimes(dtype)


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
@pytest.mark.parametrize("rows_a_round", [1, 2, 3])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_the_on_chip_split_takes_rows_in_rounds(runtime, rng, dtype, rows_a_round, rows):
    """A grid of fewer blocks than the rows' chunks: each block takes rows in rounds and leaves the
    scratch zero for the next launch."""
    cols = 3 * V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS * V.vector_widths(dtype)[1] - 5  # 3 chunks, a partial last
    tuning = GradTuning(few_rows_fraction=0)  # every row past a warp's on chip
    for op in ("softmax", "log_softmax"):
        the_plan = plan_backward(GradRowProblem(dtype, op, rows, cols), runtime.profile(0), tuning)
        assert the_plan.tier == "cached", the_plan
        chunks = the_plan.notes["chunks"]
        launch = replace(the_plan.launches[0], grid=chunks * rows_a_round)
        y = forward_output(rng, (rows, cols), 1, op, dtype)
        dy = rng.standard_normal((rows, cols)).astype(y.dtype)
        got = runtime.run_backward(dy, y, replace(the_plan, launches=(launch,)))
        assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} {rows_a_round} rows a round")


@pytest.mark.parametrize("into", ["dy", "y"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_every_row_regime_writes_over_dy_or_y(runtime, rng, dtype, into):
    """out= dy or out= y: every kernel reads a value before it writes its place, in every regime."""
    tiers = set()
    for rows, cols in ROW_SHAPES:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            the_plan = plan_backward(GradRowProblem(dtype, op, rows, cols), runtime.profile(0))
            tiers.add(the_plan.tier)
            got = runtime.run_backward(dy, y, the_plan, into=into)
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} over {into} {the_plan.launches[0].kernel}")
    assert tiers == row_regimes(dtype)


@pytest.fixture(scope="module")
def async_library() -> EmulationLibrary:
    return _library_or_skip(SRC_CUDA, tuple(V.DTYPES), ("PS_EMULATE_ASYNC_COPY",))


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_the_on_chip_split_copies_the_next_row_ahead(async_library, rng, dtype, offset):
    """Where copies are asynchronous (NVIDIA sm_80 and newer), a block copies its next row to shared
    memory while it finishes the current one: in the emulation those copies land only at the wait, so
    a row read before its copies arrive fails. Rows in rounds of one and two, whole rows and rows
    with a partial head (the partial slots loaded directly)."""
    runtime = EmulatedRuntime(async_library, 32)
    cols = 3 * V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS * V.vector_widths(dtype)[1] - 5
    tuning = GradTuning(few_rows_fraction=0)
    for rows, rows_a_round in [(5, 1), (7, 2)]:
        for op in ("softmax", "log_softmax"):
            problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3)
            the_plan = plan_backward(problem, runtime.profile(0), tuning)
            assert the_plan.tier == "cached", the_plan
            launch = replace(the_plan.launches[0], grid=the_plan.notes["chunks"] * rows_a_round)
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            got = runtime.run_backward(dy, y, replace(the_plan, launches=(launch,)), (offset,) * 3)
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} offset {offset} {rows_a_round} a round")
            for into in ("dy", "y"):  # the next row's copies, issued before this row's stores, read it unchanged
                got = runtime.run_backward(dy, y, replace(the_plan, launches=(launch,)), (offset,) * 3, into=into)
                assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} offset {offset} over {into}")


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_rows_past_one_chunk_a_multiprocessor_take_several_on_chip(async_library, rng, dtype, offset):
    """Where copies are asynchronous, rows of more on-chip chunks than multiprocessors (6 on the
    emulated 4) stay on chip where two rows fill most of a round of resident blocks
    (cached_spanning_rows; the two passes without it): rows in rounds of two and of three, whole
    rows and rows with a partial head, into fresh outputs and over dy."""
    # an sm_90-like multiprocessor (the staged copies of four blocks need its shared memory)
    runtime = EmulatedRuntime(async_library, 32, arch="sm_90", vendor="nvidia", shared_mem_per_multiprocessor=233472)
    device = runtime.profile(0)
    cols = 6 * V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS * V.vector_widths(dtype)[1] - 5
    for rows, rows_a_round in [(5, 2), (5, 3)]:
        for op in ("softmax", "log_softmax"):
            problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3)
            the_plan = plan_backward(problem, device)
            assert the_plan.tier == "cached" and the_plan.notes["chunks"] > device.multiprocessors, the_plan
            without = plan_backward(problem, device, replace(DEFAULT_GRAD_TUNING, cached_spanning_rows=False))
            assert without.tier == "split", without
            launch = replace(the_plan.launches[0], grid=the_plan.notes["chunks"] * rows_a_round)
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            dy[1, cols // 2] = np.nan
            for into in (None, "dy"):
                got = runtime.run_backward(dy, y, replace(the_plan, launches=(launch,)), (offset,) * 3, into=into)
                assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} offset {offset} {rows_a_round} a round")


@pytest.mark.parametrize("offsets", [(1, 1, 1), (1, 2, 3), (0, 0, 1)])
def test_misaligned_rows_take_partial_slots_or_scalars(runtime, rng, offsets):
    """The same offset on all three arrays takes vector slots with a partial head; different offsets
    take the scalar kernels."""
    for rows, cols in [(40, 3), (9, 130), (5, 1000), (7, 3000), (3, 12000), (2, 100000)]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, "float32")
            dy = rng.standard_normal((rows, cols)).astype(np.float32)
            problem = GradRowProblem("float32", op, rows, cols, misaligns=offsets)
            the_plan = plan_backward(problem, runtime.profile(0))
            if len(set(offsets)) > 1:
                assert the_plan.notes["vec"] == 1
            got = runtime.run_backward(dy, y, the_plan, offsets)
            assert_gradient(got, dy, y, 1, op, f"{rows}x{cols} {offsets} {the_plan.launches[0].kernel}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_rows_of_whole_slots_and_the_same_kernels_on_partial_ones(runtime, rng, dtype):
    """16-bit rows of whole 16-byte slots take the kernels' path without a test a slot (a warp of 2
    slots a lane, blocks of 2 and 4); the same kernel on rows a vector shorter that start 3 elements
    off a vector (a partial head and tail) takes the tested path; a misaligned view of whole-length
    rows takes the layouts of partial slots (up to 8 slots a lane in a warp)."""
    layouts = set()
    for rows, cols in [(33, 512), (9, 1024), (7, 2048), (5, 4096), (9, 1000)]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            whole = plan_backward(GradRowProblem(dtype, op, rows, cols), runtime.profile(0))
            assert whole.tier in ("warp", "block") and whole.notes["vec"] == 8
            assert whole.notes["slots"] <= 2 or whole.notes["lanes"] > runtime.profile(0).warp_size
            layouts.add((whole.notes["lanes"], whole.notes["slots"]))
            got = runtime.run_backward(dy, y, whole)
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} {whole.launches[0].kernel}")
            # the same kernel (it holds the row) on rows of cols - 8 whose slots are partial at both ends
            short = plan_backward(GradRowProblem(dtype, op, rows, cols - 8, misaligns=(3, 3, 3)), runtime.profile(0))
            launch = replace(whole.launches[0], args=short.launches[0].args)
            got = runtime.run_backward(dy[:, 8:], y[:, 8:], replace(short, launches=(launch,)), (3, 3, 3))
            assert_gradient(got, dy[:, 8:], y[:, 8:], 1, op, f"{dtype} {rows}x{cols - 8} +3 {launch.kernel}")
            misaligned = plan_backward(GradRowProblem(dtype, op, rows, cols, misaligns=(1, 1, 1)), runtime.profile(0))
            got = runtime.run_backward(dy, y, misaligned, (1, 1, 1))
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} +1 {misaligned.launches[0].kernel}")
    assert len(layouts) >= 3


@pytest.mark.parametrize("vec, lanes, slots", [(8, 16, 1), (8, "warp", 4), (8, 128, 4), (8, 128, 2), (4, 8, 2)])
def test_16_bit_rows_take_the_elements_of_their_partial_slots_one_a_lane(runtime, rng, vec, lanes, slots):
    """Groups of 16-byte slots with at least 2 (vec - 1) lanes, and blocks of 4 slots a thread, take
    a row's full slots whole and the elements of its partial slots one a lane (blocks of 2 slots and
    narrow slots test each slot): rows starting at every offset in a vector, of every length up to
    the group's, including rows inside one vector and rows of no full slot, in a padded stride."""
    dtype = "bfloat16"
    stride = 4 * vec
    lanes = runtime.profile(0).warp_size if lanes == "warp" else lanes
    for op in ("softmax", "log_softmax"):
        for offset in range(vec):
            for cols in sorted({1, 2, vec - 1, vec, vec + 1, 2 * vec - 1, 2 * vec + 3, 3 * vec + 1}):
                if offset + cols > lanes * slots * vec:
                    continue
                y = forward_output(rng, (9, stride), 1, op, dtype)
                dy = rng.standard_normal((9, stride)).astype(y.dtype)
                problem = GradRowProblem(dtype, op, 9, cols, strides=(stride,) * 3, misaligns=(offset,) * 3)
                the_plan = plan_backward(problem, runtime.profile(0))
                kernel = V.grad_rows_name(dtype, op, runtime.profile(0).warp_size, lanes, slots, vec)
                threads = lanes if lanes > runtime.profile(0).warp_size else V.GRAD_ROWS_THREADS
                launch = replace(the_plan.launches[0], kernel=kernel, grid=-(-9 // max(1, threads // lanes)),
                                 block=threads)
                got = runtime.run_backward(dy, y, replace(the_plan, launches=(launch,)), (offset,) * 3)
                assert_gradient(got[:, :cols], dy[:, :cols], y[:, :cols], 1, op,
                                f"{cols} columns at offset {offset} {kernel}")


#: contiguous rows of partial 16-byte vectors that the staged gradient takes: a thread a row, and
#: (past GradTuning.staged_thread_max_row_bytes) a group of lanes a row
STAGED_SHAPES = [(400, 3), (300, 5), (130, 7), (41, 77), (37, 130), (9, 197), (5, 250), (3, 287)]


def rows_with_nan_and_empty(rng, rows: int, cols: int, op: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(dy, y) with a NaN of dy in row 0, a NaN of y in the last row, and the middle row a safe
    forward's row of all -inf (log_softmax -inf, softmax 0)."""
    y = forward_output(rng, (rows, cols), 1, op, dtype)
    dy = rng.standard_normal((rows, cols)).astype(y.dtype)
    dy[0, cols // 2] = np.nan
    y[rows - 1, cols - 1] = np.nan
    y[rows // 2] = -np.inf if op == "log_softmax" else 0.0
    return dy, y


def assert_nan_and_empty_rows_into_each(runtime, dy, y, the_plan, offset: int, op: str, what: str) -> None:
    """The plan's dx into a fresh array, over dy and over y: within the reference, rows 0 and -1 NaN,
    the middle row 0."""
    rows = dy.shape[0]
    for into in (None, "dy", "y"):
        got = runtime.run_backward(dy, y, the_plan, (offset,) * 3, into)
        assert_gradient(got, dy, y, 1, op, f"{what} over {into}")
        assert np.isnan(got[[0, rows - 1]]).all() and (got[rows // 2] == 0).all(), what


@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_short_rows_staged_through_shared_memory(runtime, rng, dtype, offset):
    """Every staged gradient kernel (a thread a row, each group of lanes) on rows starting at an offset
    in a vector, over several tiles in a grid of fewer blocks than tiles (a block takes tiles in turn),
    with out= dy and out= y; a NaN of dy or y makes its row NaN, and a safe log_softmax's row of all
    -inf (a softmax's row of zeros) gets 0."""
    itemsize = V.DTYPES[dtype][2]
    if itemsize not in V.GRAD_STAGED_ITEMSIZES:
        pytest.skip(f"no staged gradient kernels are built for {itemsize}-byte elements")
    for lanes in V.GRAD_STAGED_LANES:
        tuning = GradTuning(staged_group_lanes=lanes, staged_thread_max_row_bytes=1 << 20 if lanes == 1 else 0,
                            staged_bytes_per_thread=32)
        for rows, cols in STAGED_SHAPES:
            if (cols * itemsize % 16 == 0 or cols * itemsize > tuning.staged_max_row_bytes
                    or cols < tuning.staged_min_cols[itemsize]):
                continue
            for op in ("softmax", "log_softmax"):
                dy, y = rows_with_nan_and_empty(rng, rows, cols, op, dtype)
                problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3, safe=True)
                the_plan = plan_backward(problem, runtime.profile(0), tuning)
                assert the_plan.tier == "staged" and the_plan.notes["lanes"] == lanes, the_plan
                tiles = -(-rows // the_plan.notes["tile_rows"])
                for interleave in (0, 1) if lanes > 1 else (0,):  # the groups' rows in order, or interleaved
                    args = tuple((planner.I32, interleave) if i == 6 else a
                                 for i, a in enumerate(the_plan.launches[0].args))
                    launch = replace(the_plan.launches[0], grid=max(1, tiles // 2), args=args)
                    what = f"{rows}x{cols} +{offset} {launch.kernel} interleave {interleave}, {tiles} tiles"
                    assert_nan_and_empty_rows_into_each(runtime, dy, y, replace(the_plan, launches=(launch,)),
                                                        offset, op, what)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rows_of_a_few_columns_packed_in_threads(runtime, rng, dtype):
    """Every packed gradient kernel (whole rows inside a thread's vectors) on rows starting at each
    offset that keeps a vector's rows whole, over a grid of fewer blocks than the groups need (a block
    takes rounds), with out= dy and out= y; a NaN of dy or y makes its row NaN, and a safe log_softmax's
    row of all -inf (a softmax's row of zeros) gets 0."""
    vec = V.vector_widths(dtype)[1]
    for cols in V.grad_packed_cols(dtype):
        for offset in range(0, vec, cols):
            for rows in (7, 20001):
                for op in ("softmax", "log_softmax"):
                    dy, y = rows_with_nan_and_empty(rng, rows, cols, op, dtype)
                    problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3, safe=True)
                    the_plan = plan_backward(problem, runtime.profile(0))
                    assert the_plan.tier == "packed", the_plan
                    launch = replace(the_plan.launches[0], grid=max(1, the_plan.launches[0].grid // 3))
                    what = f"{rows}x{cols} +{offset} {launch.kernel}, grid {launch.grid}"
                    assert_nan_and_empty_rows_into_each(runtime, dy, y, replace(the_plan, launches=(launch,)),
                                                        offset, op, what)
        # an offset that splits a row across vectors takes a group of lanes a row
        problem = GradRowProblem(dtype, "softmax", 9, cols, misaligns=(1,) * 3)
        assert plan_backward(problem, runtime.profile(0)).tier != "packed"


@pytest.mark.parametrize("offsets", [(0, 0, 0), (1, 1, 1), (3, 3, 3)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_rows_of_an_unaligned_stride_take_narrow_vectors(runtime, rng, dtype, offsets):
    """Rows whose stride is 4 or 8 bytes past 16 take 4- or 2-element vectors, every row starting
    at the same offset in them (a partial head where the base is misaligned), in groups and warps
    (contiguous rows here, planned without the staged rows that would take them)."""
    widths = set()
    unstaged = GradTuning(staged_itemsizes=())
    for rows, cols in [(9, 36), (9, 100), (9, 90), (5, 196), (5, 250), (3, 300)]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            problem = GradRowProblem(dtype, op, rows, cols, misaligns=offsets)
            the_plan = plan_backward(problem, runtime.profile(0), unstaged)
            widths.add(the_plan.notes["vec"])
            got = runtime.run_backward(dy, y, the_plan, offsets)
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} {offsets} {the_plan.launches[0].kernel}")
    assert {2, 4} <= widths


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_axes_match_the_reference(runtime, rng, dtype):
    for shape, axis in [((3, 50, 7), 1), ((200, 33), 0), ((2, 1000, 40), 1), ((5, 4, 3, 2), 2)]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, shape, axis, op, dtype)
            dy = rng.standard_normal(shape).astype(y.dtype)
            with ps.use_backend(f"emu{runtime.profile(0).warp_size}"):
                got = ps.softmax_backward(dy, y, axis) if op == "softmax" else ps.log_softmax_backward(dy, y, axis)
            assert_gradient(got, dy, y, axis, op, f"{dtype} {shape} axis {axis}")


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_every_strided_regime_vector_width_and_line_count(runtime, rng, dtype):
    """Short strided axes, a thread per line of positions, at every vector width and lines a thread
    (the forward's strided_thread), and longer axes in column groups: against the float64
    reference, also written over dy and over y, with a NaN position, a NaN y, and a safe
    position of all -inf (log_softmax; zeros for softmax) whose gradient is 0."""
    kernels = set()
    shapes = [(3, cols, 3 * vec) for vec in V.strided_thread_widths(dtype) for cols in (2, 4, 50)]
    for outer, cols, inner in shapes + [(2, 300, 64), (2, 1000, 40), (3, 70, 33)]:
        strides = (cols * inner, inner, 1)
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (outer, cols, inner), 1, op, dtype)
            dy = rng.standard_normal((outer, cols, inner)).astype(y.dtype)
            dy[0, cols // 2, 0] = np.nan
            y[1, cols - 1, inner - 1] = np.nan
            y[outer - 1, :, inner // 2] = -np.inf if op == "log_softmax" else 0.0
            problem = GradStridedProblem(dtype, op, outer, cols, inner, strides, strides, strides, safe=True)
            the_plan = plan_backward(problem, runtime.profile(0))
            kernels.add(the_plan.launches[0].kernel)
            for into in (None, "dy", "y"):
                got = runtime.run_backward(dy, y, the_plan, into=into)
                what = f"{dtype} {(outer, cols, inner)} {the_plan.launches[0].kernel} over {into}"
                assert_gradient(got, dy, y, 1, op, what)
                assert np.isnan(got[0, :, 0].astype(np.float64)).all() and np.isnan(
                    got[1, :, inner - 1].astype(np.float64)).all(), what
                assert (got[outer - 1, :, inner // 2] == 0).all(), what
    assert kernels == {V.grad_strided_name(dtype, op) for op in ("softmax", "log_softmax")} | {
        V.grad_strided_thread_name(dtype, op, vec, lines)
        for vec, lines in V.strided_thread_variants(dtype) for op in ("softmax", "log_softmax")}


@pytest.fixture
def async_planner(monkeypatch):
    """The planners as they run on NVIDIA sm_80 and newer (asynchronous copies), for this test only."""
    monkeypatch.setattr(planner, "has_async_copy", lambda device: True)
    planner.plan.cache_clear()
    plan_backward.cache_clear()
    yield
    planner.plan.cache_clear()
    plan_backward.cache_clear()


@pytest.mark.parametrize("dtype", [d for d in NUMPY_DTYPES if V.DTYPES[d][2] in V.GRAD_STRIDED_CACHED_ITEMSIZES])
@pytest.mark.parametrize("copies", ["sync", "async"])
def test_strided_axis_cached_on_chip(request, async_planner, rng, dtype, copies):
    """The on-chip strided regime (chunks of a tile's dy and y on co-resident blocks, the forward's
    strided_cached), at warp 32 on a device with the shared memory of an sm_80 part, built with and
    without asynchronous copies: a thread a position and a vector of them (inner positions that all
    start aligned, or not), the fewest rows that take the regime and many more (more chunks than a
    block's threads a position, whose sums merge in slices); dx also written over dy and over y,
    with a NaN dy, a NaN y, and a safe position of all -inf (zeros for softmax) whose gradient is 0."""
    library = request.getfixturevalue("library" if copies == "sync" else "async_library")
    runtime = EmulatedRuntime(library, 32, shared_mem_per_block=48 * 1024, shared_mem_per_block_optin=48 * 1024,
                              shared_mem_per_multiprocessor=192 * 1024, multiprocessors=32)
    device = runtime.profile(0)

    def problem(op, outer, cols, inner):
        strides = (cols * inner, inner, 1)
        return GradStridedProblem(dtype, op, outer, cols, inner, strides, strides, strides, safe=True)

    widths, many_chunks = set(), False
    for inner in (128, 129):
        cols = 8
        while plan_backward(problem("softmax", 2, cols, inner), device).tier != "strided_cached":
            cols += max(1, cols // 16)
            assert cols <= 1 << 12, f"{dtype}: no axis over {inner} positions takes the on-chip regime"
        for outer, n, positions in ((2, cols, inner), (1, 8 * cols, inner // 4 + inner % 2)):
            for op in ("softmax", "log_softmax"):
                the_plan = plan_backward(problem(op, outer, n, positions), device)
                assert the_plan.tier == "strided_cached", (n, positions, the_plan.tier)
                notes = the_plan.notes
                widths.add(notes["vec"])
                many_chunks |= notes["chunks"] > 256 // (notes["inner_tile"] * notes["vec"])
                y = forward_output(rng, (outer, n, positions), 1, op, dtype)
                dy = rng.standard_normal((outer, n, positions)).astype(y.dtype)
                dy[0, n // 2, 0] = np.nan
                y[outer - 1, n - 1, positions - 1] = np.nan
                y[0, :, positions // 2] = -np.inf if op == "log_softmax" else 0.0
                for into in (None, "dy", "y"):
                    got = runtime.run_backward(dy, y, the_plan, into=into)
                    what = f"{dtype} {(outer, n, positions)} {the_plan.launches[0].kernel} {notes} over {into}"
                    assert_gradient(got, dy, y, 1, op, what)
                    assert np.isnan(got[0, :, 0].astype(np.float64)).all() and np.isnan(
                        got[outer - 1, :, positions - 1].astype(np.float64)).all(), what
                    assert (got[0, :, positions // 2] == 0).all(), what
    assert widths == {1, V.strided_vector_widths(dtype)[1]} and many_chunks, (widths, many_chunks)


def test_nan_and_empty_rows(runtime, rng):
    """NaN in dy or y makes its row NaN; a log_softmax row of all -inf (a safe forward's) gets 0; a
    softmax row of zeros (its safe twin) gets 0. Every regime."""
    for rows, cols in ROW_SHAPES[2:]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, "float32")
            dy = rng.standard_normal((rows, cols)).astype(np.float32)
            if rows >= 3:
                dy[0, cols // 2] = np.nan
                y[1, cols - 1] = np.nan
                y[2] = -np.inf if op == "log_softmax" else 0.0
            else:
                y[0] = -np.inf if op == "log_softmax" else 0.0
            the_plan = plan_backward(GradRowProblem("float32", op, rows, cols, safe=True), runtime.profile(0))
            got = runtime.run_backward(dy, y, the_plan)
            assert_gradient(got, dy, y, 1, op, f"{rows}x{cols} {the_plan.tier}")
            if rows >= 3:
                assert np.isnan(got[:2]).all() and (got[2] == 0).all()
            else:
                assert (got[0] == 0).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_nan_of_y_anywhere_in_a_row_makes_it_nan_without_safe(runtime, rng, dtype):
    """Without safe=True too, a NaN of y at any column (any lane's slot, an edge element of a
    partial slot) makes its whole row NaN, in every regime."""
    for rows, cols in ROW_SHAPES[2:]:
        for op in ("softmax", "log_softmax"):
            y = forward_output(rng, (rows, cols), 1, op, dtype)
            dy = rng.standard_normal((rows, cols)).astype(y.dtype)
            at = sorted({0, 1, cols // 3, cols - 2, cols - 1})
            nan_rows = [r % rows for r in range(len(at))]
            for r, c in zip(nan_rows, at):
                y[r, c] = np.nan
            the_plan = plan_backward(GradRowProblem(dtype, op, rows, cols), runtime.profile(0))
            got = runtime.run_backward(dy, y, the_plan)
            assert np.isnan(got[sorted(set(nan_rows))]).all(), f"{dtype} {rows}x{cols} {the_plan.launches[0].kernel}"
            assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols} {the_plan.launches[0].kernel}")


# ---- the gradient from the forward's input x ----------------------------------------------------------
def gradient_from_input_reference(dy: np.ndarray, x: np.ndarray, op: str, safe: bool = False) -> np.ndarray:
    """float64 dx from dy and x along the last axis (y = softmax / log_softmax of x in float64)."""
    w = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        y = ps.reference.softmax(w, 1) if op == "softmax" else ps.reference.log_softmax(w, 1)
    empty = np.isneginf(w).all(axis=1, keepdims=True)
    if safe:  # the forward's safe rows: 0 (softmax), -inf (log_softmax: its Finish's constant row)
        y = np.where(empty, 0.0 if op == "softmax" else -np.inf, y)
    dx = gradient_reference(dy, y, 1, op)
    return np.where(empty & ~np.isnan(w).any(axis=1, keepdims=True), 0.0 if safe else np.nan, dx)


def run_from_input(runtime, dy, x, the_plan, offsets=(0, 0, 0)):
    return runtime._run(the_plan, {"dy": (dy, offsets[0]), "x": (x, offsets[1])}, ("dx", offsets[2]))


#: rows the rows regime takes (groups of lanes of every slot width, a warp, a block), and rows it does not
FROM_INPUT_SHAPES = [(40, 3), (40, 8), (33, 32), (9, 130), (6, 512), (5, 1000), (4, 2048), (7, 3000), (3, 6000),
                     (40, 1)]


#: rows the split takes: on chip in a few chunks (some of them partly empty; 16-bit rows of partial
#: slots among them), and in two passes
FROM_INPUT_SPLIT_SHAPES = [(5, 12000), (8, 9001), (3, 6001), (3, 6000), (2, 100000)]


def from_input_is_built(problem: GradRowProblem, tier: str) -> bool:
    """Whether a gradient from x is built for the rows of ``problem`` (V.grad_from_input_shapes,
    V.grad_cached_from_input_built): rows held in registers one row a step, 16-bit ones only where
    every row holds whole 16-byte slots, or on chip by the split's blocks."""
    if tier not in ("warp", "block", "cached") or (problem.cols == 1 and problem.dtype == "float32"):
        return False
    return tier == "cached" or V.DTYPES[problem.dtype][2] != 2 or whole_rows(problem, 8)


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_gradient_from_input_matches_the_reference(runtime, rng, dtype, op, offset):
    """dx from dy and x in one read of each (the row's max and sums from the held x, then the gradient
    as from y), in every shape of the rows regime and the on-chip split; None where it takes no row
    a step (the two-pass split, and float32 rows of one column, whose groups take several rows a
    step) and for 16-bit rows held in registers other than whole ones in 16-byte slots."""
    tiers = set()
    for rows, cols in [*FROM_INPUT_SHAPES, *FROM_INPUT_SPLIT_SHAPES]:
        problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3)
        the_plan = plan_backward_from_input(problem, runtime.profile(0))
        # the register regimes' tier (the staged rows, which hold no row of x, aside)
        tier = plan_backward(problem, runtime.profile(0), GradTuning(staged_itemsizes=())).tier
        assert (the_plan is not None) == from_input_is_built(problem, tier), (problem, tier)
        if the_plan is None:
            continue
        tiers.add(the_plan.tier)
        kind = "cached" if the_plan.tier == "cached" else "rows"
        assert the_plan.launches[0].kernel.startswith(f"ps_bwd_from_input_{kind}_"), the_plan
        x = (rng.standard_normal((rows, cols)) * 3).astype(NUMPY_DTYPES[dtype])
        dy = rng.standard_normal((rows, cols)).astype(x.dtype)
        got = run_from_input(runtime, dy, x, the_plan, (offset,) * 3)
        ref = gradient_from_input_reference(dy, x, op)
        bad = _tolerance.outside(got, ref)
        assert not bad.any(), (f"{dtype} {rows}x{cols} {the_plan.launches[0].kernel}: {int(bad.sum())} outside, "
                               f"e.g. got {got[bad][:3]} want {ref[bad][:3]}")
    assert tiers == ({"warp", "block", "cached"} if V.DTYPES[dtype][2] != 2 or offset == 0 else {"cached"})


#: rows a block a row holds in fewer threads than its shape (a row a little past the shape below),
#: on the emulated profile at warp 32 or 64 (a warp holds some of them at 64, or misaligned): float32
#: and float64 in blocks of 8 slots a thread, 16-bit ones of 4 (up to 1024 threads), and whole 16-bit
#: rows of 2
FITTED_SHAPES = {"float32": [(5, 1100), (3, 4200), (4, 2100)], "float64": [(5, 700), (3, 2100)],
                 "bfloat16": [(5, 2056), (3, 4200), (4, 1032), (2, 16400)],
                 "float16": [(5, 2056), (3, 4200), (4, 1032), (2, 16400)]}


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_capped_fitted_kernels_hold_two_of_their_fewest_warp_blocks(dtype):
    """The register cap of the capped fitted kernels: two blocks of the fewest warps fitted to the
    largest block shape fit a multiprocessor's four register files of 16384 at it, not 8 more; each
    capped entry of the generated source carries it."""
    def warps_held(registers: int) -> int:
        return 4 * (16384 // (32 * registers))

    largest = max(lanes for lanes, _ in V.grad_block_shapes(dtype, V.vector_widths(dtype)[1], False))
    for warp in V.WARP_SIZES:
        registers = V.grad_fitted_max_registers(dtype, warp)
        warps = 2 * (largest // 2 + warp) // 32
        assert warps_held(registers) >= warps > warps_held(registers + 8), (dtype, warp, registers)
    source = (SRC_CUDA / V.source_file_name(dtype)).read_text()
    capped = [line for line in source.splitlines() if "_FITTED_CAPPED_ENTRY(" in line]
    expected = {(op, lanes) for table in (V.GRAD_FITTED_CAPPED, V.GRAD_FROM_INPUT_FITTED_CAPPED)
                for (dt, op), shapes in table.items() if dt == dtype for lanes in shapes}
    assert bool(capped) == bool(expected)
    for line in capped:
        params = [p.strip() for p in line[line.index("(") + 1:line.rindex(")")].split(",")]
        assert (params[2], int(params[5])) in expected, line
        assert int(params[-1]) == V.grad_fitted_max_registers(dtype, int(params[4])), line


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_blocks_a_row_launch_at_the_fewest_warps_that_hold_it(runtime, rng, dtype, op, offset):
    """A block a row's kernel strides by the block's threads: launched at its fitted block (the
    emulation takes it wherever that holds more blocks by threads), from y and from x."""
    launched = []
    for rows, cols in FITTED_SHAPES[dtype]:
        problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3)
        the_plan = plan_backward(problem, runtime.profile(0))
        step = the_plan.launches[0]
        if the_plan.tier != "block":
            assert not step.fitted_block, step
            continue
        if step.fitted_block == step.block:
            continue
        made = planner.resident_launch(step, lambda kernel, block, step=step:
                                       runtime._blocks_per_multiprocessor(step, block))
        assert (made.kernel, made.block, made.grid) == (step.fitted_kernel, step.fitted_block, rows)
        launched.append(made.block)
        y = forward_output(rng, (rows, cols), 1, op, dtype)
        dy = rng.standard_normal((rows, cols)).astype(y.dtype)
        got = runtime._run(the_plan, {"dy": (dy, offset), "y": (y, offset)}, ("dx", offset))
        assert_gradient(got, dy, y, 1, op, f"{dtype} {rows}x{cols}+{offset} {step.kernel} at {made.block} threads")
        from_x = plan_backward_from_input(problem, runtime.profile(0))
        if from_x is None:  # 16-bit rows of partial slots: none built
            assert V.DTYPES[dtype][2] == 2 and not whole_rows(problem, 8)
            continue
        assert from_x.launches[0].fitted_block == step.fitted_block
        assert from_x.launches[0].fitted_kernel == V.fitted_name(from_x.launches[0].kernel)
        x = (rng.standard_normal((rows, cols)) * 3).astype(NUMPY_DTYPES[dtype])
        got = run_from_input(runtime, dy, x, from_x, (offset,) * 3)
        bad = _tolerance.outside(got, gradient_from_input_reference(dy, x, op))
        assert not bad.any(), f"{dtype} {rows}x{cols}+{offset} {from_x.launches[0].kernel}: {int(bad.sum())} outside"
    assert launched, f"no shape of {FITTED_SHAPES[dtype]} took a fitted block"
    assert all(block % runtime.profile(0).warp_size == 0 for block in launched)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_gradient_from_input_of_nan_and_empty_rows(runtime, rng, op, safe, dtype):
    """NaN in x or dy makes its row NaN; a row of x all -inf gets 0 when safe, NaN otherwise; +inf
    in x gives NaN (as the forward does). Groups, a warp and a block a row (whole 16-bit rows: a
    block of 2 slots a thread and of 4), and the on-chip split (16-bit: rows of whole slots and of
    partial ones)."""
    shapes = [(40, 3), (9, 130), (5, 1000), (6, 3000), (8, 9001)] if dtype == "float32" else [
        (40, 8), (9, 136), (5, 1000), (6, 3000), (5, 12000), (5, 9001)]
    for rows, cols in shapes:
        x = (rng.standard_normal((rows, cols)) * 3).astype(NUMPY_DTYPES[dtype])
        dy = rng.standard_normal((rows, cols)).astype(x.dtype)
        x[0, cols // 2] = np.nan
        dy[1, cols - 1] = np.nan
        x[2] = -np.inf
        x[3, 0] = np.inf
        x[4, : cols - 1] = -np.inf  # one value above -inf: y is one-hot, dx from it alone
        the_plan = plan_backward_from_input(GradRowProblem(dtype, op, rows, cols, safe=safe), runtime.profile(0))
        got = run_from_input(runtime, dy, x, the_plan)
        assert np.isnan(got[[0, 1, 3]]).all(), (rows, cols, the_plan.tier)
        assert (got[2] == 0).all() if safe else np.isnan(got[2]).all(), (rows, cols, the_plan.tier)
        ref = gradient_from_input_reference(dy, x, op, safe)
        assert not _tolerance.outside(got[4:], ref[4:]).any(), (rows, cols, the_plan.tier, got[4, -3:], ref[4, -3:])


@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_gradient_from_input_on_chip_copies_the_next_row_ahead(async_library, rng, dtype, offset):
    """The on-chip split's gradient from x where copies are asynchronous: each block's next row of dy
    and x lands in shared memory only at the wait (emulated), in rounds of one and two rows and with
    more chunks a row than multiprocessors; rows with partial end slots (16-bit: at offset 1, whole
    ones at 0)."""
    runtime = EmulatedRuntime(async_library, 32, arch="sm_90", vendor="nvidia", shared_mem_per_multiprocessor=233472)
    vec = V.vector_widths(dtype)[1]
    tuning = GradTuning(few_rows_fraction=0)
    slots_a_chunk = V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS
    for chunks, rows, rows_a_round in [(3, 5, 1), (3, 7, 2), (6, 5, 2)]:
        # a slot short of the chunks (whole 16-bit rows), or room for a partial slot at each end
        cols = chunks * slots_a_chunk * vec - (5 if V.DTYPES[dtype][2] != 2 else 13 if offset else vec)
        for op in ("softmax", "log_softmax"):
            problem = GradRowProblem(dtype, op, rows, cols, misaligns=(offset,) * 3)
            the_plan = plan_backward_from_input(problem, runtime.profile(0), tuning)
            assert the_plan is not None and the_plan.tier == "cached", the_plan
            assert the_plan.notes["chunks"] == chunks, the_plan
            launch = replace(the_plan.launches[0], grid=chunks * rows_a_round)
            x = (rng.standard_normal((rows, cols)) * 3).astype(NUMPY_DTYPES[dtype])
            dy = rng.standard_normal((rows, cols)).astype(x.dtype)
            x[1, cols // 2] = np.nan
            got = run_from_input(runtime, dy, x, replace(the_plan, launches=(launch,)), (offset,) * 3)
            ref = gradient_from_input_reference(dy, x, op)
            bad = _tolerance.outside(got, ref)
            assert not bad.any(), f"{dtype} {rows}x{cols} {op} {rows_a_round} a round: {int(bad.sum())} outside"


def long_rows_with_a_cancelling_element(rng, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """log_softmax outputs with one probability of 1/2 a row, and dy of +-10 (summing to a few
    units) whose element at that place nearly cancels exp(y) * sum(dy): dx there is about 0.005."""
    x = rng.standard_normal((rows, cols))
    k = cols // 3
    x[:, k] = 0.0
    x[:, k] = np.log(np.exp(x).sum(axis=1) - 1.0)  # exp(x_k) = the rest's sum: p_k = 1/2
    y = ps.reference.log_softmax(x, 1).astype(np.float32)
    signs = np.resize([10.0, -10.0], cols)
    dy = np.stack([rng.permutation(signs) for _ in range(rows)]) + 0.01 * rng.standard_normal((rows, cols))
    p_k = np.exp(y[:, k].astype(np.float64))
    rest = dy.sum(axis=1) - dy[:, k]
    dy[:, k] = (p_k * rest + 0.01) / (1.0 - p_k)  # dx_k = dy_k - p_k * sum(dy) = 0.01 (1 - p_k)
    return y, dy.astype(np.float32)


def test_log_softmax_gradients_take_a_long_rows_sum_exactly(runtime, rng):
    """sum(dy) in double, a term at a time: terms of +-10 a slot round in float32 (about 1e-6 a slot),
    and where exp(y) * sum(dy) cancels dy, such errors over thousands of slots would be all of dx.
    Every row regime that holds vector slots."""
    for rows, cols in [(5, 1000), (7, 3000), (3, 12000), (1, 20000), (2, 100000)]:
        y, dy = long_rows_with_a_cancelling_element(rng, rows, cols)
        the_plan = plan_backward(GradRowProblem("float32", "log_softmax", rows, cols), runtime.profile(0))
        assert the_plan.notes["vec"] > 1, the_plan
        got = runtime.run_backward(dy, y, the_plan)
        assert_gradient(got, dy, y, 1, "log_softmax", f"{rows}x{cols} {the_plan.tier}")
        ref = gradient_reference(dy, y, 1, "log_softmax")
        assert np.abs(ref[:, cols // 3]).max() < 0.02  # the cancelling element: small beside dy


#: a 32-lane assumption in the reductions the gradient kernels use: harmless at warp 32, caught at 64
MUTATIONS = {
    "butterfly stops at xor 16": ("softmax.cuh", "for (int offset = width / 2; offset > 0; offset /= 2)",
                                  "for (int offset = (width > 32 ? 32 : width) / 2; offset > 0; offset /= 2)"),
    "lane = thread & 31": ("backward.cuh", "const int lane = PS_THREAD_X % WARP, warp",
                           "const int lane = PS_THREAD_X & 31, warp"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_32_lane_assumption_fails_at_warp_64_only(tmp_path, rng, mutation):
    header_name, anchor, replacement = MUTATIONS[mutation]
    src = tmp_path / "src_cuda"
    shutil.copytree(SRC_CUDA, src)
    header = src / header_name
    text = header.read_text()
    assert anchor in text, f"mutation anchor no longer in {header_name}: {anchor!r}"
    header.write_text(text.replace(anchor, replacement))
    mutant = _library_or_skip(src, ("float32",))
    wrong = {}
    for warp in WARPS:
        runtime = EmulatedRuntime(mutant, warp)
        wrong[warp] = []
        for rows, cols in [(9, 130), (5, 1000), (7, 3000), (3, 12000)]:
            y = forward_output(rng, (rows, cols), 1, "softmax", "float32")
            dy = rng.standard_normal((rows, cols)).astype(np.float32)
            problem = GradRowProblem("float32", "softmax", rows, cols)
            the_plan = plan_backward(problem, runtime.profile(0))
            got = runtime.run_backward(dy, y, the_plan)
            if _tolerance.outside(got, gradient_reference(dy, y, 1, "softmax")).any():
                wrong[warp].append(f"{rows}x{cols} {the_plan.tier}")
            from_input = plan_backward_from_input(problem, runtime.profile(0))
            if from_input is not None:  # the gradient from x: its max and sums cross the lanes too
                x = rng.standard_normal((rows, cols)).astype(np.float32)
                got = run_from_input(runtime, dy, x, from_input)
                if _tolerance.outside(got, gradient_from_input_reference(dy, x, "softmax")).any():
                    wrong[warp].append(f"{rows}x{cols} {from_input.tier} from x")
    assert not wrong[32], f"mutation {mutation!r} should be harmless at warp 32, yet broke {wrong[32]}"
    assert wrong[64], f"mutation {mutation!r} went unnoticed at warp 64"
    assert any(w.endswith("from x") for w in wrong[64]), f"mutation {mutation!r} left the gradient from x right"
    assert any(w.endswith("cached from x") for w in wrong[64]), f"mutation {mutation!r} left the on-chip split's"


# ---- the planner --------------------------------------------------------------------------------------
PROFILES = {
    "h100": DeviceProfile.h100(),
    "mi300x": DeviceProfile.mi300x(),
    "rdna3": DeviceProfile("AMD Radeon RX 7900 XTX", "amd", "gfx1100", 32, 48, 1024, 64 * 1024, 64 * 1024),
}
BUILT_PROFILES = {"cuda": [PROFILES["h100"]], "hip": [PROFILES["mi300x"], PROFILES["rdna3"]]}


def _witness_problems(dtype: str):
    widest = V.vector_widths(dtype)[1]
    narrow = {36, 50, 60, 90, 100, 126, 130, 196, 250, 254}  # 16-bit strides 4 or 8 bytes past 16
    all_cols = sorted({c for k in range(21) for c in (1 << k, (1 << k) + 1, 3 << k)} | narrow | {10**7})
    for op in ("softmax", "log_softmax"):
        for rows in (1, 3, 4096):
            for cols in all_cols:
                if rows * cols > 10**8:
                    continue
                for misaligns in ((0, 0, 0), (1, 1, 1), (0, 1, 0)):
                    yield GradRowProblem(dtype, op, rows, cols, misaligns=tuple(m % widest for m in misaligns))
        yield GradRowProblem(dtype, op, 1024, 24576)  # rows that the largest blocks a row hold, whole
        for cols in (32, 50, 60, 100, 128, 250, 256):  # rows padded to a stride 4 or 8 bytes past 16
            for pad in (2, 4):
                yield GradRowProblem(dtype, op, 4096, cols, strides=(cols + pad,) * 3)
        yield GradStridedProblem(dtype, op, 4, 100, 30, (3000, 30, 1), (3000, 30, 1), (3000, 30, 1))
        for inner in (1024, 1023, 64, 63):  # long axes, their tiles on chip, aligned and not
            strides = (4096 * inner, inner, 1)
            yield GradStridedProblem(dtype, op, 2, 4096, inner, strides, strides, strides)
        for vec in V.strided_thread_widths(dtype):  # short axes over 3 * vec inner positions
            for cols in (2, 4, 50):
                strides = (cols * 3 * vec, 3 * vec, 1)
                yield GradStridedProblem(dtype, op, 4, cols, 3 * vec, strides, strides, strides)


@pytest.mark.parametrize("backend", BUILT_PROFILES)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_built_gradient_kernels_are_the_plannable_ones(backend, dtype):
    """Every gradient kernel a backend's build carries (from y, and from x; a block a row's fitted
    ones too) is planned for some shape on one of its profiles, and every plan names one it carries."""
    built = V.backward_catalogue(dtype, backend)
    planned = set()
    for device in BUILT_PROFILES[backend]:
        for problem in _witness_problems(dtype):
            plans = [plan_backward(problem, device)]
            if isinstance(problem, GradRowProblem):  # dx from x, where a row is held in registers, and
                plans.append(plan_backward_from_input(problem, device))  # the passes apart (a sharded axis)
                plans.append(plan_split_passes(problem, device))
            else:  # and its passes apart (an axis sharded across ranks)
                plans.append(plan_strided_passes(problem, device))
            launches = [launch for p in plans if p is not None for launch in p.launches]
            names = {launch.kernel for launch in launches} | {s.fitted_kernel for s in launches if s.fitted_kernel}
            assert names <= built, (device.name, problem, names - built)
            planned |= names
    assert built == planned, f"built for {backend}, planned on no profile: {sorted(built - planned)}"


@pytest.mark.parametrize("profile", PROFILES)
def test_long_rows_span_several_on_chip_chunks_a_multiprocessor_where_rounds_stay_full(profile):
    """Rows of more on-chip chunks than multiprocessors leave the two passes for the on-chip split
    only where copies are asynchronous, two or more rows fit a round of the launch bound's resident
    blocks and fill at least cached_spanning_min_fill of it; no other plan changes."""
    device = PROFILES[profile]
    resident = _cached_blocks_per_multiprocessor(device) * device.multiprocessors
    moved = 0
    for dtype, rows, cols in itertools.product(V.DTYPES, (1, 2, 4, 16, 64), (300_000, 600_000, 786_432, 1_048_576,
                                                                            1_500_000, 2_097_152, 4_194_304)):
        problem = GradRowProblem(dtype, "softmax", rows, cols)
        before = plan_backward(problem, device, replace(DEFAULT_GRAD_TUNING, cached_spanning_rows=False))
        after = plan_backward(problem, device)
        if after == before:
            continue
        moved += 1
        assert (before.tier, after.tier) == ("split", "cached"), (dtype, rows, cols)
        chunks = after.notes["chunks"]
        per_round = min(rows, resident // chunks)
        assert chunks > device.multiprocessors and per_round >= 2, (dtype, rows, cols, chunks)
        assert per_round * chunks >= DEFAULT_GRAD_TUNING.cached_spanning_min_fill * resident, (dtype, rows, cols)
    if planner.has_async_copy(device):
        assert moved >= 10, moved
        # float32 16x786432: 192 chunks, two rows fill 73% of a round (it ran 1-2 points behind the passes)
        assert plan_backward(GradRowProblem("float32", "softmax", 16, 786_432), device).tier == "split"
        assert plan_backward(GradRowProblem("bfloat16", "softmax", 64, 2_097_152), device).tier == "cached"
        # a multiprocessor of 100 KiB of shared memory (sm_86, sm_89) holds three such blocks, not four
        small = replace(device, arch="sm_89", shared_mem_per_multiprocessor=100 * 1024,
                        max_threads_per_multiprocessor=1536)
        assert _cached_blocks_per_multiprocessor(small) == 3
    else:
        assert moved == 0


@pytest.mark.parametrize("profile", PROFILES)
def test_16_bit_gradient_from_x_on_chip_holds_rows_to_its_three_blocks_a_multiprocessor(profile):
    """The on-chip split's 16-bit gradient from x asks its launch bound for three blocks a
    multiprocessor, not four: rows of more chunks than multiprocessors take it only where two or
    more of them fill most of a round of three (else None: the forward, then the gradient from y);
    float32 and float64 rows keep the gradient from y's rounds of four."""
    device = PROFILES[profile]
    slots_a_chunk = V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS
    fill = DEFAULT_GRAD_TUNING.cached_spanning_min_fill
    three, four = (_cached_blocks_per_multiprocessor(device, n) * device.multiprocessors for n in (3, 4))
    assert V.grad_cached_min_blocks("bfloat16", 8, True) == V.grad_cached_min_blocks("float16", 8, True) == 3
    assert V.grad_cached_min_blocks("bfloat16", 8, False) == V.grad_cached_min_blocks("float32", 4, True) == 4
    checked = 0
    for dtype, rows, chunks in itertools.product(("bfloat16", "float16", "float32"), (2, 8, 64),
                                                 (device.multiprocessors, int(1.2 * device.multiprocessors),
                                                  int(1.6 * device.multiprocessors))):
        vec = V.vector_widths(dtype)[1]
        problem = GradRowProblem(dtype, "log_softmax", rows, chunks * slots_a_chunk * vec)
        from_y = plan_backward(problem, device)
        from_x = plan_backward_from_input(problem, device)
        if from_y.tier != "cached":
            assert from_x is None, (dtype, rows, chunks)
            continue
        resident = three if V.DTYPES[dtype][2] == 2 else four
        per_round = min(rows, resident // chunks)
        fits = chunks <= device.multiprocessors or (per_round >= 2 and per_round * chunks >= fill * resident)
        assert (from_x is not None) == fits, (dtype, rows, chunks, from_x)
        if from_x is not None:
            assert from_x.notes["chunks"] == chunks and from_x.launches[0].min_grid == chunks
        checked += 1
    assert checked >= 6, checked
    if planner.has_async_copy(device):  # rows that fit four blocks a multiprocessor and not three
        problem = GradRowProblem("bfloat16", "softmax", 64, int(1.7 * device.multiprocessors) * slots_a_chunk * 8)
        assert plan_backward(problem, device).tier == "cached"
        assert plan_backward_from_input(problem, device) is None


@pytest.mark.parametrize("profile", PROFILES)
def test_plans_respect_the_launch_limits(profile):
    device = PROFILES[profile]
    for dtype in V.DTYPES:
        for problem in _witness_problems(dtype):
            the_plan = plan_backward(problem, device)
            for launch in the_plan.launches:
                assert 1 <= launch.block <= device.max_threads_per_block and launch.block % device.warp_size == 0
                assert 1 <= launch.grid <= device.max_grid_x
                assert launch.shared_mem <= device.shared_mem_per_block_optin
                if launch.cooperative:  # a row's chunks must all be resident: one block a multiprocessor is
                    # sure, and where copies are asynchronous the launch bound's blocks of the on-chip split
                    spans = planner.has_async_copy(device) and the_plan.tier == "cached"
                    blocks = _cached_blocks_per_multiprocessor(device) if spans else 1
                    assert launch.min_grid <= device.multiprocessors * blocks
            if isinstance(problem, GradRowProblem) and the_plan.tier == "warp":
                lanes, slots, vec = (the_plan.notes[k] for k in ("lanes", "slots", "vec"))
                assert lanes * slots * vec >= problem.cols  # the row fits what the lanes hold
            if isinstance(problem, GradRowProblem) and the_plan.tier == "block":
                _assert_fitted_block(problem, the_plan, device)
            else:
                assert all(not s.fitted_block and not s.row_grid for s in the_plan.launches), the_plan


def _assert_fitted_block(problem: GradRowProblem, the_plan, device: DeviceProfile) -> None:
    """A block a row's fitted block: the fewest whole warps whose slots hold the row, at most the
    shape's threads; its row grid a block per row."""
    (launch,) = the_plan.launches
    warp, per_thread = device.warp_size, the_plan.notes["slots"]
    slots = grad_slots(problem, the_plan.notes["vec"])
    assert launch.block == the_plan.notes["lanes"] and launch.fitted_block % warp == 0
    assert launch.fitted_kernel == V.fitted_name(launch.kernel)
    assert warp <= launch.fitted_block <= launch.block
    assert launch.fitted_block * per_thread >= slots > (launch.fitted_block - warp) * per_thread or \
        launch.fitted_block == launch.block
    assert launch.row_grid == min(problem.rows, device.max_grid_x)


@pytest.mark.parametrize("profile", PROFILES)
def test_rows_a_little_past_a_block_shape_fit_their_blocks_to_whole_warps(profile):
    device = PROFILES[profile]
    warp = device.warp_size
    cases = {("float32", 8200): (512, 2050 / 8), ("float32", 4100): (256, 1025 / 8),
             ("bfloat16", 16400): (1024, 2050 / 4), ("float16", 6144): (256, 768 / 4)}
    for (dtype, cols), (shape_threads, needed) in cases.items():
        the_plan = plan_backward(GradRowProblem(dtype, "softmax", 4096, cols), device)
        if shape_threads > device.max_threads_per_block:
            continue
        (launch,) = the_plan.launches
        assert the_plan.tier == "block" and launch.block == shape_threads, (dtype, cols, launch)
        assert launch.fitted_block == min(shape_threads, ceil(ceil(needed) / warp) * warp) < shape_threads
        _assert_fitted_block(GradRowProblem(dtype, "softmax", 4096, cols), the_plan, device)
        from_x = plan_backward_from_input(GradRowProblem(dtype, "softmax", 4096, cols), device)
        assert from_x.launches[0].fitted_block == launch.fitted_block  # the same rows, read from x


def test_the_runtime_takes_a_fitted_block_where_it_holds_more_blocks():
    step = planner.Launch("k", 4224, 512, 0, (), cut_to_one_wave=False, fitted_block=288, fitted_kernel="f",
                          row_grid=8192)
    asked = []

    def blocks(per_kernel):
        return lambda kernel, threads: asked.append((kernel, threads)) or per_kernel[kernel]

    more = planner.resident_launch(step, blocks({"k": 1, "f": 2}))
    assert (more.kernel, more.block, more.grid) == ("f", 288, 8192)  # two rows a multiprocessor, a block a row
    assert asked == [("k", 512), ("f", 288)]  # each kernel's occupancy at its own block
    same = planner.resident_launch(step, blocks({"k": 1, "f": 1}))
    assert (same.kernel, same.block, same.grid) == ("k", 512, 4224)  # no more rows: the shape, grid-stride
    several = planner.resident_launch(step, blocks({"k": 3, "f": 3}))
    assert (several.kernel, several.block, several.grid) == ("k", 512, 8192)  # the shape, a block a row
    full = replace(step, fitted_block=512)
    assert planner.resident_launch(full, blocks({"k": 4})) == replace(full, grid=8192)
    other = planner.Launch("k", 100, 256, 0, ())
    assert planner.resident_launch(other, lambda kernel, threads: 1 / 0) is other  # no fitted block: as planned


@pytest.mark.parametrize("warp", WARPS)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_groups_hold_a_row_in_the_fewest_lanes_of_16_bytes(dtype, warp):
    """A group of lanes holds its row, a lane at most 16 bytes of it (but a warp takes more where the
    row needs), in the fewest lanes (a power of two) that can."""
    for vec in (*V.vector_widths(dtype), *V.grad_narrow_widths(dtype)):
        slot_bytes = vec * V.DTYPES[dtype][2]
        lane_slots = V.grad_lane_slots(dtype, vec)
        assert lane_slots * slot_bytes <= max(16, slot_bytes)
        for row_slots in range(1, warp * V.GRAD_MAX_SLOTS + 1):
            lanes, slots = V.grad_group_shape(row_slots, warp, lane_slots)
            assert lanes * slots >= row_slots and lanes <= warp
            assert lanes & (lanes - 1) == 0 and slots & (slots - 1) == 0
            if lanes < warp:
                assert slots <= lane_slots and (lanes == 1 or lanes // 2 * lane_slots < row_slots)
            else:
                assert slots == 1 or warp * slots // 2 < row_slots


def test_every_rule_says_why_and_the_last_takes_every_problem():
    assert [r.name for r in ROW_RULES][-1] == "a row split across blocks, two passes"
    assert [r.name for r in STRIDED_RULES][-1] == "a strided axis"
    assert all(r.why for r in (*ROW_RULES, *STRIDED_RULES))


GOLDEN = [  # shape -> regime on an H100: one or two a rule
    ("float32", (2097152, 32), "a warp a row", "g8_s1"),
    ("bfloat16", (1000000, 90), "short rows", "staged_bf16_softmax_l1_v8"),  # a thread a row
    ("bfloat16", (1000000, 197), "short rows", "staged_bf16_softmax_l4_v8"),  # 4 lanes a row
    ("float32", (6000000, 10), "short rows", "staged_f32_softmax_l1_v4"),
    ("float32", (65536, 1024), "a warp a row", "g32_s8"),
    ("bfloat16", (65536, 1024), "a block a row", "g64_s2_v8"),  # whole 16-byte slots: 2 a thread
    ("bfloat16", (65536, 1001), "a warp a row", "g32_s4_v8"),  # partial slots: 4 a lane
    ("float32", (8192, 8192), "a block a row", "g256_s8"),
    ("bfloat16", (4096, 128256), "a row split across blocks", "cached"),
    ("float32", (1, 10**8), "a row split across blocks", "partials"),
]


@pytest.mark.parametrize("dtype, shape, regime, kernel_part", GOLDEN)
def test_golden_regimes(dtype, shape, regime, kernel_part):
    the_plan = plan_backward(GradRowProblem(dtype, "softmax", *shape), PROFILES["h100"])
    assert the_plan.regime == regime and kernel_part in the_plan.launches[0].kernel


STRIDED_GOLDEN = [  # (outer, cols, inner) -> strided regime on an H100
    ("float32", (1, 3, 10**7), "strided_thread", "_v4_l2"),  # a short axis: 16-byte vectors, two lines a thread
    ("float32", (64, 100, 10000), "strided_thread", "_v4_l1"),
    ("bfloat16", (128, 400, 2048), "strided_cached", "_v4"),  # tiles that fill a block's shared memory
    ("float32", (128, 400, 2048), "strided_thread", "_v4_l1"),  # its lines give a block to most multiprocessors
    ("float64", (256, 200, 512), "strided", "strided_f64"),
    ("float32", (1, 8192, 8192), "strided", "strided_f32"),
    ("bfloat16", (1, 8192, 8192), "strided_cached", "strided_cached_bf16_softmax_v4"),  # dy and y read once
    ("float16", (1, 8192, 8191), "strided_cached", "strided_cached_f16_softmax_v1"),  # ... rows off a vector
]


A100 = DeviceProfile("NVIDIA A100", "nvidia", "sm_80", 32, 108, 1024, 48 * 1024, 163 * 1024,
                     shared_mem_per_multiprocessor=164 * 1024)


@pytest.mark.parametrize("device", [PROFILES["h100"], A100], ids=["h100", "a100"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_long_strided_axes_of_16_bit_gradients_are_cached_on_chip(device, dtype):
    """Axis 0 of 8192 x 8192 on a part that copies asynchronously: 16-bit gradients split each tile's
    axis into chunks whose dy and y fit shared memory beside the GradSum scratch, four blocks a
    multiprocessor, on blocks that can all be resident, with a tile row of one 128-byte line of each
    array (one position a thread where rows start off a vector); float32 and float64 keep the
    column groups."""
    strides = (0, 8192, 1)
    p = plan_backward(GradStridedProblem(dtype, "log_softmax", 1, 8192, 8192, strides, strides, strides), device)
    itemsize = V.DTYPES[dtype][2]
    if itemsize not in V.GRAD_STRIDED_CACHED_ITEMSIZES:
        assert p.tier == "strided"
        return
    assert p.tier == "strided_cached"
    (launch,) = p.launches
    tile, vec, chunks, chunk_cols = (p.notes[k] for k in ("inner_tile", "vec", "chunks", "chunk_cols"))
    assert vec == 4 and tile * vec * itemsize == 128
    assert launch.block % tile == 0 and launch.block <= device.max_threads_per_block
    assert chunks * chunk_cols >= 8192 > (chunks - 1) * chunk_cols
    assert launch.shared_mem == 2 * chunk_cols * tile * vec * itemsize  # dy and y
    assert launch.shared_mem + launch.block * vec * (8 + 4) + 1024 <= device.shared_mem_per_multiprocessor // 4
    assert launch.cooperative and launch.min_grid == chunks <= device.multiprocessors
    assert launch.grid % chunks == 0 and launch.grid <= 4 * device.multiprocessors
    assert launch.kernel == V.grad_strided_cached_name(dtype, "log_softmax", vec)
    tiles = 8192 // (tile * vec)
    assert dict(p.scratch) == {"sums": 16 * tiles * chunks * tile * vec, "arrivals": 4 * tiles}
    odd = plan_backward(GradStridedProblem(dtype, "softmax", 1, 8192, 8191, (0, 8191, 1), (0, 8191, 1),
                                           (0, 8191, 1)), device)
    assert odd.tier == "strided_cached" and odd.notes["vec"] == 1
    shifted = plan_backward(GradStridedProblem(dtype, "softmax", 1, 8192, 8192, strides, strides, strides,
                                               misaligns=(0, 1, 0)), device)
    assert shifted.notes["vec"] == 1
    for amd in (PROFILES["mi300x"], PROFILES["rdna3"]):  # no asynchronous copies: column groups
        assert plan_backward(GradStridedProblem(dtype, "softmax", 1, 8192, 8192, strides, strides, strides),
                             amd).tier == "strided"


@pytest.mark.parametrize("dtype, shape, tier, kernel_part", STRIDED_GOLDEN)
def test_golden_strided_regimes(dtype, shape, tier, kernel_part):
    outer, cols, inner = shape
    strides = (cols * inner, inner, 1)
    the_plan = plan_backward(GradStridedProblem(dtype, "softmax", outer, cols, inner, strides, strides, strides),
                             PROFILES["h100"])
    assert the_plan.tier == tier and kernel_part in the_plan.launches[0].kernel, the_plan.launches[0].kernel


# ---- the public API on the host ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_cpu_backend_every_axis(rng, dtype, op):
    fn = ps.softmax_backward if op == "softmax" else ps.log_softmax_backward
    for shape in [(7,), (3, 5), (4, 1, 6), (2, 3, 4, 5)]:
        for axis in range(-len(shape), len(shape)):
            y = forward_output(rng, shape, axis, op, dtype)
            dy = rng.standard_normal(shape).astype(y.dtype)
            got = fn(dy, y, axis)
            assert got.dtype == y.dtype and got.shape == shape
            assert_gradient(got, dy, y, axis, op, f"{dtype} {shape} axis {axis}")


@pytest.mark.parametrize("backend", ["emu32", "emu64"])
def test_the_api_runs_the_emulated_kernels(library, rng, backend):
    for shape, axis in [((9, 130), 1), ((3, 12000), -1), ((50, 6), 0), ((2, 3, 40), 1)]:
        for op, fn in (("softmax", ps.softmax_backward), ("log_softmax", ps.log_softmax_backward)):
            y = forward_output(rng, shape, axis, op, "float32")
            dy = rng.standard_normal(shape).astype(np.float32)
            with ps.use_backend(backend):
                got = fn(dy, y, axis)
            assert_gradient(got, dy, y, axis, op, f"{backend} {shape} axis {axis}")


def test_out_views_and_lists(rng):
    y = forward_output(rng, (6, 10), 1, "softmax", "float32")
    dy = rng.standard_normal((6, 10)).astype(np.float32)
    out = np.full((6, 10), np.nan, np.float32)
    assert ps.softmax_backward(dy, y, out=out) is out
    assert_gradient(out, dy, y, 1, "softmax", "out=")
    assert_gradient(ps.softmax_backward(dy[:, ::2], y[:, ::2] / y[:, ::2].sum(1, keepdims=True)),
                    dy[:, ::2], y[:, ::2] / y[:, ::2].sum(1, keepdims=True), 1, "softmax", "strided views")
    got = ps.softmax_backward(dy.tolist(), y.tolist())
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    assert ps.softmax_backward(np.float32(1.0), np.float32(1.0)) == 0.0
    assert ps.log_softmax_backward(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_bad_input_names_what_was_wrong():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"one shape; got dy \(2, 3\) and y \(3, 2\)"):
        ps.softmax_backward(a, a.T.copy())
    with pytest.raises(TypeError, match="one dtype; got dy float32 and y float64"):
        ps.softmax_backward(a, a.astype(np.float64))
    with pytest.raises(TypeError, match="softmax_backward needs floating-point dy and y; got dy int32 and y int32. "
                                        "Supported dtypes: float32, float16, bfloat16, float64"):
        ps.softmax_backward(a.astype(np.int32), a.astype(np.int32))
    with pytest.raises(TypeError, match="got dy float32 and y int64"):
        ps.log_softmax_backward(a, a.astype(np.int64))
    with pytest.raises(IndexError, match="axis 2 is out of bounds"):
        ps.log_softmax_backward(a, a, 2)
    with pytest.raises(ValueError, match="out has shape"):
        ps.softmax_backward(a, a, out=np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="out has dtype"):
        ps.softmax_backward(a, a, out=np.zeros((2, 3), np.float64))


# ---- torch's autograd --------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_autograd_takes_the_package_gradient(monkeypatch, op):
    torch = pytest.importorskip("torch")
    from portable_softmax import _torch_op

    calls = []
    real = _torch_op._gradient
    monkeypatch.setattr(_torch_op, "_gradient", lambda *a: calls.append(a[3]) or real(*a))
    f = ps.softmax if op == "softmax" else ps.log_softmax
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    f(x, 1).sin().sum().backward()
    assert calls == [op]
    x_ref = x.detach().clone().requires_grad_()
    (torch.softmax if op == "softmax" else torch.log_softmax)(x_ref, 1).sin().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_gradcheck_gradgradcheck_func_and_compile(op):
    torch = pytest.importorskip("torch")
    f = ps.softmax if op == "softmax" else ps.log_softmax
    ref = torch.softmax if op == "softmax" else torch.log_softmax
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    for axis in (0, 1, 2):
        assert torch.autograd.gradcheck(lambda a, axis=axis: f(a, axis), (x,))
        assert torch.autograd.gradgradcheck(lambda a, axis=axis: f(a, axis), (x,))
    want = torch.func.grad(lambda a: ref(a, 1).sin().sum())(x.detach())
    torch.testing.assert_close(torch.func.grad(lambda a: f(a, 1).sin().sum())(x.detach()), want)
    batched = torch.func.vmap(torch.func.grad(lambda a: f(a, 0).sin().sum()))(x.detach())
    torch.testing.assert_close(batched, torch.func.vmap(torch.func.grad(lambda a: ref(a, 0).sin().sum()))(x.detach()))
    compiled = torch.compile(lambda a: f(a, 1).sin().sum(), fullgraph=True)
    xc = x.detach().clone().requires_grad_()
    compiled(xc).backward()
    torch.testing.assert_close(xc.grad, want)


def _gradient_formula(torch, op: str, dy, y, axis: int):
    if op == "softmax":
        return y * (dy - (dy * y).sum(axis, keepdim=True))
    return dy - y.exp() * dy.sum(axis, keepdim=True)


def _torch_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "torch sees no CUDA or ROCm device"


_TORCH_CUDA_SKIP = _torch_cuda_reason()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(_TORCH_CUDA_SKIP is not None, reason=f"{_TORCH_CUDA_SKIP}")])])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_torch_gradient_functions_are_differentiable(op, device):
    """ps.softmax_backward / ps.log_softmax_backward of tensors that require grad, or inside
    torch.func transforms and torch.compile, are recorded as the formula's derivatives (double
    backward, jacrev / jacfwd, vmap of grad); out= of such a tensor is refused as for the forward.
    On a GPU the derivatives run the gradient kernels (float64, so gradcheck's tolerances hold)."""
    torch = pytest.importorskip("torch")
    fn = getattr(ps, f"{op}_backward")
    y = getattr(torch, op)(torch.randn(4, 3, 5, dtype=torch.float64, device=device), 1)
    dy = torch.randn(4, 3, 5, dtype=torch.float64, device=device)
    v = torch.randn(4, 3, 5, dtype=torch.float64, device=device)
    d, w = dy.clone().requires_grad_(), y.clone().requires_grad_()
    dx = fn(d, w, 1)
    assert dx.grad_fn is not None
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, 1), (d, w))
    assert torch.autograd.gradgradcheck(lambda a, b: fn(a, b, 1), (d, w))
    for argnums in (0, 1):
        ours = torch.func.grad(lambda a, b: (fn(a, b, 1) * v).sum(), argnums=argnums)(dy, y)
        want = torch.func.grad(lambda a, b: (_gradient_formula(torch, op, a, b, 1) * v).sum(), argnums=argnums)(dy, y)
        torch.testing.assert_close(ours, want)
    jac = torch.func.jacrev(lambda b: _gradient_formula(torch, op, dy, b, 2))(y)
    torch.testing.assert_close(torch.func.jacrev(lambda b: fn(dy, b, 2))(y), jac)
    torch.testing.assert_close(torch.func.jacfwd(lambda b: fn(dy, b, 2))(y), jac)
    batched = torch.func.vmap(torch.func.grad(lambda b, a: (fn(a, b, 0) * v[0]).sum()))(y, dy)
    torch.testing.assert_close(batched, torch.func.vmap(torch.func.grad(
        lambda b, a: (_gradient_formula(torch, op, a, b, 0) * v[0]).sum()))(y, dy))
    wc = y.clone().requires_grad_()
    (torch.compile(lambda a, b: fn(a, b, 1), fullgraph=True)(dy, wc) * v).sum().backward()
    want = torch.func.grad(lambda b: (_gradient_formula(torch, op, dy, b, 1) * v).sum())(y)
    torch.testing.assert_close(wc.grad, want)
    with pytest.raises(ValueError, match=f"out= cannot take the {op}_backward of a tensor that autograd"):
        fn(d, w, 1, out=torch.empty_like(dy))
    with pytest.raises(TypeError, match="dy and y must have one dtype; got dy float64 and y float32"):
        fn(d, w.float(), 1)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [(0, 2), (2, 0), (-1, -2), None, (1,), [0, 1, 2]])
def test_gradient_over_several_axes_as_the_forward_takes_them(rng, op, axis):
    """The forward's tuple or None axis (softmax over the joint set): the gradient over the same
    set, for numpy, torch and JAX arrays, into out= too."""
    x = rng.standard_normal((3, 4, 5))
    y = getattr(ps, op)(x, axis=axis)
    dy = rng.standard_normal((3, 4, 5))
    joint = tuple(range(3)) if axis is None else tuple(a % 3 for a in axis)
    ref = gradient_reference(dy, y, joint, op)
    fn = getattr(ps, f"{op}_backward")
    np.testing.assert_allclose(fn(dy, y, axis), ref, rtol=1e-12, atol=1e-14)
    out = np.full_like(dy, np.nan)
    assert fn(dy, y, axis, out=out) is out
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14)
    torch = pytest.importorskip("torch")
    got = fn(torch.from_numpy(dy), torch.from_numpy(y), axis)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=r"duplicate value in axis=\(0, 0\)"):
        fn(dy, y, (0, 0))
    with pytest.raises(ValueError, match="dy and y must have one shape"):
        fn(dy, y[:2], (0, 1))
    with pytest.raises(IndexError, match="axis 3 is out of bounds"):
        fn(dy, y, (0, 3))


def test_torch_safe_log_softmax_rows_of_all_neg_inf_get_zero_gradient():
    torch = pytest.importorskip("torch")
    x = torch.tensor([[-float("inf")] * 3, [1.0, 2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    ps.log_softmax(x, 1, safe=True).sum().backward()
    assert (x.grad[0] == 0).all() and torch.isfinite(x.grad).all()
    y = torch.tensor([[-float("inf")] * 3], dtype=torch.float32)
    assert (ps.log_softmax_backward(torch.ones(1, 3), y) == 0).all()


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_two_pass_split_of_short_rows_takes_blocks_sized_to_the_rows(device, dtype):
    """The gradient's two passes over a sharded softmax's local rows: rows shorter than four slots a
    thread of a full block take a block of about that many (at least 64 threads and a warp), a row
    each; longer rows keep full blocks."""
    split_only = replace(DEFAULT_GRAD_TUNING, passes_rows_in_registers=False)
    for cols in (1, 100, 1000, 4096, 16384, 64128):
        p = plan_split_passes(GradRowProblem(dtype, "softmax", 65536, cols), device, split_only)
        slots, block = ceil(cols / p.notes["vec"]), p.launches[0].block
        assert all(launch.block == block for launch in p.launches), p
        if slots >= 4 * V.GRAD_STREAM_THREADS:
            assert block == V.GRAD_STREAM_THREADS, (cols, block)
            continue
        assert block % device.warp_size == 0 and max(64, device.warp_size) <= block < V.GRAD_STREAM_THREADS or \
            block == V.GRAD_STREAM_THREADS, (cols, block)
        assert block == max(64, device.warp_size) or block < slots <= 4 * block, (cols, slots, block)
        assert p.notes["chunks"] == 1, p.notes


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_gradient_passes_apart_take_rows_a_warp_holds_a_warp_a_row(device, dtype):
    """The gradient's two passes apart take rows of up to GRAD_MAX_SLOTS 16-byte slots a lane (and the
    forward's values a lane) a warp a row, in the fewest slots a lane that hold them, where dy, y and
    dx share their offset in 16-byte vectors; others the split's passes."""
    warp, widest = device.warp_size, V.vector_widths(dtype)[1]
    built = V.grad_rows_pass_slots(dtype)
    planned = set()
    for cols in (1, 3, 37, 100, 256, 257, 1000, 1024, 2048, 4096):
        for misaligns in ((0, 0, 0), (1, 1, 1), (1, 1, 0)):
            problem = GradRowProblem(dtype, "softmax", 4096, cols, None, misaligns)
            p = plan_split_passes(problem, device)
            vec = grad_vector_width(problem, narrow=False)
            slots = grad_slots(problem, widest)
            if vec != widest or ceil(slots / warp) > built[-1]:
                assert p.tier == "split", (cols, misaligns, p.tier)
                continue
            lane_slots = p.notes["slots"]
            assert p.tier == "warp" and p.notes["chunks"] == 1 and lane_slots in built, (cols, p.notes)
            assert lane_slots * warp >= slots and (lane_slots == 1 or lane_slots * warp < 2 * slots), (cols, lane_slots)
            names = [V.grad_rows_sums_name(dtype, "softmax", warp, lane_slots),
                     V.grad_rows_finish_name(dtype, "softmax", warp, lane_slots)]
            assert [launch.kernel for launch in p.launches] == names
            assert dict(p.scratch)["sums"] == 16 * 4096
            planned.add(lane_slots)
    assert planned == set(built), (planned, built)

"""Plans for the gradient kernels (src_cuda/backward.cuh): a pure function of the problem and the device.

The rules are tried in order and the first that applies builds the plan; each says in a line why it
exists. Kernel names are resolved from ``_variants`` once a rule has chosen its shape.

>>> from portable_softmax.planner import DeviceProfile
>>> from portable_softmax.planner_backward import GradRowProblem, plan_backward
>>> p = plan_backward(GradRowProblem("float32", "softmax", rows=4096, cols=1000), DeviceProfile.h100())
>>> p.regime, p.launches[0].kernel
('a warp a row', 'ps_bwd_rows_f32_softmax_w32_g32_s8_v4')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from math import ceil, lcm
from typing import Any

from . import _variants as V
from . import planner as _planner
from .planner import (
    I32,
    I64,
    PTR,
    DeviceProfile,
    Launch,
    Plan,
    PlanError,
    SizeMap,
    _compute_bytes,
    _work_grid,
    default_tuning,
    grid_for,
    split_stream_threads,
    strided_cached_vec,
    strided_passes,
    strided_thread_lines,
    strided_tiles,
    widest_aligned,
)

OPS = ("softmax", "log_softmax")


@dataclass(frozen=True)
class GradRowProblem:
    """dx from dy and y along contiguous rows: element (r, c) of each at ``a[r * stride + c]``.

    ``strides`` are (dy, y, dx) row strides (None: ``cols``); ``misaligns`` their base addresses in
    elements modulo the widest vector (``address // itemsize % (16 // itemsize)``).
    """

    dtype: str
    op: str
    rows: int
    cols: int
    strides: tuple[int, int, int] | None = None
    misaligns: tuple[int, int, int] = (0, 0, 0)
    safe: bool = False

    def row_strides(self) -> tuple[int, int, int]:
        return self.strides if self.strides is not None else (self.cols,) * 3


@dataclass(frozen=True)
class GradStridedProblem:
    """dx from dy and y along the middle axis of (outer, cols, inner) views with element strides."""

    dtype: str
    op: str
    outer: int
    cols: int
    inner: int
    dy_strides: tuple[int, int, int]
    y_strides: tuple[int, int, int]
    dx_strides: tuple[int, int, int]
    safe: bool = False
    #: the (dy, y, dx) base addresses in elements past a 16-byte boundary
    misaligns: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True)
class GradTuning:
    """The gradient planner's numbers (one family of devices)."""

    #: the on-chip split takes rows of at most one chunk a multiprocessor (one resident block each is
    #: certain), and, where copies are asynchronous (NVIDIA sm_80+, whose occupancy the launch bound
    #: sets), longer rows of up to GRAD_CACHED_MIN_BLOCKS a multiprocessor (as threads and shared
    #: memory allow) where two or more rows fit a round and fill at least cached_spanning_min_fill of
    #: its blocks, rather than the two passes
    cached_spanning_rows: bool = True
    cached_spanning_min_fill: float = 0.75
    #: rows as long as a block holds, but fewer than multiprocessors / this, split across blocks
    few_rows_fraction: int = 2
    #: the two-pass split cuts rows into enough chunks for this many blocks a multiprocessor
    split_blocks_per_multiprocessor: int = 8
    #: ... each of at least this many slots a thread
    split_min_slots_per_thread: int = 4
    #: rows shorter than this many slots a thread of a full block stream in smaller blocks
    #: (planner.split_stream_threads; 0: full blocks always)
    split_stream_slots_per_thread: int = 4
    #: the two passes apart take rows a warp holds a warp a row (planner.Tuning.passes_rows_in_registers)
    passes_rows_in_registers: bool = True
    #: strided axes of up to this many rows take a thread per line of positions (strided_thread) ...
    strided_thread_short_cols: int = 64
    #: ... and so do axes of up to strided_thread_max_cols rows over at least
    #: strided_thread_min_inner inner positions, of elements of these sizes, where the lines fill
    #: at least strided_thread_min_fill of the multiprocessors with a block each: such a thread
    #: walks a long axis alone, so with fewer lines column groups keep more loads in flight
    #: (float64 columns of 200 rows ran faster in column groups at any number of lines)
    strided_thread_max_cols: int = 512
    strided_thread_min_inner: int = 32
    strided_thread_max_cols_itemsizes: tuple = (2, 4)
    strided_thread_min_fill: float = 0.5
    #: ... in blocks of this many threads (the kernels' launch bound, kStridedThreadThreads)
    strided_thread_threads: int = 256
    #: contiguous rows of dy, y and dx alike aligned whose length is not a whole number of 16-byte
    #: vectors, of staged_min_cols columns (by element size) up to staged_max_row_bytes, of elements of
    #: these sizes, go through shared memory (the forward's staged_rows): every global access a whole
    #: vector (16-bit rows of 2 and 3 columns ran 14-34% slower there, rows of 4 traded a tenth of
    #: softmax's speed for a sixth more of log_softmax's, float32 rows of 2 columns 14-18% slower)
    staged_itemsizes: tuple = V.GRAD_STAGED_ITEMSIZES
    staged_min_cols: SizeMap = SizeMap({2: 5, 4: 3})
    staged_max_row_bytes: int = 576
    #: ... a thread a row up to staged_thread_max_row_bytes (a tile of 128 such rows of dy and y fills
    #: a block's 48 KiB), else a group of staged_group_lanes lanes, its rows in the order of fewer
    #: shared banks (planner.staged_bank_ways)
    staged_thread_max_row_bytes: int = 180
    staged_group_lanes: int = 4
    #: ... a block of staged_threads threads (the kernels' launch bound, kStagedThreads) taking tiles
    #: of about staged_bytes_per_thread bytes of each array a thread
    staged_threads: int = 128
    staged_bytes_per_thread: int = 64
    #: the packed rows' blocks (the kernels' launch bound, kPackedThreads; fewer threads where a tile of
    #: dy and one of y would not fit a block's shared memory)
    packed_threads: int = 256


DEFAULT_GRAD_TUNING = GradTuning()


@dataclass(frozen=True)
class _Shape:
    """What the row rules look at: the vector width, the slots a row covers, and whether every slot
    of every row is full."""

    vec: int
    slots: int
    whole: bool = False


@dataclass(frozen=True)
class _Lines:
    """What the strided rules look at: a short-axis thread's vector width and lines (vectors of
    inner positions) a thread, and the blocks those lines fill."""

    vec: int
    lines: int
    blocks: int


@dataclass(frozen=True)
class Rule:
    """A planner rule: where it applies, the plan it builds, and why. Row rules look at a row
    problem and its _Shape, strided rules at a strided problem and its _Lines."""

    name: str
    why: str
    applies: Callable[[GradTuning, Any, DeviceProfile, Any], bool]
    build: Callable[[GradTuning, Any, DeviceProfile, Any], Plan]


def _row_args(p: GradRowProblem) -> tuple:
    dys, ys, dxs = p.row_strides()
    return ((I64, p.rows), (I64, p.cols), (I64, dys), (I64, ys), (I64, dxs))


def _rows_plan(p: GradRowProblem, device: DeviceProfile, s: _Shape, lanes: int, slots: int, tier: str) -> Plan:
    warp = device.warp_size
    threads = lanes if lanes > warp else V.GRAD_ROWS_THREADS
    rows_a_block = threads // lanes * V.grad_rows_batch(p.dtype, warp, lanes, slots, s.vec) if lanes <= warp else 1
    name = V.grad_rows_name(p.dtype, p.op, warp, lanes, slots, s.vec)
    args = ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), *_row_args(p), (I32, int(p.safe)))
    fitted = {"fitted_block": block_threads(s.slots, lanes, slots, warp), "fitted_kernel": V.fitted_name(name),
              "row_grid": _work_grid(p.rows, device)} if lanes > warp else {}
    launch = Launch(name, grid_for(ceil(p.rows / rows_a_block), device), threads, 0, args, cut_to_one_wave=False,
                    **fitted)
    return Plan(tier, (launch,), notes={"lanes": lanes, "slots": slots, "vec": s.vec}, scratch_zeroed=False)


def block_threads(slots: int, shape_threads: int, per_thread: int, warp: int) -> int:
    """The fewest threads, whole warps, whose ``per_thread`` slots each hold a row of ``slots``
    slots, at most the block shape's: a row a little longer than the shape below would leave up to
    half of the shape's threads empty (planner.resident_launch chooses between them)."""
    return min(shape_threads, ceil(ceil(slots / per_thread) / warp) * warp)


def _block_shape(dtype: str, device: DeviceProfile, s: _Shape) -> tuple[int, int] | None:
    """The first block (threads, slots a thread) of grad_block_shapes that holds the row."""
    slots = s.slots
    for threads, per_thread in V.grad_block_shapes(dtype, s.vec, s.whole):
        if device.warp_size < threads <= device.max_threads_per_block and threads * per_thread >= slots:
            return threads, per_thread
    return None


def _one_span(p: GradRowProblem) -> bool:
    """Whether dy, y and dx are each one contiguous span of rows, alike aligned (what the short rows'
    tiles read and write with whole vectors)."""
    widest = V.vector_widths(p.dtype)[1]
    return p.rows >= 2 and p.row_strides() == (p.cols,) * 3 and len({m % widest for m in p.misaligns}) == 1


def _staged_lanes(t: GradTuning, p: GradRowProblem) -> int | None:
    """Lanes a row of the staged rows (t.staged_*), or None where the rows do not take them."""
    itemsize = V.DTYPES[p.dtype][2]
    row_bytes = p.cols * itemsize
    if (itemsize not in t.staged_itemsizes or not _one_span(p) or row_bytes % 16 == 0
            or p.cols < t.staged_min_cols.get(itemsize, 1 << 30) or row_bytes > t.staged_max_row_bytes):
        return None
    lanes = 1 if row_bytes <= t.staged_thread_max_row_bytes else t.staged_group_lanes
    return lanes if lanes in V.GRAD_STAGED_LANES else None


def _packed_shape(t: GradTuning, p: GradRowProblem, device: DeviceProfile) -> tuple[int, int, int, int] | None:
    """(threads, values a thread's group, groups a thread, shared bytes) of the packed rows, or None
    where they do not take these rows: contiguous rows of V.grad_packed_cols columns, dy, y and dx
    alike aligned, every lcm(cols, vec) values of the span starting a row, a tile of each in a block's
    shared memory (blocks of t.packed_threads, fewer where they would not fit)."""
    vec = V.vector_widths(p.dtype)[1]
    if p.cols not in V.grad_packed_cols(p.dtype) or not _one_span(p) or p.misaligns[0] % vec % p.cols != 0:
        return None
    per_thread = lcm(p.cols, vec)  # whole vectors and whole rows
    group = per_thread // vec
    depth = 1 if group >= 4 else 4 // group  # packed_rows' DEPTH: four vectors in flight a thread

    def tiles_bytes(threads: int) -> int:  # a tile of dy, then one of y
        return 2 * depth * threads * per_thread * V.DTYPES[p.dtype][2]

    threads = min(t.packed_threads, device.max_threads_per_block)
    while threads > device.warp_size and tiles_bytes(threads) > device.shared_mem_per_block:
        threads //= 2
    shared = tiles_bytes(threads)
    return (threads, per_thread, depth, shared) if shared <= device.shared_mem_per_block else None


def _packed(t, p, device, s):
    vec = V.vector_widths(p.dtype)[1]
    threads, per_thread, depth, shared = _packed_shape(t, p, device)
    groups = ceil((p.misaligns[0] % vec + p.rows * p.cols) / per_thread)
    launch = Launch(V.grad_packed_name(p.dtype, p.op, p.cols), _work_grid(ceil(groups / (threads * depth)), device),
                    threads, shared, ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (I64, p.rows), (I32, int(p.safe))),
                    cut_to_one_wave=False)
    return Plan("packed", (launch,), notes={"vec": vec, "values_per_thread": per_thread * depth},
                scratch_zeroed=False)


def _staged(t, p, device, s):
    lanes = _staged_lanes(t, p)
    itemsize = V.DTYPES[p.dtype][2]
    vec = V.vector_widths(p.dtype)[1]
    groups = t.staged_threads // lanes
    row_bytes = p.cols * itemsize
    rows_a_group = max(1, round(t.staged_bytes_per_thread * lanes / row_bytes))
    fitting = (device.shared_mem_per_block // 2 - 2 * 16) // row_bytes
    tile_rows = max(1, min(p.rows, groups * rows_a_group, fitting))
    shared = 2 * ceil((vec - 1 + tile_rows * p.cols) / vec) * vec * itemsize  # dy's tile, then y's
    interleave = 0
    if lanes > 1:
        forward = _planner.RowProblem(p.dtype, p.op, p.rows, p.cols, x_misalign=p.misaligns[0])
        ways = [_planner.staged_bank_ways(replace(default_tuning(device), staged_threads=t.staged_threads), forward,
                                          lanes, None, bool(i)) for i in (0, 1)]
        interleave = int(ways[1] < ways[0])
    args = ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (I64, p.rows), (I64, p.cols), (I64, tile_rows), (I32, interleave),
            (I32, int(p.safe)))
    launch = Launch(V.grad_staged_name(p.dtype, p.op, lanes), _work_grid(ceil(p.rows / tile_rows), device),
                    t.staged_threads, shared, args, cut_to_one_wave=False)
    return Plan("staged", (launch,), notes={"lanes": lanes, "tile_rows": tile_rows, "vec": vec,
                                            "interleave": interleave}, scratch_zeroed=False)


def _cached_chunks(s: _Shape) -> int:
    return ceil(s.slots / (V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS))


def _cached_blocks_per_multiprocessor(device: DeviceProfile, min_blocks: int = V.GRAD_CACHED_MIN_BLOCKS) -> int:
    """The on-chip split's blocks a multiprocessor holds for certain where copies are asynchronous:
    its launch bound's (``min_blocks``), as far as threads and shared memory allow (a block's staged
    copies of dy and y, 16 bytes a slot each, and the runtime's 1 KiB reserve)."""
    staged = 2 * V.GRAD_CACHED_THREADS * V.GRAD_CACHED_SLOTS * 16 + 1024 + 64
    return min(min_blocks, device.max_threads_per_multiprocessor // V.GRAD_CACHED_THREADS,
               device.shared_mem_per_multiprocessor // staged)


def _cached_fits(t: GradTuning, p: GradRowProblem, device: DeviceProfile, s: _Shape,
                 min_blocks: int = V.GRAD_CACHED_MIN_BLOCKS) -> bool:
    """Whether the on-chip split holds the rows: one chunk a multiprocessor, or (a row's wait then
    overlapping another's loads) several, where two or more rows fill most of a round of resident
    blocks (at 73% full, float32 16x786432 ran 1-2 points behind the two passes); ``min_blocks``:
    its launch bound's blocks a multiprocessor."""
    if V.GRAD_CACHED_THREADS > device.max_threads_per_block:
        return False
    chunks = _cached_chunks(s)
    if chunks <= device.multiprocessors:
        return True
    if not (t.cached_spanning_rows and _planner.has_async_copy(device)):
        return False
    resident = _cached_blocks_per_multiprocessor(device, min_blocks) * device.multiprocessors
    per_round = min(p.rows, resident // chunks)
    return per_round >= 2 and per_round * chunks >= t.cached_spanning_min_fill * resident


def _in_a_warp(t, p, device, s):
    lanes, slots = V.grad_group_shape(s.slots, device.warp_size, V.grad_lane_slots(p.dtype, s.vec))
    return _rows_plan(p, device, s, lanes, slots, "warp")


def _block(t, p, device, s):
    threads, per_thread = _block_shape(p.dtype, device, s)
    return _rows_plan(p, device, s, threads, per_thread, "block")


def _few_rows(t: GradTuning, p: GradRowProblem, device: DeviceProfile, s: _Shape) -> bool:
    return p.rows * t.few_rows_fraction < device.multiprocessors and _cached_chunks(s) > 1


def _cached(t, p, device, s):
    chunks = _cached_chunks(s)
    name = V.grad_cached_name(p.dtype, p.op, device.warp_size, s.vec, s.whole)
    dys, ys, dxs = p.row_strides()
    args = ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (PTR, "sums"), (PTR, "arrivals"), (I64, p.rows), (I64, p.cols),
            (I64, dys), (I64, ys), (I64, dxs), (I64, chunks), (I32, int(p.safe)))
    grid = min(p.rows * chunks, device.max_grid_x // chunks * chunks)
    launch = Launch(name, grid, V.GRAD_CACHED_THREADS, 0, args, cooperative=True, min_grid=chunks)
    scratch = (("sums", p.rows * chunks * 2 * 8), ("arrivals", p.rows * 4))  # a GradSum: two doubles
    return Plan("cached", (launch,), scratch, notes={"chunks": chunks, "vec": s.vec})


def _split(t, p, device, s):
    threads = split_stream_threads(t.split_stream_slots_per_thread, device.warp_size, s.slots, V.GRAD_STREAM_THREADS)
    want = ceil(device.multiprocessors * t.split_blocks_per_multiprocessor / p.rows)
    chunks = max(1, min(want, s.slots // (threads * t.split_min_slots_per_thread)))
    chunk_slots = ceil(s.slots / chunks)
    chunks = ceil(s.slots / chunk_slots)
    warp = device.warp_size
    dys, ys, dxs = p.row_strides()
    grid = grid_for(p.rows * chunks, device)
    partials = Launch(V.grad_partials_name(p.dtype, p.op, warp, s.vec), grid, threads, 0,
                      ((PTR, "dy"), (PTR, "y"), (PTR, "sums"), (I64, p.rows), (I64, p.cols), (I64, dys), (I64, ys),
                       (I64, chunk_slots), (I64, chunks)), cut_to_one_wave=False)
    finish = Launch(V.grad_finish_name(p.dtype, p.op, warp, s.vec), grid, threads, 0,
                    ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (PTR, "sums"), *_row_args(p), (I64, chunk_slots),
                     (I64, chunks), (I32, int(p.safe))), cut_to_one_wave=False)
    return Plan("split", (partials, finish), (("sums", p.rows * chunks * 2 * 8),),
                notes={"chunks": chunks, "chunk_slots": chunk_slots, "vec": s.vec}, scratch_zeroed=False)


#: the row rules, in order: the first that applies plans
ROW_RULES: tuple[Rule, ...] = (
    Rule("short rows, packed", "contiguous rows of 2-4 16-bit columns: whole rows inside each thread's vectors, "
         "a tile of dy and one of y through shared memory, no lanes to combine",
         lambda t, p, d, s: _packed_shape(t, p, d) is not None, _packed),
    Rule("short rows, staged", "contiguous rows of partial 16-byte vectors a few hundred bytes long: the block "
         "copies a span of rows of dy and y into shared memory with whole vectors, a thread or a few lanes take "
         "each row there, and the block stores dx's span with whole vectors",
         lambda t, p, d, s: _staged_lanes(t, p) is not None, _staged),
    Rule("a group of lanes a row", "rows of at most a warp's slots: up to GRAD_LANE_BYTES of a row a lane "
         "(grad_lane_slots), so several rows a warp, each load a whole vector of every lane",
         lambda t, p, d, s: s.slots <= d.warp_size, _in_a_warp),
    Rule("a warp a row", "rows of up to grad_max_slots slots a lane: held in registers, reduced with shuffles "
         "(half a warp where slots are narrow enough)",
         lambda t, p, d, s: s.slots <= d.warp_size * V.grad_max_slots(p.dtype, s.vec, s.whole), _in_a_warp),
    Rule("a block a row", "rows one block's registers hold, while there are rows enough for the device",
         lambda t, p, d, s: _block_shape(p.dtype, d, s) is not None and not _few_rows(t, p, d, s), _block),
    Rule("a row split across blocks, on chip", "longer rows (or a few long ones) whose chunks fit the "
         "resident blocks: one read and one write, the chunks' sums meeting in scratch",
         lambda t, p, d, s: _cached_fits(t, p, d, s), _cached),
    Rule("a row split across blocks, two passes", "rows too long for the chip: each chunk's sum, then "
         "the chunk again to finish it", lambda t, p, d, s: True, _split),
)


def grad_vector_width(p: GradRowProblem, narrow: bool = True) -> int:
    """The widest vector where dy, y and dx share their misalignment on every row, else 1 (short
    rows at varying offsets stay scalar: their partial slots would cost more than vectors save).
    Where ``narrow``, 16-bit rows whose stride is not a whole 16 bytes, of at least 32 elements,
    take the widest narrower vector that every row starts at the same offset in, while their rows
    fit grad_narrow_max_slots of it (the split regimes are built for 1 and the widest only)."""
    widest = V.vector_widths(p.dtype)[1]
    strides = p.row_strides()
    unaligned_step = p.rows > 1 and strides[0] % widest != 0
    if narrow and unaligned_step and p.cols >= 4 * widest:
        for vec in V.grad_narrow_widths(p.dtype):
            if (all(s % vec == 0 for s in strides) and len({m % vec for m in p.misaligns}) == 1
                    and grad_slots(p, vec) <= V.grad_narrow_max_slots(p.dtype, vec)):
                return vec
    same_base = len({m % widest for m in p.misaligns}) == 1
    same_step = p.rows <= 1 or len({s % widest for s in strides}) == 1
    short_unaligned = unaligned_step and p.cols < 4 * widest
    return widest if same_base and same_step and not short_unaligned else 1


def grad_slots(p: GradRowProblem, vec: int) -> int:
    stride = p.row_strides()[0]
    pad = p.misaligns[0] % vec if p.rows <= 1 or stride % vec == 0 else vec - 1
    return ceil((pad + p.cols) / vec)


def whole_rows(p: GradRowProblem, vec: int) -> bool:
    """Every row starts on a vector of ``vec`` and holds whole ones (the kernels test it the same way)."""
    return (p.cols % vec == 0 and all(m % vec == 0 for m in p.misaligns)
            and (p.rows <= 1 or all(s % vec == 0 for s in p.row_strides())))


def _check(dtype: str, op: str, device: DeviceProfile) -> None:
    if dtype not in V.DTYPES:
        raise PlanError(f"dtype {dtype!r} has no kernels; supported: {', '.join(V.DTYPES)}")
    if op not in OPS:
        raise PlanError(f"op {op!r} has no gradient kernels; supported: {', '.join(OPS)}")
    if device.warp_size not in V.WARP_SIZES:
        raise PlanError(f"warp size {device.warp_size} has no kernels; built for {V.WARP_SIZES}")


@lru_cache(maxsize=4096)
def plan_backward(problem: GradRowProblem | GradStridedProblem, device: DeviceProfile,
                  tuning: GradTuning = DEFAULT_GRAD_TUNING) -> Plan:
    """The launches that compute dx for ``problem`` on ``device``."""
    _check(problem.dtype, problem.op, device)
    if isinstance(problem, GradStridedProblem):
        lines = _lines(tuning, problem)
        return next(r for r in STRIDED_RULES if r.applies(tuning, problem, device, lines)).build(
            tuning, problem, device, lines)
    if problem.rows <= 0 or problem.cols <= 0:
        return Plan("empty", ())
    vec = grad_vector_width(problem)
    shape = _Shape(vec, grad_slots(problem, vec), whole_rows(problem, vec))
    for rule in ROW_RULES:
        if rule.applies(tuning, problem, device, shape):
            return rule.build(tuning, problem, device, shape)
    raise AssertionError("the last rule applies to every problem")


def plan_backward_from_input(problem: GradRowProblem, device: DeviceProfile,
                             tuning: GradTuning = DEFAULT_GRAD_TUNING) -> Plan | None:
    """The launch that computes dx from dy and the forward's input x in one read of each, where the
    gradient's plan holds a row in registers (a group of lanes, a warp or a block a row, one row a
    step) or on chip (the on-chip split, its chunks in registers): the kernel takes the row's max and
    sums from x and finishes as from y = softmax(x). ``problem`` describes dy, x and dx (its y strides
    and misalignment are x's); the launch reads buffers "dy" and "x" and writes "dx". None where no
    such kernel is built (V.grad_from_input_shapes, V.grad_cached_from_input_built: rows the two-pass
    split takes; rows of one float32 column, whose groups take several rows a step; 16-bit rows held
    in registers other than whole ones in 16-byte slots; rows of scalar slots): compute y first there.

    >>> from portable_softmax.planner import DeviceProfile
    >>> p = plan_backward_from_input(GradRowProblem("float32", "softmax", 8192, 8192), DeviceProfile.h100())
    >>> p.regime, p.launches[0].kernel
    ('a block a row', 'ps_bwd_from_input_rows_f32_softmax_w32_g512_s8_v4')
    """
    # the staged rows hold a tile of y, not a row of x in registers: the register regimes' shapes
    the_plan = plan_backward(problem, device, replace(tuning, staged_itemsizes=()))
    if not the_plan.launches:
        return the_plan
    notes = the_plan.notes
    if the_plan.tier not in ("warp", "block", "cached"):
        return None
    if the_plan.tier == "cached":
        return _cached_from_input(problem, device, tuning, the_plan)
    if V.DTYPES[problem.dtype][2] == 2 and not whole_rows(problem, notes["vec"]):
        return None
    if (notes["lanes"], notes["slots"]) not in V.grad_from_input_shapes(problem.dtype, device.warp_size,
                                                                         notes["vec"]):
        return None
    return _reading_x(the_plan, V.grad_rows_from_input_name(problem.dtype, problem.op, device.warp_size,
                                                            notes["lanes"], notes["slots"], notes["vec"]))


def _reading_x(the_plan: Plan, kernel: str, **changes) -> Plan:
    """The gradient from y's one-launch plan as the gradient from x's: its launch's kernel ``kernel``,
    reading buffer "x" where it read "y" (the plan's other fields as ``changes`` says)."""
    launch = the_plan.launches[0]
    args = tuple((kind, "x") if (kind, value) == (PTR, "y") else (kind, value) for kind, value in launch.args)
    fitted = V.fitted_name(kernel) if launch.fitted_kernel else ""
    return replace(the_plan, launches=(replace(launch, kernel=kernel, args=args, fitted_kernel=fitted),), **changes)


def _cached_from_input(problem: GradRowProblem, device: DeviceProfile, tuning: GradTuning,
                       the_plan: Plan) -> Plan | None:
    """The on-chip split's gradient from x, in the launch shape of its gradient from y: each chunk
    publishes three doubles (its max of x, and its sums relative to it: InputChunk) where the
    gradient from y publishes two. Its 16-bit kernels hold fewer blocks a multiprocessor
    (V.grad_cached_min_blocks): rows of more chunks than multiprocessors are held to those."""
    vec = the_plan.notes["vec"]
    if not V.grad_cached_from_input_built(problem.dtype, vec):
        return None
    whole = whole_rows(problem, vec)
    min_blocks = V.grad_cached_min_blocks(problem.dtype, vec, True)
    if not _cached_fits(tuning, problem, device, _Shape(vec, grad_slots(problem, vec), whole), min_blocks):
        return None
    scratch = (("sums", problem.rows * the_plan.notes["chunks"] * 3 * 8), ("arrivals", problem.rows * 4))
    name = V.grad_cached_from_input_name(problem.dtype, problem.op, device.warp_size, vec, whole)
    return _reading_x(the_plan, name, scratch=scratch)


def plan_split_passes(problem: GradRowProblem, device: DeviceProfile, tuning: GradTuning | None = None) -> Plan:
    """The two passes apart over contiguous rows, whatever their length, for a caller that combines
    each row's sums between them (the sharded softmax's all_reduce): the first launch writes each chunk's
    GradSum to ``sums`` (two doubles a chunk, a row's ``notes["chunks"]`` chunks side by side), the
    second finishes each chunk from the row's sums as it then finds them there. Rows a warp holds take
    a warp each (one chunk a row, _rows_passes); longer ones the split, one chunk a row where the rows
    fill the device, more where they are few."""
    _check(problem.dtype, problem.op, device)
    t = DEFAULT_GRAD_TUNING if tuning is None else tuning
    vec = grad_vector_width(problem, narrow=False)
    return _rows_passes(t, problem, device, vec) or _split(t, problem, device, _Shape(vec, grad_slots(problem, vec)))


def _rows_passes(t: GradTuning, p: GradRowProblem, device: DeviceProfile, vec: int) -> Plan | None:
    """Rows a warp holds in two passes apart (the forward's planner._rows_passes): a warp a row, its
    sums written by the first pass, dx by the second from the sums it then finds there; None where
    dy, y and dx misalign differently or the rows are too long."""
    if not t.passes_rows_in_registers or vec != V.vector_widths(p.dtype)[1]:
        return None
    warp = device.warp_size
    needed = ceil(grad_slots(p, vec) / warp)
    slots = next((s for s in V.grad_rows_pass_slots(p.dtype) if s >= needed), None)
    if slots is None:
        return None
    threads = V.GRAD_ROWS_THREADS
    grid = _work_grid(ceil(p.rows / (threads // warp)), device)
    dys, ys, _ = p.row_strides()
    sums = Launch(V.grad_rows_sums_name(p.dtype, p.op, warp, slots), grid, threads, 0,
                  ((PTR, "dy"), (PTR, "y"), (PTR, "sums"), (I64, p.rows), (I64, p.cols), (I64, dys), (I64, ys)),
                  cut_to_one_wave=False)
    finish = Launch(V.grad_rows_finish_name(p.dtype, p.op, warp, slots), grid, threads, 0,
                    ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (PTR, "sums"), *_row_args(p), (I32, int(p.safe))),
                    cut_to_one_wave=False)
    return Plan("warp", (sums, finish), (("sums", p.rows * 2 * 8),),
                notes={"chunks": 1, "slots": slots, "vec": vec}, scratch_zeroed=False)


def plan_strided_passes(problem: GradStridedProblem, device: DeviceProfile) -> Plan:
    """The strided passes apart, for a caller that combines each position's sums between them (an axis
    sharded across ranks, whose all_reduce runs there), shaped as the forward's
    (planner.strided_passes): the first launch writes the GradSum of each chunk of each position to
    ``sums`` (two doubles each, in the order of a contiguous (outer, ``notes["chunks"]``, inner)
    array), for the caller to merge a position's chunks; the second finishes each position from the
    sums it then finds there (one pair a position, in the order of a contiguous (outer, inner) array).

    >>> from portable_softmax.planner import DeviceProfile
    >>> strides = (64 * 4096, 4096, 1)
    >>> p = plan_strided_passes(GradStridedProblem("float32", "softmax", 8, 64, 4096, strides, strides, strides),
    ...                         DeviceProfile.h100())
    >>> [launch.kernel for launch in p.launches]
    ['ps_bwd_strided_sums_f32_softmax_v4_l1', 'ps_bwd_strided_finish_f32_softmax_v4_l1']
    """
    _check(problem.dtype, problem.op, device)
    p = problem
    if p.outer * p.inner <= 0 or p.cols <= 0:
        return Plan("empty", ())
    vec = widest_aligned(V.strided_thread_widths(p.dtype), p.outer, p.inner,
                         (p.dy_strides, p.y_strides, p.dx_strides), p.misaligns)
    s = strided_passes(default_tuning(device), device, p.dtype, p.outer, p.cols, p.inner, vec)
    view = _view_args(p)  # dy, y, dx, (outer, cols, inner), then each one's strides
    sums = Launch(V.grad_strided_sums_name(p.dtype, p.op, s.vec, s.lines), s.grid, s.threads, 0,
                  (*view[:2], (PTR, "sums"), *view[3:12], *s.chunk_args))
    finish = Launch(V.grad_strided_finish_name(p.dtype, p.op, s.vec, s.lines), s.grid, s.threads, 0,
                    (*view[:3], (PTR, "sums"), *view[3:], (I32, int(p.safe)), *s.chunk_args))
    return Plan("strided_thread", (sums, finish), (("sums", p.outer * s.chunks * p.inner * 16),), s.notes,
                scratch_zeroed=False)


def _lines(t: GradTuning, p: GradStridedProblem) -> _Lines:
    """The forward's short-axis shape (planner.widest_aligned, planner.strided_thread_lines) over
    dy, y and dx."""
    vec = widest_aligned(V.strided_thread_widths(p.dtype), p.outer, p.inner,
                         (p.dy_strides, p.y_strides, p.dx_strides), p.misaligns)
    lines_a_thread = strided_thread_lines(p.dtype, vec, p.cols)
    blocks = ceil(p.outer * ceil(p.inner / vec) / (t.strided_thread_threads * lines_a_thread))
    return _Lines(vec, lines_a_thread, blocks)


def _view_args(p: GradStridedProblem) -> tuple:
    return ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (I64, p.outer), (I64, p.cols), (I64, p.inner),
            *((I64, s) for s in (*p.dy_strides, *p.y_strides, *p.dx_strides)))


def _strided_thread(t: GradTuning, p: GradStridedProblem, device: DeviceProfile, s: _Lines) -> Plan:
    launch = Launch(V.grad_strided_thread_name(p.dtype, p.op, s.vec, s.lines), _work_grid(s.blocks, device),
                    t.strided_thread_threads, 0, (*_view_args(p), (I32, int(p.safe))))
    return Plan("strided_thread", (launch,), notes={"vec": s.vec, "lines": s.lines}, scratch_zeroed=False)


def _strided_groups(t: GradTuning, p: GradStridedProblem, device: DeviceProfile, s: _Lines) -> Plan:
    inner_tile = min(device.warp_size, V.next_pow2(p.inner))
    threads = min(device.max_threads_per_block, max(256, inner_tile * min(32, p.cols)))
    launch = Launch(V.grad_strided_name(p.dtype, p.op), grid_for(p.outer * ceil(p.inner / inner_tile), device, 8),
                    threads, 0, (*_view_args(p), (I32, inner_tile), (I32, int(p.safe))))
    return Plan("strided", (launch,), notes={"inner_tile": inner_tile}, scratch_zeroed=False)


def _cached_tiles(p: GradStridedProblem, device: DeviceProfile) -> tuple[int, Any] | None:
    """(vec, planner.StridedTiles) of the on-chip strided tier over dy and y, with the forward's
    numbers for the device (planner.default_tuning), or None where it does not fit, the device
    copies synchronously (V.ASYNC_COPY_MACROS) or the elements are not of
    V.GRAD_STRIDED_CACHED_ITEMSIZES."""
    itemsize = V.DTYPES[p.dtype][2]
    # has_async_copy is looked up when called: the emulation's tests patch it
    if not _planner.has_async_copy(device) or itemsize not in V.GRAD_STRIDED_CACHED_ITEMSIZES:
        return None
    t = default_tuning(device)
    vec = strided_cached_vec(t, p.dtype, p.outer, p.inner, (p.dy_strides, p.y_strides, p.dx_strides), p.misaligns)
    tiles = strided_tiles(t, device, p.dtype, p.outer, p.cols, p.inner, vec, inputs=2,
                          partial_bytes=8 + _compute_bytes(p.dtype))  # a GradSum: the double sum, the top of y
    return None if tiles is None else (vec, tiles)


def _strided_cached(t: GradTuning, p: GradStridedProblem, device: DeviceProfile, s: _Lines) -> Plan:
    vec, c = _cached_tiles(p, device)
    launch = Launch(V.grad_strided_cached_name(p.dtype, p.op, vec), c.grid, c.threads, c.shared,
                    ((PTR, "dy"), (PTR, "y"), (PTR, "dx"), (PTR, "sums"), (PTR, "arrivals"), *_view_args(p)[3:],
                     (I32, c.inner_tile), (I64, c.chunk_cols), (I64, c.chunks), (I32, int(p.safe))),
                    cooperative=True, min_grid=c.chunks)
    scratch = (("sums", c.tiles * c.chunks * c.width * 16), ("arrivals", 4 * c.tiles))  # a GradSum: two doubles
    return Plan("strided_cached", (launch,), scratch,
                notes={"inner_tile": c.inner_tile, "vec": vec, "chunks": c.chunks, "chunk_cols": c.chunk_cols})


#: The planner for a strided (non-last) axis, in order: the first rule that takes a problem builds its plan.
STRIDED_RULES: tuple[Rule, ...] = (
    Rule("empty", "no lines, or lines of no elements: nothing to launch",
         lambda t, p, d, s: p.outer * p.inner <= 0 or p.cols <= 0, lambda t, p, d, s: Plan("empty", ())),
    Rule("a strided axis, on chip", "axes whose tiles of dy and y fill a block's shared memory: chunks on "
         "co-resident blocks, dy and y read once (the forward's strided_cached)",
         lambda t, p, d, s: _cached_tiles(p, d) is not None, _strided_cached),
    Rule("a short strided axis", "up to strided_thread_short_cols rows: a thread per 16 bytes of inner positions "
         "down the whole axis, no barrier (column groups would idle, and meet every few values)",
         lambda t, p, d, s: p.cols <= t.strided_thread_short_cols, _strided_thread),
    Rule("a short strided axis, many lines", "up to strided_thread_max_cols rows over wide inner positions of "
         "2- and 4-byte elements, where the lines give most multiprocessors a block (fewer lines leave the "
         "device short of loads in flight, which column groups split the axis to make)",
         lambda t, p, d, s: p.cols <= t.strided_thread_max_cols and p.inner >= t.strided_thread_min_inner
         and V.DTYPES[p.dtype][2] in t.strided_thread_max_cols_itemsizes
         and s.blocks >= t.strided_thread_min_fill * d.multiprocessors, _strided_thread),
    Rule("a strided axis", "other axes: a warp's worth of neighbouring inner positions (fewer where inner is "
         "small) a block, the axis split among its column groups, read twice", lambda t, p, d, s: True,
         _strided_groups),
)

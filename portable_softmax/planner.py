"""The dispatch planner: a pure function from (problem, device limits, Tuning) to launches.

A plan takes one of five regimes (REGIMES; docs/design.md says what each is for): short rows,
a warp a row, a block a row, a row split across blocks, a strided axis. The planner is two
ordered tables of rules, ROW_RULES and STRIDED_RULES (each rule: a name, why it exists, when it
takes a problem, the plan it builds): the first rule that takes a problem builds its plan, and its
kernels are named once, at the end (Kernel, KERNEL_NAMES). Its numbers are a Tuning, passed in.
Nothing here touches a GPU, so every decision is unit-tested against device profiles (an NVIDIA
H100, an AMD MI300X at warp 64, an RDNA3 card at warp 32).

>>> from portable_softmax.planner import DeviceProfile, RowProblem, plan
>>> h100 = DeviceProfile.h100()
>>> p = plan(RowProblem("float32", "softmax", rows=4096, cols=1000), h100)
>>> p.tier, p.launches[0].kernel
('warp', 'ps_warp_f32_softmax_w32_l32_s8_v4')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from math import ceil, lcm

from . import _variants as V

#: argument kinds understood by every runtime adapter
PTR, I64, I32 = "ptr", "i64", "i32"


@dataclass(frozen=True)
class DeviceProfile:
    """What the planner needs to know about a device (read by the probe)."""

    name: str
    vendor: str  # "nvidia" | "amd" | "emulated"
    arch: str
    warp_size: int
    multiprocessors: int
    max_threads_per_block: int = 1024
    shared_mem_per_block: int = 48 * 1024
    shared_mem_per_block_optin: int = 48 * 1024
    max_grid_x: int = 2**31 - 1
    max_threads_per_multiprocessor: int = 2048
    shared_mem_per_multiprocessor: int = 64 * 1024

    @classmethod
    def h100(cls) -> DeviceProfile:
        return cls("NVIDIA H100 80GB HBM3", "nvidia", "sm_90", 32, 132, 1024, 48 * 1024, 227 * 1024,
                   shared_mem_per_multiprocessor=228 * 1024)

    @classmethod
    def mi300x(cls) -> DeviceProfile:
        return cls("AMD Instinct MI300X", "amd", "gfx942", 64, 304, 1024, 64 * 1024, 64 * 1024)

    @classmethod
    def rdna3(cls) -> DeviceProfile:
        return cls("AMD Radeon RX 7900 XTX", "amd", "gfx1100", 32, 96, 1024, 64 * 1024, 64 * 1024)


@dataclass(frozen=True)
class RowProblem:
    """Softmax along contiguous rows: element (r, c) at x[r * x_stride + c].

    ``x_misalign`` / ``y_misalign`` are the base addresses in elements modulo the
    widest vector (``address // itemsize % (16 // itemsize)``).
    """

    dtype: str
    op: str
    rows: int
    cols: int
    x_stride: int | None = None
    y_stride: int | None = None
    x_misalign: int = 0
    y_misalign: int = 0
    safe: bool = False

    def strides(self) -> tuple[int, int]:
        return (self.cols if self.x_stride is None else self.x_stride,
                self.cols if self.y_stride is None else self.y_stride)


@dataclass(frozen=True)
class StridedProblem:
    """Softmax along the middle axis of an (outer, cols, inner) view with element strides."""

    dtype: str
    op: str
    outer: int
    cols: int
    inner: int
    x_strides: tuple[int, int, int]
    y_strides: tuple[int, int, int]
    safe: bool = False
    #: base addresses in elements modulo the widest vector, as RowProblem's
    x_misalign: int = 0
    y_misalign: int = 0


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: int
    block: int
    shared_mem: int
    #: (kind, value): kind PTR takes a buffer name ("x", "y", or a scratch buffer's name)
    args: tuple[tuple[str, int | str], ...]
    #: every block must be resident at once (blocks wait on each other); the runtime may
    #: shrink the grid to what fits, never below min_grid
    cooperative: bool = False
    min_grid: int = 1
    #: the runtime cuts the grid to one wave of resident blocks (grid-stride loops do the rest);
    #: False launches it as planned, a block per share of the work
    cut_to_one_wave: bool = True
    #: a block a row (0 elsewhere): the fewest threads, whole warps, that hold the row, the kernel
    #: that strides by the block's threads to run at them, and a grid of a block per row. The
    #: runtime launches with them as the kernels' occupancy says (resident_launch).
    fitted_block: int = 0
    fitted_kernel: str = ""
    row_grid: int = 0


#: alignment of each buffer in a plan's scratch allocation
SCRATCH_ALIGN = 256


#: tier (Plan.tier) -> regime: short rows, a warp a row, a block a row, a row split across blocks,
#: a strided axis
REGIMES = {"empty": "empty", "packed": "short rows", "staged": "short rows", "staged_group": "short rows",
           "warp": "a warp a row", "staged_warp": "a warp a row", "block": "a block a row",
           "block_registers": "a block a row", "cached": "a row split across blocks",
           "split": "a row split across blocks", "strided_thread": "a strided axis",
           "strided_cached": "a strided axis", "strided": "a strided axis"}


@dataclass(frozen=True)
class Plan:
    tier: str
    launches: tuple[Launch, ...]
    #: device scratch buffers (name, bytes) the launches address by name
    scratch: tuple[tuple[str, int], ...] = ()
    notes: dict = field(default_factory=dict, compare=False)
    #: True: the launches find their scratch zero and leave it zero (each count and published pair
    #: cleared once its readers are past it), so one zero fill serves every later call on a stream;
    #: False: they write every scratch byte before reading it, and it needs no fill
    scratch_zeroed: bool = True

    @property
    def regime(self) -> str:
        """The regime of the plan's tier (REGIMES), as docs/design.md names it."""
        return REGIMES[self.tier]

    @property
    def scratch_bytes(self) -> int:
        return sum(n for _, n in self.scratch)

    def scratch_layout(self) -> tuple[int, dict[str, int]]:
        """The scratch buffers as one allocation, so that one fill zeroes them all: its bytes, and
        each buffer's offset in it (256-byte aligned, like a fresh allocation)."""
        offsets, total = {}, 0
        for name, nbytes in self.scratch:
            offsets[name] = total
            total += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        return total, offsets


#: kernel family -> the name of its entry point for the family's parameters (a Kernel's)
KERNEL_NAMES: dict[str, Callable[..., str]] = {
    "packed": V.packed_name, "staged": V.staged_name, "staged_group": V.staged_group_name,
    "staged_warp": V.staged_warp_name, "warp": lambda variant: variant.name, "block": V.block_name,
    "block_registers": V.block_registers_name, "cached": V.split_cached_name,
    "cached_registers": V.split_cached_registers_name, "split_partials": V.split_partials_name,
    "split_partials_buffered": V.split_partials_buffered_name,
    "split_normalize_buffered": V.split_normalize_buffered_name,
    "split_normalize": V.split_normalize_name, "strided": V.strided_name, "strided_thread": V.strided_thread_name,
    "strided_cached": V.strided_cached_name, "strided_partials": V.strided_partials_name,
    "strided_finish": V.strided_finish_name, "rows_partials": V.rows_partials_name,
    "rows_finish": V.rows_finish_name,
}


@dataclass(frozen=True)
class Kernel:
    """A kernel as a rule picks it: its family (a key of KERNEL_NAMES) and the parameters that pick
    one entry point of it; named once a plan is chosen.

    >>> Kernel("block", ("float32", "softmax", 32, 4)).name
    'ps_block_f32_softmax_w32_v4'
    """

    family: str
    params: tuple = ()

    @property
    def name(self) -> str:
        return KERNEL_NAMES[self.family](*self.params)


@dataclass(frozen=True)
class Step:
    """A launch as a rule builds it: Launch's fields, with its kernel not yet named."""

    kernel: Kernel
    grid: int
    block: int
    shared_mem: int
    args: tuple[tuple[str, int | str], ...]
    cooperative: bool = False
    min_grid: int = 1
    cut_to_one_wave: bool = True


@dataclass(frozen=True)
class Draft:
    """A plan as a rule builds it, its launches' kernels not yet named (resolve names them)."""

    tier: str
    steps: tuple[Step, ...]
    scratch: tuple[tuple[str, int], ...] = ()
    notes: dict = field(default_factory=dict, compare=False)
    scratch_zeroed: bool = True

    def resolve(self) -> Plan:
        launches = tuple(Launch(s.kernel.name, s.grid, s.block, s.shared_mem, s.args, s.cooperative, s.min_grid,
                                s.cut_to_one_wave) for s in self.steps)
        return Plan(self.tier, launches, self.scratch, self.notes, self.scratch_zeroed)


class SizeMap(dict):
    """Bytes per element -> a value: an immutable, hashable dict (a Tuning field)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def _immutable(self, *args, **kwargs):
        raise TypeError("a SizeMap is immutable; build a Tuning with dataclasses.replace")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable  # type: ignore[assignment]


@dataclass(frozen=True)
class Tuning:
    """The planner's numbers: every threshold and size it weighs, for one device family.

    ``plan(problem, device)`` takes the family's default (default_tuning); an A/B comparison passes
    ``plan(problem, device, dataclasses.replace(default_tuning(device), field=value))``. Sizes by
    element size are SizeMaps (bytes per element -> value). docs/design.md gives the figures behind
    the defaults.

    >>> from dataclasses import replace
    >>> replace(DEFAULT_TUNING, block_tier_max_threads=256).block_tier_max_threads
    256
    """

    # -- a warp a row: the register tier --------------------------------------------------------
    #: rows of scalar_rows_min_cols..scalar_rows_max_cols take scalar slots (coalesced element loads,
    #: no partial vector heads and tails): every float32 row; 16-bit rows that are not whole vectors
    #: where they fill scalar_rows_full of the slots (scalar_rows_min_fill past the staged tier's
    #: short rows)
    scalar_rows_min_cols: int = V.SCALAR_ROWS_MIN_COLS
    scalar_rows_max_cols: int = 512
    scalar_rows_min_fill: float = 0.75
    scalar_rows_full: float = 0.9
    #: values a lane holds at most, by element size: longer rows take the block tier
    warp_tier_max_values: SizeMap = SizeMap(V.MAX_VALUES_PER_LANE_BY_ITEMSIZE)
    #: the same for rows on 4-byte boundaries (where the block tier fills its cache asynchronously,
    #: it takes such rows sooner)
    warp_tier_max_values_whole_words: SizeMap = SizeMap(V.MAX_VALUES_PER_LANE_BY_ITEMSIZE)

    # -- short rows: the staged tier (a thread a row through shared memory) ----------------------
    #: contiguous rows of staged_min_cols elements up to staged_max_row_bytes that are not whole
    #: 16-byte vectors: the block copies their span with aligned vectors
    staged_min_cols: int = 5
    staged_max_row_bytes: int = 512
    #: bytes of the span a thread moves a step
    staged_bytes_per_thread: int = 128
    #: threads of a block for rows up to staged_short_row_bytes, and for longer ones
    staged_threads: int = 128
    staged_threads_long_rows: int = 64
    staged_short_row_bytes: int = 256
    #: rows of up to this many columns, by element size, staged ahead of scalar slots
    staged_before_scalar_cols: SizeMap = SizeMap()
    #: rows of whole 16-byte vectors of (from, to) bytes staged too ((1, 0): none)
    staged_whole_vector_bytes: tuple = (1, 0)

    # -- small inputs: a call is about one round of latency, so spread it wide --------------------
    #: the staged, packed and register tiers' blocks shrink until the grid has this many blocks a
    #: multiprocessor where the rows allow (0: off)
    small_input_blocks_per_sm: float = 4.0
    #: inputs under this many bytes, of rows of small_input_unstaged_min_cols or more, skip the
    #: staged tiers for lanes a row, whose values are reduced in parallel
    small_input_unstaged_bytes: int = 8 << 20
    small_input_unstaged_min_cols: int = V.ONE_ROW_MIN_VALUES
    #: rows a whole warp reads several at a time take one row a warp (the shortest variant that
    #: holds them, at most one_row_a_warp_most_slots times the slots needed; one_row_a_warp_shallow:
    #: one slot a lane, taking one row a step) while they fit this many waves of resident warps
    small_input_one_row_a_warp_waves: float = 1.0
    one_row_a_warp_most_slots: int = 4
    one_row_a_warp_shallow: bool = True
    #: lane groups of one 16-byte slot a lane take one row a step (twice the warps, half the
    #: values each) while their warps fit this many waves
    small_input_one_row_group_waves: float = 4.0
    #: rows that fill a one-slot group of exact_group_min_lanes or more take it ahead of the staged
    #: tiers, up to exact_group_max_bytes of input by element size
    exact_group_min_lanes: int = 16
    exact_group_max_bytes: SizeMap = SizeMap({2: 32 << 20})
    #: inputs up to this many bytes whose rows a group of fewer lanes than a warp holds in one
    #: slot a lane skip the staged tiers too
    small_input_group_bytes: int = 12 << 20

    # -- few tiles: a staged block's load, reduction and store in turn are not hidden ------------
    #: a staged plan of fewer tiles than this a multiprocessor gives way to the block tier, or to the
    #: register tier where it reads rows in whole slots (one warp: staged_min_tiles_per_sm_one_warp,
    #: rows filling few_tiles_min_fill of its slots; shorter rows of few_tiles_short_row_itemsizes)
    staged_min_tiles_per_sm: int = 8
    staged_min_tiles_per_sm_one_warp: int = 6
    few_tiles_min_fill: float = 0.8
    few_tiles_short_row_itemsizes: tuple = (4,)
    #: staged plans that keep few tiles cut them for this many blocks a multiprocessor (0: off),
    #: for inputs of few_tiles_smaller_min_bytes or more
    few_tiles_blocks_per_sm: float = 16.0
    few_tiles_smaller_min_bytes: int = 2 << 20

    # -- the staged tier with a warp a row, and with a group of lanes a row (NVIDIA sm_80+) ------
    #: contiguous rows of (from, to) bytes and these element sizes: a warp a row, lanes a word apart
    staged_warp_row_bytes: tuple = (514, 8000)
    staged_warp_itemsizes: tuple = V.STAGED_WARP_ITEMSIZES
    staged_warp_bytes_per_thread: int = 128
    #: groups of 4-16 lanes a row (the fewest that qualify): a lane takes at least
    #: staged_group_min_words words, a row a group fits staged_group_tile_bytes, and no bank is read
    #: by more than staged_group_max_ways lanes at once in one of staged_group_orders (rows in order,
    #: or interleaved)
    staged_groups: bool = True
    staged_group_max_row_bytes: SizeMap = SizeMap(V.STAGED_GROUP_MAX_ROW_BYTES)
    staged_group_min_words: int = V.STAGED_GROUP_MIN_WORDS
    staged_group_tile_bytes: int = 24 * 1024
    staged_group_max_ways: int = 2
    staged_group_orders: tuple = (False, True)
    #: rows of a power-of-two number of slots (whose groups start on the same banks) are padded by a
    #: slot in the tile, from staged_group_padded_min_row_bytes up to the maximum by element size
    staged_group_padded_max_row_bytes: SizeMap = SizeMap({2: 8000})
    staged_group_padded_min_row_bytes: int = 128
    #: rows of more than this many bytes (up to staged_short_row_bytes) and an even number of words
    #: take groups too: a thread a row would start each at a different word
    staged_group_short_min_row_bytes: int = 192
    #: bytes of the span a thread moves a step, unpadded (while the tile keeps
    #: staged_group_min_tile_bytes) and padded
    staged_group_bytes_per_thread: int = 64
    staged_group_padded_bytes_per_thread: int = 128
    staged_group_min_tile_bytes: int = 12 * 1024

    # -- short rows: the packed tier (whole rows inside a thread's vectors) ----------------------
    packed_threads: int = 256
    #: groups of more values than this take two tiles a block where copies are asynchronous
    #: (packed_stages: the next round's copies in flight while one is stored; packed_rounds a block)
    packed_two_tiles_above: int = 32
    packed_stages: int = 2
    packed_rounds: int = 2
    #: such groups take the packed tier only from this many blocks a multiprocessor on (else the
    #: staged tier's smaller blocks spread the rows wider)
    packed_large_groups_min_blocks_per_sm: float = 0.5
    #: small inputs (small_input_unstaged_bytes) of whole-vector rows take groups of up to this many
    #: values on any grid; rows of partial vectors, from this many groups a multiprocessor
    packed_unstaged_small_grid_most_values: int = 40
    packed_unstaged_partial_min_groups_per_sm: int = 96
    #: groups of more values than this are widened a row at a time, in blocks of
    #: packed_wide_group_threads, from packed_wide_min_groups_per_sm groups a multiprocessor on
    packed_widened_most: int = 64
    packed_wide_group_threads: int = 64
    packed_wide_min_groups_per_sm: int = 512

    # -- a block a row ---------------------------------------------------------------------------
    #: threads of a block at most and warps at least; slots a thread streams (fewer where rows are
    #: fewer than multiprocessors: a call is then one row's latency)
    block_tier_max_threads: int = 512
    block_tier_min_warps: int = 1
    block_tier_slots_per_thread: int = 8
    block_tier_few_rows_slots_per_thread: int = 2
    #: inputs under small_input_block_bytes (by element size where listed): more warps a block,
    #: small_input_block_slots_per_thread slots a thread, but one warp for rows of up to
    #: small_input_block_one_warp_slots_per_thread slots a lane (no reduction across warps)
    small_input_block_slots_per_thread: int = 4
    small_input_block_bytes: int = 8 << 20
    small_input_block_bytes_by_itemsize: SizeMap = SizeMap({2: 16 << 20})
    small_input_block_one_warp_slots_per_thread: int = 5
    #: a row takes at most 1 / block_tier_sm_share of a multiprocessor's shared memory, so several
    #: blocks overlap one's reduction with the others' loads
    block_tier_sm_share: int = 2
    #: with asynchronous copies, rows one block's whole shared memory holds take a block alone on
    #: its multiprocessor (no block waits on another), where they make block_alone_min_waves waves
    block_tier_whole_sm: bool = True
    #: with asynchronous copies, longer rows keep row_register_slots slots a thread in registers
    #: and the rest in shared memory (block_registers), two blocks of half the launch bound's
    #: threads a multiprocessor where they fit (row_registers_paired)
    row_registers: bool = True
    row_register_slots: int = 8
    row_registers_threads: int = V.LAUNCH_BOUND_THREADS["block_registers"]
    row_registers_paired: bool = True
    block_alone_min_waves: int = 4

    # -- a row split across blocks ---------------------------------------------------------------
    #: threads of an on-chip split block, and chunks a multiprocessor holds (several, so one's loads
    #: overlap another's wait), by element size where listed
    cached_threads: int = 256
    cached_chunks_per_sm: int = 4
    cached_chunks_per_sm_by_itemsize: SizeMap = SizeMap({2: 5})
    cached_threads_by_itemsize: SizeMap = SizeMap({4: 384})
    #: chunks a multiprocessor that a few rows make at least (smaller chunks spread them)
    split_min_chunks_per_sm: int = 2
    #: rows taking more than one and at most this many rounds of the resident grid are cut into
    #: more, smaller chunks so that every round takes as many rows (these element sizes)
    split_even_rounds_most: float = 1.65
    split_even_rounds_itemsizes: tuple = (4,)
    #: with asynchronous copies, (slots a thread in registers, blocks a multiprocessor) of the
    #: on-chip split by element size; rows fewer than multiprocessors take it only for the sizes in
    #: split_registers_full_grid where their chunks fill its resident grid
    split_registers: SizeMap = SizeMap({size: pairs[0] for size, pairs in V.SPLIT_REGISTERS_CONFIGS.items()})
    split_registers_threads: int = V.LAUNCH_BOUND_THREADS["cached_registers"]
    split_registers_full_grid: tuple = (2, 4)
    #: rows past one held chunk a multiprocessor take several a multiprocessor (as many as the
    #: held form keeps resident), the grid filled with whole rows (two or more a round), rather
    #: than the two passes
    split_registers_spanning_rows: bool = True
    #: with asynchronous copies, the two-pass split's first pass takes its chunks through a buffer
    #: of split_buffer_bytes in shared memory (a thread's whole share of it in flight at once), in
    #: blocks of split_buffer_threads, and so does its second pass for 16-bit values (streamed,
    #: their 8-wide slots keep two in flight a thread); 0: both passes stream. The buffer takes at
    #: most a split_buffer_blocks_per_sm-th of a multiprocessor's shared memory (less 2 KiB a block
    #: for its static arrays and the runtime's reserve), so that as many blocks share one
    split_buffer_bytes: int = 0
    split_buffer_threads: int = 256
    split_buffer_blocks_per_sm: int = 3
    #: a chunk of the two passes shorter than this many slots a thread of a full block streams in a
    #: smaller block of about that many slots a thread (split_stream_threads), and not through the
    #: buffer: a short row a block of 512 threads would leave most of them without a load (the
    #: sharded softmax's local rows of a few thousand columns); 0: full blocks always
    split_stream_slots_per_thread: int = 4
    #: the two passes apart (plan_split_passes) take rows a warp's registers hold a warp a row (the
    #: rows regime's passes), and the split's only for longer rows
    passes_rows_in_registers: bool = True
    #: chunks start on multiples of this many bytes from the row's first aligned slot, so that no
    #: warp access of a chunk spans a cache line more than it fills
    chunk_align_bytes: int = 256

    # -- a strided axis --------------------------------------------------------------------------
    #: axes whose tile (inner positions a block takes x the axis) fills this share of a block's
    #: shared memory are cached on chip across co-resident blocks (one read); a tile row is
    #: strided_row_bytes (one line), strided_chunks_per_sm chunks a multiprocessor
    strided_cached_min_tile: float = 1.0
    strided_cached_threads: int = 256
    strided_row_bytes: int = 128
    strided_chunks_per_sm: int = 4
    #: element sizes whose inner positions are read as vectors where aligned
    strided_vector_itemsizes: tuple = (2, 4, 8)
    #: other axes of up to strided_thread_short_cols rows, or up to strided_thread_max_cols over at
    #: least strided_thread_min_inner inner positions: a thread per 16 bytes of inner positions
    strided_thread_short_cols: int = 64
    strided_thread_max_cols: int = 512
    strided_thread_min_inner: int = 32
    strided_thread_threads: int = 256
    #: the strided passes apart (a sharded non-last axis) cut the axis into chunks until its threads
    #: number strided_pass_threads_per_sm a multiprocessor, each chunk of at least
    #: strided_pass_min_chunk_rows rows (a chunk's partial is written and merged as a row of it is read)
    strided_pass_threads_per_sm: int = 2048
    strided_pass_min_chunk_rows: int = 64

    def __post_init__(self) -> None:
        # dicts and lists given to replace() become SizeMaps and tuples, so a Tuning stays hashable
        for name, value in vars(self).items():
            if isinstance(value, dict) and not isinstance(value, SizeMap):
                object.__setattr__(self, name, SizeMap(value))
            elif isinstance(value, list):
                object.__setattr__(self, name, tuple(value))


#: every device without asynchronous copies (AMD, NVIDIA before sm_80, the emulation)
DEFAULT_TUNING = Tuning()
#: NVIDIA sm_80 and newer: asynchronous copies fill shared memory without registers, so the staged
#: and block tiers take longer rows, and 16-bit rows on 4-byte boundaries leave the register tier sooner
ASYNC_COPY_TUNING = Tuning(warp_tier_max_values_whole_words=SizeMap({2: 16}), staged_max_row_bytes=576,
                           staged_before_scalar_cols=SizeMap({2: 512, 4: 80}), staged_whole_vector_bytes=(48, 496),
                           split_buffer_bytes=65536)


class PlanError(ValueError):
    pass


def one_wave(launch: Launch, blocks_per_multiprocessor: int, multiprocessors: int) -> int:
    """The launch's grid cut to one wave of resident blocks.

    Every kernel loops over its work with a grid stride, so one full wave does it all without
    a half-empty last wave; blocks of a cooperative launch wait on each other and must all be
    resident, in whole rows of min_grid blocks.
    """
    if not launch.cut_to_one_wave and not launch.cooperative:
        return launch.grid
    resident = blocks_per_multiprocessor * multiprocessors
    if resident < launch.min_grid:
        raise PlanError(f"{launch.kernel} needs {launch.min_grid} resident blocks; the device holds {resident}")
    grid = min(launch.grid, resident)
    return grid - grid % launch.min_grid


def resident_launch(launch: Launch, blocks_at: Callable[[str, int], int]) -> Launch:
    """The kernel, block and grid a runtime launches ``launch`` with, ``blocks_at(kernel, threads)``
    giving a kernel's blocks a multiprocessor at blocks of that many threads (its occupancy, which
    its registers set as much as its threads).

    A block a row takes its fitted kernel and block where they hold more blocks a multiprocessor
    than the shape's: more rows in flight. Fewer threads holding no more rows only lose the warps
    that hide a row's reduction and stores. With two or more blocks resident it takes a block per
    row, each block's start hidden by its neighbours' work, and no tail of blocks looping over
    their last rows; one resident block keeps the grid-stride loop, which spares it a block's start
    between rows (docs/design.md).

    >>> step = Launch("k", 4224, 512, 0, (), cut_to_one_wave=False, fitted_block=288, fitted_kernel="k_fitted",
    ...               row_grid=8192)
    >>> made = resident_launch(step, lambda kernel, threads: 2 if threads <= 288 else 1)
    >>> made.kernel, made.block, made.grid
    ('k_fitted', 288, 8192)
    >>> resident_launch(step, lambda kernel, threads: 1).grid
    4224
    """
    if not launch.fitted_block:
        return launch
    kernel, block, resident = launch.kernel, launch.block, blocks_at(launch.kernel, launch.block)
    if launch.fitted_block < launch.block:
        fitted = blocks_at(launch.fitted_kernel, launch.fitted_block)
        if fitted > resident:
            kernel, block, resident = launch.fitted_kernel, launch.fitted_block, fitted
    return replace(launch, kernel=kernel, block=block, grid=launch.row_grid if resident >= 2 else launch.grid)


def _check_common(dtype: str, op: str, device: DeviceProfile) -> None:
    if dtype not in V.DTYPES:
        raise PlanError(f"dtype {dtype!r} has no kernels; supported: {', '.join(V.DTYPES)}")
    if op not in V.OPS:
        raise PlanError(f"op {op!r} unknown; supported: {', '.join(V.OPS)}")
    if device.warp_size not in V.WARP_SIZES:
        raise PlanError(f"warp size {device.warp_size} of {device.name} is not one of {V.WARP_SIZES}")


def grid_for(work_blocks: int, device: DeviceProfile, blocks_per_sm: int = 32) -> int:
    """Enough blocks to fill the device many times; grid-stride loops do the rest."""
    return max(1, min(work_blocks, device.multiprocessors * blocks_per_sm, device.max_grid_x))


def _work_grid(work_blocks: int, device: DeviceProfile) -> int:
    """A block per share of the work (grid-stride loops take what passes the grid limit): short-lived
    blocks, launched all at once, keep more loads in flight than one wave looping over the work."""
    return max(1, min(work_blocks, device.max_grid_x))


def scalar_rows(t: Tuning, p: RowProblem, warp: int) -> bool:
    """Whether rows take scalar slots in the register tier (see t.scalar_rows_min_cols)."""
    itemsize = V.DTYPES[p.dtype][2]
    widest = V.vector_widths(p.dtype)[1]
    if p.rows <= 1 or not t.scalar_rows_min_cols <= p.cols <= t.scalar_rows_max_cols:
        return False
    if itemsize == 4:
        return True  # whole vectors too
    if p.strides()[0] % widest == 0:
        return False
    fill = p.cols / (warp << ceil(p.cols / warp - 1).bit_length())  # of the deep variant's slots
    if itemsize == 2 and p.cols * itemsize > t.staged_short_row_bytes:
        return fill >= t.scalar_rows_min_fill  # the staged tier would run 64-thread blocks
    return itemsize == 2 and fill >= t.scalar_rows_full


def choose_vec(p: RowProblem) -> int:
    """Widest vector whose slots line up in both input and output rows.

    Short rows that start at varying offsets stay scalar: their partial head and
    tail slots would cost more guarded loads than the vectors save.
    """
    widest = V.vector_widths(p.dtype)[1]
    xs, ys = p.strides()
    same_base = (p.x_misalign - p.y_misalign) % widest == 0
    same_step = p.rows <= 1 or (xs - ys) % widest == 0
    short_unaligned = p.rows > 1 and xs % widest != 0 and p.cols < 4 * widest
    return widest if same_base and same_step and not short_unaligned else 1


def register_vec(t: Tuning, p: RowProblem, warp: int) -> int:
    """The vector width of the register tier's (and the block tiers') slots of these rows."""
    return 1 if scalar_rows(t, p, warp) else choose_vec(p)


def slots_needed(p: RowProblem, vec: int) -> int:
    """Slots covering the longest row, counting its unaligned head."""
    xs, _ = p.strides()
    if p.rows <= 1 or xs % vec == 0:
        pad = p.x_misalign % vec
    else:
        pad = vec - 1  # rows start at different offsets: assume the worst
    return ceil((pad + p.cols) / vec)


def _warp_candidates(t: Tuning, p: RowProblem, device: DeviceProfile, vec: int) -> list[V.WarpVariant]:
    """The register tier's variants of these vectors within the values a lane may hold."""
    itemsize = V.DTYPES[p.dtype][2]
    # the asynchronous cap holds for rows on 4-byte boundaries (see t.warp_tier_max_values_async)
    whole_words = (p.strides()[0] * itemsize) % 4 == 0 and (p.x_misalign * itemsize) % 4 == 0
    caps = t.warp_tier_max_values_whole_words if whole_words else t.warp_tier_max_values
    most = caps.get(itemsize, 1 << 30)
    return [v for v in V.warp_variants(p.dtype, p.op, device.warp_size, vec) if v.slots * vec <= most]


def _warp_variant(t: Tuning, p: RowProblem, device: DeviceProfile, vec: int, slots: int) -> V.WarpVariant | None:
    candidates = _warp_candidates(t, p, device, vec)
    if vec == 1 and slots <= V.THREAD_ROW_SLOTS:  # tiny scalar rows: a lane each, no shuffles
        candidates = [v for v in candidates if v.lanes == 1]
    for v in candidates:
        if v.lanes * v.slots >= slots:
            return v
    return None


def _plan_staged(t: Tuning, p: RowProblem, device: DeviceProfile, blocks_per_sm: float | None = None) -> Draft | None:
    """Contiguous short rows read and written as one span of aligned vectors, or None.

    Rows whose input and output are both contiguous and share their misalignment qualify
    (and whose length would leave the register tier partial or scalar vectors). A step takes
    whole rows for every thread, so that each moves about t.staged_bytes_per_thread of the span.
    `blocks_per_sm`: the grid the tiles are cut for (_spread_tile).
    """
    itemsize = V.DTYPES[p.dtype][2]
    row_bytes = p.cols * itemsize
    vec = V.vector_widths(p.dtype)[1]
    ahead_of_scalar = p.cols <= t.staged_before_scalar_cols.get(itemsize, 0)
    lo, hi = t.staged_whole_vector_bytes
    whole_vectors_staged = lo <= row_bytes <= hi
    max_row_bytes = t.staged_max_row_bytes
    if (not _one_span(p, vec) or (scalar_rows(t, p, device.warp_size) and not ahead_of_scalar)
            or (row_bytes % 16 == 0 and not whole_vectors_staged)
            or p.cols < t.staged_min_cols or row_bytes > max_row_bytes):
        return None
    short = row_bytes <= t.staged_short_row_bytes
    threads = max(device.warp_size, t.staged_threads if short else t.staged_threads_long_rows)
    rounds = max(1, round(t.staged_bytes_per_thread / row_bytes))  # rows a thread takes per step
    tile_rows = min(p.rows, threads * rounds, _rows_fitting(p, device, vec) // threads * threads)
    return _staged_plan(t, p, device, "staged", Kernel("staged", (p.dtype, p.op)), threads, tile_rows, vec,
                        blocks_per_sm=blocks_per_sm)


def _one_span(p: RowProblem, vec: int) -> bool:
    """Whether the rows are one contiguous span in input and output, with the same misalignment
    (what the staged tiers read and write with aligned vectors)."""
    return p.rows >= 2 and p.strides() == (p.cols, p.cols) and (p.x_misalign - p.y_misalign) % vec == 0


def _rows_fitting(p: RowProblem, device: DeviceProfile, vec: int, stride: int | None = None) -> int:
    """Rows of a staged tile, `stride` elements apart (the row length unless padded), within one
    block's default shared memory (and the span's partial vectors)."""
    itemsize = V.DTYPES[p.dtype][2]
    return (device.shared_mem_per_block - 2 * vec * itemsize) // ((stride or p.cols) * itemsize)


def _resident_warps(device: DeviceProfile) -> int:
    """Warps the whole device holds at once (one wave of them)."""
    return device.multiprocessors * device.max_threads_per_multiprocessor // device.warp_size


def _one_row_a_warp(t: Tuning, p: RowProblem, device: DeviceProfile, vec: int, slots: int,
                    variant: V.WarpVariant) -> V.WarpVariant:
    """The register-tier variant for rows of `slots` slots: `variant`, or where a whole warp reads
    each row several rows at a time and the rows fit t.small_input_one_row_a_warp_waves waves of
    resident warps, the shortest whole-warp variant taking one that holds the row."""
    warp = device.warp_size
    if (variant.lanes != warp or variant.batch == 1
            or p.rows > t.small_input_one_row_a_warp_waves * _resident_warps(device)):
        return variant
    most = t.one_row_a_warp_most_slots * ceil(slots / warp)
    candidates = _warp_candidates(t, p, device, vec)
    if t.one_row_a_warp_shallow:
        candidates += V.one_row_variants(p.dtype, p.op, warp, vec)
    one_a_step = [v for v in candidates if v.lanes == warp and v.batch == 1 and warp * v.slots >= slots
                  and v.slots <= most]
    return min(one_a_step, key=lambda v: v.slots, default=variant)


def _one_row_groups(t: Tuning, p: RowProblem, device: DeviceProfile, variant: V.WarpVariant,
                    small: bool) -> V.WarpVariant:
    """`variant`, or its twin taking one row a step (t.small_input_one_row_group_waves); `small`: the
    small-input rules keep these rows off the staged tiers (_Rows.unstaged)."""
    warp = device.warp_size
    within_waves = ceil(p.rows * variant.lanes / warp) <= t.small_input_one_row_group_waves * _resident_warps(device)
    if variant.batch == 1 or not (exact_group(t, p, warp) or (small and within_waves)):
        return variant
    twin = replace(variant, one_row=True)
    return twin if twin in V.one_row_variants(p.dtype, p.op, warp, variant.vec) else variant


def _unstaged(t: Tuning, p: RowProblem) -> bool:
    """Whether the small-input rules keep these rows off the staged tiers (t.small_input_unstaged_bytes)."""
    return (p.rows * p.cols * V.DTYPES[p.dtype][2] < t.small_input_unstaged_bytes
            and p.cols >= t.small_input_unstaged_min_cols)


def one_slot_lanes(t: Tuning, p: RowProblem, warp: int) -> int:
    """Lanes of the register tier's group holding each of these rows, whole 16-byte vectors starting
    on one, in one slot a lane, where that group has a kernel taking one row a step
    (V.one_row_variants) and the rows do not take scalar slots (scalar_rows), else 0."""
    vec = V.vector_widths(p.dtype)[1]
    if p.rows <= 1 or choose_vec(p) != vec or not _whole_vectors(p, vec) or scalar_rows(t, p, warp):
        return 0
    lanes = 1 << (p.cols // vec - 1).bit_length()
    twins = {v.lanes for v in V.one_row_variants(p.dtype, p.op, warp, vec)}
    return lanes if lanes in twins else 0


def exact_group(t: Tuning, p: RowProblem, warp: int) -> bool:
    """Whether these rows fill a one-slot lane group of t.exact_group_min_lanes or more, within
    t.exact_group_max_bytes (see there)."""
    lanes = one_slot_lanes(t, p, warp)
    itemsize = V.DTYPES[p.dtype][2]
    return (lanes >= t.exact_group_min_lanes and p.cols == lanes * V.vector_widths(p.dtype)[1]
            and p.rows * p.cols * itemsize <= t.exact_group_max_bytes.get(itemsize, 1 << 62))


def _group_rows_unstaged(t: Tuning, p: RowProblem, device: DeviceProfile) -> bool:
    """Whether rows skip the staged tiers for the register tier's one-slot groups (t.exact_group_min_lanes,
    t.small_input_group_bytes)."""
    if exact_group(t, p, device.warp_size):
        return True
    if p.cols < t.small_input_unstaged_min_cols or p.rows * p.cols * V.DTYPES[p.dtype][2] > t.small_input_group_bytes:
        return False
    lanes = one_slot_lanes(t, p, device.warp_size)
    return 0 < lanes < device.warp_size


def _under_tiles(staged: Draft, p: RowProblem, device: DeviceProfile, least: float) -> bool:
    """Whether this staged plan covers the rows in fewer than `least` tiles a multiprocessor."""
    return ceil(p.rows / staged.notes["tile_rows"]) < least * device.multiprocessors


def _few_tiles(t: Tuning, staged: Draft, p: RowProblem, device: DeviceProfile, least: float) -> bool:
    """Whether this staged plan covers rows longer than a 16-byte vector a lane of a warp (or the
    shorter rows of t.few_tiles_short_row_itemsizes) in fewer than `least` tiles a multiprocessor."""
    itemsize = V.DTYPES[p.dtype][2]
    rows_taken = p.cols * itemsize > 16 * device.warp_size or (
        itemsize in t.few_tiles_short_row_itemsizes and p.cols >= t.small_input_unstaged_min_cols)
    return rows_taken and _under_tiles(staged, p, device, least)


def _smaller_tiles(t: Tuning, tier: Callable[..., Draft | None], staged: Draft, p: RowProblem,
                   device: DeviceProfile) -> Draft:
    """The staged plan as it is taken: planned again by `tier` with its tiles cut for a grid of
    t.few_tiles_blocks_per_sm blocks a multiprocessor where it covers the rows in fewer than
    t.staged_min_tiles_per_sm tiles a multiprocessor (inputs of t.few_tiles_smaller_min_bytes or more)."""
    if (not t.few_tiles_blocks_per_sm or not _under_tiles(staged, p, device, t.staged_min_tiles_per_sm)
            or p.rows * p.cols * V.DTYPES[p.dtype][2] < t.few_tiles_smaller_min_bytes):
        return staged
    return tier(t, p, device, t.few_tiles_blocks_per_sm) or staged  # the same tier: it plans the rows again


def _one_warp_gives_way(t: Tuning, staged: Draft, p: RowProblem, device: DeviceProfile, fill: float) -> bool:
    """Whether a staged plan of few tiles gives way to one warp (or lane group) a row whose slots
    the row fills to `fill` (t.staged_min_tiles_per_sm_one_warp, t.few_tiles_min_fill)."""
    return _few_tiles(t, staged, p, device, t.staged_min_tiles_per_sm_one_warp) and fill >= t.few_tiles_min_fill


def _whole_slot_rows(t: Tuning, p: RowProblem, vec: int) -> bool:
    """Whether the register tier reads every row in whole slots: whole 16-byte vectors starting on
    one (no partial head or tail slot), or the scalar slots of t.few_tiles_short_row_itemsizes."""
    itemsize = V.DTYPES[p.dtype][2]
    if vec == 1:
        return itemsize in t.few_tiles_short_row_itemsizes
    return vec * itemsize == 16 and _whole_vectors(p, vec)


def _whole_vectors(p: RowProblem, vec: int) -> bool:
    """Whether every row is whole vectors of `vec` elements starting on one (no partial head or tail slot)."""
    return p.cols % vec == 0 and slots_needed(p, vec) == p.cols // vec


def _spread_blocks(t: Tuning, device: DeviceProfile, blocks_per_sm: float | None = None) -> int:
    """Blocks that a small input's grid should reach (`blocks_per_sm`, by default
    t.small_input_blocks_per_sm, a multiprocessor), 0 for none."""
    return ceil((t.small_input_blocks_per_sm if blocks_per_sm is None else blocks_per_sm) * device.multiprocessors)


def _spread_threads(device: DeviceProfile, threads: int, needed: float) -> int:
    """A block's threads cut to the whole warps that `needed` threads fill (at least one warp)."""
    return min(threads, max(device.warp_size, ceil(needed / device.warp_size) * device.warp_size))


def _spread_tile(t: Tuning, p: RowProblem, device: DeviceProfile, threads: int, lanes: int, tile_rows: int,
                 blocks_per_sm: float | None = None) -> tuple[int, int]:
    """(threads, tile_rows) of a staged tier, fewer where the grid would fall short of `blocks_per_sm`
    (by default t.small_input_blocks_per_sm) blocks a multiprocessor: first fewer rows a thread (or
    group) a step, then, a thread a row, fewer threads. Groups keep their block (the planner's bank
    counts assume it)."""
    wanted = _spread_blocks(t, device, blocks_per_sm)
    if not wanted or ceil(p.rows / tile_rows) >= wanted:
        return threads, tile_rows
    target, groups = ceil(p.rows / wanted), threads // lanes
    if target >= groups:
        return threads, min(tile_rows, ceil(target / groups) * groups)
    if lanes == 1:
        threads = _spread_threads(device, threads, target)
    return threads, min(p.rows, threads // lanes)


def _staged_plan(t: Tuning, p: RowProblem, device: DeviceProfile, tier: str, kernel: Kernel, threads: int,
                 tile_rows: int, vec: int, lanes: int = 1, row_shift: int | None = None, interleave: bool = False,
                 blocks_per_sm: float | None = None) -> Draft | None:
    """The launch of a staged tier taking tile_rows rows a step, `lanes` lanes a row (None where none
    fit), its tiles cut for a grid of `blocks_per_sm` (_spread_tile). `row_shift` and `interleave`
    (the group kernels' arguments): rows of 2**row_shift slots padded by a slot in the tile, or -1;
    the groups of 32 lanes on rows in order, or interleaved."""
    if tile_rows == 0:
        return None
    threads, tile_rows = _spread_tile(t, p, device, threads, lanes, tile_rows, blocks_per_sm)
    stride = _tile_stride(p, vec, -1 if row_shift is None else row_shift)
    shared = ceil((vec - 1 + tile_rows * stride) / vec) * vec * V.DTYPES[p.dtype][2]
    group_args = () if row_shift is None else ((I32, row_shift), (I32, int(interleave)))
    launch = Step(kernel, _work_grid(ceil(p.rows / tile_rows), device), threads, shared,
                    (("ptr", "x"), ("ptr", "y"), (I64, p.rows), (I64, p.cols), (I64, tile_rows), *group_args,
                     (I32, _safe(p))),
                    cut_to_one_wave=False)
    notes = {"vec": vec, "tile_rows": tile_rows, "lanes": lanes}
    if row_shift is not None:
        notes.update(row_shift=row_shift, interleave=interleave)
    return Draft(tier, (launch,), notes=notes)


def _plan_staged_warp(t: Tuning, p: RowProblem, device: DeviceProfile,
                      blocks_per_sm: float | None = None) -> Draft | None:
    """Contiguous rows staged through shared memory a warp a row (see t.staged_warp_row_bytes), or None."""
    itemsize = V.DTYPES[p.dtype][2]
    row_bytes = p.cols * itemsize
    vec = V.vector_widths(p.dtype)[1]
    lo, hi = t.staged_warp_row_bytes
    if (not has_async_copy(device) or not lo <= row_bytes <= hi or itemsize not in t.staged_warp_itemsizes
            or not _one_span(p, vec)):
        return None
    threads = max(device.warp_size, t.staged_threads)
    return _staged_plan(t, p, device, "staged_warp", Kernel("staged_warp", (p.dtype, p.op, device.warp_size)), threads,
                        _group_tile_rows(p, device, vec, threads, device.warp_size,
                                         bytes_per_thread=t.staged_warp_bytes_per_thread), vec, device.warp_size,
                        blocks_per_sm=blocks_per_sm)


def _tile_stride(p: RowProblem, vec: int, row_shift: int) -> int:
    """Elements from a staged row's start to the next row's in the tile: the row length, and a slot
    more where the tile is padded (row_shift >= 0)."""
    return p.cols + vec if row_shift >= 0 else p.cols


def _group_tile_rows(p: RowProblem, device: DeviceProfile, vec: int, threads: int, lanes: int,
                     stride: int | None = None, *, bytes_per_thread: int) -> int:
    """Rows of a step of a staged tier whose rows a group of `lanes` lanes takes: about
    `bytes_per_thread` a thread, a whole number a group (0 where a row a group does not fit)."""
    groups = threads // lanes
    wanted = ceil(max(1, round(threads * bytes_per_thread / (p.cols * V.DTYPES[p.dtype][2]))) / groups)
    return min(p.rows, wanted * groups, _rows_fitting(p, device, vec, stride) // groups * groups)


#: 4-byte banks of shared memory (NVIDIA; AMD's LDS too)
SHARED_BANKS = 32


def staged_bank_ways(t: Tuning, p: RowProblem, lanes: int, stride: int | None = None, interleave: bool = False) -> int:
    """How many lanes of 32 consecutive ones read one bank at once (the worst, over a tile's first
    two steps) where groups of `lanes` lanes take staged rows `stride` elements apart (the row
    length unless padded), each the word `lanes` words after the last: the groups of 32 lanes take
    consecutive rows, or (interleave) rows t.staged_threads / 32 apart, and start at their rows' first
    whole words (staged_row_in_words)."""
    itemsize = V.DTYPES[p.dtype][2]
    per_window = SHARED_BANKS // lanes
    windows = t.staged_threads // SHARED_BANKS
    worst = 0
    for step in range(2):  # odd-length rows alternate their offsets
        for w in range(windows):
            reads = [0] * SHARED_BANKS
            for g in range(per_window):
                row = step * per_window * windows + (g * windows + w if interleave else w * per_window + g)
                word = -(-(p.x_misalign + row * (stride or p.cols)) * itemsize // 4)  # the first whole word
                for lane in range(lanes):
                    reads[(word + lane) % SHARED_BANKS] += 1
            worst = max(worst, max(reads))
    return worst


def _plan_staged_groups(t: Tuning, p: RowProblem, device: DeviceProfile,
                        blocks_per_sm: float | None = None) -> Draft | None:
    """Contiguous rows staged through shared memory a group of lanes a row (see t.staged_groups), or None."""
    itemsize = V.DTYPES[p.dtype][2]
    row_bytes = p.cols * itemsize
    vec = V.vector_widths(p.dtype)[1]
    if (not t.staged_groups or not has_async_copy(device) or row_bytes > t.staged_group_max_row_bytes.get(itemsize, 0)
            or not _one_span(p, vec)):
        return None
    the_plan = None
    if row_bytes > t.staged_short_row_bytes or (row_bytes > t.staged_group_short_min_row_bytes and row_bytes % 8 == 0):
        the_plan = _plan_groups_at(t, p, device, vec, -1, blocks_per_sm)
    row_slots = row_bytes // 16
    padded_max = t.staged_group_padded_max_row_bytes.get(itemsize, 0)
    if (the_plan is None and t.staged_group_padded_min_row_bytes < row_bytes <= padded_max
            and p.x_misalign == 0 and row_bytes % 16 == 0 and row_slots & (row_slots - 1) == 0):
        the_plan = _plan_groups_at(t, p, device, vec, row_slots.bit_length() - 1, blocks_per_sm)
    return the_plan


def _plan_groups_at(t: Tuning, p: RowProblem, device: DeviceProfile, vec: int, row_shift: int,
                    blocks_per_sm: float | None = None) -> Draft | None:
    """The staged group plan with the fewest lanes that qualify, for rows padded by a slot in the
    tile where row_shift >= 0, or None."""
    itemsize = V.DTYPES[p.dtype][2]
    stride = _tile_stride(p, vec, row_shift)
    threads = max(device.warp_size, t.staged_threads)
    for lanes in V.staged_group_lanes(p.dtype):
        if (lanes >= device.warp_size or p.cols * itemsize < 4 * lanes * t.staged_group_min_words
                or threads // lanes * stride * itemsize > t.staged_group_tile_bytes):
            continue
        ways = {i: staged_bank_ways(t, p, lanes, stride, i) for i in t.staged_group_orders}
        interleave = min(ways, key=ways.get)  # the first of the orders sharing the fewest banks
        if ways[interleave] > t.staged_group_max_ways:
            interleave = None
        tile_rows = _group_tile_rows(p, device, vec, threads, lanes, stride, bytes_per_thread=(
            t.staged_group_padded_bytes_per_thread if row_shift >= 0 else t.staged_warp_bytes_per_thread))
        if row_shift < 0:  # unpadded: the smaller tile where it still holds t.staged_group_min_tile_bytes
            smaller = _group_tile_rows(p, device, vec, threads, lanes, stride,
                                       bytes_per_thread=t.staged_group_bytes_per_thread)
            if smaller * stride * itemsize >= t.staged_group_min_tile_bytes:
                tile_rows = smaller
        if interleave is None or tile_rows == 0:  # banks shared, or a row a group does not fit
            continue
        return _staged_plan(t, p, device, "staged_group", Kernel("staged_group", (p.dtype, p.op, lanes)), threads,
                            tile_rows, vec, lanes, row_shift, interleave, blocks_per_sm)
    return None


def _plan_packed(t: Tuning, p: RowProblem, device: DeviceProfile) -> Draft | None:
    """Contiguous rows of a few elements (V.packed_cols), whole rows inside a thread's vectors, or None.

    The input and output must be contiguous with the same misalignment, a multiple of the row
    length, so that every group of lcm(cols, vec) values starts a row.
    """
    if p.cols not in V.packed_cols(p.dtype):
        return None
    vec = V.vector_widths(p.dtype)[1]
    contiguous = p.rows == 1 or p.strides() == (p.cols, p.cols)
    if not contiguous or (p.x_misalign - p.y_misalign) % vec != 0 or p.x_misalign % vec % p.cols != 0:
        return None
    per_thread = lcm(p.cols, vec)  # values, in whole vectors and whole rows
    group = per_thread // vec
    depth = 1 if group >= 4 else 4 // group
    wide = per_thread > t.packed_widened_most
    block = t.packed_wide_group_threads if wide else t.packed_threads
    tile = depth * block * per_thread * V.DTYPES[p.dtype][2]  # the groups pass through shared memory
    if tile > device.shared_mem_per_block_optin or block > device.max_threads_per_block:
        return None
    two_tiles = has_async_copy(device) and per_thread > t.packed_two_tiles_above  # kPackedTwoTiles
    stages = t.packed_stages if two_tiles and t.packed_stages * tile <= device.shared_mem_per_block_optin else 1
    rounds = t.packed_rounds if stages > 1 else 1
    groups = ceil((p.x_misalign % vec + p.rows * p.cols) / per_thread)
    blocks = ceil(groups / (block * depth * rounds))
    unstaged = _unstaged(t, p)
    if unstaged and p.cols % vec != 0:  # the register tier's rows would be scalars or partial vectors
        if (register_vec(t, p, device.warp_size) > 1 and per_thread > t.packed_two_tiles_above
                and groups < t.packed_unstaged_partial_min_groups_per_sm * device.multiprocessors):
            return None
    else:
        if wide and groups < t.packed_wide_min_groups_per_sm * device.multiprocessors:
            return None
        small_grid_most = t.packed_unstaged_small_grid_most_values if unstaged else t.packed_two_tiles_above
        if per_thread > small_grid_most and blocks < t.packed_large_groups_min_blocks_per_sm * device.multiprocessors:
            return None
    threads, wanted = block, _spread_blocks(t, device)
    if wanted and blocks < wanted and rounds > 1:
        # a small input's blocks take one round each before they lose warps: more blocks, spread wider
        rounds = 1
        blocks = ceil(groups / (block * depth * rounds))
    if wanted and blocks < wanted:  # fewer warps a block, so that a small input spreads wider
        threads = _spread_threads(device, threads, groups / (depth * rounds * wanted))
        tile = tile // block * threads
        blocks = ceil(groups / (threads * depth * rounds))
    launch = Step(Kernel("packed", (p.dtype, p.op, p.cols)), _work_grid(blocks, device), threads, stages * tile,
                    (("ptr", "x"), ("ptr", "y"), (I64, p.rows), (I32, _safe(p)), (I32, stages)),
                    cut_to_one_wave=False)
    return Draft("packed", (launch,), notes={"vec": vec, "values_per_thread": per_thread * depth, "stages": stages})


def _small_input_block_warps(t: Tuning, slots: int, warp: int) -> int:
    """Warps of a small input's block-tier block (t.small_input_block_slots_per_thread)."""
    if slots <= t.small_input_block_one_warp_slots_per_thread * warp:
        return 1
    return ceil(slots / t.small_input_block_slots_per_thread / warp)


def _cooperative_grid(device: DeviceProfile, threads: int, shared_per_block: int, jobs: int, chunks: int,
                      most_per_multiprocessor: int | None = None) -> int:
    """Blocks of an on-chip split whose `chunks` blocks of a job wait on each other: whole jobs, at
    most as many blocks as stay resident at once (threads, shared memory and, where the kernel's
    registers allow only so many, most_per_multiprocessor permitting), at least one job."""
    per_multiprocessor = min(device.max_threads_per_multiprocessor // threads,
                             device.shared_mem_per_multiprocessor // shared_per_block,
                             most_per_multiprocessor or device.max_threads_per_multiprocessor)
    resident = device.multiprocessors * max(1, per_multiprocessor)
    return max(chunks, min(jobs * chunks, resident) // chunks * chunks)


def _compute_bytes(dtype: str) -> int:
    """Bytes of the type a dtype computes in (float64: double, every other: float)."""
    return 8 if V.compute_type(dtype) == "double" else 4


def _on_chip_chunk(t: Tuning, device: DeviceProfile, static_bytes: int, vec: int, itemsize: int,
                   wanted_threads: int) -> tuple[int, int]:
    """(threads, slots) of a block of the on-chip split tiers (blocks merging through global memory
    ): its threads (wanted_threads, within the device's limits), and the most slots
    of a chunk, a multiple of _chunk_unit, in a share of a multiprocessor's shared memory
    (t.cached_chunks_per_sm: several chunks a multiprocessor, so one's loads overlap another's wait)."""
    threads = min(device.max_threads_per_block, max(wanted_threads, 4 * device.warp_size))
    per_multiprocessor = t.cached_chunks_per_sm_by_itemsize.get(itemsize, t.cached_chunks_per_sm)
    budget = min(device.shared_mem_per_block_optin, device.shared_mem_per_multiprocessor // per_multiprocessor)
    unit = _chunk_unit(t, vec, itemsize)
    return threads, (budget - static_bytes) // (vec * itemsize) // unit * unit


def _chunk_unit(t: Tuning, vec: int, itemsize: int) -> int:
    """Slots that chunk boundaries are multiples of (t.chunk_align_bytes, at least one slot)."""
    return max(1, t.chunk_align_bytes // (vec * itemsize))


def _split_evenly(slots: int, chunks: int, unit: int) -> tuple[int, int]:
    """(chunk_slots, chunks): about `chunks` chunks of a row of `slots` slots, each a multiple of
    `unit` slots but the last."""
    chunk_slots = ceil(ceil(slots / chunks) / unit) * unit
    return chunk_slots, ceil(slots / chunk_slots)


def _safe(p) -> int:
    return int(p.safe and p.op == "softmax")


def default_tuning(device: DeviceProfile) -> Tuning:
    """The Tuning of the device's family: NVIDIA with asynchronous copies (sm_80 and newer), or
    every other device (older NVIDIA, AMD, the emulation)."""
    return ASYNC_COPY_TUNING if has_async_copy(device) else DEFAULT_TUNING


@lru_cache(maxsize=4096)
def plan(problem: RowProblem | StridedProblem, device: DeviceProfile, tuning: Tuning | None = None) -> Plan:
    """Pick the kernel variant(s) and launch shapes for one problem on one device, with the
    device family's numbers (default_tuning) or `tuning`'s: the first rule of ROW_RULES (or
    STRIDED_RULES) that takes the problem builds the plan."""
    _check_common(problem.dtype, problem.op, device)
    t = default_tuning(device) if tuning is None else tuning
    if isinstance(problem, StridedProblem):
        return _plan_strided(t, problem, device)
    return _plan_rows(t, problem, device)


@dataclass(frozen=True)
class Rule:
    """A row of a planner table: its name, why it exists, when it takes a problem (given the
    problem's _Rows or _Axis), and the plan it then builds."""

    name: str
    why: str
    when: Callable[..., bool]
    build: Callable[..., Draft]


def first_rule(rules: tuple[Rule, ...], problem: _Rows | _Axis) -> Rule:
    """The first of `rules` that takes `problem`: the one whose plan it gets."""
    return next(rule for rule in rules if rule.when(problem))


def rule_for(problem: RowProblem | StridedProblem, device: DeviceProfile, tuning: Tuning | None = None) -> Rule:
    """The rule (of ROW_RULES or STRIDED_RULES) whose plan `problem` gets on `device`.

    >>> rule_for(RowProblem("float32", "softmax", 4096, 1000), DeviceProfile.h100()).name
    'warp'
    """
    _check_common(problem.dtype, problem.op, device)
    t = default_tuning(device) if tuning is None else tuning
    if isinstance(problem, StridedProblem):
        return first_rule(STRIDED_RULES, _Axis(t, problem, device))
    return first_rule(ROW_RULES, _Rows(t, problem, device))


class _Rows:
    """A row problem on a device under a Tuning, and what the rules ask of it, each worked out when
    first asked (a rule that does not apply never pays for a later rule's figures)."""

    def __init__(self, t: Tuning, p: RowProblem, device: DeviceProfile) -> None:
        self.t, self.p, self.device = t, p, device
        self.warp = device.warp_size
        self.itemsize = V.DTYPES[p.dtype][2]

    def notes(self) -> dict:
        return {"vec": self.vec, "slots": self.slots}

    # -- short rows ------------------------------------------------------------------------------
    @cached_property
    def unstaged(self) -> bool:
        """Whether the small-input rules keep these rows off the staged tiers."""
        return _unstaged(self.t, self.p) or _group_rows_unstaged(self.t, self.p, self.device)

    @cached_property
    def packed(self) -> Draft | None:
        return _plan_packed(self.t, self.p, self.device)

    @cached_property
    def staged(self) -> tuple[Callable[..., Draft | None], Draft] | None:
        """The first staged tier that takes the rows, and its plan (None where the small-input rules
        keep them off, or none does)."""
        if self.unstaged:
            return None
        for tier in (_plan_staged_groups, _plan_staged, _plan_staged_warp):
            the_plan = tier(self.t, self.p, self.device)
            if the_plan is not None:
                return tier, the_plan
        return None

    @cached_property
    def few_tiles(self) -> Draft | None:
        """The staged plan where it covers the rows in few tiles (t.staged_min_tiles_per_sm), else None."""
        if self.staged is None or not _few_tiles(self.t, self.staged[1], self.p, self.device,
                                                 self.t.staged_min_tiles_per_sm):
            return None
        return self.staged[1]

    def staged_taken(self) -> Draft:
        """The staged plan as it is taken (its tiles cut smaller where few, _smaller_tiles)."""
        tier, the_plan = self.staged
        return _smaller_tiles(self.t, tier, the_plan, self.p, self.device)

    # -- a warp a row ----------------------------------------------------------------------------
    @cached_property
    def vec(self) -> int:
        return register_vec(self.t, self.p, self.warp)

    @cached_property
    def slots(self) -> int:
        return slots_needed(self.p, self.vec)

    @cached_property
    def row_args(self) -> tuple:
        xs, ys = self.p.strides()
        return (("ptr", "x"), ("ptr", "y"), (I64, self.p.rows), (I64, self.p.cols), (I64, xs), (I64, ys))

    @cached_property
    def variant(self) -> V.WarpVariant | None:
        """The register tier's variant holding the rows (None where none does)."""
        return _warp_variant(self.t, self.p, self.device, self.vec, self.slots)

    def warp_beats_few_tiles(self) -> bool:
        """Whether the register tier takes rows that a staged plan covers in few tiles: rows read in
        whole slots that fill the variant's lanes (of two or more 16-byte vectors; scalar slots and
        one vector a lane pass) well enough (_one_warp_gives_way)."""
        v, vec, slots = self.variant, self.vec, self.slots
        warp_slots = v.lanes * v.slots if vec > 1 and v.slots > 1 else slots
        return _whole_slot_rows(self.t, self.p, vec) and _one_warp_gives_way(self.t, self.few_tiles, self.p,
                                                                             self.device, slots / warp_slots)

    # -- a block a row ---------------------------------------------------------------------------
    @cached_property
    def cache_bytes(self) -> int:
        return self.slots * self.vec * self.itemsize

    @cached_property
    def compute_bytes(self) -> int:
        return _compute_bytes(self.p.dtype)

    @cached_property
    def static_bytes(self) -> int:
        """The block reduction's static scratch, and what the runtime reserves per block, beside the cache."""
        return 2 * (1024 // self.warp) * self.compute_bytes + 1024

    @cached_property
    def few_rows(self) -> bool:
        return self.p.rows < self.device.multiprocessors

    def block_fits(self) -> bool:
        """Whether a row fits the shared memory a block may take: a share of a multiprocessor's
        (t.block_tier_sm_share), so that several blocks overlap one's reduction with the others'
        loads; few rows of very many slots are split instead."""
        budget = min(self.device.shared_mem_per_block_optin,
                     self.device.shared_mem_per_multiprocessor // self.t.block_tier_sm_share) - self.static_bytes
        return self.cache_bytes <= budget and not (self.few_rows and self.slots > 4 * self.device.max_threads_per_block)

    def block_beats_few_tiles(self) -> bool:
        """Whether the block tier takes rows that a staged plan covers in few tiles: any block of
        more than one warp, and a one-warp block that its row fills well enough."""
        warp, slots = self.warp, self.slots
        return self.block.steps[0].block != warp or _one_warp_gives_way(
            self.t, self.few_tiles, self.p, self.device, slots / (warp * ceil(slots / warp)))

    @cached_property
    def block(self) -> Draft:
        """A block a row, its threads streaming t.block_tier_slots_per_thread slots each (for few rows,
        t.block_tier_few_rows_slots_per_thread; small inputs, _small_input_block_warps), within
        t.block_tier_min_warps and t.block_tier_max_threads."""
        t, p, device, warp, slots = self.t, self.p, self.device, self.warp, self.slots
        per_thread = t.block_tier_few_rows_slots_per_thread if self.few_rows else t.block_tier_slots_per_thread
        warps = ceil(slots / per_thread / warp)
        small_bytes = t.small_input_block_bytes_by_itemsize.get(self.itemsize, t.small_input_block_bytes)
        if not self.few_rows and (self.few_tiles is not None or p.rows * p.cols * self.itemsize < small_bytes):
            warps = _small_input_block_warps(t, slots, warp)
        threads = min(device.max_threads_per_block, t.block_tier_max_threads, max(t.block_tier_min_warps, warps) * warp)
        launch = Step(Kernel("block", (p.dtype, p.op, warp, self.vec)), _work_grid(p.rows, device), threads,
                      self.cache_bytes, self.row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
        return Draft("block", (launch,), notes=self.notes())

    @cached_property
    def waves_alone(self) -> bool:
        """Whether the rows make t.block_alone_min_waves waves of blocks alone on their multiprocessors."""
        return self.p.rows >= self.t.block_alone_min_waves * self.device.multiprocessors

    def block_alone_fits(self) -> bool:
        """Whether a block alone on its multiprocessor holds a row in its shared memory (with
        asynchronous copies, t.block_tier_whole_sm, where the rows make waves of such blocks)."""
        return (self.t.block_tier_whole_sm and has_async_copy(self.device) and not self.few_rows and self.waves_alone
                and self.cache_bytes + self.static_bytes <= self.device.shared_mem_per_block_optin)

    def registers(self, threads: int) -> Draft | None:
        """A block a row of `threads` threads, the row's first t.row_register_slots slots a thread in
        registers and the rest in shared memory, where as many such blocks as the launch bound's
        registers keep on a multiprocessor (t.row_registers_threads / threads) hold it there (None
        elsewhere)."""
        t, p, device, slots, vec, static_bytes = self.t, self.p, self.device, self.slots, self.vec, self.static_bytes
        blocks_per_multiprocessor = t.row_registers_threads // threads
        if not (t.row_registers and p.dtype in V.BLOCK_REGISTERS_DTYPES and has_async_copy(device)
                and not self.few_rows and device.max_threads_per_block >= t.row_registers_threads):
            return None
        held = min(t.row_register_slots * threads, slots - 1)  # the last slot: in the cache
        shared = (slots - held) * vec * self.itemsize
        if (shared + static_bytes > device.shared_mem_per_block_optin
                or blocks_per_multiprocessor * (shared + static_bytes) > device.shared_mem_per_multiprocessor):
            return None
        launch = Step(Kernel("block_registers", (p.dtype, p.op, self.warp, vec)), _work_grid(p.rows, device),
                      threads, shared, self.row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
        return Draft("block_registers", (launch,), notes={**self.notes(), "held_slots": held})

    @cached_property
    def paired(self) -> Draft | None:
        """Rows two blocks a multiprocessor hold with their first slots in registers (t.row_registers_paired)."""
        return self.registers(self.t.row_registers_threads // 2) if self.t.row_registers_paired else None

    @cached_property
    def alone(self) -> Draft | None:
        """Rows one block of the launch bound's threads holds, alone on its multiprocessor, in waves."""
        return self.registers(self.t.row_registers_threads) if self.waves_alone else None

    # -- a row split across blocks ---------------------------------------------------------------
    @cached_property
    def on_chip(self) -> Draft | None:
        return _on_chip_split(self)


def _warp_plan(r: _Rows) -> Draft:
    """The register tier: r.variant, or its twin taking one row a warp or a step (small inputs), in
    blocks that shrink so that a small input spreads over more multiprocessors."""
    t, p, device, warp = r.t, r.p, r.device, r.warp
    variant = _one_row_groups(t, p, device, _one_row_a_warp(t, p, device, r.vec, r.slots, r.variant), r.unstaged)
    threads = max(V.WARP_TIER_THREADS, 2 * warp)
    batch = variant.batch
    wanted = _spread_blocks(t, device)
    if wanted and ceil(p.rows / (threads // variant.lanes * batch)) < wanted:
        # fewer warps a block, so that a small input's rows spread over more multiprocessors
        threads = _spread_threads(device, threads, ceil(p.rows / (wanted * batch)) * variant.lanes)
    rows_per_block = threads // variant.lanes * batch
    launch = Step(Kernel("warp", (variant,)), _work_grid(ceil(p.rows / rows_per_block), device), threads, 0,
                  r.row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
    return Draft("warp", (launch,), notes=r.notes())


def _on_chip_split(r: _Rows) -> Draft | None:
    """Chunks of each row on co-resident blocks, merged through global memory: at most one chunk of
    a row a multiprocessor (one resident block a multiprocessor is always possible); with
    asynchronous copies each chunk's first slots in registers (t.split_registers), where a row past
    one such chunk a multiprocessor takes several, as many as that form keeps resident
    (t.split_registers_spanning_rows). None where a row takes more chunks than that."""
    t, p, device, warp, vec, slots, itemsize = r.t, r.p, r.device, r.warp, r.vec, r.slots, r.itemsize
    static_bytes, few_rows = r.static_bytes, r.few_rows
    notes = r.notes()
    held_config = t.split_registers.get(itemsize) if p.dtype in V.BLOCK_REGISTERS_DTYPES else None
    fills_the_grid = False  # the held form's chunks, as long as they can be, fill its resident grid
    spans = False  # a row of the held form takes more chunks than multiprocessors
    if held_config is not None:
        held_slots, per_multiprocessor = held_config
        budget = min(device.shared_mem_per_block_optin, device.shared_mem_per_multiprocessor // per_multiprocessor)
        held_cap = held_slots * t.split_registers_threads + (budget - static_bytes) // (vec * itemsize)
        spans = t.split_registers_spanning_rows and ceil(slots / held_cap) > device.multiprocessors
        # rows that span several chunks a multiprocessor fill the grid whatever their number (below)
        fills_the_grid = spans or p.rows * ceil(slots / held_cap) >= per_multiprocessor * device.multiprocessors
    if (held_config is not None and has_async_copy(device)
            and (not few_rows or (itemsize in t.split_registers_full_grid and fills_the_grid))
            and device.max_threads_per_block >= t.split_registers_threads):
        threads = t.split_registers_threads
        held, chunk_cap = held_slots * threads, held_cap
        kernel = Kernel("cached_registers", (p.dtype, p.op, warp, vec, held_slots, per_multiprocessor))
    else:
        wanted = t.cached_threads_by_itemsize.get(itemsize, t.cached_threads)
        threads, chunk_cap = _on_chip_chunk(t, device, static_bytes, vec, itemsize, wanted)
        held, per_multiprocessor = 0, None
        kernel = Kernel("cached", (p.dtype, p.op, warp, vec))
    chunk_cap = max(threads, chunk_cap)
    chunks = max(ceil(slots / chunk_cap),
                 min(ceil(t.split_min_chunks_per_sm * device.multiprocessors / p.rows), ceil(slots / threads)))
    unit = _chunk_unit(t, vec, itemsize)

    def chunk_bytes(chunk_slots: int) -> int:
        """Shared memory of a chunk: its first `held` slots are in registers."""
        return max(0, chunk_slots - held) * vec * itemsize

    if held and spans:
        # A row past one chunk a multiprocessor: several of its chunks a multiprocessor, as many as
        # the launch bound keeps resident, each within its share of shared memory (whole units,
        # never rounded past it), and the grid filled with whole rows, at least two a round (one
        # row's wait then overlaps another's loads; alone, a row ran as fast in the two passes).
        cap = chunk_cap // unit * unit
        resident = per_multiprocessor * device.multiprocessors
        per_round = min(p.rows, resident // ceil(slots / cap))
        if per_round < 2:
            return None
        chunk_slots, chunks = _split_evenly(slots, resident // per_round, unit)
        grid = per_round * chunks
    else:
        if chunks > device.multiprocessors:  # one resident block a multiprocessor is always possible
            return None
        chunk_slots, chunks = _split_evenly(slots, chunks, unit)
        grid = _cooperative_grid(device, threads, chunk_bytes(chunk_slots) + static_bytes, p.rows, chunks,
                                 per_multiprocessor)
        rounds = p.rows / (grid // chunks)
        if itemsize in t.split_even_rounds_itemsizes and 1 < rounds <= t.split_even_rounds_most:
            # rounds of as many rows each, in the same grid: more and smaller chunks
            even = ceil(p.rows / ceil(rounds))
            if grid // even > chunks:
                chunk_slots, chunks = _split_evenly(slots, grid // even, unit)
                grid = even * chunks
    if held:
        notes.update(held_slots=held)
    xs, ys = p.strides()
    launch = Step(kernel, grid, threads, chunk_bytes(chunk_slots),
                  (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), ("ptr", "arrivals"), (I64, p.rows),
                   (I64, p.cols), (I64, xs), (I64, ys), (I64, chunk_slots), (I64, chunks), (I32, _safe(p))),
                  cooperative=True, min_grid=chunks)
    notes.update(chunks=chunks, chunk_slots=chunk_slots)
    return Draft("cached", (launch,), scratch=(("partials", 2 * p.rows * chunks * r.compute_bytes),
                                               ("arrivals", 4 * p.rows)), notes=notes)


def split_stream_threads(slots_per_thread: int, warp: int, slots: int, most: int) -> int:
    """Threads a block of a streamed split pass over chunks of ``slots`` slots: ``most``, or for
    chunks shorter than ``slots_per_thread`` slots a thread of it, the power of two that gives about
    that many (at least 64 threads and a warp, so that a multiprocessor's resident blocks still fill
    its threads). 0 slots a thread: ``most``.

    >>> [split_stream_threads(4, 32, slots, 512) for slots in (128, 1000, 5000)]
    [64, 256, 512]
    """
    if not slots_per_thread or slots >= slots_per_thread * most:
        return most
    return min(most, max(64, warp, 1 << (ceil(slots / slots_per_thread) - 1).bit_length()))


def _two_pass_split(r: _Rows) -> Draft:
    """Rows too long to keep on chip, streamed twice (partials, then normalize), in enough chunks
    for several full waves of resident blocks (a last wave half full would idle half the device).
    Short rows (the sharded softmax's local rows) take smaller blocks, a row each."""
    t, p, device, vec, slots = r.t, r.p, r.device, r.vec, r.slots
    most = min(device.max_threads_per_block, 512)
    threads = split_stream_threads(t.split_stream_slots_per_thread, r.warp, slots, most)
    resident = device.multiprocessors * max(1, device.max_threads_per_multiprocessor // threads)
    min_chunk = 4 * threads  # each thread streams at least four slots per chunk
    max_chunk = 64 * threads
    chunks = max(ceil(slots / max_chunk), ceil(4 * resident / p.rows))
    chunks = max(1, min(chunks, ceil(slots / min_chunk)))
    chunk_slots, chunks = _split_evenly(slots, chunks, _chunk_unit(t, vec, r.itemsize))
    jobs = p.rows * chunks
    grid = grid_for(jobs, device, max(1, device.max_threads_per_multiprocessor // threads))
    xs, ys = p.strides()
    first_args = (("ptr", "x"), ("ptr", "partials"), (I64, p.rows), (I64, p.cols), (I64, xs),
                  (I64, chunk_slots), (I64, chunks))
    second_args = (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), (I64, p.rows), (I64, p.cols),
                   (I64, xs), (I64, ys), (I64, chunk_slots), (I64, chunks), (I32, _safe(p)))
    slot_bytes = vec * r.itemsize
    buffered = bool(t.split_buffer_bytes) and has_async_copy(device) and slot_bytes >= 4 and threads == most
    if buffered:
        budget = min(t.split_buffer_bytes, device.shared_mem_per_multiprocessor // t.split_buffer_blocks_per_sm - 2048)
        buffer_slots = max(1, min(chunk_slots, budget // slot_bytes))

    def step(family: str, params: tuple, args: tuple, through_buffer: bool) -> Step:
        if through_buffer:
            return Step(Kernel(f"{family}_buffered", params), grid, t.split_buffer_threads,
                        buffer_slots * slot_bytes, (*args, (I64, buffer_slots)))
        return Step(Kernel(family, params), grid, threads, 0, args)

    partials = step("split_partials", (p.dtype, r.warp, vec), first_args, buffered)
    normalize = step("split_normalize", (p.dtype, p.op, r.warp, vec), second_args,
                     buffered and r.itemsize in V.SPLIT_BUFFERED_NORMALIZE_ITEMSIZES)
    return Draft("split", (partials, normalize), scratch=(("partials", 2 * jobs * r.compute_bytes),),
                 notes={**r.notes(), "chunks": chunks, "chunk_slots": chunk_slots}, scratch_zeroed=False)


#: The planner for rows, in order: the first rule that takes a problem builds its plan. Later rules
#: see only what the earlier ones left: after "warp", no register variant holds the rows, or a
#: staged plan of few tiles fills better; past "staged_few_tiles", neither a staged plan nor a
#: register variant exists.
ROW_RULES: tuple[Rule, ...] = (
    Rule("empty", "no rows, or rows of no elements: nothing to launch",
         lambda r: r.p.rows <= 0 or r.p.cols <= 0, lambda r: Draft("empty", ())),
    Rule("packed", "rows of a few elements: whole rows inside each thread's vectors, no lanes to combine",
         lambda r: r.packed is not None, lambda r: r.packed),
    Rule("staged", "short contiguous rows: a block copies their span in aligned vectors, a thread (or lanes) a row",
         lambda r: r.staged is not None and r.few_tiles is None, _Rows.staged_taken),
    Rule("warp", "rows a warp's registers hold, several to a warp where short: one read, shuffles only",
         lambda r: r.variant is not None and (r.few_tiles is None or r.warp_beats_few_tiles()), _warp_plan),
    Rule("block", "rows a share of a multiprocessor's shared memory holds: a block a row, one read",
         lambda r: r.variant is None and r.block_fits() and (r.few_tiles is None or r.block_beats_few_tiles()),
         lambda r: r.block),
    Rule("staged_few_tiles", "a staged plan of few tiles still beats what the tiers below would make of its rows",
         lambda r: r.few_tiles is not None, _Rows.staged_taken),
    Rule("block_registers_paired", "rows two blocks a multiprocessor hold, their first slots in registers",
         lambda r: r.paired is not None, lambda r: r.paired),
    Rule("block_alone", "rows a block's whole shared memory holds: a block alone on its multiprocessor waits on none",
         _Rows.block_alone_fits, lambda r: r.block),
    Rule("block_registers_alone", "rows a block holds in shared memory and registers, alone on its multiprocessor",
         lambda r: r.alone is not None, lambda r: r.alone),
    Rule("cached", "rows past a block: chunks on co-resident blocks, merged through global memory, one read",
         lambda r: r.on_chip is not None, lambda r: r.on_chip),
    Rule("split", "rows too long to keep on chip: partials, then normalize, two reads",
         lambda r: True, _two_pass_split),
)


def _plan_rows(t: Tuning, p: RowProblem, device: DeviceProfile) -> Plan:
    rows = _Rows(t, p, device)
    return first_rule(ROW_RULES, rows).build(rows).resolve()


def _rows_passes(r: _Rows) -> Draft | None:
    """Rows a warp's registers hold, in two passes apart: a warp a row, each lane a power of two of
    16-byte slots, its (m, d) written by the first pass and its outputs by the second from the pair it
    then finds there; None where input and output rows misalign differently or are too long."""
    t, p, device, warp = r.t, r.p, r.device, r.warp
    widest = V.vector_widths(p.dtype)[1]
    if not t.passes_rows_in_registers or choose_vec(p) != widest:
        return None
    needed = ceil(slots_needed(p, widest) / warp)
    slots = next((s for s in V.rows_pass_slots(p.dtype) if s >= needed), None)
    if slots is None:
        return None
    threads = max(V.WARP_TIER_THREADS, 2 * warp)
    grid = _work_grid(ceil(p.rows / (threads // warp * V.warp_batch(p.dtype, slots, widest))), device)
    xs, ys = p.strides()
    head = (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), (I64, p.rows), (I64, p.cols), (I64, xs))
    partials = Step(Kernel("rows_partials", (p.dtype, warp, slots)), grid, threads, 0,
                    (head[0], *head[2:]), cut_to_one_wave=False)
    finish = Step(Kernel("rows_finish", (p.dtype, p.op, warp, slots)), grid, threads, 0,
                  (*head, (I64, ys), (I32, _safe(p))), cut_to_one_wave=False)
    return Draft("warp", (partials, finish), scratch=(("partials", 2 * p.rows * r.compute_bytes),),
                 notes={**r.notes(), "vec": widest, "slots": slots, "chunks": 1}, scratch_zeroed=False)


def plan_split_passes(problem: RowProblem, device: DeviceProfile, tuning: Tuning | None = None) -> Plan:
    """The two passes apart over contiguous rows, whatever their length, for a caller that combines
    each row's pairs between them (the sharded softmax's collective): the first launch writes each
    chunk's (m, d) to ``partials`` (rows x ``notes["chunks"]`` pairs, a row's chunks side by side), the
    second normalises each chunk with the row's pairs as it then finds them there. Rows a warp's
    registers hold take a warp each (one chunk a row, _rows_passes); longer ones the split, one chunk
    a row where the rows fill the device, more where they are few.

    >>> p = plan_split_passes(RowProblem("bfloat16", "softmax", rows=2, cols=5_000_000), DeviceProfile.h100())
    >>> [launch.kernel for launch in p.launches], p.notes["chunks"] > 100
    (['ps_split_partials_buffered_bf16_w32_v8', 'ps_split_normalize_buffered_bf16_softmax_w32_v8'], True)
    >>> amd = plan_split_passes(RowProblem("bfloat16", "softmax", rows=2, cols=5_000_000), DeviceProfile.mi300x())
    >>> [launch.kernel for launch in amd.launches]  # no asynchronous copies: both passes stream
    ['ps_split_partials_bf16_w64_v8', 'ps_split_normalize_bf16_softmax_w64_v8']
    """
    _check_common(problem.dtype, problem.op, device)
    t = default_tuning(device) if tuning is None else tuning
    rows = _Rows(t, problem, device)
    return (_rows_passes(rows) or _two_pass_split(rows)).resolve()


def _sm_version(device: DeviceProfile) -> int:
    """The NVIDIA compute capability as a number (sm_90a: 90); 0 for other vendors."""
    digits = device.arch.removeprefix("sm_").rstrip("af")
    return int(digits) if device.vendor == "nvidia" and digits.isdigit() else 0


def has_async_copy(device: DeviceProfile) -> bool:
    """Copies from global to shared memory that bypass registers (cp.async): NVIDIA sm_80 and newer."""
    return _sm_version(device) >= 80


def _view_args(p: StridedProblem) -> tuple:
    """The (outer, cols, inner) view and its input and output strides, as the strided kernels take them."""
    return ((I64, p.outer), (I64, p.cols), (I64, p.inner), *((I64, s) for s in p.x_strides),
            *((I64, s) for s in p.y_strides))


class _Axis:
    """A strided problem on a device under a Tuning, as the strided rules ask of it."""

    def __init__(self, t: Tuning, p: StridedProblem, device: DeviceProfile) -> None:
        self.t, self.p, self.device = t, p, device

    @cached_property
    def cached(self) -> Draft | None:
        return _plan_strided_cached(self.t, self.p, self.device)

    def short(self) -> bool:
        """Axes of up to t.strided_thread_short_cols rows, or up to t.strided_thread_max_cols over
        at least t.strided_thread_min_inner inner positions."""
        t, p = self.t, self.p
        return p.cols <= t.strided_thread_short_cols or (
            p.cols <= t.strided_thread_max_cols and p.inner >= t.strided_thread_min_inner)


def _plan_strided_groups(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Draft:
    """A warp's worth of neighbouring inner positions per row read (fewer when inner is small);
    the rest of the block splits the reduced axis into column groups."""
    inner_tile = min(device.warp_size, 1 << (p.inner - 1).bit_length())
    threads = min(device.max_threads_per_block, max(256, inner_tile * min(32, p.cols)))
    tiles = p.outer * ceil(p.inner / inner_tile)
    args = (("ptr", "x"), ("ptr", "y"), *_view_args(p), (I32, inner_tile), (I32, _safe(p)))
    launch = Step(Kernel("strided", (p.dtype, p.op)), grid_for(tiles, device, 8), threads, 0, args)
    return Draft("strided", (launch,), notes={"inner_tile": inner_tile})


#: The planner for a strided (non-last) axis, in order: the first rule that takes a problem builds its plan.
STRIDED_RULES: tuple[Rule, ...] = (
    Rule("empty", "no lines, or lines of no elements: nothing to launch",
         lambda a: a.p.outer * a.p.inner <= 0 or a.p.cols <= 0, lambda a: Draft("empty", ())),
    Rule("strided_cached", "axes whose tiles fill a block's shared memory: chunks on co-resident blocks, one read",
         lambda a: a.cached is not None, lambda a: a.cached),
    Rule("strided_thread", "short axes: a thread per 16 bytes of inner positions, no reduction across threads",
         _Axis.short, lambda a: _plan_strided_thread(a.t, a.p, a.device)),
    Rule("strided", "other axes: a warp of inner positions a read, column groups across the block",
         lambda a: True, lambda a: _plan_strided_groups(a.t, a.p, a.device)),
)


def _plan_strided(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Plan:
    axis = _Axis(t, p, device)
    return first_rule(STRIDED_RULES, axis).build(axis).resolve()


@dataclass(frozen=True)
class StridedPasses:
    """The shape of the strided passes apart: ``vec`` inner positions a vector, ``lines`` vectors a
    thread, the axis in ``chunks`` chunks of ``chunk_cols`` rows, ``grid`` blocks of ``threads``."""

    vec: int
    lines: int
    chunks: int
    chunk_cols: int
    grid: int
    threads: int

    @property
    def chunk_args(self) -> tuple:
        """The launch arguments that tell both passes the axis's chunks."""
        return ((I64, self.chunks), (I64, self.chunk_cols))

    @property
    def notes(self) -> dict:
        return {"vec": self.vec, "lines": self.lines, "chunks": self.chunks, "chunk_cols": self.chunk_cols}


def strided_passes(t: Tuning, device: DeviceProfile, dtype: str, outer: int, cols: int, inner: int,
                   vec: int) -> StridedPasses:
    """The shape of the strided passes apart over an (outer, cols, inner) view whose rows are aligned
    to ``vec`` inner positions: strided_thread's 16 bytes of positions a thread, and the axis cut
    into chunks until the threads fill the device (Tuning.strided_pass_*)."""
    lines_a_thread = V.vector_widths(dtype)[1] // vec
    threads = ceil(outer * ceil(inner / vec) / lines_a_thread)
    wanted = ceil(t.strided_pass_threads_per_sm * device.multiprocessors / threads)
    chunks = max(1, min(wanted, cols // t.strided_pass_min_chunk_rows))
    chunk_cols = ceil(cols / chunks)
    chunks = ceil(cols / chunk_cols)
    grid = _work_grid(ceil(threads * chunks / t.strided_thread_threads), device)
    return StridedPasses(vec, lines_a_thread, chunks, chunk_cols, grid, t.strided_thread_threads)


def plan_strided_passes(problem: StridedProblem, device: DeviceProfile, tuning: Tuning | None = None) -> Plan:
    """The strided passes apart, for a caller that combines each position's pairs between them (an axis
    sharded across ranks, whose collective runs there): a thread takes 16 bytes of inner positions
    down a chunk of the axis (strided_thread), the axis cut into enough chunks to fill the device.
    The first launch writes the (m, d) of each chunk of each position to ``partials`` (two of the
    compute type each, in the order of a contiguous (outer, ``notes["chunks"]``, inner) array), for
    the caller to merge a position's chunks; the second finishes each position with the pair it then
    finds in ``partials`` (one a position, in the order of a contiguous (outer, inner) array). The
    on-chip tier, whose point is one read where both passes run together, is not one of them.

    >>> strides = (8192 * 4096, 4096, 1)
    >>> p = plan_strided_passes(StridedProblem("bfloat16", "softmax", 2, 8192, 4096, strides, strides),
    ...                         DeviceProfile.h100())
    >>> [launch.kernel for launch in p.launches], p.notes["chunks"]
    (['ps_strided_partials_bf16_v8_l1', 'ps_strided_finish_bf16_softmax_v8_l1'], 128)
    """
    _check_common(problem.dtype, problem.op, device)
    t = default_tuning(device) if tuning is None else tuning
    p = problem
    if p.outer * p.inner <= 0 or p.cols <= 0:
        return Plan("empty", ())
    vec = _widest_aligned(p, V.strided_thread_widths(p.dtype))
    s = strided_passes(t, device, p.dtype, p.outer, p.cols, p.inner, vec)
    x_view = ((I64, p.outer), (I64, p.cols), (I64, p.inner), *((I64, x) for x in p.x_strides))
    first = Step(Kernel("strided_partials", (p.dtype, s.vec, s.lines)), s.grid, s.threads, 0,
                 (("ptr", "x"), ("ptr", "partials"), *x_view, *s.chunk_args))
    second = Step(Kernel("strided_finish", (p.dtype, p.op, s.vec, s.lines)), s.grid, s.threads, 0,
                  (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), *_view_args(p), (I32, _safe(p)), *s.chunk_args))
    scratch = (("partials", p.outer * s.chunks * p.inner * 2 * _compute_bytes(p.dtype)),)
    return Draft("strided_thread", (first, second), scratch, s.notes, scratch_zeroed=False).resolve()


def widest_aligned(widths, outer: int, inner: int, strides, misaligns) -> int:
    """The widest of `widths` to which every row of the arrays with these (outer, col, inner)
    `strides` and base `misaligns` starts aligned (inner positions contiguous), else 1."""
    if any(inner_stride != 1 for _, _, inner_stride in strides):
        return 1
    steps = (inner, *(c for _, c, _ in strides), *misaligns) + (tuple(o for o, _, _ in strides) if outer > 1 else ())
    return max((v for v in widths if all(s % v == 0 for s in steps)), default=1)


def _widest_aligned(p: StridedProblem, widths) -> int:
    return widest_aligned(widths, p.outer, p.inner, (p.x_strides, p.y_strides), (p.x_misalign, p.y_misalign))


def strided_thread_lines(dtype: str, vec: int, cols: int) -> int:
    """Vectors of `vec` inner positions a thread of the short-axis strided tier takes: 16 bytes of
    positions, and more 16-byte vectors where the axis has few rows to load."""
    lines_a_thread = V.vector_widths(dtype)[1] // vec
    if lines_a_thread == 1:
        lines_a_thread = next((n for rows, n in V.STRIDED_THREAD_WIDE_LINES if cols <= rows), 1)
    return lines_a_thread


def strided_vec(t: Tuning, p: StridedProblem) -> int:
    """Inner positions a thread of the on-chip strided tier takes with one vector load: the
    widest (V.strided_vector_widths) when every row of the input and output starts aligned to
    it, else 1."""
    return strided_cached_vec(t, p.dtype, p.outer, p.inner, (p.x_strides, p.y_strides), (p.x_misalign, p.y_misalign))


def strided_cached_vec(t: Tuning, dtype: str, outer: int, inner: int, strides, misaligns) -> int:
    """strided_vec over any arrays (a gradient's dy, y and dx): their (outer, col, inner) strides
    and base misaligns."""
    if V.DTYPES[dtype][2] not in t.strided_vector_itemsizes:
        return 1
    return widest_aligned(V.strided_vector_widths(dtype), outer, inner, strides, misaligns)


def _plan_strided_thread(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Draft:
    vec = _widest_aligned(p, V.strided_thread_widths(p.dtype))
    lines_a_thread = strided_thread_lines(p.dtype, vec, p.cols)
    lines = p.outer * ceil(p.inner / vec)
    args = (("ptr", "x"), ("ptr", "y"), *_view_args(p), (I32, _safe(p)))
    launch = Step(Kernel("strided_thread", (p.dtype, p.op, vec, lines_a_thread)),
                  _work_grid(ceil(lines / (t.strided_thread_threads * lines_a_thread)), device),
                  t.strided_thread_threads, 0, args)
    return Draft("strided_thread", (launch,), notes={"vec": vec, "lines": lines_a_thread})


@dataclass(frozen=True)
class StridedTiles:
    """The on-chip strided tier's shape (strided_cached): tiles of ``width`` inner positions, each
    split into ``chunks`` chunks of ``chunk_cols`` rows that co-resident blocks cache, ``grid``
    blocks of ``threads`` with ``shared`` bytes of cache each."""

    inner_tile: int
    width: int
    chunk_cols: int
    chunks: int
    tiles: int
    threads: int
    shared: int
    grid: int


def strided_tiles(t: Tuning, device: DeviceProfile, dtype: str, outer: int, cols: int, inner: int, vec: int,
                  inputs: int = 1, partial_bytes: int | None = None) -> StridedTiles | None:
    """The shape of strided_cached for an (outer, cols, inner) view whose positions take ``vec``
    inner positions a thread and hold ``inputs`` arrays in the cache (the forward's x; a gradient's
    dy and y), with a thread's partials in ``partial_bytes`` of shared memory a position (the
    forward's (m, d): two of the compute type),
    or None where the axis is short enough for one block or too long for the chip."""
    itemsize = V.DTYPES[dtype][2]
    partial_bytes = 2 * _compute_bytes(dtype) if partial_bytes is None else partial_bytes
    # Threads along inner: a tile row of t.strided_row_bytes (whole cache lines, and no wider, so
    # that a chunk of a tile holds many rows and a tile few chunks, whose partials every chunk reads).
    inner_tile = min(device.warp_size, 1 << (ceil(inner / vec) - 1).bit_length(),
                     max(1, t.strided_row_bytes // (vec * itemsize)))
    width = inner_tile * vec  # inner positions of a tile
    row_bytes = width * itemsize * inputs  # a row of a tile in the cache
    threads = t.strided_cached_threads
    # The axes it takes are those of one input, whatever the cache holds: a gradient's axis takes the
    # regime of its forward's.
    if width * itemsize * cols < t.strided_cached_min_tile * device.shared_mem_per_block or (
            threads > device.max_threads_per_block or threads % inner_tile):
        return None
    static_bytes = threads * vec * partial_bytes + 1024  # the partials' scratch, the runtime's share
    chunk_budget = min(device.shared_mem_per_block_optin,
                       device.shared_mem_per_multiprocessor // t.strided_chunks_per_sm) - static_bytes
    chunk_cols = chunk_budget // row_bytes
    if chunk_cols < threads // inner_tile:
        return None
    chunks = ceil(cols / chunk_cols)
    if chunks > device.multiprocessors:
        return None
    chunk_cols = ceil(cols / chunks)
    chunks = ceil(cols / chunk_cols)
    shared = chunk_cols * row_bytes
    tiles = outer * ceil(inner / width)
    grid = _cooperative_grid(device, threads, shared + static_bytes, tiles, chunks)
    return StridedTiles(inner_tile, width, chunk_cols, chunks, tiles, threads, shared, grid)


def _plan_strided_cached(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Draft | None:
    """The on-chip form of the strided tier (strided_cached), or None where it does not fit."""
    vec = strided_vec(t, p)
    s = strided_tiles(t, device, p.dtype, p.outer, p.cols, p.inner, vec)
    if s is None:
        return None
    args = (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), ("ptr", "arrivals"), *_view_args(p),
            (I32, s.inner_tile), (I64, s.chunk_cols), (I64, s.chunks), (I32, _safe(p)))
    launch = Step(Kernel("strided_cached", (p.dtype, p.op, vec)), s.grid, s.threads, s.shared, args,
                  cooperative=True, min_grid=s.chunks)
    partials = s.tiles * s.chunks * s.width * 2 * _compute_bytes(p.dtype)  # an (m, d) a chunk a position
    return Draft("strided_cached", (launch,), scratch=(("partials", partials), ("arrivals", 4 * s.tiles)),
                 notes={"inner_tile": s.inner_tile, "vec": vec, "chunks": s.chunks, "chunk_cols": s.chunk_cols})

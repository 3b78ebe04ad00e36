"""The dispatch planner: a pure function from (problem, device limits) to launches.

Nothing here touches a GPU, so every decision is unit-tested against device
profiles (an NVIDIA H100, an AMD MI300X at warp 64, an RDNA3 card at warp 32).

>>> from portable_softmax.planner import DeviceProfile, RowProblem, plan
>>> h100 = DeviceProfile.h100()
>>> p = plan(RowProblem("float32", "softmax", rows=4096, cols=1000), h100)
>>> p.tier, p.launches[0].kernel
('warp', 'ps_warp_f32_softmax_w32_l32_s8_v4')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
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


#: alignment of each buffer in a plan's scratch allocation
SCRATCH_ALIGN = 256


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

    ``plan(problem, device)`` takes the family's default (``default_tuning``); an A/B run passes
    ``plan(problem, device, dataclasses.replace(default_tuning(device), name=value))``.
    """

    #: rows of SCALAR_ROWS_MIN_COLS to SCALAR_ROWS_MAX_COLS elements take scalar slots in the
    #: register tier (coalesced element loads, no partial vector heads and tails): all float32 rows;
    #: 16-bit rows that are not whole 16-byte vectors and fill SCALAR_ROWS_FULL of the lanes' slots,
    #: or SCALAR_ROWS_MIN_FILL when they are too long for the staged tier's 128-thread blocks.
    #: Measured on an H100 (% of the copy, scalar against the staged tier or 16-byte vectors):
    #: float32 67-131 odd columns 82-101 against 69-93, whole-vector rows of 96, 100 and 160 columns
    #: 99-102 against 95-98 (64-500 columns otherwise within 2 points); 16-bit 127, 201, 255 and 511
    #: odd columns 76-89 against 41-67; but 16-bit rows of 67, 99-100 and 131 odd columns (half to
    #: three quarters of the slots filled, the staged tier at 128 threads) 47-69 against 66-75, and
    #: 16-bit whole-vector rows of 64-112 columns 56-76 against 74-91. float32 rows of 64 columns take
    #: a group of 16 lanes of one 16-byte slot instead (EXACT_GROUP_MIN_LANES); of 128 columns, a whole
    #: warp's, they measured level to 2 points slower than scalar slots (H100, 4-256 MiB).
    scalar_rows_min_cols: int = V.SCALAR_ROWS_MIN_COLS
    scalar_rows_max_cols: int = 512
    scalar_rows_min_fill: float = 0.75
    scalar_rows_full: float = 0.9
    #: values a lane of the register tier holds at most, by bytes per element (rows that need more go
    #: to the block tier). Measured on an H100: 16-bit rows of 1500 and 2048 columns at 64 values a
    #: lane 69-79% of the copy, in the block tier 80-88%; at a cap of 16 values 1000-1024 columns
    #: fell from 88-94 to 80-84; float32 rows at 64 values a lane are at the copy already.
    warp_tier_max_values: SizeMap = SizeMap(V.MAX_VALUES_PER_LANE_BY_ITEMSIZE)
    #: the same where the block tier's row cache is filled by asynchronous copies, for rows that start
    #: on 4-byte boundaries. Measured on an H100 (16-bit, % of the copy, cap 16 against 32): 600-1024
    #: columns 72-91 -> 87-101 (520: 77 -> 79); odd columns 513-777 57-73 against 67-78 at 32, 901-1001
    #: level (+1-2 at 16), so rows of an odd number of 16-bit values keep the cap of 32.
    warp_tier_max_values_whole_words: SizeMap = SizeMap(V.MAX_VALUES_PER_LANE_BY_ITEMSIZE)
    #: contiguous rows of STAGED_MIN_COLS elements up to STAGED_MAX_ROW_BYTES whose length is not a
    #: whole number of 16-byte vectors are staged through shared memory (staged_rows). Measured on an
    #: H100: 5-7 and 100 columns gain 15-40 points of the copy over the register tier; rows of whole
    #: vectors (8, 32, 128 columns) and of 1-4 elements are faster in the register tier.
    staged_min_cols: int = 5
    staged_max_row_bytes: int = 512
    #: the same where copies are asynchronous (the staged tier fills its span with cp.async). Measured
    #: on an H100: 16-bit rows of 257 columns 53 -> 95% of the copy, 270 columns 95-96 (91 with a warp
    #: a row); longer rows go to the staged tier with a warp a row (STAGED_WARP_ROW_BYTES).
    #: bytes of the span a thread of the staged tier moves per step. Measured on an H200 against 64
    #: (% of the copy): 16-bit rows of 7 columns 81-85 -> 85-89, 13: 79 -> 85-86, 32: 80-81 -> 84-85;
    #: 63-255 columns and float32 7-50 columns within a point; 256 bytes level or slower. On an H100,
    #: 16-bit rows of 5 columns +4 and 13 level.
    staged_bytes_per_thread: int = 128
    #: threads of a staged block: rows of up to STAGED_SHORT_ROW_BYTES, and longer ones (at most the
    #: kernel's launch bound, V.LAUNCH_BOUND_THREADS; 64 or 256 measured level or slower on an H100)
    staged_threads: int = 128
    staged_threads_long_rows: int = 64
    staged_short_row_bytes: int = 256
    #: where copies are asynchronous: rows of up to this many columns, by element size, that the
    #: staged tier takes ahead of the register tier's scalar slots. Measured on an H100: 16-bit 127,
    #: 201 and 255 columns 84-91 -> 94-100% of the copy; float32 65-75 columns 91-96 -> 100-101, but
    #: 96-127 columns 1-4 points slower staged.
    staged_before_scalar_cols: SizeMap = SizeMap()
    #: where copies are asynchronous: rows of whole 16-byte vectors of this many bytes (from, to) are
    #: staged too. Measured on an H100 (threads starting rows at different words, for_each_word_from):
    #: 16-bit 24-200 columns 65-96 -> 94-101% of the copy, float32 20-68 columns 92-101 -> 99-102,
    #: 16-bit 208-232 columns 87-91 -> 93-96 (240-248 level); rows of 384 bytes level or 4 points
    #: slower in float32, 512 bytes (16-bit 256) 95 -> 87-92, and 32 bytes (float32 8 columns) 99 -> 93-94.
    staged_whole_vector_bytes: tuple = (1, 0)  # none
    #: small inputs: the staged tiers' tiles, and the packed and register tiers' blocks, shrink until
    #: the grid has this many blocks a multiprocessor where the rows allow (0: the usual sizes). A
    #: 1 MiB input made 16-70 blocks of the usual size, most multiprocessors idle, and a staged thread
    #: took its several rows one after the other. Measured on an H200 (same process, two runs, % of
    #: the copy, 1 MiB inputs, 2026-11-24): 16-bit rows of 5-13 columns 51-58 -> 81-88 (torch 72-78),
    #: float32 5 columns 67-72 -> 90-93 (torch 86-90), packed 16-bit rows of 1-32 columns +2 to +5;
    #: 8 blocks a multiprocessor level with 4.
    small_input_blocks_per_sm: float = 4.0
    #: inputs of fewer bytes than this, of rows of at least SMALL_INPUT_UNSTAGED_MIN_COLS columns,
    #: skip the staged tiers (a thread or a group of lanes a row, its values one after the other) for
    #: the register tier's lanes a row, whose values are reduced in parallel: a small input's call is
    #: about one round of latency. Measured on an H200 (same process, two runs, % of the copy, against
    #: the staged tiers spread as above): at 1-4 MiB float32 rows of 32-127 columns 50-99 -> 74-122
    #: (4096x64 50 -> 79-82, torch 90-93; 16384x64 56 -> 85-86, torch 90-91), 16-bit rows of 64-3000
    #: columns 51-96 -> 71-104 (8192x64 61-65 -> 79-84, torch 86-93); but 16-bit 513 columns 95-98 ->
    #: 95 at 4 MiB. At 16 MiB mixed: float32 64 columns 70 -> 90-91, 16-bit 1000-3000 columns +3-8,
    #: but 16-bit 200 and 513 columns 91-93 -> 71-85. So inputs under 8 MiB.
    small_input_unstaged_bytes: int = 8388608
    small_input_unstaged_min_cols: int = V.ONE_ROW_MIN_VALUES
    #: rows that a whole warp of the register tier reads several at a time (its lanes' slots hold under
    #: 32 bytes of a row, WarpBatch), no more of them than SMALL_INPUT_ONE_ROW_A_WARP_WAVES waves of
    #: the device's resident warps, take one row a warp instead: the shortest variant of the same
    #: vectors whose lanes hold 32 bytes (its slots past the row empty), where that is at most
    #: ONE_ROW_A_WARP_MOST_SLOTS times the slots a lane needs. Such a call is about one round of
    #: latency: twice or four times the warps, a row each, finish sooner than fewer warps taking their
    #: rows in turn, while they all fit on the device at once. Measured on an H100 (device time a call,
    #: us, 1 MiB, `tools/warp_batch_probe.py`; several rows a warp / one / torch): float32 4096x64
    #: 5.70 / 5.09 / 5.06, 2064x127 5.28 / 5.06 / 5.34, 1x128 4.38 / 4.16 / 4.16, float16 2621x200
    #: 5.95 / 5.28 / 5.50; on an H200 (% of the copy, `tools/ab_bench.py`, softmax / log_softmax):
    #: rows within one wave (0.25-4 MiB) +3 to +15 (float32 4096x64 81 / 79 -> 89 / 93, 2621x100 90 /
    #: 81 -> 93 / 96, 8256x127 121 / 118 -> 126 / 128, float16 2621x200 79 -> 90); past it 3-24
    #: slower (float32 16384x64 84 -> 72, 32767x64 110 -> 86, float16 10485x200 104 -> 98), so those
    #: keep their rows. Where one 16-byte slot a lane holds the row, the variant is the whole warp's
    #: of one slot taking one row a step (V.one_row_variants), not two slots (ONE_ROW_A_WARP_SHALLOW):
    #: half the values a lane, the empty half of them no longer computed. Measured on an H100 (two runs,
    #: % of the copy): float16 2621x200 89-95 -> 92-99, 4096x200 89-93 -> 92-96; float32 rows of 64-127
    #: columns level.
    small_input_one_row_a_warp_waves: float = 1.0
    one_row_a_warp_most_slots: int = 4
    one_row_a_warp_shallow: bool = True
    #: the register tier's lane groups of a small input (SMALL_INPUT_UNSTAGED_BYTES) whose lanes hold
    #: under 32 bytes of a row (one 16-byte slot: WarpBatch gives the group two rows a step) take one row
    #: a step instead (V.one_row_variants) where their warps then fit SMALL_INPUT_ONE_ROW_GROUP_WAVES
    #: waves of resident warps: twice the warps, each lane half the values. A small call is a round of
    #: latency, and a lane's values are a chain of dependent arithmetic that few warps a scheduler do
    #: not hide (ncu, H100, float16 8192x64: 11% achieved occupancy against torch's 39%, with 2.4 times
    #: fewer instructions). Measured on an H100 (device time a call, `tools/warp_batch_probe.py`, us,
    #: two rows a step / one / torch): float16 8192x64 5.76 / 5.06 / 5.31, 4096x100 (then a warp a row)
    #: 6.21 / 5.28 / 5.73, float32 8192x32 5.28 / 5.06 / 5.06. Then (`tools/ab_bench.py`, two runs,
    #: % of the copy, softmax and log_softmax, against the plans before): float16 512x64 82-85 -> 89-90
    #: (torch 86-90), 4096x64 80-83 -> 90-92 (91-95), 8192x64 82-85 -> 92-96 (88-92), 32768x64 87-88
    #: -> 93-94 (76-81), 4096x100 77-80 -> 90-91 (84-95), 5242x100 74-76 -> 88-89 (82-92), 4096x128
    #: 85-88 -> 92-96 (82-89), 16384x128 87-88 -> 92-94 (76-84); bfloat16 6000x64 80-81 -> 95 (91-95),
    #: 12000x160 (a whole warp's one slot, 1.4 waves) 106-108 -> 113-119 (106-115); float32 8192x16 86-91
    #: -> 94-95 (94-95), 1024x32 85-89 -> 90-95 (92-94), 4096x32 86-90 -> 91-94 (93-94), 8192x48 93-94
    #: -> 90-93 (90). At one wave instead of four, 12000x160 stays level. Earlier, lane groups of 8-16
    #: lanes taking a whole warp a row within half a wave measured +1 to +11 (docs/perf-notes.md); the
    #: groups of one row a step beat that by 0-10 more and keep their lanes.
    small_input_one_row_group_waves: float = 4.0
    #: rows that a lane group of the register tier holds in one 16-byte slot a lane, filling each of
    #: EXACT_GROUP_MIN_LANES or more lanes (at warp 32: float32 rows of 64 columns, 16-bit rows of 128
    #: and 256; float32 rows that take scalar slots, scalar_rows, keep them), take that group's kernel
    #: of one row a step (V.one_row_variants), ahead of the staged tiers: float32 rows at every size,
    #: 16-bit rows up to EXACT_GROUP_MAX_BYTES (past it, the padded staged groups:
    #: STAGED_GROUP_PADDED_MAX_ROW_BYTES). Measured (% of the copy, softmax / log_softmax, against the
    #: staged groups with a slot of padding a row) on H100s (tools/ab_bench.py, same process, four
    #: machine sessions): float32 64 columns at 8 MiB 82-87 / 85-90 -> 94-96 / 96-97, 16 MiB 93-94 /
    #: 96 -> 97-98 / 98, 64 MiB 97-100 -> 98-100, 512 MiB 99-100 -> 101 (torch 101); at 0.5-2 MiB
    #: (against a whole warp a row of scalar slots) softmax level, log_softmax level to 2 slower;
    #: float16 128 columns at 16 MiB 85-86 / 88-89 -> 97 / 98; float16 256 columns at 16 MiB 87-91 /
    #: 92-93 -> 97-98 / 98; bfloat16 the same. On an H200 (the bench command, both builds in one
    #: machine session): float32 64 columns at 16 MiB 83 / 88 -> 96 / 97, 64-512 MiB level (2097152x64
    #: 97 / 97 -> 95 / 97, torch 87 / 91); 16-bit 128 columns at 16 MiB 76-78 / 78-80 -> 91 / 91-93, 32
    #: MiB 83-84 -> 88-90. Groups of 4-8 lanes (float32 16 and 32 columns) measured level to 2 slower
    #: from 16 MiB on (H100), so they take the staged tiers past SMALL_INPUT_GROUP_BYTES.
    exact_group_min_lanes: int = 16
    #: bytes an element -> the largest input that EXACT_GROUP_MIN_LANES's rule takes (none: any). 16-bit
    #: rows past 32 MiB: on the H200 the padded staged groups led the register tier's groups from 64 MiB
    #: on (16-bit 128 columns at 64 MiB 88-92 -> 86-89, 128-256 MiB 90-95 -> 84-86; 256 columns at
    #: 64-256 MiB 91-96 -> 83-87), where the H100 measured the groups 1-2 ahead (float16 1048576x128 98
    #: -> 100, 131072x256 98-99 -> 99-100).
    exact_group_max_bytes: SizeMap = SizeMap({2: 33554432})
    #: inputs of up to this many bytes whose rows a lane group of fewer lanes than a warp holds in one
    #: 16-byte slot a lane (V.one_row_variants' groups) skip the staged tiers too, as inputs under
    #: SMALL_INPUT_UNSTAGED_BYTES do: the staged tiers' few blocks a multiprocessor at 8-12 MiB each
    #: load, reduce and store a tile in turn. Measured on H100s (% of the copy, softmax / log_softmax,
    #: against the staged tiers, same process): at 8-8.5 MiB float32 rows of 16-60 columns +7 to +22
    #: (16 columns 79-81 / 82-84 -> 96 / 97, 44: 98 / 101 -> 115 / 117), 16-bit rows of 48-120 columns
    #: +13 to +27 (float16 96 columns 86 / 90 -> 113 / 114); at 12 MiB float32 16-60 columns level to
    #: +16 (20 columns 95 / 98 -> 112 / 113, 52 columns 109-111 / 117 -> 114 / 115), 16-bit 48-120
    #: columns +6 to +17 but float16 80 columns 91-92 / 95 -> 91 / 90; at 16 MiB float32 rows of 24-36
    #: and 52-60 columns and 16-bit rows of 48-120 columns 1-11 slower (bfloat16 104 columns 103 / 109
    #: -> 96 / 97), so not there. On an H200 at 8.5-12 MiB +12 to +25 (float32 139264x16 70-72 / 74-75
    #: -> 96 / 97, float16 46421x96 79-81 / 83-85 -> 101-103 / 102-104). Rows a whole warp takes
    #: (float32 100, float16 200 columns) lost 9-18 on the register tier at 12-16 MiB (H100) and keep the
    #: staged groups.
    small_input_group_bytes: int = 12582912
    #: a staged plan of rows longer than a 16-byte vector a lane of a warp (and of the shorter rows of
    #: FEW_TILES_SHORT_ROW_ITEMSIZES) that covers them in fewer tiles than this a multiprocessor gives
    #: way to the block tier (the small-input block, SMALL_INPUT_BLOCK_SLOTS_PER_THREAD), or to the
    #: register tier where it reads the rows in whole slots (_whole_slot_rows); rows one warp takes fill
    #: FEW_TILES_MIN_FILL of its slots. The staged blocks, a few a multiprocessor, each load, reduce and
    #: store a tile in turn; with few tiles each, that sequence is not hidden behind other blocks' (the
    #: small-input rules' reason, past their sizes). Measured on an H100 (tools/ab_bench.py, same
    #: process, % of the copy, softmax and log_softmax, 2026-11-27), 16-bit rows of 260-4000 columns at
    #: 8.2-32 MiB against the staged tiers: under 8 tiles a multiprocessor the block tier +5 to +27 on
    #: 1100-4000 columns (float16 1114x4000 88 -> 114, 3315x1344 92 -> 110), +5 to +13 on 640-1024
    #: columns at 8.5-12 MiB (4352x1024 81 -> 94), level (within 3) at 6-8 tiles but rows of 624-720
    #: columns, 3-8 slower there; the register tier +4 to +13 on whole-vector rows of 416-512 columns
    #: (8704x512 78 -> 90), level to 6 slower at 6-8 tiles. Rows of partial slots on the register tier
    #: (260, 300, 513, 777 columns) ran 4-36 slower, rows filling under 0.8 of the tier's slots 2-21
    #: slower (the register tier at 264-384 columns, the block tier at 520-600 and, two warps, 1100);
    #: from 8 tiles on the staged tiers led.
    staged_min_tiles_per_sm: int = 8
    #: ... but rows that one warp takes (the register tier, or a block of one warp) give way only under
    #: this many: such moves measured +6 to +9 on average under 6 tiles, level (-8 to +5) at 6-8.
    staged_min_tiles_per_sm_one_warp: int = 6
    #: the share of a warp's slots (a one-warp block's lanes x passes, the register tier's lanes x
    #: slots a lane where a lane holds two or more 16-byte vectors) that rows STAGED_MIN_TILES_PER_SM
    #: moves to one warp fill at least. Blocks of several warps fill 0.75 or more by their size
    #: (SMALL_INPUT_BLOCK_SLOTS_PER_THREAD), and measured +3 to +23 at 0.75-0.8 (16-bit rows of 1600
    #: and 3200 columns); float32 rows on scalar slots or one vector a lane gained at 0.56-0.75 (below).
    few_tiles_min_fill: float = 0.8
    #: element sizes whose shorter rows (of SMALL_INPUT_UNSTAGED_MIN_COLS columns or more) follow the
    #: rule too, to the register tier: float32, whose register-tier rows take scalar slots
    #: (SCALAR_ROWS_MIN_COLS) or one 16-byte slot a lane. Measured on an H100 (same process, two runs,
    #: 2026-11-27), under 6 tiles a multiprocessor at 9-14 MiB: float32 rows of 40-150 columns +7 to
    #: +20 (29491x80 88-93 -> 112-114, 32768x72 81-83 -> 90-92, 15728x150 100-103 -> 113-118), but
    #: 100 columns level (-1); then, on 53 other shapes of 20-148 columns at 8.5-16 MiB, +8.3 on
    #: average, 47 by more than 2, none slower by more than 2 (76458x48 94-97 -> 112-114, torch 103-108).
    #: 16-bit rows of 96 and 200 columns +4 to +8 there, but at 16 MiB (5-10 tiles) 16-bit rows of
    #: 48-120 columns measured 1-11 slower in the thirty-fifth session, so they keep the staged tiers.
    few_tiles_short_row_itemsizes: tuple = (4,)
    #: staged plans that stay on the staged tiers with fewer than STAGED_MIN_TILES_PER_SM tiles a
    #: multiprocessor (rows the rule above leaves, or whose other tiers do not qualify) cut their tiles
    #: until the grid has this many blocks a multiprocessor where the rows allow (0: off), for inputs of
    #: FEW_TILES_SMALLER_MIN_BYTES or more: with a few tiles a block, a block's load, reduction and
    #: store in turn are not hidden; with smaller tiles and more blocks they are. Measured on an H100
    #: (tools/ab_bench.py, same process, two runs, % of the copy, 2026-11-27), 256 shapes drawn from the
    #: plans this changes (rows of 5-447 columns, 0.5-40 MiB), against the tiles as spread for 4 blocks
    #: a multiprocessor: staged groups +10 to +18 on average at every size (float32 and 16-bit rows of
    #: 50-447 columns); the staged tier's short rows +5 to +9 under 6 tiles at 8-16 MiB, +1 to +4 at
    #: 6-8 tiles and past 16 MiB (worst 5 slower, bfloat16 120328x122 at 28 MiB), +6 at 2-8 MiB, but
    #: level to 6 slower at 0.5-1 MiB. 8 blocks a multiprocessor gained less (+0 to +7 on average), 32
    #: as much or less. Then on 125 other shapes (1.25-36 MiB; the better of two runs): staged groups
    #: +10 to +15 on average, 16-bit rows of 320 columns at 9-20 MiB 82-91 -> 93-110, 16-bit 13 columns
    #: at 10-13 MiB 87-101 -> 94-116; at 1.25 MiB level (+0 to +1, 6 slower to 9 faster), at 1.5-1.75
    #: MiB 16-bit +5 to +6 but float32 level (-0.4 to +1.6): so from 2 MiB. On an H200, the 335 shapes
    #: of both lists from 2 MiB: +6.7 on average, 202 by more than 2, 7 slower by 2.5-4 (H100: +8.1,
    #: 222, one slower by 5.5).
    few_tiles_blocks_per_sm: float = 16.0
    few_tiles_smaller_min_bytes: int = 2097152
    #: where copies are asynchronous: contiguous rows of this many bytes (from, to) and element sizes
    #: take the staged tier with a warp a row (staged_warp_name): the block reads a span of whole rows
    #: with aligned vectors, each warp takes rows from shared memory, its lanes a word apart, and
    #: merges their (m, d) by shuffles. Rows the staged tier takes a thread a row (up to
    #: STAGED_MAX_ROW_BYTES_ASYNC) stay there. Measured on an H100 (% of the copy, against the tiers
    #: these rows took before): 16-bit rows of 300-383 columns (a thread a staged row) 81-91 -> 96-99,
    #: 400-1001 columns (register and block tiers; odd lengths the slowest) 67-88 -> 97-101, 1300-4000
    #: columns 95-99 -> 100-101, but 4096 columns (8 KiB) 99 -> 98; a thread a row ahead at 270
    #: columns (95 against 91); float32 rows of 145-2048 columns within a point either way.
    staged_warp_row_bytes: tuple = (514, 8000)
    staged_warp_itemsizes: tuple = V.STAGED_WARP_ITEMSIZES
    #: bytes of the span a thread of the warp-a-row staged tier moves per step. Measured on an H100:
    #: 16-bit 1001 columns at 64 bytes (a row a warp) 91-96%, at 128 bytes 100 (777 and 900 columns
    #: 1-2 points slower); 32 bytes 2-24 points slower.
    staged_warp_bytes_per_thread: int = 128
    #: where copies are asynchronous: contiguous rows of up to STAGED_GROUP_MAX_ROW_BYTES that a group
    #: of fewer lanes than a warp takes (V.STAGED_GROUP_LANES, the fewest that qualify), several rows a
    #: warp at once: fewer shuffle steps a row, and those shared by the warp's rows. A group qualifies
    #: where its lanes take at least STAGED_GROUP_MIN_WORDS words of a row each, a row a group fits
    #: STAGED_GROUP_TILE_BYTES, and the warp's groups, whose rows lie any number of banks apart, read no
    #: bank more than STAGED_GROUP_MAX_WAYS at once (staged_bank_ways). Rows of up to
    #: STAGED_SHORT_ROW_BYTES stay a thread a row (but for padded ones and those of
    #: STAGED_GROUP_SHORT_MIN_ROW_BYTES, below). Measured on an H200 (% of the copy, against a thread
    #: or a warp a row): 16-bit 140 columns (4 lanes) 88-94 -> 99-100, 160
    #: (8) 82-89 -> 90-92, 176-240 columns (4) 71-94 -> 95-98, 288 (8) 68 -> 98-99, 300 (4) 69 -> 99,
    #: 320 (16, 10 words a lane) 74 -> 89-93, 383 (16) 75 -> 83-85, 400-500 (8) 67-84 -> 92-99, 513-1001
    #: columns (8 or 16) 85-93 -> 96-99, 1500 (16) 94-96 -> 98. Rows of up to 256 bytes measured 91-100
    #: a thread a row and, with 4 lanes, from 8 points slower (92 columns, 84-88) to 6 faster (120
    #: columns). Where four groups read one bank (8 lanes: 383, 513, 700 and 900 columns) 71-76; 16
    #: lanes at 8 words a lane 73 against 79 a thread a row (255 columns); rows of 32 KiB a tile (8
    #: lanes, 1001 columns: 98; 16 lanes, 2048 columns: 94 against 96) or more slower. On an H100 every
    #: row measured level or faster (16-bit 176-450 columns 89-97 -> 100-101).
    staged_groups: bool = True
    #: bytes an element -> the longest row (bytes) groups take. float32, against the register and
    #: staged tiers (% of the copy): H200 67-150 columns 90-98 -> 99-100 (100 columns softmax 90 ->
    #: 100), 200-700 columns 98-101 -> 97-100 (383 columns 1-3 slower); H100 level or faster (80
    #: columns 98 -> 101).
    staged_group_max_row_bytes: SizeMap = SizeMap(V.STAGED_GROUP_MAX_ROW_BYTES)
    staged_group_min_words: int = V.STAGED_GROUP_MIN_WORDS
    staged_group_tile_bytes: int = 24576
    staged_group_max_ways: int = 2
    #: the orders of a tile's rows among a block's groups that the planner weighs: in order (False),
    #: and interleaved (True: the groups of 32 lanes on rows STAGED_THREADS / 32 apart), for the
    #: lengths whose groups share banks in order. Measured against in order only (same run, two runs
    #: each, % of the copy): H200 16-bit 255 columns 80-85 -> 98-99, 383: 82-86 -> 98-99, 161: 87-91 ->
    #: 98, bfloat16 257: 82-87 -> 99-100, 389: 85-89 -> 94-96, 450: 89-93 -> 95-96, float32 97 columns
    #: 87-94 -> 97, 129: 79-87 -> 98, but 16-bit 130 columns 97-99 -> 94-97; H100 level or up to +6.
    #: Of the two, the one whose groups share the fewest banks; in order where both share as few.
    #: Measured against in order wherever that was within STAGED_GROUP_MAX_WAYS (same process, two
    #: runs, % of the copy, 64 MiB / 256 MiB, 2026-11-25): H200 16-bit 154 columns 91-93 -> 95-97 /
    #: 87-88 -> 91-93, 218 columns 89-93 -> 97-101 / 89-91 -> 97-100, 350 columns 90-91 -> 98-102 / 90
    #: -> 97-99, float32 77 columns 90-97 -> 103-108 / 88-91 -> 98-100; 16-bit 134-684 and float32
    #: 67-147 columns otherwise level (within 2); H100 level everywhere.
    staged_group_orders: tuple = (False, True)
    #: rows of a power-of-two number of 16-byte slots (whole 128-byte lines from 128 bytes, where the
    #: groups of a warp start on the same banks), of these element sizes and longer than
    #: STAGED_GROUP_PADDED_MIN_ROW_BYTES, the span aligned, that no group takes as they lie, take a slot
    #: of padding after each row in the tile. Measured on an H200 (% of the copy, against the tiers
    #: before): 16-bit 128 columns (4 lanes) 85-92 -> 92-94, 256 columns (4) 78-83 -> 95-96; where an
    #: unpadded group qualifies (16 lanes at 512 and 1024 columns) padded groups were 1-2 points
    #: slower, and float32 128 columns (the register tier's lanes each a whole vector) 99-100 -> 96-97.
    #: float32 rows of 64 columns (256 bytes) gained too (H200 85-88 -> 93-95 at 64 MiB), but now take
    #: the register tier's groups (EXACT_GROUP_MIN_LANES), as 16-bit rows of 128 and 256 columns do up to
    #: EXACT_GROUP_MAX_BYTES. Bytes an element -> the longest row padded.
    staged_group_padded_max_row_bytes: SizeMap = SizeMap({2: 8000})
    staged_group_padded_min_row_bytes: int = 128
    #: rows of more than this many bytes (up to STAGED_SHORT_ROW_BYTES) that are an even number of
    #: 4-byte words take the groups too where one qualifies. A thread a row starts each of its rows at
    #: a different word (for_each_word_from) for such rows, and measured slower there than 4 lanes a
    #: row; rows of an odd number of words, and shorter rows, measured as fast or faster a thread a
    #: row. Measured on an H200 (same process, two runs, % of the copy, 64 MiB / 256 MiB, 2026-11-25),
    #: a thread a row -> 4 lanes: float32 52-60 columns 95-102 -> 99-108 / 97-98 -> 98-100; 16-bit
    #: 100-120 columns 87-93 -> 94-100 / 92-96 -> 96-100, 124 columns 86-91 -> 88-92 / 92-95 -> 90-93.
    #: Not taken: float32 40 columns (160 bytes) 99-104 -> 95-98; float32 49-61 and 16-bit 98-127
    #: columns of an odd number of words, up to 12 points slower (16-bit 98 columns log_softmax 103 ->
    #: 92); 16-bit 80-88 columns level to 3 slower.
    staged_group_short_min_row_bytes: int = 192
    #: bytes of the span a thread of the staged groups moves per step (padded rows: as the warp-a-row
    #: tier, STAGED_WARP_BYTES_PER_THREAD). Measured (same process, two runs, % of the copy, 64 MiB /
    #: 256 MiB, 2026-11-25), 128 -> 64: H200 16-bit 218-251 columns 79-92 -> 90-101 / 87-97 -> 90-101,
    #: 420-493 columns 89-96 -> 100-104 / 96-98 -> 99-101, float32 110-125 columns 87-94 -> 99-105 /
    #: 95-97 -> 99-101 (torch 94-102), other rows of 100-1200 columns level to +3 but for 16-bit rows of
    #: 130-150 columns at 256 MiB, 96-101 -> 91-99 (float16 130 columns 97-98 -> 91-93); H100
    #: level or faster (float32 110-125 columns 99-101 -> 104-107 at 64 MiB) but for float32 67-77
    #: columns at 64 MiB, 104-108 -> 102-105. Smaller tiles, more of them, shorten each step's run of
    #: loads, compute and stores that the blocks of few waves take in step. Padded 16-bit rows of 128
    #: columns measured 94-96 -> 90-92 at 256 MiB, so keep theirs. Tiles under
    #: STAGED_GROUP_MIN_TILE_BYTES keep theirs too: the losses above had tiles of 8-10 KiB (16-bit 130-150
    #: columns, 32 rows), and so had 16-bit rows of 513 columns (8 rows of 16 lanes; H200 at 256 MiB
    #: 96-100 -> 90-94 in the default command); the gains had 13-22 KiB (16-bit rows of 100-124
    #: columns: 64 rows of 13-16 KiB instead of 96, +2 to +5 at 64 MiB, level at 256 MiB).
    staged_group_bytes_per_thread: int = 64
    #: bytes of the span a thread of the padded staged groups moves per step (see above). Measured on
    #: an H200 (same process, two runs, % of the copy, 2026-11-25), 128 -> 64 / 192: 16-bit 128 columns
    #: at 64 MiB 86-87 -> 87-89 / 84-85, at 128-256 MiB 91-94 -> 89-91 / 89-94; 256 columns 91-95 ->
    #: 91-96 / 82-86 at 64 MiB (tiles of 32 rows either way), 95-96 -> 95-96 / 92-93 at 256 MiB.
    #: Blocks of 64 threads (tiles of half the rows) level.
    staged_group_padded_bytes_per_thread: int = 128
    staged_group_min_tile_bytes: int = 12288
    #: threads per block of the packed tier (its launch bound is 256)
    packed_threads: int = 256
    #: values a thread of the packed tier holds above which it may take two tiles (kPackedTwoTilesAbove:
    #: rows of 5 and 7 16-bit columns, whose registers allow 3-4 blocks a multiprocessor)
    packed_two_tiles_above: int = 32
    #: tiles of those blocks where copies are asynchronous: with two, the next round's copies are in
    #: flight while a block computes and stores a round. Measured on an H200 (% of the copy, softmax /
    #: log_softmax, two rounds a block): float16 5 columns 89 / 91 -> 95 / 98, 7 columns 87 / 89 ->
    #: 95 / 97, bfloat16 7 columns 87 / 91 -> 96 / 99 against one tile
    packed_stages: int = 2
    #: rounds (a tile each) a block of two tiles takes. Measured on an H200 as above: one round 87-91
    #: (no round to prefetch), two 95-99, three 94-97, four (with the earlier softmax) a point or two
    #: below two, eight 79-91
    packed_rounds: int = 2
    #: rows whose groups hold more than PACKED_TWO_TILES_ABOVE values go to the packed tier only where
    #: its grid has at least this many blocks a multiprocessor (else the staged tier's smaller blocks
    #: spread the rows wider). Measured on an H200 (% of the copy, packed against staged): 16-bit rows
    #: of 64 columns, 1 MiB (16 blocks) 49-52 against 56-61; 8 MiB (128 blocks) 74-76 against 70-74;
    #: 256 MiB 94-95 against 87-90.
    packed_large_groups_min_blocks_per_sm: float = 0.5
    #: inputs under 8 MiB keep rows of 16 or more columns off the staged tiers (SMALL_INPUT_UNSTAGED_BYTES),
    #: so there the packed tier's alternative is the register tier. Rows of whole 16-byte vectors take
    #: groups of up to this many values on any grid, larger ones as above: on an H200 (% of the copy, two
    #: runs) 16-bit 40 columns at 0.25-1 MiB 72-80 -> 74-83 packed; 56 and 64 columns (56-64 values)
    #: at 1.5-4 MiB were 5-10 slower packed than in the register tier (64 columns at 3 MiB 83-86 against
    #: 73-75).
    packed_unstaged_small_grid_most_values: int = 40
    #: rows that are not whole vectors there take the packed tier on any grid where the register tier
    #: would read them as scalars (16-bit rows of 17-31 columns), else from this many groups a
    #: multiprocessor on. Measured on an H200 against the register tier (% of the copy, two runs):
    #: scalar rows, 16-bit 18 columns at 0.25-8 MiB 33-70 -> 56-110 (8 MiB 33-35 -> 100-102), 20
    #: columns 43-72 -> 71-122, 28 columns 44-74 -> 69-117; partial vectors, 36 and 44 columns at 0.25-1
    #: MiB (22-55 groups a multiprocessor) 68-75 in the register tier against 59-71 packed, at 2 MiB
    #: (90-110 groups) 36 columns 90-99 -> 107-111 and 44 level, at 3-6 MiB 64-91 -> 94-107.
    packed_unstaged_partial_min_groups_per_sm: int = 96
    #: values of a group above which it is widened a row at a time (kPackedWidenedMost: 16-bit rows of
    #: 9, 11, 13, 18, 36 and 44 columns, 72-104 values a thread)
    packed_widened_most: int = 64
    #: threads per block of those groups (their shared memory: two tiles of threads x 144-208 bytes).
    #: Measured on an H200 (% of the copy, two runs, 16-bit rows of 9, 11 and 13 columns at 12-256 MiB)
    #: against 128 threads: 64 level to +5 (11 columns at 12 MiB 88-89 -> 92-94, 13 columns at 48 MiB
    #: 92-94 -> 95-96), 256 level to 12 slower (9 columns at 12 MiB 97-99 -> 86-87).
    packed_wide_group_threads: int = 64
    #: those groups go to the packed tier from this many groups a multiprocessor on. Measured on an H200
    #: against the staged tier (% of the copy, two runs): at 8 MiB (305-441 groups a multiprocessor)
    #: 9 columns 95-98 against 93-96, but 11 and 13 columns 84-90 against 93-101; at 12 MiB (458-662)
    #: 9 columns 96-99 against 86-87, 11 92-94 against 91, 13 88-91 either way; from 16 MiB on packed
    #: 89-107 against staged 83-101 (256 MiB: 96-100 against 83-95).
    packed_wide_min_groups_per_sm: int = 512
    #: threads per block of the block tier, at most (a thread streams at least 8 slots below that).
    #: Measured on an H100: 16-bit rows of 50257 columns at 800 threads 53-60% of the copy, at 512
    #: threads 68-75% (two blocks fit a multiprocessor's registers), at 256 threads 50-57%.
    block_tier_max_threads: int = 512
    #: fewest warps of a block-tier block, and the slots a thread streams before the block grows.
    #: Measured on an H100: 16-bit rows of 3000 and 4096 columns at 4 warps a block (the earlier
    #: minimum) 74-79% of the copy, at 2 warps (8 slots a thread) 82-86; 4 or 16 slots a thread
    #: slower (8192-50257 columns 3-10 points, float32 1-2).
    block_tier_min_warps: int = 1
    block_tier_slots_per_thread: int = 8
    #: slots a thread where rows are fewer than multiprocessors (small inputs: a call's time is one row's
    #: latency, not bandwidth). Measured on an H100, device time per call of 32 rows of 4096 float32
    #: values queued behind a sleep: 8 slots (128 threads) 5.0 us, 4: 4.0, 2 (512 threads): 3.7, against
    #: torch.softmax's 3.8.
    block_tier_few_rows_slots_per_thread: int = 2
    #: slots a thread of the block tier for inputs under SMALL_INPUT_BLOCK_BYTES (by element size,
    #: SMALL_INPUT_BLOCK_BYTES_BY_ITEMSIZE), and for the rows
    #: that STAGED_MIN_TILES_PER_SM moves there: more warps to blocks of which a multiprocessor holds
    #: at most 32, where few rows a multiprocessor leave few blocks to overlap. But rows of up to
    #: SMALL_INPUT_BLOCK_ONE_WARP_SLOTS_PER_THREAD slots a lane of one warp keep one warp (no reduction
    #: across warps). Measured on an H100 (same process, % of the copy, 2026-11-27), against
    #: BLOCK_TIER_SLOTS_PER_THREAD: 16-bit rows of 1344-7000 columns at 1-7 MiB +2 to +13 (float16
    #: 393x4000 104 -> 114, 1367x2300 96 -> 108), float32 2100-6000 columns at 2-7 MiB level to +8,
    #: float32 7500-8192 columns level (within 2), 1 MiB inputs level to +8; at 16-24 MiB float32 rows
    #: lost 4-7, so only under 8 MiB. Rows of 1056-1280 columns (132-160 slots) on one warp against
    #: two: +1 to +6 at 3-6 MiB, +2 to +15 at 8.5-18 MiB (moved rows); two warps against one from 168
    #: slots (1344-1520 columns +1 to +4), three against two for 2100-2200 columns +4 to +12.
    small_input_block_slots_per_thread: int = 4
    small_input_block_bytes: int = 8388608
    #: ... by element size where it differs: 16-bit inputs under 16 MiB. Measured (same process, the
    #: better of two runs, % of the copy, softmax and log_softmax, 2026-11-27), 16-bit block-tier rows
    #: of 4096-24000 columns: on an H200 at 9 and 12 MiB +5.6 to +5.8 on average over 36 shapes (none
    #: slower; float16 1152x4096 81 -> 90-91), at 16 MiB +2.7 (-3.5 to +8.5), from 24 MiB level to 5
    #: slower; then on an H100, 158 shapes at 8.5-15.9 MiB (4500, 9000, 11000 and 14000 columns, and
    #: every size but 9 and 12 MiB, new), +4.6 on average in each of two calls, 129 by more than 2,
    #: none slower by more than 2 (float16 667x11000 99 -> 108-109). float32 rows (H200) level at 12
    #: MiB, 2-4 slower on average from 16 MiB.
    small_input_block_bytes_by_itemsize: SizeMap = SizeMap({2: 16777216})
    small_input_block_one_warp_slots_per_thread: int = 5
    #: a block-tier row takes at most 1 / BLOCK_TIER_SM_SHARE of a multiprocessor's shared memory
    #: (longer rows are split across blocks)
    block_tier_sm_share: int = 2
    #: longer rows that one block's shared memory still holds go to
    #: the block tier too, a block alone on its multiprocessor, where copies are asynchronous (the whole
    #: row in flight at once without registers), instead of the on-chip split: no block waits on
    #: another. Measured (same run, two runs each, % of the copy, 2026-11-24): H100 float32 32000-56000
    #: columns 90-94 -> 95-99, 16-bit 100000-113000 columns 88-91 -> 93-95; H200 float32 81-88 -> 83-90
    #: (40000: 83-86 -> 90), 16-bit 100000-110000 77-82 -> 79-85. The 16-bit rows of 60000-90000 columns
    #: that clusters took measured 4-7 slower in such blocks on the H200 (softmax; log_softmax level
    #: but 90000 columns +6), until the block tier's loops lost their test a slot (CLUSTER_ITEMSIZES).
    #: A row in flight from a block that then waits for the next row's copies while storing (the next
    #: row's copies issued during the stores, a resident grid) measured 9-14 slower on the H200.
    block_tier_whole_sm: bool = True
    #: rows past one block's shared memory that fit it with ROW_REGISTER_SLOTS slots a thread of
    #: ROW_REGISTERS_THREADS in registers (softmax.cuh: kRowRegisterSlots, kRowRegistersThreads) take a
    #: block alone on its multiprocessor (block_rows_registers), where copies are asynchronous, instead
    #: of the on-chip split, whose blocks wait for each other's chunks. Measured against the on-chip
    #: split (same machine session, % of the copy, 2026-11-24): H200 float32 65536 columns 85 -> 92,
    #: 80000 87 -> 91, 16-bit 128256-163840 columns 80-87 -> 88-92.6; H100 93-96 -> 93-97 (+1 to +4).
    #: Rows that the shared memory alone holds measured level taken this way (H200, float32 +1-2,
    #: 16-bit -2 to +2), so they stay in the block tier.
    row_registers: bool = True
    row_register_slots: int = 8
    row_registers_threads: int = V.LAUNCH_BOUND_THREADS["block_registers"]
    #: rows past the block tier's half of a multiprocessor's shared memory that two blocks a
    #: multiprocessor still hold, each with ROW_REGISTER_SLOTS slots a thread of half
    #: ROW_REGISTERS_THREADS in registers and the rest in shared memory, take block_rows_registers so,
    #: two rows a multiprocessor, ahead of a block alone on its multiprocessor: a block alone leaves
    #: its multiprocessor's loads idle while it reduces and stores, and with few rows a wave (64 MiB
    #: inputs) the blocks of the device keep in step. The launch bound's 64 registers a thread let two
    #: blocks of half its threads share a multiprocessor's 64K registers. Measured on an H200 (same
    #: process, two runs, % of the copy, 2026-11-25), against the block alone: float32 32000-40000
    #: columns 82-89 -> 93-99 at 64 MiB and 93-95 -> 95-96 at 256 MiB, 45000 columns 86-87 -> 90-91 /
    #: 92-93 -> 92-94; 16-bit 65536-90000 columns 75-83 -> 85-93 / 84-91 -> 91-97. Rows that one such
    #: block a multiprocessor holds (float32 50257 and 65536, 16-bit 100000 columns) measured level to 4
    #: slower at 512 threads, so they keep their plans.
    row_registers_paired: bool = True
    #: a block alone on its multiprocessor (BLOCK_TIER_WHOLE_SM, and block_rows_registers at the launch
    #: bound's threads) takes rows only where they make this many waves of such blocks; fewer rows go
    #: to the on-chip split. A block alone stops its multiprocessor's loads while it reduces and
    #: stores, and in few waves the device's blocks stay in step, so the memory idles with them (the
    #: split's rows spread over all multiprocessors, each chunk's stores refilling it with the next
    #: row's). Measured on an H100 (same process, % of the copy, softmax / log_softmax, 2026-11-26),
    #: block alone against the split: 1.1-3 waves bfloat16 150-390 rows of 100000-160000 columns
    #: 71-92 -> 83-97 (209x160000 86-88 -> 96-97), float32 150-390 rows of 50257-80000 columns 80-94
    #: -> 89-98 (209x80000 89-91 -> 97-98), but float32 256x65536 93-94 -> 90-93; 3-4 waves (396-528
    #: rows) level to +6; 3.9-7.8 waves (512-1024 rows) 1-2 slower split (bfloat16 1024x131072 94 -> 92).
    #: On an H200 at 64 MiB (2026-11-25, before the split held slots in registers) the split led such
    #: blocks by 0-5 on the same rows but float32 256x65536 (3 behind).
    block_alone_min_waves: int = 4
    #: threads per block of the on-chip split tier, and chunks of its rows a
    #: multiprocessor holds
    cached_threads: int = 256
    cached_chunks_per_sm: int = 4
    #: chunks a multiprocessor by bytes per element, where not CACHED_CHUNKS_PER_SM. Measured (same
    #: run, two runs each, % of the copy, 2026-11-24): 16-bit rows of 100000-262144 columns at 5
    #: chunks against 4, H100 88-91 -> 89-92 (512x262144 88-89 -> 89-91), H200 74-80 -> 77-83
    #: (float16 1024x131072 softmax 79 -> 78); float32 level on both (within a point or two either way).
    cached_chunks_per_sm_by_itemsize: SizeMap = SizeMap({2: 5})
    #: threads per block of the on-chip split tier by bytes per element, where not CACHED_THREADS: at
    #: most V.LAUNCH_BOUND_THREADS["cached"], whose kernels' launch bounds keep 4 such blocks a
    #: multiprocessor. Measured on an H100 (% of the copy, two runs): float32 rows of 65536-262144
    #: columns at 384 threads 86-90 -> 88-92.6 (256x262144 88-89.6 -> 91-92.6), 16x1048576 74-76 ->
    #: 81; 16-bit rows at 384 threads -1.5 to +1, at 512 threads (float32 spilling under the bound
    #: that allows four such blocks) float32 softmax 5-6 slower.
    cached_threads_by_itemsize: SizeMap = SizeMap({4: 384})
    #: chunks a multiprocessor that the on-chip split's rows make at least (few rows: smaller chunks).
    #: 3-5 measured no steadier gain on rows fewer than multiprocessors at 4-32 MiB (H100, same process,
    #: 2026-11-27: means +1, -1, -5 over 69 shapes), where the same plan read 10-20 points apart
    #: between variants of one spec.
    split_min_chunks_per_sm: int = 2
    #: rows of the on-chip split that take more than one and at most this many rounds of its resident
    #: grid (grid / chunks rows a round), of these element sizes, are cut into more, smaller chunks so
    #: that each round takes as many rows, in as many blocks (0: off). With the last round a third to
    #: nine tenths full, the first round's loads and the last one's stores, which nothing overlaps,
    #: are longer than they need be. Measured (tools/ab_bench.py, same process, the better of two runs,
    #: % of the copy, softmax and log_softmax, 2026-11-27): float32 rows of 50257-262144 columns at
    #: 36-64 MiB, H200 +2.1 on average over 23 shapes (worst -1; 81x128256 80-83 -> 84-87, 88x190000
    #: 85-87 -> 87-91), then +2.3 over 32 others (19 by more than 2, 2 slower by 2.5-3); H100 +2.0 over
    #: 55 (27 by more than 2; 76x150000 87-92 -> 95-96, 163x90000 92-93 -> 97-101; 125x100000 95-99 ->
    #: 93-95, 160x72000 -2.5). From 1.78 rounds on, and 16-bit rows, level to 7 slower (an even third
    #: round where the last took a few rows: float32 333x50257 88-90 -> 83-87 on the H200).
    split_even_rounds_most: float = 1.65
    split_even_rounds_itemsizes: tuple = (4,)
    #: bytes per element -> (slots a thread holds in registers, blocks a multiprocessor) of the on-chip
    #: split whose chunks are held partly in registers (split_cached_registers), where copies are
    #: asynchronous; dtypes not listed keep the whole chunk in shared memory. The pairs built
    #: (V.SPLIT_REGISTERS_CONFIGS), the first of each size taken. Measured on an H200 (same process, % of the copy,
    #: 2026-11-24) against whole chunks in shared memory (float32: 4 blocks of 384 threads, 16-bit: 5
    #: of 256): float32 (4, 5) 84-88 -> 88-91, (5, 5) 84-88 -> 88-92 (64x1048576 81-83 -> 87-88), (6, 4)
    #: 84-88 -> 86-90, (8, 3) 78-86 (spills); 16-bit (3, 5) and (2, 5) +1 to +4 (bfloat16 512x262144
    #: 80-84 -> 82-86), (4, 4) level, (8, 3) 3-4 slower. On an H100 (5, 5) and (3, 5) level to +4
    #: (float32 64x1048576 91 -> 94-95). Fewer rows than multiprocessors keep whole chunks in shared
    #: memory: their chunks are cut small to spread the rows (the registers would not make them fewer),
    #: and such rows measured level to 5 points slower held (float16 8x262144 55 -> 50-51, H100).
    split_registers: SizeMap = SizeMap({size: pairs[0] for size, pairs in V.SPLIT_REGISTERS_CONFIGS.items()})
    split_registers_threads: int = V.LAUNCH_BOUND_THREADS["cached_registers"]
    #: bytes per element whose rows, fewer than multiprocessors, take the held form too where their
    #: chunks, as long as it makes them, fill its resident grid (float32: rows of 100000 columns from
    #: 95 rows on, of 262144 from 42): few rows need not spread over more chunks when there are that
    #: many. Measured on an H200 (same process, two runs, % of the copy, 2026-11-25) against whole
    #: chunks in shared memory (4 blocks of 384 threads): float32 128x131072 77-79 -> 83-84, 64x262144
    #: 76-78 -> 80-82, 88x190000 82-83 -> 85-86, 130x128256 86-89 -> 88-91, 100x100000 81-83 -> 84-86;
    #: 16-bit rows (3 held slots, 5 blocks of 256 threads against 5 of 256) 3 slower to 3 faster
    #: (float16 96x262144 72-76 -> 72-76, 100x190000 78-82 -> 79-84). Then on 13-14 shapes of 16-bit
    #: rows of 131072-262144 columns at 36-64 MiB (2026-11-27, the better of two runs): H200 +3.0 on
    #: average (9 by more than 2; 80x262144 67-70 -> 75-76, 125x150000 75-79 -> 79-83), H100 +1.9 (5 by
    #: more than 2; bfloat16 125x150000 82-86 -> 90-91, float16 80x262144 80-85 -> 87-88); 96x262144
    #: 2 slower on both, none slower by more.
    split_registers_full_grid: tuple = (2, 4)
    #: chunks of split rows start on multiples of this many bytes from the row's first aligned slot,
    #: so that in a row that starts on a cache line every chunk does too (a chunk starting mid-line
    #: makes each warp access of it span one 128-byte line more than it fills). Measured on an H100
    #: (% of the copy, two runs, against chunks a whole number of slots long): 16-bit rows of
    #: 128256-262144 columns 83-88 -> 88-91, float32 rows of 65536-262144 columns 88-92 -> 91-94, one
    #: 1e8 float32 row 62 -> 64; 256 bytes measured 0.5-1.5 above 128 on a third of those shapes
    #: (16-bit 131072 columns, the 16-bit two-pass row 52-53 -> 54) and level on the rest.
    chunk_align_bytes: int = 256
    #: a non-last axis whose tiles (the inner positions a block takes x the reduced axis) take at
    #: least this share of a block's default shared memory is cached on chip across co-resident
    #: blocks (one read); smaller tiles are read twice by the strided tier, whose second read mostly
    #: hits the cache
    strided_cached_min_tile: float = 1.0
    #: threads of the on-chip strided tier (kStridedCachedThreads in softmax.cuh)
    strided_cached_threads: int = 256
    #: bytes of a tile row of the on-chip strided tier: a 128-byte line. Measured on an H100 (axis 0
    #: of 8192 x 8192 float32): 512-byte rows (a warp of 16-byte vectors) 29% of the copy, a thread per
    #: position over 128-byte rows 63-65% (86 chunks a tile against 22: each chunk reads every partial).
    strided_row_bytes: int = 128
    #: chunks of the on-chip strided tier a multiprocessor holds
    strided_chunks_per_sm: int = 4
    #: element sizes whose rows the on-chip strided tier reads as vectors (V.strided_vector_widths,
    #: when aligned). Measured on an H100, axis 0 (% of the copy): 16-bit pairs against a thread per
    #: position (whose warp read half a line a row) 8192 x 8192 42-43 -> 54-56, 16384 x 4096 43-44 ->
    #: 54-56, 4096 x 16384 42-44 -> 49-58, 32768 x 2048 39-40 -> 46-48; 16-bit 8-wide vectors 25-32
    #: against 32-41 (80 registers a thread, and 16 KiB of (m, d) scratch a block). On an H200, 16-bit
    #: 4-wide (8-byte) vectors against pairs: 8192 x 8192 47-48 -> 54-57, 16384 x 4096 45 -> 52-56,
    #: 32768 x 2048 40-41 -> 46-49 (a slot's addresses, copies and stores over four values, not two).
    strided_vector_itemsizes: tuple = (2, 4, 8)
    #: a non-last axis that does not take the on-chip strided tier is reduced a thread per 16 bytes of
    #: inner positions (strided_thread: no column groups, no barrier) when it has at most
    #: STRIDED_THREAD_SHORT_COLS rows, or at most STRIDED_THREAD_MAX_COLS over at least
    #: STRIDED_THREAD_MIN_INNER inner positions. Measured on an H200 (% of the copy, float32 / bfloat16
    #: softmax, against the column groups of the strided tier): axis 0 of 2-64 rows 4-17 -> 47-92 /
    #: 2.5-9 -> 25-75 (3 and 32 rows, inner odd: 36-40 / 24-25), 65-300 rows 17-37 -> 54-61 /
    #: 10-21 -> 41-48; middle axes of 8 inner positions and 8 rows 3 -> 27 / 2 -> 13, of 16 and 64
    #: 17 -> 35 / 9 -> 24, but of 16 and 256 41 -> 33 / 22 -> 21. (Axes of some 384 rows and more
    #: over 32 positions or more mostly take the on-chip tier before this one.)
    strided_thread_short_cols: int = 64
    strided_thread_max_cols: int = 512
    strided_thread_min_inner: int = 32
    #: threads of its blocks (kStridedThreadThreads in softmax.cuh)
    strided_thread_threads: int = 256


#: every device without asynchronous copies (AMD, NVIDIA before sm_80, the emulation)
DEFAULT_TUNING = Tuning()
#: NVIDIA sm_80 and newer: asynchronous copies fill shared memory without registers, so the staged
#: and block tiers take longer rows, and 16-bit rows on 4-byte boundaries leave the register tier sooner
ASYNC_COPY_TUNING = Tuning(warp_tier_max_values_whole_words=SizeMap({2: 16}), staged_max_row_bytes=576,
                           staged_before_scalar_cols=SizeMap({2: 512, 4: 80}), staged_whole_vector_bytes=(48, 496))


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


def _check_common(dtype: str, op: str, device: DeviceProfile) -> None:
    if dtype not in V.DTYPES:
        raise PlanError(f"dtype {dtype!r} has no kernels; supported: {', '.join(V.DTYPES)}")
    if op not in V.OPS:
        raise PlanError(f"op {op!r} unknown; supported: {', '.join(V.OPS)}")
    if device.warp_size not in V.WARP_SIZES:
        raise PlanError(f"warp size {device.warp_size} of {device.name} is not one of {V.WARP_SIZES}")


def _grid(work_blocks: int, device: DeviceProfile, blocks_per_sm: int = 32) -> int:
    """Enough blocks to fill the device many times; grid-stride loops do the rest."""
    return max(1, min(work_blocks, device.multiprocessors * blocks_per_sm, device.max_grid_x))


def _work_grid(work_blocks: int, device: DeviceProfile) -> int:
    """A block per share of the work (grid-stride loops take what passes the grid limit).

    Measured on an H100 for the register, staged, packed and block tiers, whose blocks are
    short-lived: 3-15 points of the copy above one wave of resident blocks looping over the same
    work (float32 rows of 1-1024 columns 85-95% -> 96-102%, of 3000-8192 columns 92-95% ->
    98-99%; 16-bit block-tier rows within 3 points either way).
    """
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


def _plan_staged(t: Tuning, p: RowProblem, device: DeviceProfile, blocks_per_sm: float | None = None) -> Plan | None:
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
    return _staged_plan(t, p, device, "staged", V.staged_name(p.dtype, p.op), threads, tile_rows, vec,
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
    small-input rules keep these rows off the staged tiers (_plan_rows' `unstaged`)."""
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


def _under_tiles(staged: Plan, p: RowProblem, device: DeviceProfile, least: float) -> bool:
    """Whether this staged plan covers the rows in fewer than `least` tiles a multiprocessor."""
    return ceil(p.rows / staged.notes["tile_rows"]) < least * device.multiprocessors


def _few_tiles(t: Tuning, staged: Plan, p: RowProblem, device: DeviceProfile, least: float) -> bool:
    """Whether this staged plan covers rows longer than a 16-byte vector a lane of a warp (or the
    shorter rows of t.few_tiles_short_row_itemsizes) in fewer than `least` tiles a multiprocessor."""
    itemsize = V.DTYPES[p.dtype][2]
    rows_taken = p.cols * itemsize > 16 * device.warp_size or (
        itemsize in t.few_tiles_short_row_itemsizes and p.cols >= t.small_input_unstaged_min_cols)
    return rows_taken and _under_tiles(staged, p, device, least)


def _smaller_tiles(t: Tuning, tier: Callable[..., Plan | None], staged: Plan, p: RowProblem,
                   device: DeviceProfile) -> Plan:
    """The staged plan as it is taken: planned again by `tier` with its tiles cut for a grid of
    t.few_tiles_blocks_per_sm blocks a multiprocessor where it covers the rows in fewer than
    t.staged_min_tiles_per_sm tiles a multiprocessor (inputs of t.few_tiles_smaller_min_bytes or more)."""
    if (not t.few_tiles_blocks_per_sm or not _under_tiles(staged, p, device, t.staged_min_tiles_per_sm)
            or p.rows * p.cols * V.DTYPES[p.dtype][2] < t.few_tiles_smaller_min_bytes):
        return staged
    return tier(t, p, device, t.few_tiles_blocks_per_sm) or staged  # the same tier: it plans the rows again


def _one_warp_gives_way(t: Tuning, staged: Plan, p: RowProblem, device: DeviceProfile, fill: float) -> bool:
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


def _staged_plan(t: Tuning, p: RowProblem, device: DeviceProfile, tier: str, kernel: str, threads: int, tile_rows: int,
                 vec: int, lanes: int = 1, row_shift: int | None = None, interleave: bool = False,
                 blocks_per_sm: float | None = None) -> Plan | None:
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
    launch = Launch(kernel, _work_grid(ceil(p.rows / tile_rows), device), threads, shared,
                    (("ptr", "x"), ("ptr", "y"), (I64, p.rows), (I64, p.cols), (I64, tile_rows), *group_args,
                     (I32, _safe(p))),
                    cut_to_one_wave=False)
    notes = {"vec": vec, "tile_rows": tile_rows, "lanes": lanes}
    if row_shift is not None:
        notes.update(row_shift=row_shift, interleave=interleave)
    return Plan(tier, (launch,), notes=notes)


def _plan_staged_warp(t: Tuning, p: RowProblem, device: DeviceProfile,
                      blocks_per_sm: float | None = None) -> Plan | None:
    """Contiguous rows staged through shared memory a warp a row (see t.staged_warp_row_bytes), or None."""
    itemsize = V.DTYPES[p.dtype][2]
    row_bytes = p.cols * itemsize
    vec = V.vector_widths(p.dtype)[1]
    lo, hi = t.staged_warp_row_bytes
    if (not has_async_copy(device) or not lo <= row_bytes <= hi or itemsize not in t.staged_warp_itemsizes
            or not _one_span(p, vec)):
        return None
    threads = max(device.warp_size, t.staged_threads)
    return _staged_plan(t, p, device, "staged_warp", V.staged_warp_name(p.dtype, p.op, device.warp_size), threads,
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
                        blocks_per_sm: float | None = None) -> Plan | None:
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
                    blocks_per_sm: float | None = None) -> Plan | None:
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
        return _staged_plan(t, p, device, "staged_group", V.staged_group_name(p.dtype, p.op, lanes), threads,
                            tile_rows, vec, lanes, row_shift, interleave, blocks_per_sm)
    return None


def _plan_packed(t: Tuning, p: RowProblem, device: DeviceProfile) -> Plan | None:
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
        # A small input's blocks take one round each before they lose warps: measured on an H200 (%
        # of the copy, two runs), 16-bit rows of 5-20 columns at 3-4 MiB 88-104 -> 101-111, 20
        # columns at 0.25-2 MiB 59-109 -> 71-121; level elsewhere.
        rounds = 1
        blocks = ceil(groups / (block * depth * rounds))
    if wanted and blocks < wanted:  # fewer warps a block, so that a small input spreads wider
        threads = _spread_threads(device, threads, groups / (depth * rounds * wanted))
        tile = tile // block * threads
        blocks = ceil(groups / (threads * depth * rounds))
    launch = Launch(V.packed_name(p.dtype, p.op, p.cols), _work_grid(blocks, device), threads, stages * tile,
                    (("ptr", "x"), ("ptr", "y"), (I64, p.rows), (I32, _safe(p)), (I32, stages)),
                    cut_to_one_wave=False)
    return Plan("packed", (launch,), notes={"vec": vec, "values_per_thread": per_thread * depth, "stages": stages})


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
    family = ASYNC_COPY_TUNING if has_async_copy(device) else DEFAULT_TUNING
    overrides = {field: globals()[name] for name, field in _LEGACY_KNOBS.items() if name in globals()}
    return replace(family, **overrides) if overrides else family


#: Tuning fields that both families share, under their former module-level names: tests and tools
#: that still set ``planner.NAME`` (monkeypatch) change the default Tuning through them. Deprecated:
#: pass a Tuning to plan() instead.
_LEGACY_KNOBS = {f.name.upper(): f.name for f in fields(Tuning)
                 if getattr(DEFAULT_TUNING, f.name) == getattr(ASYNC_COPY_TUNING, f.name)}


def __getattr__(name: str):
    """The shared default of a Tuning field under its former module-level name (_LEGACY_KNOBS)."""
    if name in _LEGACY_KNOBS:
        return getattr(DEFAULT_TUNING, _LEGACY_KNOBS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=4096)
def plan(problem: RowProblem | StridedProblem, device: DeviceProfile, tuning: Tuning | None = None) -> Plan:
    """Pick the kernel variant(s) and launch shapes for one problem on one device, with the
    device family's numbers (default_tuning) or `tuning`'s."""
    _check_common(problem.dtype, problem.op, device)
    t = default_tuning(device) if tuning is None else tuning
    if isinstance(problem, StridedProblem):
        return _plan_strided(t, problem, device)
    return _plan_rows(t, problem, device)


def _plan_rows(t: Tuning, p: RowProblem, device: DeviceProfile) -> Plan:
    if p.rows <= 0 or p.cols <= 0:
        return Plan("empty", ())
    unstaged = _unstaged(t, p) or _group_rows_unstaged(t, p, device)
    staged = staged_tier = None  # a staged plan of few tiles: taken only where the tiers below do not qualify
    for tier in (_plan_packed, _plan_staged_groups, _plan_staged, _plan_staged_warp):
        if unstaged and tier is not _plan_packed:
            continue
        the_plan = tier(t, p, device)
        if the_plan is not None:
            if the_plan.tier == "packed":
                return the_plan
            if not _few_tiles(t, the_plan, p, device, t.staged_min_tiles_per_sm):
                return _smaller_tiles(t, tier, the_plan, p, device)
            staged, staged_tier = the_plan, tier
            break

    def staged_taken() -> Plan:
        """The staged plan of few tiles, as it is taken where no tier below takes its rows."""
        return _smaller_tiles(t, staged_tier, staged, p, device)
    warp = device.warp_size
    vec = register_vec(t, p, warp)
    slots = slots_needed(p, vec)
    xs, ys = p.strides()
    row_args = (("ptr", "x"), ("ptr", "y"), (I64, p.rows), (I64, p.cols), (I64, xs), (I64, ys))
    itemsize = V.DTYPES[p.dtype][2]
    notes = {"vec": vec, "slots": slots}

    variant = _warp_variant(t, p, device, vec, slots)
    if variant is not None and staged is not None:
        # the fill test: lanes of two or more 16-byte vectors (scalar slots and one vector a lane pass)
        warp_slots = variant.lanes * variant.slots if vec > 1 and variant.slots > 1 else slots
        if not (_whole_slot_rows(t, p, vec) and _one_warp_gives_way(t, staged, p, device, slots / warp_slots)):
            return staged_taken()
    if variant is not None:
        variant = _one_row_groups(t, p, device, _one_row_a_warp(t, p, device, vec, slots, variant), unstaged)
        threads = max(V.WARP_TIER_THREADS, 2 * warp)
        batch = variant.batch
        wanted = _spread_blocks(t, device)
        if wanted and ceil(p.rows / (threads // variant.lanes * batch)) < wanted:
            # fewer warps a block, so that a small input's rows spread over more multiprocessors
            threads = _spread_threads(device, threads, ceil(p.rows / (wanted * batch)) * variant.lanes)
        rows_per_block = threads // variant.lanes * batch
        launch = Launch(variant.name, _work_grid(ceil(p.rows / rows_per_block), device), threads, 0,
                        row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
        return Plan("warp", (launch,), notes=notes)

    cache_bytes = slots * vec * itemsize
    compute_bytes = _compute_bytes(p.dtype)
    # The block reduction's static scratch, and what the runtime reserves per block, sit beside the cache.
    static_bytes = 2 * (1024 // warp) * compute_bytes + 1024
    # A block may take a share of a multiprocessor's shared memory, so that several blocks
    # overlap one's reduction with the others' loads.
    block_budget = min(device.shared_mem_per_block_optin,
                       device.shared_mem_per_multiprocessor // t.block_tier_sm_share) - static_bytes
    few_rows = p.rows < device.multiprocessors

    def block_plan() -> Plan:
        """A block a row, its threads streaming t.block_tier_slots_per_thread slots each (for few rows,
        t.block_tier_few_rows_slots_per_thread; small inputs, _small_input_block_warps), within
        t.block_tier_min_warps and t.block_tier_max_threads."""
        per_thread = t.block_tier_few_rows_slots_per_thread if few_rows else t.block_tier_slots_per_thread
        warps = ceil(slots / per_thread / warp)
        small_bytes = t.small_input_block_bytes_by_itemsize.get(itemsize, t.small_input_block_bytes)
        if not few_rows and (staged is not None or p.rows * p.cols * itemsize < small_bytes):
            warps = _small_input_block_warps(t, slots, warp)
        threads = min(device.max_threads_per_block, t.block_tier_max_threads, max(t.block_tier_min_warps, warps) * warp)
        launch = Launch(V.block_name(p.dtype, p.op, warp, vec), _work_grid(p.rows, device), threads, cache_bytes,
                        row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
        return Plan("block", (launch,), notes=notes)

    if cache_bytes <= block_budget and not (few_rows and slots > 4 * device.max_threads_per_block):
        the_plan = block_plan()
        threads = the_plan.launches[0].block
        if staged is not None and threads == warp and not _one_warp_gives_way(t,
                staged, p, device, slots / (warp * ceil(slots / warp))):
            return staged_taken()
        return the_plan
    if staged is not None:
        return staged_taken()

    def registers_plan(threads: int) -> Plan | None:
        """A block a row of `threads` threads, the row's first t.row_register_slots slots a thread in
        registers and the rest in shared memory, where as many such blocks as the launch bound's
        registers keep on a multiprocessor (t.row_registers_threads / threads) hold it there (None
        elsewhere)."""
        blocks_per_multiprocessor = t.row_registers_threads // threads
        if not (t.row_registers and p.dtype in V.BLOCK_REGISTERS_DTYPES and has_async_copy(device) and not few_rows
                and device.max_threads_per_block >= t.row_registers_threads):
            return None
        held = min(t.row_register_slots * threads, slots - 1)  # the last slot: in the cache
        shared = (slots - held) * vec * itemsize
        if (shared + static_bytes > device.shared_mem_per_block_optin
                or blocks_per_multiprocessor * (shared + static_bytes) > device.shared_mem_per_multiprocessor):
            return None
        launch = Launch(V.block_registers_name(p.dtype, p.op, warp, vec), _work_grid(p.rows, device), threads,
                        shared, row_args + ((I32, _safe(p)),), cut_to_one_wave=False)
        return Plan("block_registers", (launch,), notes={**notes, "held_slots": held})

    # Rows that two blocks a multiprocessor hold with their first slots in registers (t.row_registers_paired).
    paired = registers_plan(t.row_registers_threads // 2) if t.row_registers_paired else None
    if paired is not None:
        return paired

    # A row that one block's shared memory holds: a block per row, alone on its multiprocessor (its
    # slots, more than half a multiprocessor's shared memory holds, take t.block_tier_max_threads),
    # where the rows make t.block_alone_min_waves waves of such blocks.
    waves_alone = p.rows >= t.block_alone_min_waves * device.multiprocessors
    if (t.block_tier_whole_sm and has_async_copy(device) and not few_rows and waves_alone
            and cache_bytes + static_bytes <= device.shared_mem_per_block_optin):
        return block_plan()

    # Longer rows that one block holds in its shared memory and its threads' registers: a block a
    # row alone on its multiprocessor, the row's first slots in registers (as many waves).
    alone = registers_plan(t.row_registers_threads) if waves_alone else None
    if alone is not None:
        return alone

    # On chip: chunks on co-resident blocks, at most one chunk of a row per multiprocessor (one
    # resident block per multiprocessor is always possible).
    held_config = t.split_registers.get(itemsize) if p.dtype in V.BLOCK_REGISTERS_DTYPES else None
    fills_the_grid = False  # the held form's chunks, as long as they can be, fill its resident grid
    if held_config is not None:
        held_slots, per_multiprocessor = held_config
        budget = min(device.shared_mem_per_block_optin, device.shared_mem_per_multiprocessor // per_multiprocessor)
        held_cap = held_slots * t.split_registers_threads + (budget - static_bytes) // (vec * itemsize)
        fills_the_grid = p.rows * ceil(slots / held_cap) >= per_multiprocessor * device.multiprocessors
    if (held_config is not None and has_async_copy(device)
            and (not few_rows or (itemsize in t.split_registers_full_grid and fills_the_grid))
            and device.max_threads_per_block >= t.split_registers_threads):
        threads = t.split_registers_threads
        held, chunk_cap = held_slots * threads, held_cap
        kernel = V.split_cached_registers_name(p.dtype, p.op, warp, vec, held_slots, per_multiprocessor)
    else:
        wanted = t.cached_threads_by_itemsize.get(itemsize, t.cached_threads)
        threads, chunk_cap = _on_chip_chunk(t, device, static_bytes, vec, itemsize, wanted)
        held, per_multiprocessor = 0, None
        kernel = V.split_cached_name(p.dtype, p.op, warp, vec)
    chunk_cap = max(threads, chunk_cap)
    chunks = max(ceil(slots / chunk_cap),
                 min(ceil(t.split_min_chunks_per_sm * device.multiprocessors / p.rows), ceil(slots / threads)))
    if chunks <= device.multiprocessors:
        unit = _chunk_unit(t, vec, itemsize)

        def chunk_bytes(chunk_slots: int) -> int:
            """Shared memory of a chunk: its first `held` slots are in registers."""
            return max(0, chunk_slots - held) * vec * itemsize

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
        shared = chunk_bytes(chunk_slots)
        if held:
            notes.update(held_slots=held)
        launch = Launch(kernel, grid, threads, shared,
                        (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), ("ptr", "arrivals"), (I64, p.rows),
                         (I64, p.cols), (I64, xs), (I64, ys), (I64, chunk_slots), (I64, chunks), (I32, _safe(p))),
                        cooperative=True, min_grid=chunks)
        notes.update(chunks=chunks, chunk_slots=chunk_slots)
        return Plan("cached", (launch,), scratch=(("partials", 2 * p.rows * chunks * compute_bytes),
                                                  ("arrivals", 4 * p.rows)), notes=notes)

    # Rows too long to keep on chip: stream them twice, in enough chunks for several full
    # waves of resident blocks (a last wave half full would idle half the device).
    threads = min(device.max_threads_per_block, 512)
    resident = device.multiprocessors * max(1, device.max_threads_per_multiprocessor // threads)
    min_chunk = 4 * threads  # each thread streams at least four slots per chunk
    max_chunk = 64 * threads
    chunks = max(ceil(slots / max_chunk), ceil(4 * resident / p.rows))
    chunks = max(1, min(chunks, ceil(slots / min_chunk)))
    chunk_slots, chunks = _split_evenly(slots, chunks, _chunk_unit(t, vec, itemsize))
    jobs = p.rows * chunks
    grid = _grid(jobs, device, 4)
    partials = Launch(V.split_partials_name(p.dtype, warp, vec), grid, threads, 0,
                      (("ptr", "x"), ("ptr", "partials"), (I64, p.rows), (I64, p.cols), (I64, xs),
                       (I64, chunk_slots), (I64, chunks)))
    normalize = Launch(V.split_normalize_name(p.dtype, p.op, warp, vec), grid, threads, 0,
                       (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), (I64, p.rows), (I64, p.cols),
                        (I64, xs), (I64, ys), (I64, chunk_slots), (I64, chunks), (I32, _safe(p))))
    notes.update(chunks=chunks, chunk_slots=chunk_slots)
    return Plan("split", (partials, normalize), scratch=(("partials", 2 * jobs * compute_bytes),), notes=notes,
                scratch_zeroed=False)


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


def _plan_strided(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Plan:
    lines = p.outer * p.inner
    if lines <= 0 or p.cols <= 0:
        return Plan("empty", ())
    cached = _plan_strided_cached(t, p, device)
    if cached is not None:
        return cached
    if p.cols <= t.strided_thread_short_cols or (
            p.cols <= t.strided_thread_max_cols and p.inner >= t.strided_thread_min_inner):
        return _plan_strided_thread(t, p, device)
    # A warp's worth of neighbouring inner positions per row read (fewer when inner is small);
    # the rest of the block splits the reduced axis into column groups.
    inner_tile = min(device.warp_size, 1 << (p.inner - 1).bit_length())
    threads = min(device.max_threads_per_block, max(256, inner_tile * min(32, p.cols)))
    tiles = p.outer * ceil(p.inner / inner_tile)
    args = (("ptr", "x"), ("ptr", "y"), *_view_args(p), (I32, inner_tile), (I32, _safe(p)))
    launch = Launch(V.strided_name(p.dtype, p.op), _grid(tiles, device, 8), threads, 0, args)
    return Plan("strided", (launch,), notes={"inner_tile": inner_tile})


def _widest_aligned(p: StridedProblem, widths) -> int:
    """The widest of `widths` to which every row of the input and output starts aligned (inner
    positions contiguous), else 1."""
    (xo, xc, xi), (yo, yc, yi) = p.x_strides, p.y_strides
    if xi != 1 or yi != 1:
        return 1
    steps = (p.inner, xc, yc, p.x_misalign, p.y_misalign) + ((xo, yo) if p.outer > 1 else ())
    return max((v for v in widths if all(s % v == 0 for s in steps)), default=1)


def strided_vec(t: Tuning, p: StridedProblem) -> int:
    """Inner positions a thread of the on-chip strided tier takes with one vector load: the
    widest (V.strided_vector_widths) when every row of the input and output starts aligned to
    it, else 1."""
    if V.DTYPES[p.dtype][2] not in t.strided_vector_itemsizes:
        return 1
    return _widest_aligned(p, V.strided_vector_widths(p.dtype))


def _plan_strided_thread(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Plan:
    vec = _widest_aligned(p, V.strided_thread_widths(p.dtype))
    lines_a_thread = V.vector_widths(p.dtype)[1] // vec  # 16 bytes of inner positions a thread
    if lines_a_thread == 1:  # more 16-byte vectors a thread where the axis has few rows to load
        lines_a_thread = next((n for rows, n in V.STRIDED_THREAD_WIDE_LINES if p.cols <= rows), 1)
    lines = p.outer * ceil(p.inner / vec)
    args = (("ptr", "x"), ("ptr", "y"), *_view_args(p), (I32, _safe(p)))
    launch = Launch(V.strided_thread_name(p.dtype, p.op, vec, lines_a_thread),
                    _work_grid(ceil(lines / (t.strided_thread_threads * lines_a_thread)), device),
                    t.strided_thread_threads, 0, args)
    return Plan("strided_thread", (launch,), notes={"vec": vec, "lines": lines_a_thread})


def _plan_strided_cached(t: Tuning, p: StridedProblem, device: DeviceProfile) -> Plan | None:
    """The on-chip form of the strided tier (strided_cached), or None where it does not fit."""
    itemsize = V.DTYPES[p.dtype][2]
    compute_bytes = _compute_bytes(p.dtype)
    vec = strided_vec(t, p)
    # Threads along inner: a tile row of t.strided_row_bytes (whole cache lines, and no wider, so
    # that a chunk of a tile holds many rows and a tile few chunks, whose partials every chunk reads).
    inner_tile = min(device.warp_size, 1 << (ceil(p.inner / vec) - 1).bit_length(),
                     max(1, t.strided_row_bytes // (vec * itemsize)))
    width = inner_tile * vec  # inner positions of a tile
    threads = t.strided_cached_threads
    if width * p.cols * itemsize < t.strided_cached_min_tile * device.shared_mem_per_block or (
            threads > device.max_threads_per_block or threads % inner_tile):
        return None
    static_bytes = 2 * threads * vec * compute_bytes + 1024  # the (m, d) scratch, the runtime's share
    chunk_budget = min(device.shared_mem_per_block_optin,
                       device.shared_mem_per_multiprocessor // t.strided_chunks_per_sm) - static_bytes
    chunk_cols = chunk_budget // (width * itemsize)
    if chunk_cols < threads // inner_tile:
        return None
    chunks = ceil(p.cols / chunk_cols)
    if chunks > device.multiprocessors:
        return None
    chunk_cols = ceil(p.cols / chunks)
    chunks = ceil(p.cols / chunk_cols)
    shared = chunk_cols * width * itemsize
    tiles = p.outer * ceil(p.inner / width)
    grid = _cooperative_grid(device, threads, shared + static_bytes, tiles, chunks)
    args = (("ptr", "x"), ("ptr", "y"), ("ptr", "partials"), ("ptr", "arrivals"), *_view_args(p),
            (I32, inner_tile), (I64, chunk_cols), (I64, chunks), (I32, _safe(p)))
    launch = Launch(V.strided_cached_name(p.dtype, p.op, vec), grid, threads, shared, args,
                    cooperative=True, min_grid=chunks)
    return Plan("strided_cached", (launch,),
                scratch=(("partials", 2 * tiles * chunks * width * compute_bytes), ("arrivals", 4 * tiles)),
                notes={"inner_tile": inner_tile, "vec": vec, "chunks": chunks, "chunk_cols": chunk_cols})

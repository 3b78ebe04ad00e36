"""The catalogue of compiled kernel variants, shared by the planner and the sources.

One list says which template instantiations exist. The planner only picks
names from it, and ``python -m portable_softmax._variants SRC_DIR`` writes the
per-dtype entry-point files (``softmax_<dtype>.cu``) that instantiate them, so
the two can never disagree (a test regenerates the files and compares).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

#: storage dtype name -> (short tag, C++ storage type, bytes per element)
DTYPES: dict[str, tuple[str, str, int]] = {
    "float32": ("f32", "float", 4),
    "float16": ("f16", "half_t", 2),
    "bfloat16": ("bf16", "bfloat16_t", 2),
    "float64": ("f64", "double", 8),
}
#: op name -> C++ enumerator
OPS: dict[str, str] = {"softmax": "ps::kSoftmax", "log_softmax": "ps::kLogSoftmax"}
WARP_SIZES = (32, 64)

#: threads per block of the register tier; its launch bound is 256
WARP_TIER_THREADS = 128
#: tier -> the most threads a block its kernels are compiled for (softmax.cuh: kBlockTierThreads,
#: kStagedThreads, kCachedThreads; their launch bounds also cap registers for occupancy)
LAUNCH_BOUND_THREADS = {"block": 512, "staged": 128, "cached": 384, "block_registers": 1024,
                        "cached_registers": 256}
#: element sizes whose two-pass split normalises through a buffer in shared memory where copies are
#: asynchronous (its first pass does for every size): streamed, their 8-wide slots keep two in flight
SPLIT_BUFFERED_NORMALIZE_ITEMSIZES = (2,)
#: a lane of the register tier holds at most this many compute values
MAX_VALUES_PER_LANE = {"float": 64, "double": 16}
#: ... and at most this many of a 16-bit row (bytes per element -> values): longer 16-bit rows take
#: the block tier (planner.Tuning.warp_tier_max_values holds the same cap)
MAX_VALUES_PER_LANE_BY_ITEMSIZE = {2: 32}


def compute_type(dtype: str) -> str:
    return "double" if dtype == "float64" else "float"


def vector_widths(dtype: str) -> tuple[int, int]:
    """Scalar (for views whose input and output misalign differently) and 16 bytes."""
    return (1, 16 // DTYPES[dtype][2])


def strided_vector_widths(dtype: str) -> tuple[int, int]:
    """Inner positions a thread of the on-chip strided tier takes with one load: 1, or a 16-byte
    vector of 4- and 8-byte types, an 8-byte vector of four 16-bit ones (16 bytes of those would
    need twice the registers and (m, d) scratch a thread)."""
    return (1, 4) if DTYPES[dtype][2] == 2 else vector_widths(dtype)


def warp_batch(dtype: str, slots: int, vec: int) -> int:
    """Rows a lane group takes per step in the register tier (WarpBatch in softmax.cuh)."""
    nbytes = slots * vec * DTYPES[dtype][2]
    return 1 if nbytes >= 32 else 32 // nbytes


def max_slots(dtype: str, vec: int) -> int:
    return MAX_VALUES_PER_LANE[compute_type(dtype)] // vec


def pow2_upto(n: int) -> list[int]:
    out, p = [], 1
    while p <= n:
        out.append(p)
        p *= 2
    return out


@dataclass(frozen=True)
class WarpVariant:
    dtype: str
    op: str
    warp: int
    lanes: int
    slots: int
    vec: int
    one_row: bool = False  # a group takes one row a step, not warp_batch's

    @property
    def name(self) -> str:
        tag = DTYPES[self.dtype][0]
        suffix = "_b1" if self.one_row else ""
        return f"ps_warp_{tag}_{self.op}_w{self.warp}_l{self.lanes}_s{self.slots}_v{self.vec}{suffix}"

    @property
    def batch(self) -> int:
        """Rows a lane group takes a step."""
        return 1 if self.one_row else warp_batch(self.dtype, self.slots, self.vec)


#: scalar rows up to this many elements are taken by one thread each, with no shuffles
THREAD_ROW_SLOTS = 8


def thread_row_variants(dtype: str, op: str, warp: int) -> list[WarpVariant]:
    """One lane per scalar row of 2..THREAD_ROW_SLOTS elements: tiny rows that start at
    varying offsets cost fewer instructions this way than spread over lanes."""
    return [WarpVariant(dtype, op, warp, 1, s, 1) for s in pow2_upto(THREAD_ROW_SLOTS) if s > 1]


def warp_variants(dtype: str, op: str, warp: int, vec: int) -> list[WarpVariant]:
    """Lane groups 1..WARP holding one slot each, then whole warps holding 2.. slots
    (and, for scalar slots, single lanes holding a short row): the shapes the planner weighs
    (built_warp_variants: those it can pick)."""
    groups = [WarpVariant(dtype, op, warp, lanes, 1, vec) for lanes in pow2_upto(warp)]
    deep = [WarpVariant(dtype, op, warp, warp, s, vec) for s in pow2_upto(max_slots(dtype, vec)) if s > 1]
    return groups + deep + (thread_row_variants(dtype, op, warp) if vec == 1 else [])


#: dtypes whose register tier also has groups that take one row a step (one_row_variants)
ONE_ROW_GROUP_DTYPES = ("float32", "float16", "bfloat16")


def one_row_variants(dtype: str, op: str, warp: int, vec: int) -> list[WarpVariant]:
    """Groups of 2..WARP lanes, one 16-byte slot a lane, taking one row a step where warp_batch
    would take two: for small inputs, more warps holding fewer values each."""
    if dtype not in ONE_ROW_GROUP_DTYPES or vec != vector_widths(dtype)[1]:
        return []
    return [WarpVariant(dtype, op, warp, lanes, 1, vec, one_row=True) for lanes in pow2_upto(warp)
            if lanes > 1 and warp_batch(dtype, 1, vec) > 1]


#: the fewest values of a row that takes a group of one row a step (planner: small inputs of rows
#: of at least Tuning.small_input_unstaged_min_cols elements, or groups of exact_group_min_lanes)
ONE_ROW_MIN_VALUES = 16
#: float32 rows of this many elements or more take scalar slots (planner: Tuning.scalar_rows_min_cols)
SCALAR_ROWS_MIN_COLS = 65


def plannable(v: WarpVariant) -> bool:
    """Whether the planner can pick this register-tier shape. It never picks: more values a lane
    than MAX_VALUES_PER_LANE_BY_ITEMSIZE; scalar groups of 2..THREAD_ROW_SLOTS lanes (such rows
    take one lane); groups of one row a step holding fewer than ONE_ROW_MIN_VALUES values; and a
    whole warp of one 16-byte float32 slot a lane taking two rows a step where every row it holds
    is SCALAR_ROWS_MIN_COLS long (rows of several take scalar slots, a single row the one-row twin)."""
    itemsize = DTYPES[v.dtype][2]
    if v.slots * v.vec > MAX_VALUES_PER_LANE_BY_ITEMSIZE.get(itemsize, 1 << 30):
        return False
    if v.vec == 1 and 1 < v.lanes <= THREAD_ROW_SLOTS and v.slots == 1:
        return False
    if v.one_row and v.lanes * v.vec < ONE_ROW_MIN_VALUES:
        return False
    shortest = v.lanes * v.vec // 2 - (v.vec - 1) + 1  # with a misaligned head of vec - 1 elements
    return not (itemsize == 4 and v.vec > 1 and v.lanes == v.warp and v.slots == 1 and not v.one_row
                and shortest >= SCALAR_ROWS_MIN_COLS)


def built_warp_variants(dtype: str, op: str, warp: int, vec: int) -> list[WarpVariant]:
    """Every register-tier kernel built for these vectors: the plannable warp_variants, then one_row_variants."""
    return [v for v in warp_variants(dtype, op, warp, vec) + one_row_variants(dtype, op, warp, vec) if plannable(v)]


def block_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_block_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


#: dtypes of the block tier whose rows pass its shared memory, part of each row in registers
#: (float64 would need the registers for its arithmetic)
BLOCK_REGISTERS_DTYPES = ("float32", "float16", "bfloat16")


def block_registers_name(dtype: str, op: str, warp: int, vec: int) -> str:
    """A block a row, the row's first slots held in registers and the rest in shared memory."""
    return f"ps_block_registers_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def rows_pass_slots(dtype: str) -> list[int]:
    """Slots a lane of the rows regime's passes apart holds (a warp a row of 16-byte slots): every
    power of two up to the values a lane of the register tier holds (MAX_VALUES_PER_LANE, and
    MAX_VALUES_PER_LANE_BY_ITEMSIZE)."""
    vec = vector_widths(dtype)[1]
    most = min(max_slots(dtype, vec), MAX_VALUES_PER_LANE_BY_ITEMSIZE.get(DTYPES[dtype][2], 1 << 30) // vec)
    return pow2_upto(most)


def rows_partials_name(dtype: str, warp: int, slots: int) -> str:
    """The sharded softmax's local rows that a warp holds, first pass: each row's (m, d)."""
    return f"ps_rows_partials_{DTYPES[dtype][0]}_w{warp}_s{slots}_v{vector_widths(dtype)[1]}"


def rows_finish_name(dtype: str, op: str, warp: int, slots: int) -> str:
    """... second pass: each row finished with a given (m, d)."""
    return f"ps_rows_finish_{DTYPES[dtype][0]}_{op}_w{warp}_s{slots}_v{vector_widths(dtype)[1]}"


def split_partials_name(dtype: str, warp: int, vec: int) -> str:
    return f"ps_split_partials_{DTYPES[dtype][0]}_w{warp}_v{vec}"


def split_partials_buffered_name(dtype: str, warp: int, vec: int) -> str:
    return f"ps_split_partials_buffered_{DTYPES[dtype][0]}_w{warp}_v{vec}"


def split_normalize_buffered_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_split_normalize_buffered_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def split_normalize_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_split_normalize_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def split_cached_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_split_cached_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


#: bytes per element -> (slots a thread holds in registers, blocks a multiprocessor) of the built
#: split_cached_registers kernels (planner.Tuning.split_registers picks among them)
SPLIT_REGISTERS_CONFIGS: dict[int, tuple[tuple[int, int], ...]] = {4: ((5, 5),), 2: ((3, 5),)}


def split_cached_registers_name(dtype: str, op: str, warp: int, vec: int, held: int, blocks: int) -> str:
    """The on-chip split with `held` slots a thread of each chunk in registers (the chunk's first
    ones), at least `blocks` blocks a multiprocessor (BLOCK_REGISTERS_DTYPES)."""
    return f"ps_split_cached_registers_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}_h{held}_b{blocks}"


def split_registers_configs(dtype: str) -> tuple[tuple[int, int], ...]:
    return SPLIT_REGISTERS_CONFIGS.get(DTYPES[dtype][2], ()) if dtype in BLOCK_REGISTERS_DTYPES else ()


def strided_name(dtype: str, op: str) -> str:
    return f"ps_strided_{DTYPES[dtype][0]}_{op}"


#: lines a thread of the short-axis strided tier takes in 16-byte vectors, by the most rows of the
#: reduced axis they serve: with few rows to load, more lines a thread keep more loads in flight
STRIDED_THREAD_WIDE_LINES = ((2, 4), (4, 2))


def strided_thread_widths(dtype: str) -> tuple[int, ...]:
    """Vector widths of the short-axis strided tier: every power of two up to 16 bytes."""
    widest = vector_widths(dtype)[1]
    return tuple(1 << k for k in range(widest.bit_length()))


def strided_thread_variants(dtype: str) -> tuple[tuple[int, int], ...]:
    """(vec, lines) of the short-axis strided tier: 16 bytes of inner positions a thread in vectors
    of `vec` (16 // (vec * itemsize) of them), and 16-byte vectors also 2 or 4 a thread."""
    widest = vector_widths(dtype)[1]
    return tuple((vec, widest // vec) for vec in strided_thread_widths(dtype)) + tuple(
        (widest, lines) for _, lines in STRIDED_THREAD_WIDE_LINES)


def strided_thread_name(dtype: str, op: str, vec: int, lines: int) -> str:
    """A short non-last axis, a thread per `lines` vectors of `vec` inner positions and the whole axis."""
    return f"ps_strided_thread_{DTYPES[dtype][0]}_{op}_v{vec}_l{lines}"


def strided_cached_name(dtype: str, op: str, vec: int) -> str:
    """A non-last axis split over co-resident blocks that cache their chunks (one read); a thread
    takes `vec` neighbouring inner positions."""
    return f"ps_strided_cached_{DTYPES[dtype][0]}_{op}_v{vec}"


def staged_name(dtype: str, op: str) -> str:
    """Contiguous short rows staged through shared memory (widest vectors; no shuffles)."""
    return f"ps_staged_{DTYPES[dtype][0]}_{op}_v{vector_widths(dtype)[1]}"


#: lanes a row of the staged tier's groups smaller than a warp (built once, for every warp size)
STAGED_GROUP_LANES = (4, 8, 16)
#: bytes per element -> the longest row (bytes) the staged groups take (planner.Tuning.staged_group_max_row_bytes)
STAGED_GROUP_MAX_ROW_BYTES = {2: 8000, 4: 600}
#: 4-byte words of a row each lane of a staged group takes at least (planner.Tuning.staged_group_min_words)
STAGED_GROUP_MIN_WORDS = 10
#: bytes per element of the staged tier with a warp a row
STAGED_WARP_ITEMSIZES = (2,)


def staged_group_lanes(dtype: str) -> tuple[int, ...]:
    """The staged groups of one dtype: those whose lanes each take STAGED_GROUP_MIN_WORDS words of a
    row no longer than STAGED_GROUP_MAX_ROW_BYTES (none for float64)."""
    longest = STAGED_GROUP_MAX_ROW_BYTES.get(DTYPES[dtype][2], 0)
    return tuple(lanes for lanes in STAGED_GROUP_LANES if 4 * lanes * STAGED_GROUP_MIN_WORDS <= longest)


def staged_group_name(dtype: str, op: str, lanes: int) -> str:
    """The staged tier with a group of `lanes` lanes a row (fewer than a warp: a warp takes several rows)."""
    return f"ps_staged_lanes_{DTYPES[dtype][0]}_{op}_l{lanes}_v{vector_widths(dtype)[1]}"


def staged_warp_name(dtype: str, op: str, warp: int) -> str:
    """The staged tier with a warp a row: its lanes share the row's words and merge by shuffles."""
    return f"ps_staged_warp_{DTYPES[dtype][0]}_{op}_w{warp}_v{vector_widths(dtype)[1]}"


#: row lengths of the packed tier by bytes per element: a thread holds lcm(cols, 16-byte vector)
#: values of whole rows, and a block's groups pass through shared memory (whole lines loaded and
#: stored). Lengths whose groups would be an even number of slots other than 2, 4 or 8 (48
#: columns: 6) are not packed.
PACKED_COLS = {2: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 28, 32, 36, 40, 44, 56, 64)}


def strided_pass_variants(dtype: str) -> tuple[tuple[int, int], ...]:
    """(vec, lines) of the strided passes apart (a sharded non-last axis, strided_thread over chunks of
    the axis): 16 bytes of inner positions a thread, in vectors of ``vec``."""
    widest = vector_widths(dtype)[1]
    return tuple((vec, widest // vec) for vec in strided_thread_widths(dtype))


def strided_partials_name(dtype: str, vec: int, lines: int) -> str:
    """A sharded non-last axis's first pass: the (m, d) of each chunk of each position (the same for
    both ops), a thread per ``lines`` vectors of ``vec`` positions."""
    return f"ps_strided_partials_{DTYPES[dtype][0]}_v{vec}_l{lines}"


def strided_finish_name(dtype: str, op: str, vec: int, lines: int) -> str:
    """A sharded non-last axis's second pass: each position finished with a given (m, d)."""
    return f"ps_strided_finish_{DTYPES[dtype][0]}_{op}_v{vec}_l{lines}"


def packed_cols(dtype: str) -> tuple[int, ...]:
    return PACKED_COLS.get(DTYPES[dtype][2], ())


def packed_name(dtype: str, op: str, cols: int) -> str:
    """Contiguous rows of `cols` elements, whole rows inside a thread's 16-byte vectors."""
    return f"ps_packed_{DTYPES[dtype][0]}_{op}_c{cols}_v{vector_widths(dtype)[1]}"


#: the tiers that fill shared memory with asynchronous copies (cp.async), which only NVIDIA sm_80 and
#: newer have (planner.has_async_copy): built for NVIDIA and the emulation, never for AMD, and never
#: at warp 64. The gradient's on-chip strided tier is one: a tile of its two inputs takes the
#: shared memory of those parts (an AMD CU's 64 KiB holds too few rows of a vector tile).
ASYNC_COPY_MACROS = ("PS_STAGED_GROUP_ENTRY", "PS_STAGED_WARP_ENTRY", "PS_BLOCK_REGISTERS_ENTRY",
                     "PS_CACHED_REGISTERS_ENTRY", "PS_PARTIALS_BUFFERED_ENTRY",
                     "PS_SPLIT_BUFFERED_ENTRY", "PS_GRAD_STRIDED_CACHED_ENTRY")


@dataclass(frozen=True)
class Entry:
    """One extern "C" kernel: its name, and the macro line of softmax.cuh that defines it."""

    name: str
    macro: str
    params: tuple

    @property
    def line(self) -> str:
        return f"{self.macro}({', '.join(str(p) for p in self.params)})"

    @property
    def async_copy(self) -> bool:
        return self.macro in ASYNC_COPY_MACROS


def warp_free_entries(dtype: str) -> list[Entry]:
    """The kernels of one dtype that use no shuffles, built once for every warp size."""
    tag, ctype, _ = DTYPES[dtype]
    widest = vector_widths(dtype)[1]
    out = []
    for op, enum in OPS.items():
        head = (tag, ctype, op, enum)
        out.append(Entry(strided_name(dtype, op), "PS_STRIDED_ENTRY", head))
        out += [Entry(strided_thread_name(dtype, op, vec, lines), "PS_STRIDED_THREAD_ENTRY", (*head, vec, lines))
                for vec, lines in strided_thread_variants(dtype)]
        out += [Entry(strided_cached_name(dtype, op, vec), "PS_STRIDED_CACHED_ENTRY", (*head, vec))
                for vec in strided_vector_widths(dtype)]
        out += [Entry(strided_finish_name(dtype, op, vec, lines), "PS_STRIDED_FINISH_ENTRY", (*head, vec, lines))
                for vec, lines in strided_pass_variants(dtype)]
        out.append(Entry(staged_name(dtype, op), "PS_STAGED_ENTRY", (*head, widest)))
        out += [Entry(staged_group_name(dtype, op, lanes), "PS_STAGED_GROUP_ENTRY", (*head, lanes, widest))
                for lanes in staged_group_lanes(dtype)]
        out += [Entry(packed_name(dtype, op, cols), "PS_PACKED_ENTRY", (*head, cols, widest))
                for cols in packed_cols(dtype)]
    out += [Entry(strided_partials_name(dtype, vec, lines), "PS_STRIDED_PARTIALS_ENTRY", (tag, ctype, vec, lines))
            for vec, lines in strided_pass_variants(dtype)]
    return out


def warp_entries(dtype: str, warp: int) -> list[Entry]:
    """The kernels of one dtype at one warp size (warp_free_entries excluded); at warp 64, none of
    ASYNC_COPY_MACROS (no wave64 device copies asynchronously)."""
    tag, ctype, _ = DTYPES[dtype]
    out = []
    for vec in vector_widths(dtype):
        out.append(Entry(split_partials_name(dtype, warp, vec), "PS_PARTIALS_ENTRY", (tag, ctype, warp, vec)))
        buffered = vec * DTYPES[dtype][2] >= 4  # slots an asynchronous copy takes (4 bytes and up)
        if buffered:
            out.append(Entry(split_partials_buffered_name(dtype, warp, vec), "PS_PARTIALS_BUFFERED_ENTRY",
                             (tag, ctype, warp, vec)))
        for op, enum in OPS.items():
            head = (tag, ctype, op, enum, warp)
            out += [Entry(v.name, "PS_WARP_ONE_ROW_ENTRY" if v.one_row else "PS_WARP_ENTRY",
                          (*head, v.lanes, v.slots, vec)) for v in built_warp_variants(dtype, op, warp, vec)]
            out.append(Entry(block_name(dtype, op, warp, vec), "PS_BLOCK_ENTRY", (*head, vec)))
            if dtype in BLOCK_REGISTERS_DTYPES:
                out.append(Entry(block_registers_name(dtype, op, warp, vec), "PS_BLOCK_REGISTERS_ENTRY", (*head, vec)))
            out.append(Entry(split_normalize_name(dtype, op, warp, vec), "PS_SPLIT_ENTRY", (*head, vec)))
            if buffered and DTYPES[dtype][2] in SPLIT_BUFFERED_NORMALIZE_ITEMSIZES:
                out.append(Entry(split_normalize_buffered_name(dtype, op, warp, vec), "PS_SPLIT_BUFFERED_ENTRY",
                                 (*head, vec)))
            out.append(Entry(split_cached_name(dtype, op, warp, vec), "PS_CACHED_ENTRY", (*head, vec)))
            out += [Entry(split_cached_registers_name(dtype, op, warp, vec, h, b), "PS_CACHED_REGISTERS_ENTRY",
                          (*head, vec, h, b)) for h, b in split_registers_configs(dtype)]
    widest = vector_widths(dtype)[1]
    for slots in rows_pass_slots(dtype):
        out.append(Entry(rows_partials_name(dtype, warp, slots), "PS_ROWS_PARTIALS_ENTRY",
                         (tag, ctype, warp, slots, widest)))
        out += [Entry(rows_finish_name(dtype, op, warp, slots), "PS_ROWS_FINISH_ENTRY",
                      (tag, ctype, op, enum, warp, slots, widest)) for op, enum in OPS.items()]
    if DTYPES[dtype][2] in STAGED_WARP_ITEMSIZES:
        out += [Entry(staged_warp_name(dtype, op, warp), "PS_STAGED_WARP_ENTRY",
                      (tag, ctype, op, enum, warp, vector_widths(dtype)[1])) for op, enum in OPS.items()]
    return [e for e in out if warp == 32 or not e.async_copy]


def warp_free_names(dtype: str, async_copy: bool = True) -> list[str]:
    """The names of warp_free_entries; without async_copy, those a device without it can plan."""
    return [e.name for e in warp_free_entries(dtype) if async_copy or not e.async_copy]


def entry_names(dtype: str, warp: int, async_copy: bool = True) -> list[str]:
    """The names of warp_entries; without async_copy, those a device without it can plan."""
    return [e.name for e in warp_entries(dtype, warp) if async_copy or not e.async_copy]


#: backend -> (warp sizes, whether its devices copy asynchronously) of the kernels its builds carry
BACKENDS = {"cuda": ((32,), True), "hip": ((32, 64), False)}


def catalogue(dtype: str, backend: str) -> set[str]:
    """Every kernel of one dtype that a backend's build carries ("cuda": NVIDIA, "hip": AMD)."""
    warps, async_copy = BACKENDS[backend]
    names = set(warp_free_names(dtype, async_copy))
    for warp in warps:
        names.update(entry_names(dtype, warp, async_copy))
    return names


# ---- the gradients (src_cuda/backward.cuh, planned by planner_backward.py) ------------------------
#: threads of a block whose groups of lanes take a row each (backward.cuh kGradRowsThreads)
GRAD_ROWS_THREADS = 256
#: slots a lane of a whole warp holds, beyond one: 2..GRAD_MAX_SLOTS ...
GRAD_MAX_SLOTS = 8
#: ... but 2 of 16-bit rows in 16-byte slots, all of them full: longer such rows take a block of 2
#: slots a thread (GRAD_WHOLE_16_BIT_BLOCKS), then of 4 (docs/design.md)
GRAD_WHOLE_16_BIT_MAX_SLOTS = 2


def wide_16_bit(dtype: str, vec: int) -> bool:
    """16-bit elements in 16-byte slots (backward.cuh kWide16Bit)."""
    return DTYPES[dtype][2] == 2 and vec == vector_widths(dtype)[1]


def whole_16_bit(dtype: str, vec: int, whole: bool) -> bool:
    """16-bit rows in 16-byte slots whose every slot is full (``whole``)."""
    return whole and wide_16_bit(dtype, vec)


def grad_max_slots(dtype: str, vec: int, whole: bool) -> int:
    """The most slots of ``vec`` elements a lane of a warp holds of a row (``whole``: every slot of
    the rows is full)."""
    return GRAD_WHOLE_16_BIT_MAX_SLOTS if whole_16_bit(dtype, vec, whole) else GRAD_MAX_SLOTS


#: blocks a row, (threads, slots a thread), the first that holds a row taking it (1024 threads of 4
#: slots would hold no more than 512 of 8). 16-bit rows take 4 slots a thread, their 8 elements a
#: slot costing twice the registers once widened ...
GRAD_BLOCK_SHAPES = ((128, 8), (256, 8), (512, 8))
GRAD_BLOCK_SHAPES_BY_ITEMSIZE = {2: ((128, 4), (256, 4), (512, 4), (1024, 4))}
#: ... and whole rows in 16-byte slots 2 a thread first
GRAD_WHOLE_16_BIT_BLOCKS = ((64, 2), (128, 2))


def grad_block_shapes(dtype: str, vec: int, whole: bool) -> tuple[tuple[int, int], ...]:
    shapes = GRAD_BLOCK_SHAPES_BY_ITEMSIZE.get(DTYPES[dtype][2], GRAD_BLOCK_SHAPES)
    return GRAD_WHOLE_16_BIT_BLOCKS + shapes if whole_16_bit(dtype, vec, whole) else shapes


#: the on-chip split: a chunk is GRAD_CACHED_THREADS threads x GRAD_CACHED_SLOTS slots
GRAD_CACHED_THREADS = 256
GRAD_CACHED_SLOTS = 4
#: ... at least this many such blocks a multiprocessor (backward.cuh kGradCachedMinBlocks), and
#: three for the 16-bit gradient from x (grad_cached_min_blocks)
GRAD_CACHED_MIN_BLOCKS = 4
GRAD_CACHED_FROM_INPUT_16_BIT_MIN_BLOCKS = 3


def grad_cached_min_blocks(dtype: str, vec: int, from_input: bool) -> int:
    """The on-chip split's blocks a multiprocessor its launch bound asks for (backward.cuh
    grad_cached_min_blocks)."""
    if from_input and wide_16_bit(dtype, vec):
        return GRAD_CACHED_FROM_INPUT_16_BIT_MIN_BLOCKS
    return GRAD_CACHED_MIN_BLOCKS


#: the two-pass split's threads a block (backward.cuh kGradStreamThreads)
GRAD_STREAM_THREADS = 256


#: a lane of a group holds at most this many bytes of a row's dy (and as many of y): slots narrower
#: than 16 bytes go several to a lane, so that a warp takes more rows at once (docs/design.md)
GRAD_LANE_BYTES = 16
#: ... in at most this many slots
GRAD_MAX_LANE_SLOTS = 4


def grad_lane_slots(dtype: str, vec: int) -> int:
    """Slots a lane of a group of lanes holds at most, at vector width ``vec``."""
    return max(1, min(GRAD_MAX_LANE_SLOTS, GRAD_LANE_BYTES // (vec * DTYPES[dtype][2])))


def grad_rows_shapes(dtype: str, warp: int, vec: int,
                     wholes: tuple[bool, ...] = (False, True)) -> list[tuple[int, int]]:
    """(lanes a row, slots a lane) of the rows-in-registers gradient at width ``vec``: the groups and
    warps of grad_group_shape for rows of 1..WARP * grad_max_slots slots, and blocks (more lanes
    than a warp) of grad_block_shapes, for rows of partial slots and of whole ones (``wholes``)."""
    lane_slots = grad_lane_slots(dtype, vec)
    groups, blocks = set(), []
    for whole in wholes:
        most = warp * grad_max_slots(dtype, vec, whole)
        groups |= {grad_group_shape(slots, warp, lane_slots) for slots in range(1, most + 1)}
        # a block holding no more than a warp does is never planned
        blocks += [(threads, s) for threads, s in grad_block_shapes(dtype, vec, whole)
                   if threads > warp and threads * s > most and (threads, s) not in blocks]
    return sorted(groups) + blocks


#: 16-bit rows whose stride is not a whole 16 bytes, of at most this many 16-byte vectors, take 8- or
#: 4-byte vectors instead, so that every row starts at the same offset in them (docs/design.md)
GRAD_NARROW_MAX_VECTORS = 32


def grad_narrow_widths(dtype: str) -> tuple[int, ...]:
    """The narrower vector widths of the rows-in-registers gradient, widest first."""
    return (4, 2) if DTYPES[dtype][2] == 2 else ()


def grad_narrow_max_slots(dtype: str, vec: int) -> int:
    """The most slots of ``vec`` elements a row takes at that narrow width."""
    return GRAD_NARROW_MAX_VECTORS * vector_widths(dtype)[1] // vec


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def grad_group_shape(slots: int, warp: int, lane_slots: int) -> tuple[int, int]:
    """(lanes a row, slots a lane) of the group or warp that holds a row of ``slots`` slots: the
    fewest lanes (a power of two) of at most ``lane_slots`` slots each, else a warp of the fewest
    slots (a power of two)."""
    if slots <= warp * lane_slots:
        lanes = next_pow2(-(-slots // lane_slots))
        return lanes, next_pow2(-(-slots // lanes))
    return warp, next_pow2(-(-slots // warp))


def grad_narrow_shapes(dtype: str, warp: int, vec: int) -> list[tuple[int, int]]:
    """(lanes a row, slots a lane) built at a narrow width: the group or warp that takes a row of at
    least 32 elements (shorter ones stay scalar) in at most grad_narrow_max_slots slots."""
    lane_slots = grad_lane_slots(dtype, vec)
    return sorted({grad_group_shape(slots, warp, lane_slots)
                   for slots in range(32 // vec, grad_narrow_max_slots(dtype, vec) + 1)})


#: rows a group of one scalar slot a lane takes a step, at most (backward.cuh kGradMaxBatch)
GRAD_MAX_BATCH = 8


def grad_rows_batch(dtype: str, warp: int, lanes: int, slots: int, vec: int) -> int:
    """Rows a group takes a step in the gradient's rows regime (backward.cuh GradRowsBatch): groups
    of one float32 scalar a lane take warp_batch rows, up to GRAD_MAX_BATCH; the others one."""
    if lanes <= warp and slots == 1 and vec == 1 and DTYPES[dtype][2] == 4:
        return min(GRAD_MAX_BATCH, warp_batch(dtype, slots, vec))
    return 1


def grad_rows_name(dtype: str, op: str, warp: int, lanes: int, slots: int, vec: int) -> str:
    return f"ps_bwd_rows_{DTYPES[dtype][0]}_{op}_w{warp}_g{lanes}_s{slots}_v{vec}"


def grad_rows_from_input_name(dtype: str, op: str, warp: int, lanes: int, slots: int, vec: int) -> str:
    """The gradient from the forward's input x (and dy) of a grad_rows shape: the row's max and sums
    from x held in registers, then its gradient as from y (backward.cuh grad_rows, InputRow)."""
    return f"ps_bwd_from_input_rows_{DTYPES[dtype][0]}_{op}_w{warp}_g{lanes}_s{slots}_v{vec}"


def fitted_name(kernel: str) -> str:
    """A block a row's kernel (grad_rows_name, grad_rows_from_input_name) built to run at fewer
    threads than its shape's, its stride between a thread's slots the block's threads
    (backward.cuh slot_stride)."""
    for kind in ("ps_bwd_rows_", "ps_bwd_from_input_rows_"):
        if kernel.startswith(kind):
            return kind + "fitted_" + kernel[len(kind):]
    raise ValueError(f"{kernel} is no block a row's kernel")


def grad_from_input_shapes(dtype: str, warp: int, vec: int) -> list[tuple[int, int]]:
    """The grad_rows shapes whose gradient from x is built: those that take one row a step, and for
    16-bit elements those of whole rows in 16-byte slots alone (the kernel tests no slot, and the
    planner plans it for no other rows; docs/design.md)."""
    if DTYPES[dtype][2] == 2:
        if not whole_16_bit(dtype, vec, True):
            return []
        return grad_rows_shapes(dtype, warp, vec, wholes=(True,))
    return [(lanes, slots) for lanes, slots in grad_rows_shapes(dtype, warp, vec)
            if grad_rows_batch(dtype, warp, lanes, slots, vec) == 1]


#: The gradients from y whose fitted kernels at 16-byte slots are capped at
#: grad_fitted_max_registers, (dtype, op) -> the block shapes' threads: under their shape's bound
#: they took more (104-105 at 8 slots a thread, 64 at 1024 threads of 4), so that a fitted block
#: held fewer a multiprocessor (the smaller shapes of float32 log_softmax's and float64 softmax's
#: too: at their bound, 104-105, their short rows ran 1-5 points slower). The others take no more
#: there; capped, float32 softmax's spilled and float64 log_softmax's ran 1-2 points slower
#: (docs/design.md).
GRAD_FITTED_CAPPED = {
    ("float32", "log_softmax"): (128, 256, 512),
    ("float64", "softmax"): (128, 256, 512),
    ("bfloat16", "softmax"): (1024,),
    ("bfloat16", "log_softmax"): (1024,),
    ("float16", "softmax"): (1024,),
    ("float16", "log_softmax"): (1024,),
}


#: ... and the gradients from x whose fitted kernels are: 63-64 registers under the shape's bound, 56
#: with no spill in float16 and 4-32 bytes spilled in bfloat16, faster in both (docs/design.md)
GRAD_FROM_INPUT_FITTED_CAPPED = {
    ("bfloat16", "softmax"): (1024,),
    ("bfloat16", "log_softmax"): (1024,),
    ("float16", "softmax"): (1024,),
    ("float16", "log_softmax"): (1024,),
}


def grad_fitted_max_registers(dtype: str, warp: int) -> int:
    """The registers a thread of a capped fitted kernel: the most at which two blocks of the fewest
    warps fitted to the largest block shape (half its threads and one warp more) fit an NVIDIA
    multiprocessor's four register files of 16384 registers, taken in steps of 8 a thread (96 at
    512 threads, 56 at 1024)."""
    threads = max(lanes for lanes, _ in grad_block_shapes(dtype, vector_widths(dtype)[1], False))
    warps_a_file = -(-2 * (threads // 2 + warp) // 32 // 4)
    return 16384 // (32 * warps_a_file) // 8 * 8


def grad_rows_entries(dtype: str, op: str, warp: int, vec: int, shapes) -> list[Entry]:
    """The rows regime's gradient entries at one width: from y for each of ``shapes``, and from x
    beside those of grad_from_input_shapes; blocks a row (more lanes than a warp) also fitted, those
    of GRAD_FITTED_CAPPED at 16-byte slots under a register cap."""
    tag, ctype, _ = DTYPES[dtype]
    from_input = set(grad_from_input_shapes(dtype, warp, vec))
    out = []
    for lanes, slots in shapes:
        args = (tag, ctype, op, OPS[op], warp, lanes, slots, vec)
        names = [(grad_rows_name(dtype, op, warp, lanes, slots, vec), "PS_GRAD_ROWS")]
        if (lanes, slots) in from_input:
            names.append((grad_rows_from_input_name(dtype, op, warp, lanes, slots, vec), "PS_GRAD_ROWS_FROM_INPUT"))
        for name, macro in names:
            out.append(Entry(name, macro + "_ENTRY", args))
            if lanes > warp:
                capped_shapes = (GRAD_FITTED_CAPPED if macro == "PS_GRAD_ROWS" else GRAD_FROM_INPUT_FITTED_CAPPED)
                capped = lanes in capped_shapes.get((dtype, op), ()) and vec * DTYPES[dtype][2] == 16
                if capped:
                    out.append(Entry(fitted_name(name), macro + "_FITTED_CAPPED_ENTRY",
                                     args + (grad_fitted_max_registers(dtype, warp),)))
                else:
                    out.append(Entry(fitted_name(name), macro + "_FITTED_ENTRY", args))
    return out


def grad_cached_name(dtype: str, op: str, warp: int, vec: int, whole: bool = False) -> str:
    """The on-chip split's kernel; ``whole``: the one for 16-bit rows in 16-byte slots, all of them
    full (whole_16_bit), which tests no slot."""
    kind = "cached_whole" if whole_16_bit(dtype, vec, whole) else "cached"
    return f"ps_bwd_{kind}_{DTYPES[dtype][0]}_{op}_w{warp}_s{GRAD_CACHED_SLOTS}_v{vec}"


def grad_cached_from_input_name(dtype: str, op: str, warp: int, vec: int, whole: bool = False) -> str:
    """The on-chip split's gradient from the forward's input x (and dy): each chunk's max of x and
    its sums, merged across the row's blocks (backward.cuh grad_split_cached, FROM_INPUT);
    ``whole`` as grad_cached_name's."""
    kind = "cached_whole" if whole_16_bit(dtype, vec, whole) else "cached"
    return f"ps_bwd_from_input_{kind}_{DTYPES[dtype][0]}_{op}_w{warp}_s{GRAD_CACHED_SLOTS}_v{vec}"


def grad_cached_from_input_built(dtype: str, vec: int) -> bool:
    """Whether the on-chip split's gradient from x is built at ``vec``: 16-byte slots alone."""
    return vec == vector_widths(dtype)[1]


def grad_partials_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_bwd_partials_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def grad_finish_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_bwd_finish_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def grad_rows_pass_slots(dtype: str) -> list[int]:
    """Slots a lane of the gradient's rows passes apart holds of dy and of y (a warp a row of 16-byte
    slots): the forward's (rows_pass_slots), up to GRAD_MAX_SLOTS."""
    return [s for s in rows_pass_slots(dtype) if s <= GRAD_MAX_SLOTS]


def grad_rows_sums_name(dtype: str, op: str, warp: int, slots: int) -> str:
    """The gradient of the sharded softmax's local rows that a warp holds, first pass: each row's sums."""
    return f"ps_bwd_rows_sums_{DTYPES[dtype][0]}_{op}_w{warp}_s{slots}_v{vector_widths(dtype)[1]}"


def grad_rows_finish_name(dtype: str, op: str, warp: int, slots: int) -> str:
    """... second pass: each row finished with given sums."""
    return f"ps_bwd_rows_finish_{DTYPES[dtype][0]}_{op}_w{warp}_s{slots}_v{vector_widths(dtype)[1]}"


def grad_strided_name(dtype: str, op: str) -> str:
    return f"ps_bwd_strided_{DTYPES[dtype][0]}_{op}"


def grad_strided_thread_name(dtype: str, op: str, vec: int, lines: int) -> str:
    """The gradient of a short non-last axis: the forward's strided_thread variants (vec, lines)."""
    return f"ps_bwd_strided_thread_{DTYPES[dtype][0]}_{op}_v{vec}_l{lines}"


#: element sizes whose gradient takes the on-chip strided tier: 16-bit axes read their dy and y once
#: at 50-72% of the copy where column groups reading them twice took 18-27; float32 and float64
#: axes run faster in column groups (54-60% beside 41-56)
GRAD_STRIDED_CACHED_ITEMSIZES = (2,)


def grad_strided_cached_name(dtype: str, op: str, vec: int) -> str:
    """The gradient of a non-last axis on co-resident blocks that cache their chunks of dy and y: the
    forward's strided_cached with the gradient's op."""
    return f"ps_bwd_strided_cached_{DTYPES[dtype][0]}_{op}_v{vec}"


def grad_strided_sums_name(dtype: str, op: str, vec: int, lines: int) -> str:
    """A sharded non-last axis's gradient, first pass: the (sum, top) of each chunk of each position."""
    return f"ps_bwd_strided_sums_{DTYPES[dtype][0]}_{op}_v{vec}_l{lines}"


def grad_strided_finish_name(dtype: str, op: str, vec: int, lines: int) -> str:
    """... second pass: each position finished with a given (sum, top)."""
    return f"ps_bwd_strided_finish_{DTYPES[dtype][0]}_{op}_v{vec}_l{lines}"


#: the gradient's staged rows (the forward's staged_rows with the gradient's op): a thread a row (1) or
#: a group of lanes a row, for elements of GRAD_STAGED_ITEMSIZES
GRAD_STAGED_LANES = (1, 4)
GRAD_STAGED_ITEMSIZES = (2, 4)


def grad_staged_name(dtype: str, op: str, lanes: int) -> str:
    return f"ps_bwd_staged_{DTYPES[dtype][0]}_{op}_l{lanes}_v{vector_widths(dtype)[1]}"


#: the gradient's packed rows (the forward's packed_rows with the gradient's op): contiguous rows of
#: these columns, by element size, whole rows inside a thread's 16-byte vectors
GRAD_PACKED_COLS = {2: (2, 3, 4)}


def grad_packed_cols(dtype: str) -> tuple[int, ...]:
    return GRAD_PACKED_COLS.get(DTYPES[dtype][2], ())


def grad_packed_name(dtype: str, op: str, cols: int) -> str:
    return f"ps_bwd_packed_{DTYPES[dtype][0]}_{op}_c{cols}_v{vector_widths(dtype)[1]}"


def grad_warp_free_entries(dtype: str) -> list[Entry]:
    tag, ctype, _ = DTYPES[dtype]
    out = []
    for op, enum in OPS.items():
        if DTYPES[dtype][2] in GRAD_STAGED_ITEMSIZES:
            out += [Entry(grad_staged_name(dtype, op, lanes), "PS_GRAD_STAGED_ENTRY",
                          (tag, ctype, op, enum, lanes, vector_widths(dtype)[1])) for lanes in GRAD_STAGED_LANES]
        out += [Entry(grad_packed_name(dtype, op, cols), "PS_GRAD_PACKED_ENTRY",
                      (tag, ctype, op, enum, cols, vector_widths(dtype)[1])) for cols in grad_packed_cols(dtype)]
        out.append(Entry(grad_strided_name(dtype, op), "PS_GRAD_STRIDED_ENTRY", (tag, ctype, op, enum)))
        out += [Entry(grad_strided_cached_name(dtype, op, vec), "PS_GRAD_STRIDED_CACHED_ENTRY",
                      (tag, ctype, op, enum, vec)) for vec in strided_vector_widths(dtype)
                if DTYPES[dtype][2] in GRAD_STRIDED_CACHED_ITEMSIZES]
        out += [Entry(grad_strided_thread_name(dtype, op, vec, lines), "PS_GRAD_STRIDED_THREAD_ENTRY",
                      (tag, ctype, op, enum, vec, lines)) for vec, lines in strided_thread_variants(dtype)]
        # the passes apart (a sharded axis): each macro defines the sums pass and the finish pass
        out += [Entry(grad_strided_sums_name(dtype, op, vec, lines), "PS_GRAD_STRIDED_PASSES_ENTRY",
                      (tag, ctype, op, enum, vec, lines)) for vec, lines in strided_pass_variants(dtype)]
    return out


def grad_warp_entries(dtype: str, warp: int) -> list[Entry]:
    """The gradient kernels of one dtype at one warp size. The two-pass split's macros (and those of
    the rows passes apart) define two kernels (partials or sums, and finish): each Entry names the first."""
    tag, ctype, _ = DTYPES[dtype]
    out = []
    for vec in vector_widths(dtype):
        for op, enum in OPS.items():
            head = (tag, ctype, op, enum, warp)
            out += grad_rows_entries(dtype, op, warp, vec, grad_rows_shapes(dtype, warp, vec))
            out.append(Entry(grad_cached_name(dtype, op, warp, vec), "PS_GRAD_CACHED_ENTRY",
                             (*head, GRAD_CACHED_SLOTS, vec)))
            if whole_16_bit(dtype, vec, True):
                out.append(Entry(grad_cached_name(dtype, op, warp, vec, True), "PS_GRAD_CACHED_WHOLE_ENTRY",
                                 (*head, GRAD_CACHED_SLOTS, vec)))
            if grad_cached_from_input_built(dtype, vec):
                out.append(Entry(grad_cached_from_input_name(dtype, op, warp, vec), "PS_GRAD_CACHED_FROM_INPUT_ENTRY",
                                 (*head, GRAD_CACHED_SLOTS, vec)))
                if whole_16_bit(dtype, vec, True):
                    out.append(Entry(grad_cached_from_input_name(dtype, op, warp, vec, True),
                                     "PS_GRAD_CACHED_FROM_INPUT_WHOLE_ENTRY", (*head, GRAD_CACHED_SLOTS, vec)))
            out.append(Entry(grad_partials_name(dtype, op, warp, vec), "PS_GRAD_SPLIT_ENTRY", (*head, vec)))
    for op, enum in OPS.items():  # the passes apart of rows a warp holds: the macro defines both
        out += [Entry(grad_rows_sums_name(dtype, op, warp, slots), "PS_GRAD_ROWS_PASSES_ENTRY",
                      (tag, ctype, op, enum, warp, slots, vector_widths(dtype)[1]))
                for slots in grad_rows_pass_slots(dtype)]
    for vec in grad_narrow_widths(dtype):
        for op in OPS:
            out += grad_rows_entries(dtype, op, warp, vec, grad_narrow_shapes(dtype, warp, vec))
    return out


def backward_catalogue(dtype: str, backend: str) -> set[str]:
    """Every gradient kernel of one dtype that a backend's build carries (as catalogue())."""
    warps, async_copy = BACKENDS[backend]
    names = {e.name for e in grad_warp_free_entries(dtype) if async_copy or not e.async_copy}
    for op in OPS:  # the finish passes that the sums passes' macros define beside them
        names.update(grad_strided_finish_name(dtype, op, vec, lines) for vec, lines in strided_pass_variants(dtype))
    for warp in warps:
        names.update(e.name for e in grad_warp_entries(dtype, warp))
        names.update(grad_finish_name(dtype, op, warp, vec) for op in OPS for vec in vector_widths(dtype))
        names.update(grad_rows_finish_name(dtype, op, warp, slots)
                     for op in OPS for slots in grad_rows_pass_slots(dtype))
    return names


def _guarded(entries: list[Entry]) -> list[str]:
    """Macro lines, those of asynchronous-copy tiers inside #if PS_ASYNC_COPY_TIERS."""
    plain = [e.line for e in entries if not e.async_copy]
    copying = [e.line for e in entries if e.async_copy]
    if copying:
        plain += ["#if PS_ASYNC_COPY_TIERS  // asynchronous copies: NVIDIA and the emulation, never AMD", *copying,
                  "#endif"]
    return plain


def source_file_name(dtype: str) -> str:
    return f"softmax_{DTYPES[dtype][0]}.cu"


def render_source(dtype: str) -> str:
    out = [
        f"// Entry points for {dtype}: generated by `python -m portable_softmax._variants src_cuda`.",
        "// Do not edit; change portable_softmax/_variants.py and regenerate.",
        '#include "softmax.cuh"',
        '#include "backward.cuh"',
        "",
    ]
    out += _guarded(warp_free_entries(dtype))
    out += _guarded(warp_entries(dtype, 32))
    out.append("#if PS_WAVE64  // wave64 variants: AMD CDNA and the emulation, never NVIDIA")
    out += _guarded(warp_entries(dtype, 64))
    out.append("#endif")
    out.append("// gradients")
    out += _guarded(grad_warp_free_entries(dtype) + grad_warp_entries(dtype, 32))
    out.append("#if PS_WAVE64")
    out += [e.line for e in grad_warp_entries(dtype, 64)]
    out.append("#endif")
    return "\n".join(out) + "\n"


def write_sources(directory: Path) -> list[Path]:
    written = []
    for dtype in DTYPES:
        path = Path(directory) / source_file_name(dtype)
        path.write_text(render_source(dtype))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_sources(Path(sys.argv[1] if len(sys.argv) > 1 else "src_cuda")):
        print(p)

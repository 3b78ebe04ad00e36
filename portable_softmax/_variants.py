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
#: a lane of the register tier holds at most this many compute values
MAX_VALUES_PER_LANE = {"float": 64, "double": 16}


def compute_type(dtype: str) -> str:
    return "double" if dtype == "float64" else "float"


def vector_widths(dtype: str) -> tuple[int, int]:
    """Scalar (for views whose input and output misalign differently) and 16 bytes."""
    return (1, 16 // DTYPES[dtype][2])


def strided_vector_widths(dtype: str) -> tuple[int, int]:
    """Inner positions a thread of the on-chip strided tier takes with one load: 1, or a 16-byte
    vector of 4- and 8-byte types, an 8-byte vector of four 16-bit ones (16-byte vectors of those
    took 80 registers a thread and 16 KiB of (m, d) scratch a block; 4-byte pairs were slower)."""
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
    (and, for scalar slots, single lanes holding a short row)."""
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


def built_warp_variants(dtype: str, op: str, warp: int, vec: int) -> list[WarpVariant]:
    """Every register-tier kernel built for these vectors: warp_variants, then one_row_variants."""
    return warp_variants(dtype, op, warp, vec) + one_row_variants(dtype, op, warp, vec)


def block_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_block_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


#: dtypes of the block tier whose rows pass its shared memory, part of each row in registers
#: (float64 would need the registers for its arithmetic)
BLOCK_REGISTERS_DTYPES = ("float32", "float16", "bfloat16")


def block_registers_name(dtype: str, op: str, warp: int, vec: int) -> str:
    """A block a row, the row's first slots held in registers and the rest in shared memory."""
    return f"ps_block_registers_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def split_partials_name(dtype: str, warp: int, vec: int) -> str:
    return f"ps_split_partials_{DTYPES[dtype][0]}_w{warp}_v{vec}"


def split_normalize_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_split_normalize_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


def split_cached_name(dtype: str, op: str, warp: int, vec: int) -> str:
    return f"ps_split_cached_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}"


#: bytes per element -> (slots a thread holds in registers, blocks a multiprocessor) of the built
#: split_cached_registers kernels (planner.SPLIT_REGISTERS picks among them)
SPLIT_REGISTERS_CONFIGS: dict[int, tuple[tuple[int, int], ...]] = {4: ((5, 5),), 2: ((3, 5),)}


def split_cached_registers_name(dtype: str, op: str, warp: int, vec: int, held: int, blocks: int) -> str:
    """The on-chip split with `held` slots a thread of each chunk in registers (the chunk's first
    ones), at least `blocks` blocks a multiprocessor (BLOCK_REGISTERS_DTYPES)."""
    return f"ps_split_cached_registers_{DTYPES[dtype][0]}_{op}_w{warp}_v{vec}_h{held}_b{blocks}"


def split_registers_configs(dtype: str) -> tuple[tuple[int, int], ...]:
    return SPLIT_REGISTERS_CONFIGS.get(DTYPES[dtype][2], ()) if dtype in BLOCK_REGISTERS_DTYPES else ()


#: blocks of a thread block cluster that split a row (NVIDIA sm_90 and newer); clusters of 8
#: measured no faster than the on-chip split tier (planner.CLUSTER_SPLIT)
CLUSTER_SIZES = (2, 4)


def cluster_name(dtype: str, op: str, vec: int, cluster: int) -> str:
    """A row split over the blocks of a thread block cluster (warp 32: NVIDIA only)."""
    return f"ps_split_cluster_{DTYPES[dtype][0]}_{op}_w32_v{vec}_c{cluster}"


def cluster_names(dtype: str) -> list[str]:
    """The cluster kernels of one dtype, built for NVIDIA only."""
    return [cluster_name(dtype, op, vec, c) for vec in vector_widths(dtype) for op in OPS for c in CLUSTER_SIZES]


def strided_name(dtype: str, op: str) -> str:
    return f"ps_strided_{DTYPES[dtype][0]}_{op}"


#: lines a thread of the short-axis strided tier takes in vectors of 16 bytes, by the most rows of
#: the reduced axis they serve (8 vectors held a thread: a row or two of each line in flight).
#: Measured on an H200 against one line (% of the copy, softmax / log_softmax): float32 2 rows
#: 47 / 51 -> 50 / 80, 3 rows 65 / 70 -> 71 / 84, 4 rows 80 / 85 -> 81 / 87.5; float16 2 rows
#: 30 / 31 -> 33 / 34, 3-4 rows 41-50 / 44-52 -> 54-60 / 56-64; bfloat16 2 rows 31 -> 35-36,
#: but 3-4 rows 41-50 / 45-52 -> 40-47.5 / 41-49.
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


def staged_group_name(dtype: str, op: str, lanes: int) -> str:
    """The staged tier with a group of `lanes` lanes a row (fewer than a warp: a warp takes several rows)."""
    return f"ps_staged_lanes_{DTYPES[dtype][0]}_{op}_l{lanes}_v{vector_widths(dtype)[1]}"


def staged_warp_name(dtype: str, op: str, warp: int) -> str:
    """The staged tier with a warp a row: its lanes share the row's words and merge by shuffles."""
    return f"ps_staged_warp_{DTYPES[dtype][0]}_{op}_w{warp}_v{vector_widths(dtype)[1]}"


#: row lengths of the packed tier (a thread holds lcm(cols, 16-byte vector) values of whole rows),
#: by bytes per element. Since its groups pass through shared memory (a block's loads and stores
#: whole lines), measured on an H100 against the tiers these rows took before (% of the copy):
#: 16-bit rows of 5 columns 93-97 -> 101, 6 99-100 -> 101.5, 8 94.6-98 -> 98, 7 level (100.5).
#: When each thread loaded its own group, 5 and 7 lost (68-69 -> 47-58). 16-bit rows of 16 and 32
#: columns (groups of 2 and 4 slots, swizzled in shared memory), on an H200 against the register and
#: staged tiers: float16 16 columns 84 / 88 -> 91 / 97 (softmax / log_softmax), bfloat16 32 columns
#: 82 / 84 -> 87 / 91. 64 columns, once whole rounds took no test a slot: 88-91 -> 94-95 (H200), on
#: grids of at least half a block a multiprocessor (planner.PACKED_LARGE_GROUPS_MIN_BLOCKS_PER_SM).
#: 9, 11 and 13 columns (groups of 72-104 values, widened a row at a time), on an H200 against the
#: staged tier at 16-256 MiB (two runs): 9 columns 83-95 -> 98-107, 11 90-98 -> 94-107, 13 87-99 ->
#: 89-98 (but 32 MiB: 92-95 -> 89-90). 18, 24, 28, 36, 40, 44 and 56 columns (a scan at 64 MiB found
#: 16-bit rows of 18-40 columns at 80-92 on the staged tier), H200 at 16-256 MiB: 80-96 -> 96-120.
#: Lengths whose groups would be an even number of slots other than 2, 4 or 8 (48 columns: 6) are
#: not packed (packed_flip).
PACKED_COLS = {2: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 18, 20, 24, 28, 32, 36, 40, 44, 56, 64)}


def packed_cols(dtype: str) -> tuple[int, ...]:
    return PACKED_COLS.get(DTYPES[dtype][2], ())


def packed_name(dtype: str, op: str, cols: int) -> str:
    """Contiguous rows of `cols` elements, whole rows inside a thread's 16-byte vectors."""
    return f"ps_packed_{DTYPES[dtype][0]}_{op}_c{cols}_v{vector_widths(dtype)[1]}"


def warp_free_names(dtype: str) -> list[str]:
    """The kernels of one dtype that use no shuffles, built once for every warp size."""
    names = [strided_name(dtype, op) for op in OPS]
    names += [strided_thread_name(dtype, op, vec, lines) for op in OPS for vec, lines in strided_thread_variants(dtype)]
    names += [strided_cached_name(dtype, op, vec) for op in OPS for vec in strided_vector_widths(dtype)]
    names += [staged_name(dtype, op) for op in OPS]
    names += [staged_group_name(dtype, op, lanes) for op in OPS for lanes in STAGED_GROUP_LANES]
    return names + [packed_name(dtype, op, cols) for op in OPS for cols in packed_cols(dtype)]


def entry_names(dtype: str, warp: int) -> list[str]:
    """Every extern "C" kernel of one dtype at one warp size (warp_free_names excluded)."""
    names = []
    for vec in vector_widths(dtype):
        names.append(split_partials_name(dtype, warp, vec))
        for op in OPS:
            names += [v.name for v in built_warp_variants(dtype, op, warp, vec)]
            names += [block_name(dtype, op, warp, vec), split_normalize_name(dtype, op, warp, vec),
                      split_cached_name(dtype, op, warp, vec)]
            if dtype in BLOCK_REGISTERS_DTYPES:
                names.append(block_registers_name(dtype, op, warp, vec))
            names += [split_cached_registers_name(dtype, op, warp, vec, held, blocks)
                      for held, blocks in split_registers_configs(dtype)]
    return names + [staged_warp_name(dtype, op, warp) for op in OPS]


def _entry_lines(dtype: str, warp: int) -> list[str]:
    tag, ctype, _ = DTYPES[dtype]
    lines = []
    for vec in vector_widths(dtype):
        lines.append(f"PS_PARTIALS_ENTRY({tag}, {ctype}, {warp}, {vec})")
        for op, enum in OPS.items():
            for v in built_warp_variants(dtype, op, warp, vec):
                macro = "PS_WARP_ONE_ROW_ENTRY" if v.one_row else "PS_WARP_ENTRY"
                lines.append(f"{macro}({tag}, {ctype}, {op}, {enum}, {warp}, {v.lanes}, {v.slots}, {vec})")
            lines.append(f"PS_BLOCK_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vec})")
            if dtype in BLOCK_REGISTERS_DTYPES:
                lines.append(f"PS_BLOCK_REGISTERS_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vec})")
            lines.append(f"PS_SPLIT_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vec})")
            lines.append(f"PS_CACHED_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vec})")
            for h, b in split_registers_configs(dtype):
                lines.append(f"PS_CACHED_REGISTERS_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vec}, {h}, {b})")
    for op, enum in OPS.items():
        lines.append(f"PS_STAGED_WARP_ENTRY({tag}, {ctype}, {op}, {enum}, {warp}, {vector_widths(dtype)[1]})")
    return lines


def source_file_name(dtype: str) -> str:
    return f"softmax_{DTYPES[dtype][0]}.cu"


def render_source(dtype: str) -> str:
    tag, ctype, _ = DTYPES[dtype]
    out = [
        f"// Entry points for {dtype}: generated by `python -m portable_softmax._variants src_cuda`.",
        "// Do not edit; change portable_softmax/_variants.py and regenerate.",
        '#include "softmax.cuh"',
        "",
    ]
    for op, enum in OPS.items():
        out.append(f"PS_STRIDED_ENTRY({tag}, {ctype}, {op}, {enum})")
        for vec, lines in strided_thread_variants(dtype):
            out.append(f"PS_STRIDED_THREAD_ENTRY({tag}, {ctype}, {op}, {enum}, {vec}, {lines})")
        for vec in strided_vector_widths(dtype):
            out.append(f"PS_STRIDED_CACHED_ENTRY({tag}, {ctype}, {op}, {enum}, {vec})")
        out.append(f"PS_STAGED_ENTRY({tag}, {ctype}, {op}, {enum}, {vector_widths(dtype)[1]})")
        for lanes in STAGED_GROUP_LANES:
            out.append(f"PS_STAGED_GROUP_ENTRY({tag}, {ctype}, {op}, {enum}, {lanes}, {vector_widths(dtype)[1]})")
        for cols in packed_cols(dtype):
            out.append(f"PS_PACKED_ENTRY({tag}, {ctype}, {op}, {enum}, {cols}, {vector_widths(dtype)[1]})")
    out += _entry_lines(dtype, 32)
    out.append("#if PS_CLUSTERS  // thread block clusters: NVIDIA only")
    for vec in vector_widths(dtype):
        for op, enum in OPS.items():
            for c in CLUSTER_SIZES:
                out.append(f"PS_CLUSTER_ENTRY({tag}, {ctype}, {op}, {enum}, 32, {vec}, {c})")
    out.append("#endif")
    out.append("#if PS_WAVE64  // wave64 variants: AMD CDNA and the emulation, never NVIDIA")
    out += _entry_lines(dtype, 64)
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

"""The planner over device profiles: every plan names a compiled variant and fits the device."""

from __future__ import annotations

import collections
import itertools
from dataclasses import replace
from math import ceil, lcm

import pytest
from checks import SMALL_INPUT_OFF, large_input_tuning

from portable_softmax import _variants as V
from portable_softmax import planner
from portable_softmax.layout import Rows, Strided, describe
from portable_softmax.planner import (
    DEFAULT_TUNING,
    I32,
    SCRATCH_ALIGN,
    DeviceProfile,
    Plan,
    PlanError,
    RowProblem,
    StridedProblem,
    Tuning,
    default_tuning,
    has_async_copy,
    plan,
)

PROFILES = {"h100": DeviceProfile.h100(), "mi300x": DeviceProfile.mi300x(), "rdna3": DeviceProfile.rdna3()}
COLS = (1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 63, 64, 65, 100, 1000, 1024, 1025, 2047, 2048, 2049, 4096, 4097,
        8191, 50257, 65536, 100000, 128256, 262144, 1 << 20, 10**8)
ROWS = (1, 7, 128, 100000, 1 << 22)


#: the planner's numbers that both Tuning families share (the fields tests here read)
T = DEFAULT_TUNING


def plan_large(problem: RowProblem | StridedProblem, device: DeviceProfile, **changes) -> Plan:
    """The plan under the device's Tuning without the small-input rules (checks.SMALL_INPUT_OFF), its
    fields `changes` replaced: most tests here plan a few rows to check the tiers that larger inputs take."""
    return plan(problem, device, replace(default_tuning(device), **{**SMALL_INPUT_OFF, **changes}))


def _compiled_names(dtype: str, warp: int) -> set[str]:
    return set(V.entry_names(dtype, warp)) | set(V.warp_free_names(dtype))


@pytest.mark.parametrize("small_input_rules", [False, True], ids=["large-input-rules", "small-input-rules"])
@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_every_plan_fits_the_device_and_names_a_compiled_kernel(device, dtype, small_input_rules):
    planned = plan if small_input_rules else plan_large
    names = _compiled_names(dtype, device.warp_size)
    tiers, held_tiers = set(), set()
    for rows, cols, op, misalign in itertools.product(ROWS, COLS, V.OPS, (0, 1)):
        if rows * cols > 1 << 40:
            continue
        p = planned(RowProblem(dtype, op, rows, cols, x_misalign=misalign, y_misalign=misalign), device)
        tiers.add(p.tier)
        for launch in p.launches:
            assert launch.kernel in names, launch.kernel
            assert f"_w{device.warp_size}_" in launch.kernel or launch.kernel in V.warp_free_names(dtype)
            assert 0 < launch.block <= device.max_threads_per_block and launch.block % device.warp_size == 0
            assert launch.block <= V.LAUNCH_BOUND_THREADS.get(p.tier, 1024), "over the kernel's launch bound"
            assert 0 < launch.grid <= device.max_grid_x
            static = 2 * (1024 // device.warp_size) * 8
            assert launch.shared_mem + static <= device.shared_mem_per_block_optin
        if p.tier in ("staged", "staged_warp", "staged_group"):  # a step's span fits the shared memory it asks for
            (launch,) = p.launches
            tile_rows, lanes = p.notes["tile_rows"], p.notes["lanes"]
            assert lanes == {"staged": 1, "staged_warp": device.warp_size}.get(p.tier, lanes)
            assert p.tier != "staged_group" or launch.kernel == V.staged_group_name(dtype, op, lanes)
            owners = launch.block // lanes
            assert tile_rows >= min(rows, owners), "every thread (or group of lanes) owns a row"
            assert tile_rows == rows or tile_rows % owners == 0, "every thread (or group) takes whole rows"
            assert launch.shared_mem >= tile_rows * cols * V.DTYPES[dtype][2] + misalign * V.DTYPES[dtype][2]
            assert launch.shared_mem <= device.shared_mem_per_block
        if p.tier == "warp":
            (launch,) = p.launches
            built = V.built_warp_variants(dtype, op, device.warp_size, p.notes["vec"])
            v = next(w for w in built if w.name == launch.kernel)
            assert v.lanes * v.slots * v.vec >= cols + misalign % v.vec, "the lane group must hold the row"
        if p.tier == "block_registers":  # registers and shared memory hold the row, the last slot in the latter
            (launch,) = p.launches
            held, slots, vec = p.notes["held_slots"], p.notes["slots"], p.notes["vec"]
            assert held == min(T.row_register_slots * launch.block, slots - 1)
            assert launch.grid == min(rows, device.max_grid_x)
            assert launch.shared_mem == (slots - held) * vec * V.DTYPES[dtype][2]
            assert launch.shared_mem + static <= device.shared_mem_per_block_optin
            # half the launch bound's threads where two such blocks share a multiprocessor, else all
            # (the static scratch of each block, and the 1 KiB the runtime reserves, beside the cache)
            half = T.row_registers_threads // 2
            half_cache = (slots - min(T.row_register_slots * half, slots - 1)) * vec * V.DTYPES[dtype][2]
            if launch.block == half:
                assert 2 * launch.shared_mem < device.shared_mem_per_multiprocessor
            else:
                assert launch.block == T.row_registers_threads
                assert 2 * (half_cache + static + 1024) > device.shared_mem_per_multiprocessor
        if p.tier in ("split", "cached"):
            assert p.notes["chunks"] * p.notes["chunk_slots"] >= p.notes["slots"]
            assert dict(p.scratch)["partials"] >= 2 * rows * p.notes["chunks"] * 4
        if p.tier == "cached":  # blocks of a row wait on each other: all of them must be resident
            (launch,) = p.launches
            assert launch.cooperative and launch.min_grid == p.notes["chunks"] <= device.multiprocessors
            assert launch.grid % p.notes["chunks"] == 0 and launch.grid >= launch.min_grid
            assert dict(p.scratch)["arrivals"] == 4 * rows
            if "held_slots" in p.notes:  # each chunk's first slots in registers, the rest in shared memory
                itemsize, vec = V.DTYPES[dtype][2], p.notes["vec"]
                held_slots, blocks = T.split_registers[itemsize]
                assert has_async_copy(device) and dtype in V.BLOCK_REGISTERS_DTYPES
                assert launch.kernel == V.split_cached_registers_name(dtype, op, device.warp_size, vec, held_slots,
                                                                      blocks)
                assert launch.block == T.split_registers_threads <= V.LAUNCH_BOUND_THREADS["cached_registers"]
                assert p.notes["held_slots"] == held_slots * launch.block
                assert launch.shared_mem == max(0, p.notes["chunk_slots"] - p.notes["held_slots"]) * vec * itemsize
                assert launch.grid <= blocks * device.multiprocessors, "more blocks than the registers keep resident"
                held_tiers.add("cached_registers")
        if p.scratch:  # one allocation: every buffer aligned, inside it, none overlapping
            total, offsets = p.scratch_layout()
            spans = sorted((offsets[name], offsets[name] + nbytes) for name, nbytes in p.scratch)
            assert all(start % SCRATCH_ALIGN == 0 for start, _ in spans) and spans[-1][1] <= total
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    expected = {"staged", "warp", "block", "cached", "split"} | ({"packed"} if V.packed_cols(dtype) else set())
    if has_async_copy(device) and V.DTYPES[dtype][2] in T.staged_warp_itemsizes:
        expected.add("staged_warp")
    if has_async_copy(device) and V.DTYPES[dtype][2] in T.staged_group_max_row_bytes:
        expected.add("staged_group")
    if has_async_copy(device) and dtype in V.BLOCK_REGISTERS_DTYPES:
        expected.add("block_registers")
    assert tiers == expected
    held = (has_async_copy(device) and dtype in V.BLOCK_REGISTERS_DTYPES
            and V.DTYPES[dtype][2] in T.split_registers)
    assert held_tiers == ({"cached_registers"} if held else set())


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_tiny_rows_pack_several_rows_per_warp(device):
    p = plan_large(RowProblem("float32", "softmax", 4096, 8, x_stride=12, y_stride=12), device)
    assert p.tier == "warp" and "_l2_s1_v4" in p.launches[0].kernel  # 2 lanes x 4 floats per row


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_contiguous_short_rows_are_staged_as_one_span(device):
    def ungrouped(problem: RowProblem, device: DeviceProfile) -> Plan:
        """The tiers as they are where groups of lanes do not take rows."""
        return plan_large(problem, device, staged_groups=False)

    for cols in (5, 7, 100):
        p = ungrouped(RowProblem("float16", "softmax", 1 << 20, cols, x_misalign=3, y_misalign=3), device)
        assert p.tier == "staged" and p.notes["vec"] == 8  # any common offset: 16-byte vectors
        block, tile_rows = p.launches[0].block, p.notes["tile_rows"]
        assert tile_rows % block == 0, "every thread takes whole rows of the span"
        assert block * 64 * 2 // 3 <= tile_rows * cols * 2, "about 64 bytes of the span a thread"
    padded = ungrouped(RowProblem("float16", "softmax", 1 << 20, 7, x_stride=8, y_stride=8), device)
    mixed = ungrouped(RowProblem("float16", "softmax", 1 << 20, 7, x_misalign=1, y_misalign=0), device)
    long = ungrouped(RowProblem("float32", "softmax", 1 << 20, 129), device)
    assert {padded.tier, mixed.tier, long.tier} == {"warp"}

    def tier_of(dtype: str, cols: int) -> str:
        the_plan = ungrouped(RowProblem(dtype, "softmax", 1 << 20, cols), device)
        scalar = the_plan.tier == "warp" and the_plan.launches[0].kernel.endswith("_v1")
        return "scalar" if scalar else the_plan.tier

    # Rows that take scalar slots in the register tier where the staged tier loads through
    # registers; where copies are asynchronous, the staged tier takes the shorter ones.
    staged_where_async = [("float32", 67), ("float16", 127), ("float16", 255)]
    scalar_always = [("float32", 100), ("float32", 127)]
    # rows of whole 16-byte vectors: the register tier, or staged up to 496 bytes where copies are asynchronous
    whole_vectors = [("float16", 104), ("float32", 20), ("float16", 200), ("bfloat16", 248)]
    copies_async = has_async_copy(device)
    assert {tier_of(*c) for c in staged_where_async} == {"staged" if copies_async else "scalar"}
    assert {tier_of(*c) for c in scalar_always} == {"scalar"}
    assert {tier_of(*c) for c in whole_vectors} == {"staged" if copies_async else "warp"}
    assert tier_of("float16", 256) == "warp"  # 512 bytes of whole vectors
    # 514-576 bytes: staged only where copies are asynchronous; longer rows a warp a row
    assert (tier_of("float16", 270) == "staged") == copies_async
    for dtype, cols in (("float16", 288), ("float16", 300), ("bfloat16", 511), ("bfloat16", 601), ("float16", 4000)):
        assert (tier_of(dtype, cols) == "staged_warp") == copies_async, (dtype, cols)
    assert tier_of("float32", 1000) != "staged_warp" and tier_of("float64", 300) != "staged_warp"
    assert tier_of("float16", 4096) == "block"  # 8 KiB


def test_bank_ways_of_groups_taking_consecutive_rows():
    """Groups of a warp start at their rows' first whole words; counted by hand from the row length in words."""
    def ways(cols: int, lanes: int, misalign: int = 0) -> int:
        problem = RowProblem("float16", "softmax", 1000, cols, x_misalign=misalign)
        return planner.staged_bank_ways(DEFAULT_TUNING, problem, lanes)

    assert ways(288, 8) == 2  # rows 144 words apart: groups on banks 0, 16, 0, 16
    assert ways(400, 8) == 1  # 200 words: 0, 8, 16, 24
    assert ways(700, 8) == 4  # 350 words: 0, 30, 28, 26, all four over banks 0 and 1
    assert ways(320, 4) == 8  # 160 words: every group on the same banks
    assert ways(320, 16) == 2
    assert ways(383, 8) == 4 and ways(383, 16) == 2  # 191.5 words: 0, 192, 383, 575 -> 0, 0, 31, 31
    assert ways(300, 4) == 2 and ways(300, 4, misalign=1) == 2
    # padded by a 16-byte slot: 256 columns 132 words apart, groups on banks 0, 4, ..., 28
    assert planner.staged_bank_ways(DEFAULT_TUNING, RowProblem("float16", "softmax", 1000, 256), 4) == 8
    assert planner.staged_bank_ways(DEFAULT_TUNING, RowProblem("float16", "softmax", 1000, 256), 4, 264) == 1
    # float32, 100 words: groups on banks 0, 4, ..., 28, each on its own four
    assert planner.staged_bank_ways(DEFAULT_TUNING, RowProblem("float32", "softmax", 1000, 100), 4) == 1


def test_bank_ways_of_groups_taking_interleaved_rows():
    """The groups of 32 lanes on rows staged_threads / 32 = 4 apart; counted by hand."""
    def ways(cols: int, lanes: int) -> int:
        return planner.staged_bank_ways(DEFAULT_TUNING, RowProblem("float16", "softmax", 1000, cols), lanes, None, True)

    assert T.staged_threads // 32 == 4
    # 255 columns: rows 4 apart are 510 words apart, 30 banks on: groups of 4 lanes on banks 0, 30,
    # 28, ..., 18, each overlapping the next by two banks (in order: 127.5 words, 8 ways)
    assert ways(255, 4) == 2
    assert ways(700, 8) == 1  # 1400 words: banks 0, 24, 16, 8, eight each
    assert ways(400, 4) == 8  # 800 words, a multiple of 32: every group on the same banks


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_groups_of_lanes_take_rows_whose_banks_they_share_least(device):
    """Where copies are asynchronous, 16-bit rows and float32 rows of up to 600 bytes take the fewest
    lanes a row (of 4, 8, 16) whose lanes get staged_group_min_words words each, whose tile of a row
    a group fits staged_group_tile_bytes and whose warp reads no bank more than twice at once; other
    rows, and rows of up to staged_short_row_bytes, keep their tiers, but for those of more than
    staged_group_short_min_row_bytes that are an even number of words, and padded ones (16-bit
    rows past exact_group_max_bytes: float32 rows of 64 columns, and smaller 16-bit inputs, take the
    register tier's groups, exact_group_min_lanes)."""
    def chosen(dtype: str, cols: int) -> tuple[str, int | None]:
        p = plan_large(RowProblem(dtype, "softmax", 1 << 20, cols), device)
        return p.tier, p.notes.get("lanes")

    if not has_async_copy(device):
        assert all(chosen("float16", c)[0] != "staged_group" for c in (140, 288, 300, 513, 1001))
        return
    assert chosen("float16", 140) == ("staged_group", 4)  # 70 words: 17.5 a lane
    assert chosen("float16", 300) == ("staged_group", 4)  # 4 lanes: 2 ways
    assert chosen("bfloat16", 288) == ("staged_group", 8)  # 4 lanes: 4 ways; 8 lanes: 2
    assert chosen("float16", 400) == ("staged_group", 8)  # 4 lanes: 32 rows of 800 bytes a tile, over 24 KiB
    assert chosen("float16", 700) == ("staged_group", 8)  # 8 lanes: 4 ways in order, 1 interleaved
    assert chosen("float16", 1500) == ("staged_group", 16)  # 8 rows of 3000 bytes
    assert chosen("float16", 320) == ("staged_group", 16)  # 160 words: 4 and 8 lanes all on the same banks
    assert chosen("float16", 160) == ("staged_group", 8)  # 80 words: 4 lanes 4 ways
    # up to 256 bytes a thread a row, but rows of 193-256 bytes that are an even number of words
    assert {chosen("float16", c)[0] for c in (90, 92, 96, 98, 126)} == {"staged"}  # 180-192 bytes; 49, 63 words
    even_words = (("float16", 100), ("bfloat16", 120), ("float32", 52), ("float32", 62))  # 50, 60, 52, 62 words
    assert {chosen(dtype, c) for dtype, c in even_words} == {("staged_group", 4)}
    assert {chosen("float32", c)[0] for c in (40, 48, 61)} == {"staged"}  # 160 bytes; 4 lanes 4 ways; 61 words
    assert chosen("float16", 255) == ("staged_group", 4)  # 4 lanes: 8 ways in order, 2 interleaved
    assert plan_large(RowProblem("float16", "softmax", 1 << 20, 255), device).notes["interleave"]
    assert not plan_large(RowProblem("float16", "softmax", 1 << 20, 300), device).notes["interleave"]  # 2 ways in both
    assert plan_large(RowProblem("float16", "softmax", 1 << 20, 350), device).notes["interleave"]  # 2 ways in order, 1
    assert chosen("float16", 2048)[0] == "staged_warp"  # 8 rows of 4 KiB a tile with 16 lanes
    # rows of a power-of-two number of 16-byte slots: a slot of padding after each row in the tile
    p = plan_large(RowProblem("float16", "softmax", 1 << 20, 256), device)
    assert (p.tier, p.notes["lanes"], p.notes["row_shift"]) == ("staged_group", 4, 5)  # 32 slots
    assert p.launches[0].shared_mem >= p.notes["tile_rows"] * (256 + 8) * 2
    # row_shift, interleave, safe
    assert [a for a in p.launches[0].args if a[0] == "i32"] == [("i32", 5), ("i32", 0), ("i32", 0)]
    assert plan_large(RowProblem("float16", "softmax", 1 << 20, 300), device).notes["row_shift"] == -1
    misaligned = plan_large(RowProblem("float16", "softmax", 1 << 20, 256, x_misalign=2, y_misalign=2), device)
    assert misaligned.tier != "staged_group"  # unpadded, every group of a warp on the same banks
    # 256 bytes, padded
    assert plan_large(RowProblem("float16", "softmax", 1 << 20, 128), device).notes["row_shift"] == 4
    # within exact_group_max_bytes, and float32 rows of 64 columns at any size: the register tier's groups
    assert plan_large(RowProblem("float16", "softmax", 1 << 16, 256), device).tier == "warp"
    assert chosen("float32", 64)[0] == "warp"
    # a tile of about staged_group_bytes_per_thread a thread where that is staged_group_min_tile_bytes or
    # more, else (and padded) staged_warp_bytes_per_thread
    def tile_rows(cols: int) -> int:
        return plan_large(RowProblem("float16", "softmax", 1 << 20, cols), device).notes["tile_rows"]

    assert tile_rows(218) == 32  # 16 rows of 436 bytes for 64 a thread: 32, a row a group (14 KiB)
    assert tile_rows(140) == 64  # 32 rows (9 KiB) too small: 59 rows of 128 bytes a thread, two a group
    assert tile_rows(513) == 16  # 16 lanes: 8 rows (8 KiB) too small
    assert tile_rows(128) == 64  # padded
    # 16 lanes: 2 ways
    assert plan_large(RowProblem("float16", "softmax", 1 << 20, 512), device).notes["row_shift"] == -1
    # padded rows of up to 128 bytes stay a thread a row (1000 rows: too few blocks for the packed tier)
    assert plan_large(RowProblem("float16", "softmax", 1000, 64), device).notes.get("lanes") == 1
    assert chosen("float32", 128)[0] == "warp"  # scalar slots (scalar_rows_min_cols)
    assert chosen("float32", 100) == ("staged_group", 4)  # 100 words: each group on its own banks
    assert chosen("float32", 300)[0] != "staged_group"  # float32 rows over 600 bytes (staged_group_max_row_bytes)
    assert chosen("float64", 50)[0] != "staged_group"
    padded = plan_large(RowProblem("float16", "softmax", 1 << 20, 300, x_stride=304, y_stride=304), device)
    assert padded.tier != "staged_group"  # rows that are not one span


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_rows_of_a_few_elements_are_packed_into_vectors(device, dtype):
    vec = V.vector_widths(dtype)[1]
    for cols in (*range(1, 9), 16, 32, 64):
        for misalign in range(0, vec, cols):  # the span starts on a row boundary within its vector
            problem = RowProblem(dtype, "log_softmax", 1 << 20, cols, x_misalign=misalign, y_misalign=misalign)
            p = plan_large(problem, device)
            assert (p.tier == "packed") == (cols in V.packed_cols(dtype)), (cols, misalign, p.tier)
            if p.tier == "packed":
                assert p.launches[0].kernel == V.packed_name(dtype, "log_softmax", cols)
                assert p.notes["values_per_thread"] % cols == 0 and p.notes["values_per_thread"] % vec == 0
                # the groups pass through shared memory: a thread's values for every thread of the block
                tile = p.notes["values_per_thread"] * V.DTYPES[dtype][2] * p.launches[0].block
                assert tile <= device.shared_mem_per_block
                # two tiles (the next round's copies in flight) only where copies are asynchronous,
                # for rows whose registers leave few blocks a multiprocessor (5 and 7 16-bit columns)
                per_thread = p.notes["values_per_thread"]
                stages = 2 if has_async_copy(device) and per_thread > 32 else 1
                assert p.notes["stages"] == stages and p.launches[0].args[-1] == (I32, stages)
                assert p.launches[0].shared_mem == stages * tile
    for cols in V.packed_cols(dtype):
        # a row would straddle two threads' vectors: a misalignment that is not a multiple of the
        # row, padded rows, or input and output misaligned differently
        off_row = plan_large(RowProblem(dtype, "softmax", 1000, cols, x_misalign=1, y_misalign=1), device)
        padded = plan_large(RowProblem(dtype, "softmax", 1000, cols, x_stride=cols + 1, y_stride=cols + 1), device)
        mixed = plan_large(RowProblem(dtype, "softmax", 1000, cols, x_misalign=1, y_misalign=0), device)
        assert "packed" not in {padded.tier, mixed.tier} and (off_row.tier == "packed") == (cols == 1)
        # a tile larger than the block's shared memory: another tier
        small = replace(device, shared_mem_per_block=16 * 1024, shared_mem_per_block_optin=16 * 1024)
        packed = plan_large(RowProblem(dtype, "softmax", 1 << 22, cols), device)
        tile = packed.launches[0].shared_mem // packed.notes["stages"]
        assert (plan_large(RowProblem(dtype, "softmax", 1 << 22, cols), small).tier == "packed") == (tile <= 16 * 1024)
        # groups of more than 32 values (16-bit 5, 7, 9-14, 20 and 64 columns) only on a grid of at
        # least half a block a multiprocessor: 1000 rows are a few blocks, which the staged tier
        # spreads wider (the small-input rules off: test_small_inputs_...)
        few = plan_large(RowProblem(dtype, "softmax", 1000, cols), device)
        assert (few.tier == "packed") == (packed.notes["values_per_thread"] <= 32), (cols, few.tier)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wide_packed_groups_take_small_blocks_from_enough_groups_on(device, dtype):
    """16-bit rows of 9, 11 and 13 columns (groups of 72-104 values, widened a row at a time) are
    packed in blocks of packed_wide_group_threads from packed_wide_min_groups_per_sm groups a
    multiprocessor on, and staged below; groups of up to 64 values keep packed_threads."""
    vec = V.vector_widths(dtype)[1]
    least = T.packed_wide_min_groups_per_sm * device.multiprocessors
    for cols in (9, 11, 13):
        per_group = lcm(cols, vec)
        assert per_group > T.packed_widened_most and cols in V.packed_cols(dtype)
        enough = plan_large(RowProblem(dtype, "softmax", least * per_group // cols, cols), device)
        fewer = plan_large(RowProblem(dtype, "softmax", least * per_group // cols - per_group // cols, cols), device)
        assert (enough.tier, fewer.tier) == ("packed", "staged"), (cols, enough.tier, fewer.tier)
        assert enough.launches[0].block == T.packed_wide_group_threads
        assert enough.notes["values_per_thread"] == per_group
    for cols in (5, 7, 14, 20, 64):  # 40-64 values
        p = plan_large(RowProblem(dtype, "softmax", 1 << 22, cols), device)
        assert p.tier == "packed" and p.launches[0].block == T.packed_threads, (cols, p)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_small_packed_inputs_take_one_round_a_block_and_rows_the_register_tier_reads_poorly(device):
    """Under the small-input rules a packed grid short of small_input_blocks_per_sm blocks a
    multiprocessor gives each block one round (packed_rounds where the grid is large enough), and
    the rows those rules keep off the staged tiers are packed as the register tier would take them."""
    wanted = ceil(T.small_input_blocks_per_sm * device.multiprocessors)
    for cols, nbytes in ((5, 3 << 20), (7, 8 << 20), (20, 256 << 10), (20, 1 << 20), (5, 256 << 20)):
        rows = nbytes // (2 * cols)
        p = plan(RowProblem("float16", "softmax", rows, cols), device)
        assert p.tier == "packed", (cols, nbytes, p.tier)
        (launch,) = p.launches
        groups = ceil(rows * cols / p.notes["values_per_thread"])
        per_round = launch.block * (p.notes["values_per_thread"] // lcm(cols, 8))
        rounds = ceil(groups / (launch.grid * per_round))
        two = p.notes["stages"] == 2 and ceil(groups / (T.packed_threads * T.packed_rounds)) >= wanted
        assert rounds == (T.packed_rounds if two else 1), (cols, nbytes, launch, rounds)
    # rows the register tier would take as scalars (16-bit 18 and 28 columns) are packed on any grid,
    # rows it takes as partial vectors (36 and 44) from packed_unstaged_partial_min_groups_per_sm
    # groups a multiprocessor on, rows of whole vectors (56, 64) under the floors of larger inputs
    for cols in (18, 28):
        assert plan(RowProblem("float16", "softmax", 100, cols), device).tier == "packed", cols
    least = T.packed_unstaged_partial_min_groups_per_sm * device.multiprocessors
    for cols in (36, 44):
        per_group = lcm(cols, 8)
        rows = least * per_group // cols
        assert rows * cols * 2 < T.small_input_unstaged_bytes
        enough = plan(RowProblem("float16", "softmax", rows, cols), device)
        fewer = plan(RowProblem("float16", "softmax", rows - per_group // cols, cols), device)
        assert (enough.tier, fewer.tier) == ("packed", "warp"), (cols, enough.tier, fewer.tier)
    for cols in (56, 64):  # 100 groups a multiprocessor: over the partial vectors' least, under the floor
        rows = 100 * device.multiprocessors * lcm(cols, 8) // cols
        assert least < 100 * device.multiprocessors
        assert 100 < T.packed_large_groups_min_blocks_per_sm * T.packed_threads  # one round a block
        assert plan(RowProblem("float16", "softmax", rows, cols), device).tier == "warp", cols
    # 20 and 18 columns: the small-input rules off, such a grid is left to the staged or register tier
    assert plan_large(RowProblem("float16", "softmax", (256 << 10) // 40, 20), device).tier != "packed"
    assert plan_large(RowProblem("float16", "softmax", 100, 18), device).tier != "packed"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_tiers_of_short_lived_blocks_launch_every_block_and_cooperative_ones_one_wave(device):
    from portable_softmax.planner import one_wave

    for cols in (3, 100, 1000, 3000, 100000):
        p = plan_large(RowProblem("float32", "softmax", 1 << 16, cols), device)
        for launch in p.launches:
            cut = one_wave(launch, 2, device.multiprocessors)
            if launch.cooperative:
                assert cut <= 2 * device.multiprocessors and cut % launch.min_grid == 0, p.tier
            elif not launch.cut_to_one_wave:
                assert cut == launch.grid >= min(1 << 16, device.max_grid_x) // 1024, p.tier
            else:
                assert cut == min(launch.grid, 2 * device.multiprocessors), p.tier


def test_warp_64_holds_twice_the_row_of_warp_32():
    cols = 4096  # too long for one 32-lane warp's registers, fits 64 lanes
    assert plan_large(RowProblem("float32", "softmax", 1000, cols), PROFILES["rdna3"]).tier == "block"
    assert plan_large(RowProblem("float32", "softmax", 1000, cols), PROFILES["mi300x"]).tier == "warp"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_16_bit_lanes_hold_a_capped_number_of_values_and_block_tier_threads_stream_8_slots(device):
    warp = device.warp_size

    def rows_apart(dtype: str, cols: int) -> RowProblem:
        # Rows 128 bytes apart (each starting as aligned as a contiguous row would) are not one
        # span, so the staged tiers leave them to the register and block tiers.
        return RowProblem(dtype, "softmax", 4096, cols, x_stride=cols + 64, y_stride=cols + 64)

    # 16 values a lane where the block tier's cache fills are asynchronous (rows on 4-byte boundaries)
    cap = 16 if has_async_copy(device) else 32
    for cols in (1000, 1500, 2048, 3000, 4096, 8192):
        p = plan_large(rows_apart("bfloat16", cols), device)
        slots = p.notes["slots"]
        if p.tier == "warp":
            kernel = p.launches[0].kernel
            lane_slots = int(kernel.split("_s")[-1].split("_")[0])
            assert lane_slots * p.notes["vec"] <= cap, kernel
        else:
            assert p.tier == "block", (cols, p.tier)
            assert slots > warp * cap // p.notes["vec"]  # no register variant holds it at `cap` values a lane
            threads = p.launches[0].block
            assert threads % warp == 0 and threads == max(warp, -(-slots // 8 // warp) * warp), (cols, threads)
    # float32 lanes keep 64 values: 2048 columns stay in one 32-lane warp's registers
    if warp == 32:
        assert plan_large(rows_apart("float32", 2048), device).tier == "warp"
        assert plan_large(rows_apart("bfloat16", 2048), device).tier == "block"
    # rows of an odd number of 16-bit values keep 32 values a lane everywhere
    assert plan_large(rows_apart("float16", 513), device).tier == "warp"
    assert (plan_large(rows_apart("float16", 600), device).tier == "block") == (cap == 16 and warp == 32)


def test_misaligned_input_and_output_fall_back_to_scalar_slots():
    aligned = plan_large(RowProblem("float32", "softmax", 64, 1000, x_misalign=1, y_misalign=1), PROFILES["h100"])
    mixed = plan_large(RowProblem("float32", "softmax", 64, 1000, x_misalign=1, y_misalign=0), PROFILES["h100"])
    assert aligned.notes["vec"] == 4 and mixed.notes["vec"] == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fewer_rows_than_multiprocessors_hold_chunk_slots_where_their_chunks_fill_the_grid(dtype):
    """Fewer rows than multiprocessors take the on-chip split with slots in registers where the
    held form's chunks, as long as it makes them, are at least the blocks it keeps resident (the
    element sizes of split_registers_full_grid); fewer rows keep whole chunks in shared memory, cut
    small to spread over the device."""
    device = PROFILES["h100"]
    itemsize = V.DTYPES[dtype][2]
    held_slots, blocks = T.split_registers[itemsize]
    cols = 262144
    # the held form's chunks, for any dtype
    held_chunks = plan_large(RowProblem(dtype, "softmax", 128, cols), device,
                             split_registers_full_grid=(2, 4)).notes["chunks"]
    for rows in (8, 41, 42, 128):
        p = plan_large(RowProblem(dtype, "softmax", rows, cols), device)
        assert p.tier == "cached" and rows < device.multiprocessors
        held = "held_slots" in p.notes
        fills = rows * held_chunks >= blocks * device.multiprocessors
        assert held == (itemsize in T.split_registers_full_grid and fills), (rows, p)
        if held:
            assert p.launches[0].kernel == V.split_cached_registers_name(dtype, "softmax", 32, p.notes["vec"],
                                                                          held_slots, blocks)
    # float32 rows of 262144 columns: 16 chunks of the held form each, so 42 rows fill 5 x 132 blocks
    assert ("held_slots" in plan_large(RowProblem("float32", "softmax", 42, cols), device).notes)
    assert ("held_slots" not in plan_large(RowProblem("float32", "softmax", 41, cols), device).notes)
    # 16-bit rows too: 128 rows of 262144 columns make 10 held chunks each, 1280 >= 660
    assert ("held_slots" in plan_large(RowProblem("bfloat16", "softmax", 128, cols), device).notes)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_on_chip_split_rounds_take_as_many_rows_each(device):
    """Rows of split_even_rounds_itemsizes that take more than one and at most split_even_rounds_most
    rounds of the on-chip split's grid are cut into more chunks, so that every round takes as many
    rows in at most as many blocks; every other plan stays as it was."""
    evened = 0
    for dtype, cols, mib in itertools.product(("float32", "bfloat16"), (50257, 65536, 100000, 131072, 262144),
                                              (5, 6, 7, 24, 40, 48, 56, 64, 96, 128)):
        itemsize = V.DTYPES[dtype][2]
        rows = (mib << 20) // (cols * itemsize)
        problem = RowProblem(dtype, "softmax", rows, cols)
        before, after = _plans_with_and_without(large_input_tuning(device), "split_even_rounds_most", problem, device)
        if before.tier != "cached":
            assert after == before
            continue
        (first,), (second,) = before.launches, after.launches
        rounds = rows / (first.grid // before.notes["chunks"])
        if not (itemsize in T.split_even_rounds_itemsizes and 1 < rounds <= T.split_even_rounds_most):
            assert after == before, (dtype, rows, cols, rounds)
            continue
        even = ceil(rows / ceil(rounds))
        if after == before:  # the grid holds no more chunks of `even` rows
            assert first.grid // even <= before.notes["chunks"]
            continue
        evened += 1
        assert (second.kernel, second.block) == (first.kernel, first.block)
        assert after.notes["chunks"] > before.notes["chunks"] and second.grid == even * after.notes["chunks"]
        assert second.grid <= first.grid and second.shared_mem < first.shared_mem
        assert after.notes["chunks"] * after.notes["chunk_slots"] >= after.notes["slots"]
        assert ceil(rows / (second.grid // after.notes["chunks"])) == ceil(rounds)  # as many rounds
    assert evened >= 5, evened
    if device is PROFILES["h100"]:
        # float32 256x65536 (64 MiB): 165 rows of 4 chunks a round (1.55 rounds) -> 128 rows of 5
        p = plan_large(RowProblem("float32", "softmax", 256, 65536), device)
        assert (p.launches[0].grid, p.notes["chunks"]) == (640, 5)
        # 333x50257: 2.02 rounds, as it was
        p = plan_large(RowProblem("float32", "softmax", 333, 50257), device)
        assert (p.launches[0].grid, p.notes["chunks"]) == (660, 4)
        # 16-bit rows as they were: bfloat16 160x131072, 132 rows of 5 chunks a round (1.21 rounds)
        p = plan_large(RowProblem("bfloat16", "softmax", 160, 131072), device)
        assert (p.launches[0].grid, p.notes["chunks"]) == (660, 5)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_rows_past_one_held_chunk_a_multiprocessor_take_several_on_chip(device):
    """Rows longer than one held chunk on every multiprocessor, which the two passes took, stay on
    chip (split_registers_spanning_rows): several chunks a multiprocessor, each within its share of
    the multiprocessor's shared memory (so that the launch bound's blocks are all resident), the
    grid filled with whole rows, two or more a round; rows too long for that still take the two
    passes, and no other plan changes."""
    spanning = 0
    for dtype, rows, cols in itertools.product(("float32", "bfloat16", "float16", "float64"), (3, 5, 16, 32, 100),
                                               (1_000_000, 2_600_003, 4_194_304, 6_000_000, 16_777_216, 10**8)):
        problem = RowProblem(dtype, "softmax", rows, cols)
        before, after = _plans_with_and_without(large_input_tuning(device), "split_registers_spanning_rows", problem,
                                                device)
        if after == before:
            continue
        spanning += 1
        assert (before.tier, after.tier) == ("split", "cached"), (dtype, rows, cols)
        (step,) = after.launches
        held_slots, per_multiprocessor = T.split_registers[V.DTYPES[dtype][2]]
        chunks = after.notes["chunks"]
        assert "held_slots" in after.notes and chunks > device.multiprocessors
        static = 2 * (1024 // device.warp_size) * 4 + 1024  # the block reduction's scratch, the runtime's reserve
        assert per_multiprocessor * (step.shared_mem + static) <= device.shared_mem_per_multiprocessor
        assert step.grid % chunks == 0 and step.grid <= per_multiprocessor * device.multiprocessors
        assert step.grid // chunks == min(rows, per_multiprocessor * device.multiprocessors // chunks) >= 2
        assert chunks * after.notes["chunk_slots"] >= after.notes["slots"]
    if planner.has_async_copy(device):
        assert spanning >= 10, spanning
        # float32 16x4194304 (16 MiB rows): 330 chunks, two rows a round of 5 x 132 blocks
        p = plan_large(RowProblem("float32", "softmax", 16, 4_194_304), device)
        assert (p.tier, p.launches[0].grid, p.notes["chunks"]) == ("cached", 660, 330)
        assert plan_large(RowProblem("float32", "softmax", 1, 10**8), device).tier == "split"
        # rows fewer than multiprocessors too: bfloat16 4x4194304, the four rows in one round
        p = plan_large(RowProblem("bfloat16", "softmax", 4, 4_194_304), device)
        assert (p.tier, p.launches[0].grid, p.notes["chunks"]) == ("cached", 660, 165)
        # float32 4x6000000: one row a round; it ran as fast in the two passes
        assert plan_large(RowProblem("float32", "softmax", 4, 6_000_000), device).tier == "split"
    else:
        assert spanning == 0


def test_the_split_scratch_needs_no_fill_and_the_on_chip_split_leaves_its_own_zero():
    """The two-pass split writes every partial before reading it; the on-chip tiers count and
    publish in scratch they find zero and leave zero (Plan.scratch_zeroed)."""
    device = PROFILES["h100"]
    split = plan_large(RowProblem("float32", "softmax", 1, 10**8), device)
    cached = plan_large(RowProblem("float32", "softmax", 8, 131072), device)
    assert split.tier == "split" and split.scratch and not split.scratch_zeroed
    assert cached.tier == "cached" and cached.scratch and cached.scratch_zeroed


def test_few_long_rows_are_split_across_blocks():
    p = plan_large(RowProblem("float32", "softmax", 1, 10**8), PROFILES["h100"])
    assert p.tier == "split" and p.notes["chunks"] >= 2 * 132 // 1


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_split_rows_are_cut_into_chunks_on_aligned_boundaries(device, dtype):
    itemsize = V.DTYPES[dtype][2]
    tiers = set()
    for rows, cols in ((1, 10**8), (1, 3 * 10**7 + 17), (7, 1 << 20), (512, 262144), (640, 200000),
                       (1024, 128256), (1342, 100000), (4096, 65536), (2097, 32000), (1, 262143)):
        p = plan_large(RowProblem(dtype, "softmax", rows, cols), device)
        if "chunk_slots" not in p.notes:
            continue
        tiers.add(p.tier)
        chunk_bytes = p.notes["chunk_slots"] * p.notes["vec"] * itemsize
        assert chunk_bytes % T.chunk_align_bytes == 0, (rows, cols, p.tier, p.notes)
        assert p.notes["slots"] <= p.notes["chunks"] * p.notes["chunk_slots"]
        assert (p.notes["chunks"] - 1) * p.notes["chunk_slots"] < p.notes["slots"], "a split has no empty chunk"
    assert tiers == {"split", "cached"}


def test_strided_plan_and_errors():
    p = plan_large(StridedProblem("float32", "softmax", 8, 100, 16, (1600, 16, 1), (1600, 16, 1)), PROFILES["mi300x"])
    assert p.tier == "strided" and p.notes["inner_tile"] == 16 and p.launches[0].block == 512
    with pytest.raises(PlanError, match="warp size 16"):
        plan_large(RowProblem("float32", "softmax", 1, 1), DeviceProfile("odd", "x", "y", 16, 1))
    with pytest.raises(PlanError, match="supported: float32"):
        plan_large(RowProblem("int8", "softmax", 1, 1), PROFILES["h100"])


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_short_non_last_axes_take_a_thread_per_inner_vector(device, dtype):
    """axis=0 of 2 x 2**25 up to 64 rows: a thread per 16 bytes of inner positions, in the widest
    vectors to which every row starts aligned (narrower ones several a thread), and 16-byte vectors
    two a thread for 3-4 rows, four for 2; 256 threads a block; up to 512 rows over 32 inner
    positions or more (300 here); longer axes and 65 rows or more over fewer positions go back to
    the column groups of the strided tier."""
    widest = V.vector_widths(dtype)[1]
    for cols, wide_lines in ((2, 4), (3, 2), (4, 2), (5, 1), (9, 1), (T.strided_thread_short_cols, 1)):
        inner = (1 << 26) // cols // 16 * 16
        p = plan_large(StridedProblem(dtype, "softmax", 1, cols, inner, (0, inner, 1), (0, inner, 1)), device)
        assert p.tier == "strided_thread" and (p.notes["vec"], p.notes["lines"]) == (widest, wide_lines)
        (launch,) = p.launches
        assert launch.kernel == V.strided_thread_name(dtype, "softmax", widest, wide_lines)
        assert (widest, wide_lines) in V.strided_thread_variants(dtype)
        assert launch.block == 256 and not launch.cooperative and launch.shared_mem == 0
        assert launch.grid == -(-inner // (widest * 256 * wide_lines))
        for extra, vec in ((1, 1), (2, 2)):
            n = inner + extra
            odd = plan_large(StridedProblem(dtype, "softmax", 1, cols, n, (0, n, 1), (0, n, 1)), device)
            lines = widest // vec if vec < widest else wide_lines
            assert odd.tier == "strided_thread" and (odd.notes["vec"], odd.notes["lines"]) == (vec, lines)
            assert odd.launches[0].kernel == V.strided_thread_name(dtype, "softmax", vec, lines)
            assert odd.launches[0].grid == -(-n // (vec * 256 * lines))
        misaligned = plan_large(StridedProblem(dtype, "softmax", 1, cols, inner, (0, inner, 1), (0, inner, 1),
                                         x_misalign=1), device)
        assert misaligned.notes["vec"] == 1
    longer = plan_large(StridedProblem(dtype, "softmax", 4, 300, 40, (12000, 40, 1), (12000, 40, 1)), device)
    assert longer.tier == "strided_thread"
    for rows, inner in ((T.strided_thread_max_cols + 1, 8), (T.strided_thread_short_cols + 1, 16)):
        longer = plan_large(StridedProblem(dtype, "softmax", 64, rows, inner, (rows * inner, inner, 1),
                                     (rows * inner, inner, 1)), device)
        assert longer.tier == "strided", (rows, inner)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_long_non_last_axes_are_cached_on_chip_across_resident_blocks(device, dtype):
    """axis=0 of 8192 x 8192: the reduced axis of every tile is split into chunks that fit shared
    memory beside the (m, d) scratch, on blocks that can all be resident; short axes stay on the
    strided tier (which reads twice)."""
    itemsize = V.DTYPES[dtype][2]
    compute = 8 if dtype == "float64" else 4
    short = plan_large(StridedProblem(dtype, "softmax", 8, 80, 16, (1280, 16, 1), (1280, 16, 1)), device)
    assert short.tier == "strided"
    p = plan_large(StridedProblem(dtype, "log_softmax", 1, 8192, 8192, (0, 8192, 1), (0, 8192, 1)), device)
    if p.tier == "strided":  # float64 scratch and chunks too big for 64 KiB of shared memory
        assert device.shared_mem_per_multiprocessor <= 64 * 1024
        return
    assert p.tier == "strided_cached"
    (launch,) = p.launches
    tile, vec, chunks, chunk_cols = (p.notes[k] for k in ("inner_tile", "vec", "chunks", "chunk_cols"))
    assert vec == (16 // itemsize if itemsize >= 4 else 4), "aligned rows: 16-byte vectors (8 bytes of 16-bit)"
    assert tile * vec * itemsize == min(128, device.warp_size * vec * itemsize), "tile rows of a cache line"
    assert launch.block % tile == 0 and launch.block <= device.max_threads_per_block
    assert chunks * chunk_cols >= 8192 > (chunks - 1) * chunk_cols
    assert launch.shared_mem == chunk_cols * tile * vec * itemsize
    assert launch.shared_mem + 2 * launch.block * vec * compute + 1024 <= device.shared_mem_per_multiprocessor // 4
    assert launch.cooperative and launch.min_grid == chunks <= device.multiprocessors
    assert launch.grid % chunks == 0 and launch.kernel == V.strided_cached_name(dtype, "log_softmax", vec)
    tiles = 8192 // (tile * vec)
    assert dict(p.scratch) == {"partials": 2 * tiles * chunks * tile * vec * compute, "arrivals": 4 * tiles}
    # rows that do not all start vector-aligned take one position a thread
    odd = plan_large(StridedProblem(dtype, "softmax", 1, 8192, 8191, (0, 8191, 1), (0, 8191, 1)), device)
    assert odd.tier == "strided_cached" and odd.notes["vec"] == 1
    shifted = plan_large(StridedProblem(dtype, "softmax", 1, 8192, 8192, (0, 8192, 1), (0, 8192, 1), x_misalign=1),
                         device)
    assert shifted.notes["vec"] == 1


def test_long_rows_take_blocks_that_wait_on_no_other_where_copies_are_asynchronous():
    a100 = DeviceProfile("NVIDIA A100", "nvidia", "sm_80", 32, 108, 1024, 48 * 1024, 163 * 1024,
                         shared_mem_per_multiprocessor=164 * 1024)
    assert has_async_copy(a100) and not has_async_copy(PROFILES["mi300x"])
    assert plan_large(RowProblem("bfloat16", "softmax", 4096, 100000), a100).tier == "block_registers"
    assert plan_large(RowProblem("bfloat16", "softmax", 4096, 80000), PROFILES["h100"]).tier == "block_registers"
    assert plan_large(RowProblem("bfloat16", "softmax", 8, 80000), PROFILES["h100"]).tier == "cached"
    assert plan_large(RowProblem("float32", "softmax", 4096, 65536), PROFILES["h100"]).tier == "block_registers"


def test_rows_one_block_holds_go_alone_on_a_multiprocessor_where_copies_are_asynchronous():
    h100 = PROFILES["h100"]
    for dtype, cols in (("float32", 45300), ("float32", 50257), ("bfloat16", 90600), ("bfloat16", 100000),
                        ("float16", 113000)):
        p = plan_large(RowProblem(dtype, "softmax", 4096, cols), h100)
        (launch,) = p.launches
        itemsize = V.DTYPES[dtype][2]
        assert p.tier == "block" and launch.grid == 4096 and launch.block == T.block_tier_max_threads
        # more than half a multiprocessor's shared memory: one such block a multiprocessor
        assert h100.shared_mem_per_multiprocessor // 2 < launch.shared_mem <= h100.shared_mem_per_block_optin
        assert launch.shared_mem >= cols * itemsize
    # few rows, and rows past one block, are split
    assert plan_large(RowProblem("float32", "softmax", 8, 50257), h100).tier == "cached"
    assert plan_large(RowProblem("float32", "softmax", 4096, 59000), h100).tier == "block_registers"
    # loads through registers (AMD) keep the split
    assert plan_large(RowProblem("float32", "softmax", 4096, 12000), PROFILES["mi300x"]).tier == "cached"


def test_rows_a_block_alone_takes_need_waves_of_blocks_else_split():
    """A block alone on its multiprocessor (the block tier's whole-multiprocessor rows, and rows in
    registers and shared memory) only where the rows make block_alone_min_waves waves of them:
    fewer rows go to the on-chip split, spread over every multiprocessor."""
    h100 = PROFILES["h100"]
    waves = T.block_alone_min_waves * h100.multiprocessors
    for dtype, cols, alone in (("float32", 50257, "block"), ("bfloat16", 100000, "block"),
                               ("float32", 80000, "block_registers"), ("bfloat16", 160000, "block_registers")):
        assert plan_large(RowProblem(dtype, "softmax", waves, cols), h100).tier == alone, (dtype, cols)
        for rows in (waves - 1, 2 * h100.multiprocessors, h100.multiprocessors + 1):
            p = plan_large(RowProblem(dtype, "softmax", rows, cols), h100)
            assert p.tier == "cached" and "held_slots" in p.notes, (dtype, cols, rows, p.tier)
    # rows that two blocks a multiprocessor hold keep their plans at any number of waves
    assert plan_large(RowProblem("float32", "softmax", 2 * h100.multiprocessors, 40000), h100).tier == "block_registers"


def test_rows_two_blocks_hold_with_their_first_slots_in_registers_pair_up():
    """Rows past half a multiprocessor's shared memory that two blocks of half the launch bound's
    threads hold, each with its first slots in registers: block_registers at 512 threads, two a
    multiprocessor; rows one such block a multiprocessor holds keep a block alone."""
    h100 = PROFILES["h100"]
    threads = T.row_registers_threads // 2
    capacity = T.row_register_slots * threads
    for dtype, cols in (("float32", 29000), ("float32", 32000), ("float32", 40000), ("float32", 45000),
                        ("bfloat16", 58000), ("bfloat16", 65536), ("float16", 80000), ("float16", 90000)):
        p = plan_large(RowProblem(dtype, "log_softmax", 2000, cols), h100)
        (launch,) = p.launches
        vec = 16 // V.DTYPES[dtype][2]
        assert p.tier == "block_registers" and launch.block == threads and launch.grid == 2000, (dtype, cols, p)
        assert p.notes["held_slots"] == capacity and launch.shared_mem == (cols // vec - capacity) * 16
        assert launch.kernel == V.block_registers_name(dtype, "log_softmax", 32, vec)
        assert 2 * launch.shared_mem < h100.shared_mem_per_multiprocessor
    # half a multiprocessor's shared memory holds the row: the block tier, two blocks a multiprocessor
    assert plan_large(RowProblem("float32", "softmax", 2000, 28000), h100).tier == "block"
    # one such block a multiprocessor: a block alone (shared memory), or the launch bound's threads
    assert plan_large(RowProblem("float32", "softmax", 2000, 45300), h100).tier == "block"
    alone = plan_large(RowProblem("float32", "softmax", 2000, 65536), h100)
    assert alone.tier == "block_registers" and alone.launches[0].block == T.row_registers_threads
    # few rows are spread over more blocks; loads through registers (AMD) keep the split
    assert plan_large(RowProblem("float32", "softmax", 100, 32000), h100).tier == "cached"
    assert plan_large(RowProblem("float32", "softmax", 2000, 32000), PROFILES["mi300x"]).tier == "cached"
    assert plan_large(RowProblem("float32", "softmax", 2000, 32000), h100, row_registers_paired=False).tier == "block"


def test_rows_past_a_block_and_within_its_registers_go_alone_on_a_multiprocessor():
    """Rows that one block's shared memory cannot hold but its registers and shared memory can:
    a block a row where copies are asynchronous; few rows, longer rows, float64 and AMD split."""
    h100 = PROFILES["h100"]
    capacity = T.row_register_slots * T.row_registers_threads  # slots in registers
    for dtype, cols in (("float32", 65536), ("float32", 80000), ("bfloat16", 128256), ("float16", 131072),
                        ("bfloat16", 163840)):
        p = plan_large(RowProblem(dtype, "softmax", 1000, cols), h100)
        (launch,) = p.launches
        vec = 16 // V.DTYPES[dtype][2]
        assert p.tier == "block_registers" and launch.grid == 1000 and p.notes["held_slots"] == capacity
        assert launch.kernel == V.block_registers_name(dtype, "softmax", 32, vec)
        assert launch.shared_mem == (cols // vec - capacity) * 16
    # past registers and shared memory together: the on-chip split
    assert plan_large(RowProblem("float32", "softmax", 1000, 131072), h100).tier == "cached"
    assert plan_large(RowProblem("bfloat16", "softmax", 1000, 262144), h100).tier == "cached"
    assert plan_large(RowProblem("float32", "softmax", 8, 65536), h100).tier == "cached"  # few rows: spread wider
    assert plan_large(RowProblem("float64", "softmax", 1000, 32768), h100).tier == "cached"  # not built for float64
    assert plan_large(RowProblem("float32", "softmax", 1000, 65536), PROFILES["mi300x"]).tier == "cached"


def test_empty_problems_launch_nothing():
    assert plan_large(RowProblem("float32", "softmax", 0, 5), PROFILES["h100"]).launches == ()


@pytest.mark.parametrize(
    "shape, strides, axis, expected",
    [
        ((4, 5), (5, 1), 1, Rows(4, 5, 5)),
        ((4, 5), (8, 1), 1, Rows(4, 5, 8)),
        ((4, 5), (5, 1), 0, Strided(1, 4, 5, (0, 5, 1))),
        ((2, 3, 4), (12, 4, 1), 1, Strided(2, 3, 4, (12, 4, 1))),
        ((2, 3, 4), (12, 4, 1), 2, Rows(6, 4, 4)),
        ((2, 3, 4), (24, 8, 1), 2, Rows(6, 4, 8)),
        ((2, 3, 4), (40, 8, 1), 2, None),  # outer dims do not collapse
        ((3, 1), (1, 1), 0, Rows(1, 3, 3)),  # trailing size-1 dims are no inner axis
        ((5,), (-1,), 0, Strided(1, 5, 1, (0, -1, 0))),
    ],
)
def test_layout_description(shape, strides, axis, expected):
    assert describe(shape, strides, axis) == expected


def test_generated_entry_points_match_the_catalogue(tmp_path):
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src_cuda"
    for written in V.write_sources(tmp_path):
        committed = src / written.name
        assert committed.read_text() == written.read_text(), (
            f"{committed} is stale: run `python -m portable_softmax._variants src_cuda`"
        )


def test_block_tier_rows_fewer_than_multiprocessors_take_more_threads():
    """A small input's call waits on one row's latency: with fewer rows than multiprocessors a block
    takes block_tier_few_rows_slots_per_thread slots a thread, else block_tier_slots_per_thread."""
    h100 = PROFILES["h100"]
    few = plan_large(RowProblem("float32", "softmax", 32, 4096), h100)
    many = plan_large(RowProblem("float32", "softmax", 200, 4096), h100)
    assert (few.tier, many.tier) == ("block", "block")
    assert few.launches[0].block == 1024 // T.block_tier_few_rows_slots_per_thread  # 1024 slots of 4 values
    assert many.launches[0].block == 1024 // T.block_tier_slots_per_thread


SMALL_INPUT_COLS = (1, 4, 5, 7, 13, 16, 32, 64, 100, 200, 513, 1000, 3000, 8192)
STAGED_TIERS = ("staged", "staged_group", "staged_warp")


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_small_inputs_spread_over_the_multiprocessors(device, dtype):
    """Under the small-input rules, rows of 16 or more columns under small_input_unstaged_bytes, and
    up to small_input_group_bytes those a lane group of fewer lanes than a warp holds in one 16-byte
    slot a lane, skip the staged tiers; inputs whose grid would fall short of
    small_input_blocks_per_sm blocks a multiprocessor take smaller tiles or blocks (never fewer
    blocks), but for the block tier's, which under small_input_block_bytes (by element size,
    small_input_block_bytes_by_itemsize) take the warps of
    _small_input_block_warps; the rest plan exactly as without the rules. (The few-tiles rule that
    extends them is off here: test_few_staged_tiles_give_way.)"""
    itemsize = V.DTYPES[dtype][2]
    wanted = ceil(T.small_input_blocks_per_sm * device.multiprocessors)
    limit = T.small_input_unstaged_bytes
    block_limit = T.small_input_block_bytes_by_itemsize.get(
        itemsize, T.small_input_block_bytes)
    spread = 0
    sizes = (64 << 10, 1 << 20, limit - (1 << 20), limit, 12 << 20, 64 << 20)
    for cols, nbytes in itertools.product(SMALL_INPUT_COLS, sizes):
        rows = max(1, nbytes // (cols * itemsize))
        problem = RowProblem(dtype, "softmax", rows, cols)
        before = plan_large(problem, device)
        after = plan(problem, device, replace(default_tuning(device), staged_min_tiles_per_sm=0))
        what = (dtype, rows, cols, before.tier, after.tier)
        groups = 0 < planner.one_slot_lanes(default_tuning(device), problem, device.warp_size) < device.warp_size
        unstaged = cols >= 16 and (rows * cols * itemsize < limit or (
            groups and rows * cols * itemsize <= T.small_input_group_bytes))
        if unstaged:
            assert after.tier not in STAGED_TIERS, what
        elif before.launches[0].grid >= wanted and not (
                before.tier == "block" and rows * cols * itemsize < block_limit
                and rows >= device.multiprocessors):
            assert after == before, what
            continue
        if after.tier != before.tier:
            continue
        (b,), (a,) = before.launches, after.launches
        small_block = rows * cols * itemsize < block_limit
        if after.tier == "block" and small_block and rows >= device.multiprocessors:  # fewer: few_rows' threads
            warps = planner._small_input_block_warps(default_tuning(device), after.notes["slots"], device.warp_size)
            assert a.grid == b.grid and a.block == min(warps * device.warp_size, T.block_tier_max_threads), what
            continue
        assert a.grid >= b.grid and a.block <= b.block, what
        share = ceil(rows / wanted)  # rows a block of an even spread over the wanted blocks
        if after.tier in ("warp", "packed"):
            # a block a warp smaller would still take a share: the block is no larger than it needs
            per_block = ceil(rows / a.grid)
            assert a.block == device.warp_size or per_block * (a.block - device.warp_size) / a.block < share + 1, what
        if after.tier in STAGED_TIERS:
            # at most one step of the block's rows above an even share of the wanted blocks
            owners = a.block // after.notes["lanes"]
            assert after.notes["tile_rows"] < ceil(rows / wanted) + owners or a.block == device.warp_size, what
        if (a.grid, a.block) != (b.grid, b.block):
            spread += 1
            smallest = a.block == device.warp_size or (  # a warp, or a step of a group a row
                after.tier in STAGED_TIERS and after.notes["tile_rows"] == a.block // after.notes["lanes"])
            assert a.grid >= min(wanted // 2, rows) or smallest, what
    assert spread >= 4, "the rules changed too few plans to be tested"
    if device is PROFILES["h100"] and dtype == "float16":
        # 16-bit block-tier inputs under 16 MiB: 4 slots a thread (1152x4096 at 9 MiB: 512 slots, 128
        # threads); at 16 MiB the usual 8 (64 threads)
        assert plan(RowProblem("float16", "softmax", 1152, 4096), device).launches[0].block == 128
        assert plan(RowProblem("float16", "softmax", 2048, 4096), device).launches[0].block == 64


def _warp_variant_of(plan_: Plan, problem: RowProblem, device) -> V.WarpVariant:
    """The register-tier variant a plan of `problem` launches."""
    (launch,) = plan_.launches
    vec = plan_.notes["vec"]  # a changed Tuning may pick a shape that is not built: look among all
    shapes = V.warp_variants(problem.dtype, problem.op, device.warp_size, vec) + V.one_row_variants(
        problem.dtype, problem.op, device.warp_size, vec)
    return next(v for v in shapes if v.name == launch.kernel)


def _plans_with_and_without(tuning: Tuning, knob: str, problem: RowProblem, device) -> tuple[Plan, Plan]:
    """The plan of `problem` with `tuning`'s field `knob` at 0, and with `tuning`."""
    without = replace(tuning, **{knob: type(getattr(tuning, knob))(0)})
    return plan(problem, device, without), plan(problem, device, tuning)


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_rows_within_a_wave_take_one_row_a_warp(device):
    """Rows a whole warp reads several at a time go one a warp where they fit
    small_input_one_row_a_warp_waves waves of resident warps, on the shortest whole-warp variant of
    the same vectors that takes one row a step, holds the row and holds at most
    one_row_a_warp_most_slots times the slots a lane needs (of one slot taking one row a step where
    that holds it: one_row_a_warp_shallow); more rows, lane groups and rows already one a warp plan
    as without the rule."""
    tuning = replace(default_tuning(device), small_input_one_row_group_waves=0.0)  # its own test below
    waves = T.small_input_one_row_a_warp_waves
    warp, changed, shallow = device.warp_size, 0, 0
    resident = device.multiprocessors * device.max_threads_per_multiprocessor // warp
    for dtype, cols, rows in itertools.product(("float32", "float16"), (33, 64, 100, 127, 128, 200, 256, 300),
                                               (1, 8, 1000, resident, resident + 1, 4 * resident, 1 << 18)):
        problem = RowProblem(dtype, "softmax", rows, cols)
        before, after = _plans_with_and_without(tuning, "small_input_one_row_a_warp_waves", problem, device)
        what = (dtype, rows, cols, before.launches[0].kernel, after.launches[0].kernel)
        if before.tier != "warp":
            assert after == before, what
            continue
        was = _warp_variant_of(before, problem, device)
        if was.lanes != warp or was.batch == 1 or rows > waves * resident:
            assert after == before, what
            continue
        now = _warp_variant_of(after, problem, device)
        needed = before.notes["slots"]
        most = T.one_row_a_warp_most_slots * ceil(needed / warp)
        if now == was:  # no variant within the limits
            tuning = default_tuning(device)
            assert not [v for v in planner._warp_candidates(tuning, problem, device, was.vec) + V.one_row_variants(
                dtype, "softmax", warp, was.vec) if v.lanes == warp and v.batch == 1 and v.slots <= most], what
            continue
        changed += 1
        shallow += now.one_row
        assert (now.lanes, now.vec, now.batch) == (warp, was.vec, 1), what
        assert warp * now.slots >= needed and now.slots <= most, what
        # the shortest such: a one-slot variant taking one row a step where that holds the row
        assert now.slots == 1 or (warp * now.vec > needed * was.vec and not now.one_row) or warp < needed, what
        assert now.one_row == (now.slots == 1), what
        # a row a warp: the block's warps take a row each, at least as many blocks as before
        assert after.launches[0].grid >= before.launches[0].grid, what
    assert changed >= 4 and shallow >= 2, "the rule changed too few plans to be tested"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_small_inputs_lane_groups_take_one_row_a_step(device):
    """A small input's register-tier groups that take several rows a step take one instead (the
    same lanes, slots and vectors) where their warps then fit small_input_one_row_group_waves waves
    of resident warps (up to small_input_group_bytes for lane groups of fewer lanes than a warp);
    larger inputs and groups of one row a step plan as without the rule."""
    waves = T.small_input_one_row_group_waves
    warp, changed = device.warp_size, 0
    resident = device.multiprocessors * device.max_threads_per_multiprocessor // warp
    for dtype, op, cols, rows in itertools.product(
            ("float32", "float16", "bfloat16", "float64"), ("softmax", "log_softmax"), (16, 32, 48, 64, 100, 160),
            (1, 64, 1000, 8000, 30000, 70000, 140000, 1 << 20)):
        problem = RowProblem(dtype, op, rows, cols)
        before, after = _plans_with_and_without(default_tuning(device), "small_input_one_row_group_waves", problem,
                                                device)
        what = (dtype, op, rows, cols, before.launches[0].kernel, after.launches[0].kernel)
        if before.tier != "warp":
            assert after == before, what
            continue
        was = _warp_variant_of(before, problem, device)
        warps = ceil(rows * was.lanes / warp)
        nbytes = rows * cols * V.DTYPES[dtype][2]
        small = nbytes < T.small_input_unstaged_bytes or (
            nbytes <= T.small_input_group_bytes and was.lanes < warp and cols % was.vec == 0)
        if (was.batch == 1 or not small or warps > waves * resident or dtype not in V.ONE_ROW_GROUP_DTYPES
                or (was.slots, was.vec) != (1, V.vector_widths(dtype)[1])):
            assert after == before, what
            continue
        now = _warp_variant_of(after, problem, device)
        assert now.one_row and now.batch == 1, what
        assert (now.dtype, now.op, now.lanes, now.slots, now.vec) == (was.dtype, was.op, was.lanes, was.slots, was.vec)
        assert after.launches[0].grid * after.launches[0].block >= before.launches[0].grid * before.launches[0].block
        changed += 1
    assert changed >= 8, "the rule changed too few plans to be tested"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_rows_a_group_fills_take_one_row_a_step(device):
    """Rows of whole 16-byte vectors that fill a lane group of exact_group_min_lanes or more lanes, a
    slot each, take that group's one-row kernel at every size within exact_group_max_bytes (without
    the rule, their larger inputs plan otherwise); rows that fill fewer lanes, or part of a group, or
    start off a vector, or take scalar slots, and larger inputs, do not."""
    warp, tuning = device.warp_size, large_input_tuning(device)
    changed = 0
    for dtype in ("float32", "float16", "bfloat16"):
        vec = V.vector_widths(dtype)[1]
        itemsize = V.DTYPES[dtype][2]
        for lanes, nbytes in itertools.product((4, 8, 16, 32, 64), (1 << 20, 12 << 20, 24 << 20, 64 << 20, 256 << 20)):
            if lanes > warp:
                continue
            cols = lanes * vec
            problem = RowProblem(dtype, "log_softmax", nbytes // (cols * itemsize), cols)
            the_plan = plan_large(problem, device)
            scalar = planner.scalar_rows(default_tuning(device), problem, warp)
            within = nbytes <= tuning.exact_group_max_bytes.get(itemsize, nbytes)
            if lanes >= tuning.exact_group_min_lanes and not scalar and within:
                variant = _warp_variant_of(the_plan, problem, device)
                assert (variant.lanes, variant.slots, variant.vec, variant.one_row) == (lanes, 1, vec, True), (
                    dtype, cols, nbytes)
                changed += plan_large(problem, device, exact_group_min_lanes=1 << 30) != the_plan  # the rule off
            elif nbytes > tuning.small_input_group_bytes and the_plan.tier == "warp":
                # past the small-input sizes, fewer lanes, scalar slots or inputs past the largest keep
                # several rows a step
                assert _warp_variant_of(the_plan, problem, device).batch > 1 or scalar, (dtype, cols, nbytes)
            # a part of a group, or rows starting off a vector: not this rule's
            for other in (RowProblem(dtype, "softmax", problem.rows, cols - vec),
                          RowProblem(dtype, "softmax", problem.rows, cols, x_misalign=1, y_misalign=1)):
                if other.rows * other.cols * itemsize > tuning.small_input_group_bytes:
                    assert not planner.exact_group(default_tuning(device), other, warp), (dtype, other)
    assert changed >= 8, "the rule changed too few plans to be tested"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_mid_size_inputs_of_lane_group_rows_skip_the_staged_tiers(device):
    """Inputs of small_input_unstaged_bytes up to small_input_group_bytes whose rows a lane group of
    fewer lanes than a warp holds in one 16-byte slot a lane take the register tier; past that size,
    and rows of a whole warp's group, keep the staged tiers where copies are asynchronous (the
    few-tiles rule, which may move them too, off: test_few_staged_tiles_give_way)."""
    tuning = replace(default_tuning(device), staged_min_tiles_per_sm=0)
    warp = device.warp_size
    limit = tuning.small_input_group_bytes
    staged_kept = 0
    for dtype, cols in (("float32", 16), ("float32", 32), ("float32", 48), ("float16", 96), ("float32", 100),
                        ("float16", 200)):
        itemsize = V.DTYPES[dtype][2]
        lanes = planner.one_slot_lanes(default_tuning(device), RowProblem(dtype, "softmax", 2, cols), warp)
        for nbytes in (tuning.small_input_unstaged_bytes + (1 << 20), 12 << 20, limit, limit + (1 << 20)):
            problem = RowProblem(dtype, "softmax", nbytes // (cols * itemsize), cols)
            the_plan = plan(problem, device, tuning)
            if nbytes <= limit and 0 < lanes < warp:
                assert the_plan.tier == "warp", (dtype, cols, nbytes, the_plan.tier)
                assert _warp_variant_of(the_plan, problem, device).lanes == lanes
            elif planner.has_async_copy(device) and not planner.exact_group(default_tuning(device), problem, warp):
                assert the_plan.tier in STAGED_TIERS, (dtype, cols, nbytes, the_plan.tier)
                staged_kept += 1
    assert staged_kept >= 4 or not planner.has_async_copy(device)


FEW_TILES_COLS = {"float16": (264, 300, 384, 448, 512, 513, 600, 640, 777, 1000, 1100, 1344, 1500, 2048, 3000, 4000),
                  "bfloat16": (264, 513, 1000, 3000), "float32": (12, 16, 40, 48, 72, 80, 100, 150)}


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_few_staged_tiles_give_way(device):
    """A staged plan of rows longer than a 16-byte vector a lane of a warp (or of float32 rows of 16
    columns or more, few_tiles_short_row_itemsizes) that covers them in fewer than
    staged_min_tiles_per_sm tiles a multiprocessor gives way to the block tier (the small-input
    block's warps; longer rows only) or to the register tier, where the rows read whole slots (whole
    16-byte vectors, or float32 scalar slots); to the register tier or a block of one warp only
    under staged_min_tiles_per_sm_one_warp tiles, and where a one-warp block, or a lane of two or
    more vectors, is filled to few_tiles_min_fill. Every other plan stays as it was."""
    tuning = replace(default_tuning(device), few_tiles_blocks_per_sm=0.0)  # the staged plans kept: as they were
    warp = device.warp_size
    threshold = tuning.staged_min_tiles_per_sm
    moved = collections.Counter()
    kept = 0
    for dtype, mib in itertools.product(FEW_TILES_COLS, (6, 9, 12, 16, 24, 40)):
        for cols in FEW_TILES_COLS[dtype]:
            itemsize = V.DTYPES[dtype][2]
            rows = (mib << 20) // (cols * itemsize)
            problem = RowProblem(dtype, "softmax", rows, cols)
            before, after = _plans_with_and_without(tuning, "staged_min_tiles_per_sm", problem, device)
            what = (dtype, rows, cols, before.tier, after.tier)
            long_rows = cols * itemsize > 16 * warp
            few = (before.tier in STAGED_TIERS and (long_rows or (itemsize == 4 and cols >= 16))
                   and ceil(rows / before.notes["tile_rows"]) < threshold * device.multiprocessors)
            if not few or after == before:
                assert after == before or not few, what
                kept += few
                continue
            moved[after.tier, long_rows] += 1
            (launch,) = after.launches
            slots = after.notes["slots"]
            one_warp_tiles = ceil(rows / before.notes["tile_rows"]) < (
                tuning.staged_min_tiles_per_sm_one_warp * device.multiprocessors)
            assert after.tier == "warp" or (after.tier == "block" and long_rows), what
            if after.tier == "warp":
                variant = _warp_variant_of(after, problem, device)
                assert one_warp_tiles, what
                if variant.vec > 1:  # whole 16-byte vectors; two or more a lane filled to few_tiles_min_fill
                    assert variant.vec * itemsize == 16 and cols % variant.vec == 0, what
                    assert slots == cols // variant.vec, what
                    assert variant.slots == 1 or slots >= tuning.few_tiles_min_fill * variant.lanes * variant.slots
                else:
                    assert itemsize == 4, what
            else:
                warps = planner._small_input_block_warps(default_tuning(device), slots, warp)
                assert launch.block == warps * warp, what
                assert launch.block > warp or (
                    one_warp_tiles and slots >= tuning.few_tiles_min_fill * warp * ceil(slots / warp)), what
    if has_async_copy(device):  # the staged tiers exist: the rule moved long and short rows, and kept others
        assert moved["block", True] >= 5 and moved["warp", True] >= 1 and moved["warp", False] >= 3, moved
        assert kept >= 5, kept
    else:
        assert not moved
    h100 = PROFILES["h100"]
    if device is h100:
        # 4 slots a thread (500 slots: 128 threads, 275: 96), but one warp for rows of up to 5 slots a lane
        for rows, cols, threads in ((1114, 4000, 128), (2621, 2200, 96), (5242, 1100, 32), (4259, 1600, 64)):
            assert plan(RowProblem("float16", "softmax", rows, cols), device, tuning).launches[0].block == threads
        assert plan(RowProblem("float16", "softmax", 8704, 512), device, tuning).tier == "warp"
        for cols in (300, 513, 384, 600):  # partial slots, or under 0.8 of a warp's slots: the staged groups
            assert plan(RowProblem("float16", "softmax", (12 << 20) // (2 * cols), cols), device).tier == "staged_group"
        # one warp a row from 6 tiles a multiprocessor on (float16 1000 columns at 16 MiB: 7.9 tiles)
        assert plan(RowProblem("float16", "softmax", 8388, 1000), device, tuning).tier == "staged_group"
        # float32 rows on scalar slots under 6 tiles (80 columns at 9 MiB: 3.5), not from 6 (100 at 14 MiB: 8.7)
        assert plan(RowProblem("float32", "softmax", 29491, 80), device, tuning).tier == "warp"
        assert plan(RowProblem("float32", "softmax", 36700, 100), device, tuning).tier == "staged_group"


@pytest.mark.parametrize("device", PROFILES.values(), ids=PROFILES.keys())
def test_few_staged_tiles_cut_smaller(device):
    """A staged plan that stays on the staged tiers with fewer than staged_min_tiles_per_sm tiles a
    multiprocessor, of an input of few_tiles_smaller_min_bytes or more, keeps its tier and kernel but
    cuts its tiles toward few_tiles_blocks_per_sm blocks a multiprocessor (down to a row a thread or
    lane group a step). Every other plan stays as it was."""
    threshold = T.staged_min_tiles_per_sm * device.multiprocessors
    wanted = ceil(T.few_tiles_blocks_per_sm * device.multiprocessors)
    cut = collections.Counter()
    for dtype, mib, cols in itertools.product(("float32", "float16"), (1, 2, 4, 9, 16, 24, 40),
                                              (5, 9, 13, 20, 48, 100, 130, 200, 300, 513)):
        itemsize = V.DTYPES[dtype][2]
        rows = (mib << 20) // (cols * itemsize)
        problem = RowProblem(dtype, "softmax", rows, cols)
        before, after = _plans_with_and_without(default_tuning(device), "few_tiles_blocks_per_sm", problem, device)
        what = (dtype, rows, cols, before.tier, after.tier)
        few = (before.tier in STAGED_TIERS and ceil(rows / before.notes["tile_rows"]) < threshold
               and rows * cols * itemsize >= T.few_tiles_smaller_min_bytes)
        if not few:
            assert after == before, what
            continue
        (first,), (second,) = before.launches, after.launches
        assert (after.tier, second.kernel, second.args[:4]) == (before.tier, first.kernel, first.args[:4]), what
        tile_rows, lanes = after.notes["tile_rows"], after.notes["lanes"]
        if tile_rows == before.notes["tile_rows"]:  # already a row a thread or group a step
            assert (after, tile_rows) == (before, min(rows, first.block // lanes)), what
            continue
        cut[after.tier] += 1
        assert tile_rows < before.notes["tile_rows"] and second.grid > first.grid, what
        # as many tiles as `wanted` asks, in whole rows a thread or group a step, or a row each a step
        groups = second.block // lanes
        assert tile_rows in (ceil(ceil(rows / wanted) / groups) * groups, min(rows, groups)), what
    if has_async_copy(device):
        assert cut["staged"] >= 5 and cut["staged_group"] >= 3, cut
    else:
        assert cut["staged"] >= 5, cut
    if device is PROFILES["h100"]:
        # float32 262144x9 at 9 MiB: 3.9 -> 15.5 tiles a multiprocessor; float16 9198x513: 4.4 -> 8.7
        assert plan(RowProblem("float32", "softmax", 262144, 9), device).notes["tile_rows"] == 128
        assert plan(RowProblem("float16", "softmax", 9198, 513), device).notes["tile_rows"] == 8
        # under few_tiles_smaller_min_bytes (float16 52428x10, 1 MiB), and from 8 tiles on (float32
        # 748982x7 at 20 MiB: 8.9), as they were
        assert plan(RowProblem("float16", "softmax", 52428, 10), device).notes["tile_rows"] == 128
        assert plan(RowProblem("float32", "softmax", 748982, 7), device).notes["tile_rows"] == 640


#: the device profiles whose plans the builds must cover: NVIDIA (sm_90), AMD CDNA (warp 64), AMD RDNA (warp 32)
H200 = DeviceProfile("NVIDIA H200", "nvidia", "sm_90", 32, 132, 1024, 48 * 1024, 227 * 1024,
                     shared_mem_per_multiprocessor=228 * 1024)
#: NVIDIA before sm_80 (no asynchronous copies), which CUDA builds serve too: the streaming forms of
#: the tiers that sm_80 and newer fill with asynchronous copies are planned there
T4 = DeviceProfile("NVIDIA T4", "nvidia", "sm_75", 32, 40, 1024, 48 * 1024, 64 * 1024,
                   max_threads_per_multiprocessor=1024, shared_mem_per_multiprocessor=64 * 1024)
BUILT_PROFILES = {"cuda": (PROFILES["h100"], H200, T4), "hip": (PROFILES["mi300x"], PROFILES["rdna3"])}
#: row lengths whose plans reach every tier and variant: every length up to 150, then lengths on both
#: sides of the tiers' limits
WITNESS_COLS = (*range(1, 150), 160, 192, 200, 255, 256, 257, 300, 384, 400, 513, 777, 1000, 1025, 2048, 2049, 4096,
                5000, 8192, 16384, 30000, 40000, 50257, 60000, 120000, 262144, 10**8)


def _witness_problems(dtype: str):
    """Row and strided problems of every op over WITNESS_COLS, at 0.25, 12 and 64 MiB and as one row;
    contiguous, misaligned, and rows spaced apart."""
    itemsize = V.DTYPES[dtype][2]
    for cols, op in itertools.product(WITNESS_COLS, V.OPS):
        rows = {1} | {max(1, int(mib * (1 << 20)) // (cols * itemsize)) for mib in (0.25, 12, 64)}
        for r in rows:
            if r * cols <= 1 << 27 or r == 1:
                yield RowProblem(dtype, op, r, cols)
                yield RowProblem(dtype, op, r, cols, x_misalign=1)
                yield RowProblem(dtype, op, r, cols, x_stride=cols + 8)
    for op, outer, cols, inner, misalign in itertools.product(V.OPS, (1, 3), (2, 3, 5, 16, 64, 65, 200, 512, 513, 8192),
                                                             (1, 2, 4, 8, 7, 64, 8192), (0, 1)):
        strides = (cols * inner, inner, 1)
        yield StridedProblem(dtype, op, outer, cols, inner, strides, strides, x_misalign=misalign, y_misalign=misalign)


@pytest.mark.parametrize("backend", BUILT_PROFILES)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_built_kernels_are_the_plannable_ones(backend, dtype):
    """Every kernel a backend's build carries is planned for some shape on one of its profiles, and
    every plan names one it carries (a kernel no profile plans is dead weight in every build)."""
    built = V.catalogue(dtype, backend)
    planned = set()
    for device in BUILT_PROFILES[backend]:
        for problem in _witness_problems(dtype):
            plans = [plan(problem, device)]
            # and its passes apart (an axis sharded across ranks)
            if isinstance(problem, StridedProblem):
                plans.append(planner.plan_strided_passes(problem, device))
            else:
                plans.append(planner.plan_split_passes(problem, device))
            names = {launch.kernel for p in plans for launch in p.launches}
            assert names <= built, (device.name, problem, names - built)
            planned |= names
    assert built == planned, f"built for {backend}, planned on no profile: {sorted(built - planned)}"


#: shape -> regime on the committed Tuning: one or two shapes a regime and device family
GOLDEN_REGIMES = [
    ("h100", "float16", (1 << 20, 8), "short rows", "packed"),
    ("h100", "float16", (1 << 18, 100), "short rows", "staged_group"),
    ("rdna3", "bfloat16", (1 << 18, 100), "short rows", "staged"),
    ("h100", "float32", (4096, 1000), "a warp a row", "warp"),
    ("mi300x", "float32", (4096, 1000), "a warp a row", "warp"),
    ("h100", "float32", (4096, 8192), "a block a row", "block"),
    ("h100", "float32", (4096, 40000), "a block a row", "block_registers"),
    ("h100", "float32", (64, 262144), "a row split across blocks", "cached"),
    ("mi300x", "float32", (4096, 8192), "a row split across blocks", "cached"),
    ("h100", "float32", (1, 10**8), "a row split across blocks", "split"),
    ("h100", "float32", (1, 8192, 8192), "a strided axis", "strided_cached"),
    ("mi300x", "float32", (1, 4, 8192), "a strided axis", "strided_thread"),
    ("h100", "float32", (64, 300, 7), "a strided axis", "strided"),
]


@pytest.mark.parametrize(("profile", "dtype", "shape", "regime", "tier"), GOLDEN_REGIMES)
def test_golden_regimes(profile, dtype, shape, regime, tier):
    if len(shape) == 2:
        problem = RowProblem(dtype, "softmax", *shape)
    else:
        outer, cols, inner = shape
        strides = (cols * inner, inner, 1)
        problem = StridedProblem(dtype, "softmax", outer, cols, inner, strides, strides)
    p = plan(problem, PROFILES[profile])
    assert (p.regime, p.tier) == (regime, tier), p
    assert set(planner.REGIMES.values()) - {"empty"} == {
        "short rows", "a warp a row", "a block a row", "a row split across blocks", "a strided axis"}


def test_a_tuning_is_an_argument_and_changes_only_its_own_plans():
    device = PROFILES["h100"]
    problem = RowProblem("float32", "softmax", 4096, 8192)
    tuning = default_tuning(device)
    narrower = replace(tuning, block_tier_max_threads=256, block_tier_slots_per_thread=64)
    assert tuning == planner.ASYNC_COPY_TUNING and default_tuning(PROFILES["mi300x"]) == DEFAULT_TUNING
    # 2048 16-byte slots at 64 a thread: one warp, where the committed 8 a thread take 256 threads
    assert plan(problem, device, narrower).launches[0].block == 32 < plan(problem, device).launches[0].block
    assert plan(problem, device, tuning) == plan(problem, device)
    with pytest.raises(TypeError, match="immutable"):
        tuning.warp_tier_max_values[2] = 8


def test_the_rules_are_a_table_whose_every_rule_plans_some_problem():
    """The planner's tables: names unique, a one-line why each, the last rule takes any problem; and
    on the profiles the builds serve, with their committed Tunings, every rule is the first to take
    some problem (none is dead weight)."""
    for rules in (planner.ROW_RULES, planner.STRIDED_RULES):
        names = [rule.name for rule in rules]
        assert len(set(names)) == len(names), names
        assert all(rule.why and "\n" not in rule.why and len(rule.why) <= 120 for rule in rules)
        assert rules[-1].when(None), "the last rule takes whatever the others leave"
    taken = collections.Counter()
    for device, dtype in itertools.product({d for ds in BUILT_PROFILES.values() for d in ds}, V.DTYPES):
        itemsize = V.DTYPES[dtype][2]
        for cols in (4, 8, 20, 100, 300, 1000, 3000, 8192, 50257, 65536, 100000, 262144, 10**8):
            for rows in {0, 1, 100, 4096} | {(mib << 20) // (cols * itemsize) for mib in (12, 64, 1024)}:
                taken[planner.rule_for(RowProblem(dtype, "softmax", rows, cols), device).name] += 1
        for outer, cols, inner in ((0, 5, 3), (1, 8192, 8192), (1, 4, 8192), (64, 300, 7)):
            strides = (cols * inner, inner, 1)
            problem = StridedProblem(dtype, "softmax", outer, cols, inner, strides, strides)
            taken["strided " + planner.rule_for(problem, device).name] += 1
    every = {rule.name for rule in planner.ROW_RULES} | {"strided " + rule.name for rule in planner.STRIDED_RULES}
    assert set(taken) == every, f"never the first to take a problem: {sorted(every - set(taken))}"


#: an NVIDIA part with asynchronous copies and 100 KiB of shared memory a multiprocessor (sm_86/sm_89)
ADA = DeviceProfile("NVIDIA GeForce RTX 4090", "nvidia", "sm_89", 32, 128, 1024, 48 * 1024, 99 * 1024,
                    max_threads_per_multiprocessor=1536, shared_mem_per_multiprocessor=100 * 1024)


@pytest.mark.parametrize("device", [PROFILES["h100"], H200, ADA, T4, PROFILES["mi300x"]], ids=lambda d: d.arch)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_two_pass_split_buffers_its_chunks_where_copies_are_asynchronous(device, dtype):
    """Where copies are asynchronous the split's first pass (and a 16-bit second pass) takes its
    chunks through a buffer in shared memory that three blocks of a multiprocessor hold, its launch's
    shared memory the buffer's slots; scalar 16-bit slots (too narrow to copy) and devices without
    such copies stream both passes."""
    itemsize = V.DTYPES[dtype][2]
    for rows, cols, misalign in ((8192, 64128, 0), (1, 10**8, 0), (300, 40003, 1), (2, 5 * 10**7, 0)):
        problem = RowProblem(dtype, "softmax", rows, cols, x_misalign=misalign, y_misalign=0)
        p = planner.plan_split_passes(problem, device)
        slot_bytes = p.notes["vec"] * itemsize
        buffered = planner.has_async_copy(device) and slot_bytes >= 4
        wanted = (buffered, buffered and itemsize in V.SPLIT_BUFFERED_NORMALIZE_ITEMSIZES)
        for launch, buffers in zip(p.launches, wanted):
            assert ("_buffered_" in launch.kernel) == buffers, (launch.kernel, p.notes)
            if buffers:
                slots = launch.args[-1][1]
                assert launch.shared_mem == slots * slot_bytes <= device.shared_mem_per_multiprocessor // 3, launch
                assert slots <= p.notes["chunk_slots"], (slots, p.notes)
            else:
                assert launch.shared_mem == 0, launch


@pytest.mark.parametrize("device", [PROFILES["h100"], H200, ADA, T4, PROFILES["mi300x"], PROFILES["rdna3"]],
                         ids=lambda d: d.arch)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_two_pass_split_of_short_rows_takes_blocks_sized_to_the_rows(device, dtype):
    """Local rows of a sharded softmax of a few thousand columns take the split's passes a row a block:
    each block about four slots a thread (at least 64 threads and a warp), streamed, and enough of
    them to fill every multiprocessor's threads; rows of a full block's slots keep full blocks."""
    most = min(device.max_threads_per_block, 512)
    split_only = replace(planner.default_tuning(device), passes_rows_in_registers=False)
    for cols in (1, 100, 256, 1000, 1024, 4096, 8192, 16384, 64128):
        p = planner.plan_split_passes(RowProblem(dtype, "softmax", 65536, cols), device, split_only)
        slots = ceil(cols / p.notes["vec"])
        if slots >= 4 * most:  # full blocks (or the buffered passes' own)
            assert all(launch.block in (most, T.split_buffer_threads) for launch in p.launches), (cols, p)
            continue
        block = p.launches[0].block
        assert all(launch.block == block for launch in p.launches), p
        assert block % device.warp_size == 0 and max(64, device.warp_size) <= block <= most, (cols, block)
        assert block == max(64, device.warp_size) or block < slots <= 4 * block, (cols, slots, block)
        assert p.notes["chunks"] == 1 and all("_buffered_" not in launch.kernel for launch in p.launches)
        resident = device.multiprocessors * device.max_threads_per_multiprocessor
        assert all(launch.grid * block >= resident for launch in p.launches), (cols, p)


@pytest.mark.parametrize("device", [PROFILES["h100"], ADA, PROFILES["mi300x"], PROFILES["rdna3"]], ids=lambda d: d.arch)
@pytest.mark.parametrize("dtype", V.DTYPES)
def test_passes_apart_take_rows_a_warp_holds_a_warp_a_row(device, dtype):
    """The two passes apart (a sharded softmax's local rows) take rows of up to the register tier's
    values a lane a warp a row, in the fewest slots a lane that hold them (built for every such count),
    when input and output rows share their offset in 16-byte vectors; longer rows, and rows whose
    output starts at another offset, the split's passes."""
    warp, widest = device.warp_size, V.vector_widths(dtype)[1]
    built = V.rows_pass_slots(dtype)
    planned = set()
    for cols in (1, 3, 37, 100, 256, 257, 1000, 1024, 2048, 4096):
        for misaligns in ((0, 0), (1, 1), (1, 0)):
            problem = RowProblem(dtype, "log_softmax", 4096, cols, None, None, *misaligns)
            p = planner.plan_split_passes(problem, device)
            slots = planner.slots_needed(problem, widest)
            if planner.choose_vec(problem) != widest or ceil(slots / warp) > built[-1]:
                assert p.tier == "split", (cols, misaligns, p.tier)
                continue
            lane_slots = p.notes["slots"]
            assert p.tier == "warp" and p.notes["chunks"] == 1 and lane_slots in built, (cols, p.notes)
            assert lane_slots * warp >= slots and (lane_slots == 1 or lane_slots * warp < 2 * slots), (cols, lane_slots)
            names = [V.rows_partials_name(dtype, warp, lane_slots),
                     V.rows_finish_name(dtype, "log_softmax", warp, lane_slots)]
            assert [launch.kernel for launch in p.launches] == names
            assert dict(p.scratch)["partials"] == 2 * 4096 * (8 if dtype == "float64" else 4)
            planned.add(lane_slots)
    assert planned == set(built), (planned, built)

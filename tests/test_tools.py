"""The development tools' parts that need no GPU: tools/ab_bench.py's variants (Tunings) and spec parsing,
tools/plan_diff.py (which specs a planner variant changes), tools/ab_builds.py's summary of an
A/B table, tools/grad_ab.py's table and tools/machine_code_diff.py (which kernels' SASS two source
trees change; nvcc, no GPU).
tools/concurrent_waits.py needs a GPU: tests/test_gpu.py runs it."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

import pytest

from portable_softmax import planner

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tools(monkeypatch):
    pytest.importorskip("torch", reason="tools/ab_bench.py, which plan_diff reuses, imports torch")
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    return importlib.import_module("ab_bench"), importlib.import_module("plan_diff")


def test_plan_diff_lists_the_specs_a_rule_changes_and_restores_the_knobs(tools):
    ab_bench, plan_diff = tools
    variants = ab_bench.parse_variants("old=split_even_rounds_most:0,V.THREAD_ROW_SLOTS:4;new=")
    committed = planner.V.THREAD_ROW_SLOTS
    defaults = ab_bench.attribute_defaults(variants)
    assert defaults == {"V.THREAD_ROW_SLOTS": committed}
    # float32 256x65536 (64 MiB) takes 1.55 rounds of the on-chip split, 333x50257 2.02, and 16-bit
    # rows are not evened: only the first changes (the catalogue attribute changes none of these)
    specs = ["float32:256x65536", "float32:333x50257", "float16:256x131072"]
    changed = plan_diff.changed_specs(variants, specs, planner.DeviceProfile.h100(), defaults)
    assert changed == {("float32", "cached", 64.0): ["float32:256x65536"]}
    assert planner.V.THREAD_ROW_SLOTS == committed and planner.default_tuning is ab_bench.COMMITTED_TUNING


def test_ab_bench_variants_are_tunings(tools):
    ab_bench, _ = tools
    h100 = planner.DeviceProfile.h100()
    (_, settings), = ab_bench.parse_variants("b=exact_group_max_bytes:{2:1},staged_group_orders:[True]")
    tuning = ab_bench.variant_tuning(settings, h100)
    # a dict and a list become a SizeMap and a tuple: the Tuning stays hashable, and plans
    assert tuning == replace(planner.ASYNC_COPY_TUNING, exact_group_max_bytes=planner.SizeMap({2: 1}),
                             staged_group_orders=(True,))
    assert planner.plan(planner.RowProblem("float16", "softmax", 4096, 256), h100, tuning).tier
    try:  # the API's plans take the variant's Tuning, and the committed one again after
        ab_bench.use(settings, {})
        assert planner.default_tuning(h100) == tuning
    finally:
        ab_bench.use({}, {})
    assert planner.default_tuning is ab_bench.COMMITTED_TUNING


def test_ab_bench_parses_variants_and_sizes_scan_specs(tools):
    ab_bench, _ = tools
    knob = "split_even_rounds_most"
    assert ab_bench.parse_variants(f"a=;b={knob}:0.5") == [("a", {}), ("b", {knob: 0.5})]
    assert ab_bench.split_top_level("A:(1,2),B:{3:4},C:5") == ["A:(1,2)", "B:{3:4}", "C:5"]
    with pytest.raises(SystemExit, match="no knob 'not_a_knob': not a field of planner.Tuning, nor V.NAME"):
        ab_bench.parse_variants("a=not_a_knob:1")
    with pytest.raises(SystemExit, match=r"fields are lower case: split_even_rounds_most\)"):
        ab_bench.parse_variants("a=SPLIT_EVEN_ROUNDS_MOST:1")
    with pytest.raises(SystemExit, match="no knob 'V.NOT_THERE': V. has no attribute 'NOT_THERE'"):
        ab_bench.parse_variants("a=V.NOT_THERE:1")
    # rows fill the size: 1 MiB of float32 rows of 16 columns is 16384 rows, of float16 32768
    assert ab_bench.scan_specs("float32+float16:16+64:1") == [
        "float32:16384x16", "float32:4096x64", "float16:32768x16", "float16:8192x64"]


def test_ab_builds_summary_compares_each_build_with_the_first_by_dtype(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    ab_builds = importlib.import_module("ab_builds")
    table = {
        ("float32", "8x8", -1, "softmax"): {"base": [80.0, 82.0], "new": [84.0, 83.0]},  # better runs: +2
        ("float32", "8x8", -1, "log_softmax"): {"base": [90.0, 89.0], "new": [86.0, 87.0]},  # -3
        ("float16", "8x8", -1, "softmax"): {"base": [70.0], "new": [70.5]},  # +0.5
        ("float16", "4x4", -1, "softmax"): {"base": [70.0]},  # not measured by "new": left out
    }
    assert ab_builds.summary(table, ["base", "new"]) == [
        "new - base float32: mean -0.50, -3.0 to +2.0, ahead on 1 of 2",
        "new - base float16: mean +0.50, +0.5 to +0.5, ahead on 1 of 1",
    ]


# ---- tools/machine_code_diff.py ------------------------------------------------------------------
KERNELS = """
extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }
extern "C" __global__ void shifted(float* x) { x[threadIdx.x] += OFFSET; }
"""


@pytest.fixture
def machine_code_diff(monkeypatch):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit compiles the kernels)")
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    return importlib.import_module("machine_code_diff")


def _tree(root: Path, offset: str) -> Path:
    root.mkdir()
    (root / "softmax.cuh").write_text("")
    (root / "softmax_f32.cu").write_text(KERNELS.replace("OFFSET", offset))
    return root


def test_machine_code_diff_names_the_kernel_whose_code_changed(machine_code_diff, tmp_path, capsys):
    old, same, new = (_tree(tmp_path / n, o) for n, o in (("old", "1.0f"), ("same", "1.0f"), ("new", "3.0f")))
    code = machine_code_diff.kernel_code(machine_code_diff.compile_cubin(old / "softmax_f32.cu", old, "sm_90",
                                                                         tmp_path / "a.cubin"))
    assert set(code) == {"twice", "shifted"} and all(code.values())
    assert machine_code_diff.main([str(old), str(same), "--dtypes", "f32"]) == 0
    assert "0 with other machine code" in capsys.readouterr().out
    assert machine_code_diff.main([str(old), str(new), "--dtypes", "f32"]) == 1
    out = capsys.readouterr().out
    assert "1 with other machine code" in out and "differs  shifted" in out and "twice" not in out
    assert machine_code_diff.main([str(old), str(new), "--dtypes", "f32", "--list-only"]) == 0


def test_machine_code_diff_refuses_what_is_not_a_cubin_or_a_source_tree(machine_code_diff, tmp_path):
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        machine_code_diff.kernel_code(b"not an elf")
    with pytest.raises(SystemExit):
        machine_code_diff.main([str(tmp_path), str(tmp_path)])


def test_grad_ab_table_gives_each_builds_range_over_its_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    grad_ab = importlib.import_module("grad_ab")
    rows = [{"tag": tag, "spec": "float32:4x8", "op": op, "pct": pct, "err": err}
            for tag, pct, err in (("old1", 80.0, 1e-7), ("new1", 90.0, 2e-7), ("old2", 82.0, 1e-7),
                                  ("new2", 90.0, 3e-7))
            for op in ("softmax_backward", "log_softmax_backward")]
    rows.append({"tag": "old1", "spec": "float32:4x8", "op": "softmax_backward", "pct": 81.0, "err": 0.0,
                 "torch": 40.0})
    lines = grad_ab.table(rows)
    assert lines[0] == "spec | old | new | torch | max error"
    assert lines[1] == "float32:4x8 | 80.0-82.0 / 80.0-82.0 | 90.0 / 90.0 | 40.0 / - | 3.00e-07"

"""The development tools that need no GPU: tools/plan_diff.py (which specs a planner variant changes)."""

from __future__ import annotations

import importlib
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
    variants = ab_bench.parse_variants("old=SPLIT_EVEN_ROUNDS_MOST:0;new=")
    committed = planner.SPLIT_EVEN_ROUNDS_MOST
    defaults = {"SPLIT_EVEN_ROUNDS_MOST": committed}
    # float32 256x65536 (64 MiB) takes 1.55 rounds of the on-chip split, 333x50257 2.02, and 16-bit
    # rows are not evened: only the first changes
    specs = ["float32:256x65536", "float32:333x50257", "float16:256x131072"]
    changed = plan_diff.changed_specs(variants, specs, planner.DeviceProfile.h100(), defaults)
    assert changed == {("float32", "cached", 64.0): ["float32:256x65536"]}
    assert planner.SPLIT_EVEN_ROUNDS_MOST == committed

